#!/usr/bin/env python3
"""Writes the recorded torch reference for fine-tuning on a prepared example file (issue #36).

trainer/sft_parity_test.cc trains the Trainer on the files written here and must reproduce every
step's loss within 1e-5 relative (and the step's trained-target count exactly, its learning rate
and its pre-clip gradient norm). CI never runs Python; it uses the committed files.

For each architecture (llama, qwen2, phi3) this script writes, under trainer/testdata/sft_parity/<arch>/:
  model/          a tiny float32 Hugging Face directory (transformers' save_pretrained of a
                  LlamaForCausalLM / Qwen2ForCausalLM of the shapes of model/testdata/hf_tiny_*
                  (phi3: a Phi3ForCausalLM with a window of 8 and partial rotary, below),
                  every parameter N(0, 0.5^2) from torch.Generator seeded SEED + arch index, as
                  model/testdata/make_hf_testdata.py randomizes): the trainer's checkpoint.init_from
  examples.bin    EXAMPLES examples in the example-file format of docs (SPEC #36 §1), written here
                  with struct/numpy (independent of the C++ writer): header of 256 int32 (magic
                  20261207, version 1, token width 2, 0, N as two int32, E as two int32, zeros),
                  N uint16 tokens, zero bytes to a multiple of 8, E + 1 int64 starts, N uint8
                  trained flags
  reference.json  the run's settings, the packing (rows, and which examples each micro-batch of
                  each step holds) and per step: loss, lr, trained_targets, grad_norm (f64,
                  as Python's repr: the shortest text that reads back to the same double)

The examples (numpy Generator seeded SEED + 10 + arch index): lengths uniform in [3, 40] with
seq_len T = 32, so some are truncated to their first T tokens and many are much shorter; tokens
uniform in [0, vocab). Trained masks shaped like chat data: 1 to 3 turns, each a prompt part
(trained 0) then an answer part (trained 1); the first token is never trained. Three fixed
awkward examples are added first: a plain-text one (all trained but the first token), one of 40
tokens whose answer starts after T (no trained target once truncated), and one of 2 tokens.

Packing, re-implemented here from the spec (SPEC #36 §2), packing on, no shuffle, one rank:
  truncate to T; best-fit decreasing: examples by truncated length descending, ties by example
  index ascending; each goes into the existing row with the least free space that still fits it
  (ties: the row created first), else a new row; rows in creation order, examples within a row in
  placement order. Global batch g of every epoch = rows [g B, g B + B) (rows past the last are
  empty, all padding); G = ceil(R / B) global batches per epoch, epochs follow each other. An
  optimizer step takes ACCUM = 2 consecutive global batches (micro-batches).

The reference run (float32, torch.set_num_threads(1), eager attention): for each micro-batch of a
step, each example in its rows is run SEPARATELY, unpacked, as model(input_ids=[the example's
truncated tokens]) (positions 0.., plain causal attention, no padding); labels[i] = input_ids[i]
where trained[i] else -100; its summed cross entropy is
F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum"). The step's loss =
(sum over the step's examples of those sums) / (the step's trained targets) -- the mean over the
step's trained targets, transformers' num_items_in_batch convention -- and loss.backward() on it.
Then torch.nn.utils.clip_grad_norm_(max_norm=clip) (the norm before clipping is recorded) and
torch.optim.AdamW with two groups as the trainer makes them (trainer/config_optimizer.cc,
IsBiasOrNormTensor: names ending in "bias" or containing "layernorm" / "norm." get weight decay 0,
the rest WEIGHT_DECAY), betas BETAS, eps EPS, and before each step s (0-based) every group's lr set
to DeepSpeed's WarmupDecayLR, linear warm-up: W = max(2, WARMUP), T_total = TOTAL;
gamma = s / W while s < W, else max(0, (T_total - s) / max(1, T_total - W));
lr = MIN_LR + (MAX_LR - MIN_LR) * gamma (optimizer/lr_schedule.h).

Recorded run (from the repository root):
  # python 3.11.7, torch 2.15.0+cu132 (CPU, one thread), transformers 4.57.6, numpy 2.4.6,
  # safetensors 0.8.0
  /work/venv-peftnew/bin/python trainer/testdata/sft_parity/make_sft_parity.py
Two runs give identical bytes in every file (checked). phi3 was added later (issue #40) with
  /work/venv-peftnew/bin/python trainer/testdata/sft_parity/make_sft_parity.py --only phi3
(the same versions), which leaves the llama and qwen2 files as they were; gemma3 likewise with
  /work/venv-peftnew/bin/python trainer/testdata/sft_parity/make_sft_parity.py --only gemma3

Checked once (2026-12-07, on main before the example-file support, not a test): the same model
directories, optimizer, schedule and clipping on a plain llm.c token file (every target trained,
consecutive windows) through the trainer binary against the same torch loop: per-step losses
within 2e-7 relative, learning rates equal, gradient norms within 1e-6 relative. So a mismatch
here points at the packing / masking / loss-weighting path, not at the model or the optimizer.
"""
import argparse
import json
import os
import platform
import shutil
import struct

import numpy as np
import safetensors
import torch
import torch.nn.functional as F
import transformers

SEED = 36  # issue #36
EXAMPLES = 24          # random examples (plus the 3 fixed awkward ones)
SEQ_LEN = 32
MIN_LEN, MAX_LEN = 3, 40
ACCUM = 2              # gradient_accumulation_steps
STEPS = 6
BETAS = (0.9, 0.95)
EPS = 1e-8
WEIGHT_DECAY = 0.01
MIN_LR, MAX_LR = 5e-4, 3e-3
WARMUP, TOTAL = 2, 8
MAGIC, VERSION = 20261207, 1

# arch -> (index, config class, config kwargs, micro batch B, gradient clipping max_norm; chosen so
# that some steps clip and others do not)
ARCHS = {
    "llama": (0, "LlamaConfig", dict(
        vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=256,
        rms_norm_eps=1e-5, rope_theta=500000.0,
        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                      "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        tie_word_embeddings=False, hidden_act="silu", attention_bias=False, mlp_bias=False,
        bos_token_id=None, eos_token_id=None), 2, 3.0),
    "qwen2": (1, "Qwen2Config", dict(
        vocab_size=80, hidden_size=24, intermediate_size=40, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=128,
        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True, hidden_act="silu",
        use_sliding_window=False, bos_token_id=None, eos_token_id=None), 3, 2.0),
    # Phi-3 (issue #40): partial rotary (4 of 8 channels), a sliding window of 8 on every layer
    # (examples up to T = 32 tokens are longer), fused qkv_proj / gate_up_proj in its files.
    "phi3": (2, "Phi3Config", dict(
        vocab_size=72, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        original_max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=100.0,
        partial_rotary_factor=0.5, sliding_window=8, tie_word_embeddings=False,
        resid_pdrop=0.0, embd_pdrop=0.0, attention_dropout=0.0, pad_token_id=None,
        bos_token_id=None, eos_token_id=None), 2, 2.5),
    # Gemma 3 text (issue #40): layers sliding (window 8, shorter than many examples), full,
    # sliding; rope_local_base_freq 100 on the sliding layers, rope_theta 10000 on the full one;
    # (1 + w) norms, four per layer, q/k norms, GeGLU, embeddings times sqrt(32), tied.
    "gemma3": (3, "Gemma3TextConfig", dict(
        vocab_size=72, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, query_pre_attn_scalar=8,
        max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
        rope_local_base_freq=100.0, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True, pad_token_id=None,
        bos_token_id=None, eos_token_id=None), 2, 2.5),
}


def versions():
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "numpy": np.__version__,
            "safetensors": safetensors.__version__}


def make_model(arch, out_dir):
    index, cls, kwargs, _, _ = ARCHS[arch]
    config = getattr(transformers, cls)(**kwargs)
    config._attn_implementation = "eager"
    torch.manual_seed(0)  # the constructor's own init, overwritten below
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    g = torch.Generator().manual_seed(SEED + index)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * 0.5)
    model.save_pretrained(out_dir, safe_serialization=True)
    # Reload as the reader of the saved files would (the same f32 values).
    model = transformers.AutoModelForCausalLM.from_pretrained(
        out_dir, dtype=torch.float32, attn_implementation="eager")
    return model


def chat_mask(rng, n):
    """1 to 3 turns of (prompt: 0, answer: 1); trained[0] == 0."""
    turns = int(rng.integers(1, 4))
    trained = np.zeros(n, dtype=np.uint8)
    # Cut points: turn boundaries and prompt/answer boundaries, strictly inside (0, n].
    cuts = np.sort(rng.choice(np.arange(1, n), size=min(2 * turns - 1, n - 1), replace=False))
    bounds = [0] + [int(c) for c in cuts] + [n]
    for k in range(len(bounds) - 1):
        if k % 2 == 1:  # odd segments are answers
            trained[bounds[k]:bounds[k + 1]] = 1
    trained[0] = 0
    return trained


def make_examples(arch):
    index, _, kwargs, _, _ = ARCHS[arch]
    vocab = kwargs["vocab_size"]
    rng = np.random.default_rng(SEED + 10 + index)
    examples = []
    # Plain text: all trained but the first token.
    t = rng.integers(0, vocab, size=17)
    examples.append((t, np.concatenate([[0], np.ones(16)]).astype(np.uint8)))
    # 40 tokens whose answer starts at 35 > T: nothing trained once truncated.
    t = rng.integers(0, vocab, size=40)
    m = np.zeros(40, dtype=np.uint8)
    m[35:] = 1
    examples.append((t, m))
    # Two tokens: one target.
    examples.append((rng.integers(0, vocab, size=2), np.array([0, 1], dtype=np.uint8)))
    for _ in range(EXAMPLES):
        n = int(rng.integers(MIN_LEN, MAX_LEN + 1))
        examples.append((rng.integers(0, vocab, size=n), chat_mask(rng, n)))
    return [(t.astype(np.int64), m.astype(np.uint8)) for t, m in examples]


def write_example_file(path, examples):
    tokens = np.concatenate([t for t, _ in examples]).astype("<u2")
    trained = np.concatenate([m for _, m in examples]).astype(np.uint8)
    starts = np.zeros(len(examples) + 1, dtype="<i8")
    starts[1:] = np.cumsum([len(t) for t, _ in examples])
    n, e = len(tokens), len(examples)
    header = [0] * 256
    header[0], header[1], header[2], header[3] = MAGIC, VERSION, 2, 0
    header[4], header[5] = n & 0xFFFFFFFF, n >> 32
    header[6], header[7] = e & 0xFFFFFFFF, e >> 32
    body = struct.pack("<256i", *header) + tokens.tobytes()
    body += b"\0" * ((-len(body)) % 8)
    body += starts.tobytes() + trained.tobytes()
    assert len(body) == 1024 + (2 * n + 7) // 8 * 8 + 8 * (e + 1) + n
    with open(path, "wb") as f:
        f.write(body)


def pack(lengths, capacity):
    """Best-fit decreasing; rows of example indices in placement order."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    rows, free = [], []
    for i in order:
        best = -1
        for r in range(len(rows)):  # least free space that still fits; ties: first created
            if free[r] >= lengths[i] and (best < 0 or free[r] < free[best]):
                best = r
        if best < 0:
            rows.append([])
            free.append(capacity)
            best = len(rows) - 1
        rows[best].append(i)
        free[best] -= lengths[i]
    return rows


def lr_at(step):
    w = max(2, WARMUP)
    if step < w:
        gamma = step / w
    else:
        gamma = max(0.0, (TOTAL - step) / max(1.0, TOTAL - w))
    return MIN_LR + (MAX_LR - MIN_LR) * gamma


def no_decay(name):
    name = name.lower()
    return name.endswith("bias") or "ln_" in name or "layernorm" in name or \
        "layer_norm" in name or "norm." in name


def make(arch, root):
    _, _, _, micro, clip = ARCHS[arch]
    out = os.path.join(root, arch)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    model = make_model(arch, os.path.join(out, "model"))
    model.train()
    examples = make_examples(arch)
    write_example_file(os.path.join(out, "examples.bin"), examples)

    truncated = [(t[:SEQ_LEN], m[:SEQ_LEN]) for t, m in examples]
    rows = pack([len(t) for t, _ in truncated], SEQ_LEN)
    g_per_epoch = -(-len(rows) // micro)

    def batch_rows(global_index):
        g = global_index % g_per_epoch
        return [rows[r] if r < len(rows) else [] for r in range(g * micro, (g + 1) * micro)]

    decay = [p for n, p in model.named_parameters() if not no_decay(n)]
    keep = [p for n, p in model.named_parameters() if no_decay(n)]
    no_decay_names = [n for n, _ in model.named_parameters() if no_decay(n)]
    opt = torch.optim.AdamW([{"params": keep, "weight_decay": 0.0},
                             {"params": decay, "weight_decay": WEIGHT_DECAY}],
                            lr=MAX_LR, betas=BETAS, eps=EPS)
    params = list(model.parameters())
    history = []
    for s in range(STEPS):
        lr = lr_at(s)
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad()
        micro_batches = [batch_rows(ACCUM * s + m) for m in range(ACCUM)]
        ids = [i for mb in micro_batches for row in mb for i in row]
        n_step = int(sum(int(truncated[i][1][1:].sum()) for i in ids))
        assert n_step > 0
        total = None
        total_f64 = 0.0
        for i in ids:
            t, m = truncated[i]
            input_ids = torch.tensor(t, dtype=torch.long)[None]
            labels = torch.where(torch.tensor(m, dtype=torch.bool), input_ids[0],
                                 torch.full_like(input_ids[0], -100))
            logits = model(input_ids=input_ids).logits[0]
            ce = F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction="sum")
            total = ce if total is None else total + ce
            total_f64 += float(ce.item())
        loss = total / n_step
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm=clip))
        opt.step()
        rec = {"step": s + 1, "loss": total_f64 / n_step, "loss_f32": float(loss.item()),
               "lr": lr, "trained_targets": n_step, "grad_norm": grad_norm,
               "clipped": grad_norm > clip,
               "micro_batches": [[row for row in mb] for mb in micro_batches],
               "micro_batch_trained_targets": [
                   int(sum(int(truncated[i][1][1:].sum()) for row in mb for i in row))
                   for mb in micro_batches]}
        history.append(rec)
        print(f"{arch} step {s + 1}: loss {rec['loss']:.17g} lr {lr:.6g} targets {n_step} "
              f"grad_norm {grad_norm:.6g}")

    ref = {
        "generator": "make_sft_parity.py",
        "versions": versions(),
        "model": f"trainer/testdata/sft_parity/{arch}/model",
        "examples": f"trainer/testdata/sft_parity/{arch}/examples.bin",
        "num_examples": len(examples),
        "example_lengths": [len(t) for t, _ in examples],
        "truncated_examples": sum(len(t) > SEQ_LEN for t, _ in examples),
        "dropped_tokens": sum(max(0, len(t) - SEQ_LEN) for t, _ in examples),
        "seq_len": SEQ_LEN, "micro_batch": micro, "gradient_accumulation_steps": ACCUM,
        "steps": STEPS, "packing": True, "shuffle": False,
        "rows": rows, "global_batches_per_epoch": g_per_epoch,
        "real_token_fraction": sum(len(t) for t, _ in truncated) / (len(rows) * SEQ_LEN),
        "optimizer": {"type": "AdamW", "betas": list(BETAS), "eps": EPS,
                      "weight_decay": WEIGHT_DECAY, "no_decay_parameters": no_decay_names},
        "scheduler": {"type": "WarmupDecayLR", "warmup_min_lr": MIN_LR, "warmup_max_lr": MAX_LR,
                      "warmup_num_steps": WARMUP, "warmup_type": "linear",
                      "total_num_steps": TOTAL},
        "gradient_clipping": clip,
        "loss": "per step: sum over the step's examples, each run alone, of "
                "F.cross_entropy(logits[:-1], labels[1:], ignore_index=-100, reduction='sum'), "
                "divided by the step's trained targets",
        "history": history,
    }
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default="trainer/testdata/sft_parity")
    parser.add_argument("--only", nargs="+", choices=sorted(ARCHS), default=sorted(ARCHS))
    args = parser.parse_args()
    torch.set_num_threads(1)  # one thread: the reductions' order, hence the bits, are fixed
    torch.use_deterministic_algorithms(True)
    for arch in args.only:
        make(arch, args.root)


if __name__ == "__main__":
    main()
