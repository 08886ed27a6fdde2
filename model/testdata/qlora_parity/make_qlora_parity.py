#!/usr/bin/env python3
"""Writes the recorded QLoRA parity reference (issue #37): model/testdata/qlora_parity/.

QLoRA with compute dtype float32 computes LoRA over the DEQUANTIZED 4-bit base: bitsandbytes'
Linear4bit dequantizes W and runs the f32 GEMM. So the reference is peft's own LoRA training over a
transformers model whose block linears hold dequantize(quantize(W)) in float32. The C++ test
(model/lora_model_test.cc, QloraParityTest) loads the f32 base directory with GptModelOptions::quant4 set, so the
model quantizes on load, trains the same steps and must reproduce every loss within 1e-4 relative
and the trained adapters closely; it also checks the dequantized weights bit for bit (CRC-32C of
their f32 bytes, below). CI never runs Python; it uses the committed files.

The 4-bit codec is NOT reimplemented here: the script imports
model/kernels/testdata/nf4/make_nf4_vectors.py (the numpy reference of bitsandbytes' CUDA kernels,
blocksize 64, double quantization in nested blocks of 256 with create_dynamic_map; see its
docstring) and calls its make_case() on each weight, reading back the `.dequant_f32` line it
writes. Every linear of every decoder block (q/k/v/o_proj, gate/up/down_proj: what transformers
replaces by Linear4bit) is quantized, whether or not LoRA adapts it, flattened row-major as the
[out, in] tensor (bitsandbytes quantizes weight.data flattened). Embeddings, norms, biases and the
LM head stay float32 (transformers never quantizes them).

Files (per arch in {llama, qwen2}):
  <arch>/base/                 config.json + model.safetensors (float32), written by transformers'
                               save_pretrained from fixed seeded weights (see fill_weights)
  <arch>/adapter_init/         peft's save_pretrained of the initial adapter (README.md removed)
  <arch>/<variant>/reference.json
                               quantization, LoRA, optimizer, every step's tokens / targets /
                               losses / grad norm, the dequantized weights' CRC-32C and their
                               largest error against W, the base losses, versions
  <arch>/<variant>/adapter_trained/
                               peft's save_pretrained after the last step (README.md removed)
Variants: nf4 (bnb_4bit_quant_type nf4, no double quant), nf4_dq (nf4 with
bnb_4bit_use_double_quant), and for llama also fp4_dq (fp4 with double quant).

The models (awkward on purpose):
  llama: LlamaForCausalLM, 1 layer, hidden 40 (5 heads of 8, 1 kv head), intermediate 416,
         vocab 72, untied head, rope_theta 10000. 40 is not a multiple of 64, so quantization
         blocks straddle rows; gate/up/down hold 16640 values = 260 blocks, so double
         quantization has two nested blocks (256 and 4). LoRA on all seven linears.
  qwen2: Qwen2ForCausalLM, 2 layers, hidden 24 (3 heads of 8, 1 kv head), intermediate 60,
         vocab 80, q/k/v biases, tied head, rope_theta 1e6. gate/up/down hold 1440 values =
         22.5 blocks (a tail block of 32). LoRA on q/k/v/o only: the MLP is 4-bit without an
         adapter. Gradient accumulation of 2 micro-batches per step.
  Weights: N(0, 0.2^2) scaled per row by 10^U(-0.7, 0.3) (blocks mix rows of different
  scales), norm gains 1 + U(-0.3, 0.3), biases N(0, 0.1^2); layer 0's o_proj has an all-zero
  block (values 128..191: absmax 0, whose codes dequantize to -0.0 in the CUDA kernels' rule) and
  one outlier (8.0 at value 7).

The run (as model/testdata/make_lora_testdata.py, which model/lora_model_test.cc reproduces):
  - base loaded with AutoModelForCausalLM.from_pretrained(dtype=float32,
    attn_implementation="eager"), then every block linear's weight replaced by its dequantized
    f32 values;
  - torch.manual_seed(SEED) then get_peft_model(LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
    bias="none", task_type="CAUSAL_LM", target_modules=...)); every lora_B then overwritten with
    N(0, 0.02^2) from torch.Generator seeded SEED + 1 in named_parameters() order (a zero B would
    hide a wrong B path). adapter_init/ holds these values; the A/B init does not depend on the
    base, so one adapter_init serves every variant of an arch;
  - data: step s, micro-batch m: B = 2 rows of T + 1 = 16 tokens uniform in [0, vocab) from
    torch.Generator seeded SEED + 100; tokens the first 15, targets the last 15, then K in [1, 4]
    targets at distinct positions set to -100;
  - loss: F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100) per
    micro-batch; a step's loss is the mean of its micro-batch losses; each micro-batch's loss is
    divided by the number of micro-batches before backward;
  - torch.optim.AdamW(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01) over the adapters
    only, constant lr, STEPS = 6 steps, zero_grad before each; no clipping.
  "base_loss_dequantized" is the loss on step 0's data of the dequantized base without the
  adapter; "base_loss_f32" the same with the original f32 weights: the script asserts they differ
  by more than 10 times the test's bound, so a model that skipped quantization would fail.

CRC-32C: of the dequantized f32 values' little-endian bytes in row-major [out, in] order
(Castagnoli, as base/crc32c.h; crc32c(b"123456789") == 0xE3069283 is asserted).

Recorded run (from the repository root; the committed files were made by it):
  PYTHONHASHSEED=0 /work/venv-peftnew/bin/python \
      model/testdata/qlora_parity/make_qlora_parity.py model/testdata/qlora_parity
  # python 3.11.7, torch 2.15.0+cu132 (CPU, one thread), transformers 4.57.6, peft 0.21.2,
  # safetensors 0.8.0, numpy 2.4.6, huggingface_hub 0.36.2, accelerate 1.16.0
Two runs give identical bytes in every file (PYTHONHASHSEED fixes the order peft writes
target_modules in adapter_config.json; nothing else depends on it).
"""
import argparse
import importlib.util
import json
import os
import platform
import shutil

import numpy as np
import peft
import safetensors
import torch
import torch.nn.functional as F
import transformers

HERE = os.path.dirname(os.path.abspath(__file__))
NF4_SCRIPT = os.path.join(HERE, "..", "..", "kernels", "testdata", "nf4", "make_nf4_vectors.py")

SEED = 37  # issue #37
STEPS = 6
MICRO_BATCH = 2
SEQ_LEN = 15
R = 4
LORA_ALPHA = 8
B_INIT_STD = 0.02
ADAMW = dict(lr=2e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
LOSS_BOUND = 1e-4  # the C++ test's relative bound on every loss
ALL_LINEARS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]


def load_nf4_reference():
    spec = importlib.util.spec_from_file_location("make_nf4_vectors", NF4_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NF4 = load_nf4_reference()


def llama_config():
    return transformers.LlamaConfig(
        vocab_size=72, hidden_size=40, intermediate_size=416, num_hidden_layers=1,
        num_attention_heads=5, num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
        rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
        attention_bias=False, mlp_bias=False, pad_token_id=None, bos_token_id=None,
        eos_token_id=None)


def qwen2_config():
    return transformers.Qwen2Config(
        vocab_size=80, hidden_size=24, intermediate_size=60, num_hidden_layers=2,
        num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=64,
        rms_norm_eps=1e-6, rope_theta=1e6, tie_word_embeddings=True, hidden_act="silu",
        use_sliding_window=False, pad_token_id=None, bos_token_id=None, eos_token_id=None)


# arch -> (config, weight seed, LoRA targets, micro-batches per step, variants)
# variant -> (quant_type, double_quant)
VARIANTS = {"nf4": ("nf4", False), "nf4_dq": ("nf4", True), "fp4_dq": ("fp4", True)}
ARCHS = {
    "llama": (llama_config, 3701, ALL_LINEARS, 1, ["nf4", "nf4_dq", "fp4_dq"]),
    "qwen2": (qwen2_config, 3702, ATTENTION, 2, ["nf4", "nf4_dq"]),
}


def versions():
    import accelerate
    import huggingface_hub
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "peft": peft.__version__,
            "safetensors": safetensors.__version__, "numpy": np.__version__,
            "huggingface_hub": huggingface_hub.__version__,
            "accelerate": accelerate.__version__}


# CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as base/crc32c.h.
def _crc_table():
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


CRC_TABLE = _crc_table()


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc = CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283


def is_block_linear(name):
    return (name.startswith("model.layers.") and name.endswith(".weight")
            and any(f".{m}." in name for m in ALL_LINEARS))


def fill_weights(model, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.6 * (torch.rand(p.shape, generator=gen) - 0.5))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                w = 0.2 * torch.randn(p.shape, generator=gen)
                if p.dim() == 2 and is_block_linear(name):
                    rows = 10 ** (torch.rand((p.shape[0], 1), generator=gen) - 0.7)
                    w = w * rows
                p.copy_(w)
        o = model.model.layers[0].self_attn.o_proj.weight
        flat = o.data.view(-1)
        flat[128:192] = 0.0
        flat[7] = 8.0


def quantize_dequantize(w, quant_type, double_quant):
    """dequantize(quantize(w)) in float32 by make_nf4_vectors.make_case, and the codec state."""
    lines = []
    x = np.ascontiguousarray(w.detach().numpy().astype(np.float32).reshape(-1))
    with np.errstate(all="ignore"):
        NF4.make_case(lines, "w", quant_type, "f32", x, double_quant)
    fields = {}
    for line in lines:
        key, _, rest = line.partition(" ")
        fields[key.split(".", 1)[1]] = rest
    deq = np.array([int(h, 16) for h in fields["dequant_f32"].split()],
                   dtype=np.uint32).view(np.float32)
    assert deq.size == x.size
    info = {"crc32c": crc32c(deq.astype("<f4").tobytes()),
            "max_abs_error": float(np.max(np.abs(deq.astype(np.float64) - x))),
            "blocks": (x.size + 63) // 64}
    if double_quant:
        info["nested_offset"] = float(
            np.array([int(fields["offset"], 16)], dtype=np.uint32).view(np.float32)[0])
        info["nested_blocks"] = len(fields["nested_absmax"].split())
    return torch.from_numpy(deq.reshape(tuple(w.shape)).copy()), info


def load_base(base_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(
        base_dir, dtype=torch.float32, attn_implementation="eager")


def make_batches(vocab, micro_batches):
    g = torch.Generator().manual_seed(SEED + 100)
    out = []
    for _ in range(STEPS):
        step = []
        for _ in range(micro_batches):
            seq = torch.randint(0, vocab, (MICRO_BATCH, SEQ_LEN + 1), generator=g)
            tokens = seq[:, :-1].clone()
            targets = seq[:, 1:].clone()
            k = int(torch.randint(1, 5, (1,), generator=g))
            pos = torch.randperm(MICRO_BATCH * SEQ_LEN, generator=g)[:k]
            targets.view(-1)[pos] = -100
            step.append((tokens, targets))
        out.append(step)
    return out


def loss_of(model, tokens, targets):
    logits = model(input_ids=tokens).logits
    v = logits.shape[-1]
    return F.cross_entropy(logits.view(-1, v), targets.view(-1), ignore_index=-100)


def save_adapter(model, directory):
    model.save_pretrained(directory)
    os.remove(os.path.join(directory, "README.md"))


def peft_model(base, targets):
    torch.manual_seed(SEED)
    lcfg = peft.LoraConfig(r=R, lora_alpha=LORA_ALPHA, lora_dropout=0.0, bias="none",
                           task_type="CAUSAL_LM", target_modules=targets)
    model = peft.get_peft_model(base, lcfg)
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * B_INIT_STD)
    return model


def make_base(arch, out):
    config_fn, seed, _, _, _ = ARCHS[arch]
    base_dir = os.path.join(out, "base")
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config_fn(), dtype=torch.float32,
                                                          attn_implementation="eager")
    fill_weights(model, seed)
    model.save_pretrained(base_dir)
    gen_cfg = os.path.join(base_dir, "generation_config.json")
    if os.path.exists(gen_cfg):
        os.remove(gen_cfg)
    return base_dir


def run_variant(arch, out, base_dir, variant, batches):
    _, _, targets_list, micro_batches, _ = ARCHS[arch]
    quant_type, double_quant = VARIANTS[variant]
    vdir = os.path.join(out, variant)
    os.makedirs(vdir)
    base = load_base(base_dir)
    tokens0, targets0 = batches[0][0]
    with torch.no_grad():
        base_loss_f32 = loss_of(base, tokens0, targets0).item()
    dequantized = {}
    with torch.no_grad():
        for name, p in base.named_parameters():
            if is_block_linear(name):
                deq, info = quantize_dequantize(p, quant_type, double_quant)
                info["shape"] = list(p.shape)
                dequantized[name] = info
                p.copy_(deq)
    assert len(dequantized) == 7 * base.config.num_hidden_layers, sorted(dequantized)

    model = peft_model(base, targets_list)
    trainable = [p for p in model.parameters() if p.requires_grad]
    trainable_names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert all(("lora_A" in n or "lora_B" in n) for n in trainable_names), trainable_names
    init_dir = os.path.join(out, "adapter_init")
    if not os.path.exists(init_dir):
        save_adapter(model, init_dir)
    model.train()
    with torch.no_grad(), model.disable_adapter():
        base_loss = loss_of(model, tokens0, targets0).item()
    # Quantization must move the loss far more than the test's bound.
    assert abs(base_loss - base_loss_f32) > 10 * LOSS_BOUND * abs(base_loss_f32), (
        base_loss, base_loss_f32)

    opt = torch.optim.AdamW(trainable, **ADAMW)
    steps = []
    for s in range(STEPS):
        opt.zero_grad()
        micro_losses = []
        for tokens, targets in batches[s]:
            loss = loss_of(model, tokens, targets)
            micro_losses.append(loss.item())
            (loss / micro_batches).backward()
        grad_norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(p.grad) for p in trainable])).item()
        steps.append({"step": s, "loss": float(np.float32(np.mean(np.float32(micro_losses)))),
                      "micro_batch_losses": micro_losses, "grad_norm": grad_norm,
                      "micro_batches": [{"tokens": t.tolist(), "targets": y.tolist()}
                                        for t, y in batches[s]]})
        opt.step()
        print(f"{arch}/{variant} step {s}: loss {steps[-1]['loss']!r} grad_norm {grad_norm:.6g}")
    save_adapter(model, os.path.join(vdir, "adapter_trained"))
    with torch.no_grad():
        loss_after = loss_of(model, tokens0, targets0).item()

    ref = {
        "generator": "make_qlora_parity.py",
        "versions": versions(),
        "arch": arch,
        "base": "base",
        "quantization": {"load_in_4bit": True, "bnb_4bit_quant_type": quant_type,
                         "bnb_4bit_use_double_quant": double_quant,
                         "bnb_4bit_compute_dtype": "float32", "blocksize": 64,
                         "nested_blocksize": 256 if double_quant else None},
        "lora": {"r": R, "lora_alpha": LORA_ALPHA, "scale": LORA_ALPHA / R, "lora_dropout": 0.0,
                 "bias": "none", "target_modules": targets_list},
        "optimizer": {"type": "torch.optim.AdamW", "lr": ADAMW["lr"],
                      "betas": list(ADAMW["betas"]), "eps": ADAMW["eps"],
                      "weight_decay": ADAMW["weight_decay"], "schedule": "constant"},
        "clip_grad_norm": None,
        "gradient_accumulation_steps": micro_batches,
        "micro_batch": MICRO_BATCH, "seq_len": SEQ_LEN,
        "vocab_size": base.config.vocab_size, "steps": STEPS,
        "loss": "F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100) per "
                "micro-batch; a step's loss is the mean of its micro-batch losses",
        "base_loss_f32": base_loss_f32,
        "base_loss_dequantized": base_loss,
        "loss_after": loss_after,
        "dequantized": dequantized,
        "trainable_parameter_names": trainable_names,
        "history": steps,
    }
    with open(os.path.join(vdir, "reference.json"), "w") as f:
        json.dump(ref, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"{arch}/{variant}: base f32 {base_loss_f32!r} dequantized {base_loss!r} "
          f"first {steps[0]['loss']!r} last {steps[-1]['loss']!r} after {loss_after!r}")


def make(arch, root):
    out = os.path.join(root, arch)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    base_dir = make_base(arch, out)
    cfg = json.load(open(os.path.join(base_dir, "config.json")))
    batches = make_batches(cfg["vocab_size"], ARCHS[arch][3])
    for variant in ARCHS[arch][4]:
        run_variant(arch, out, base_dir, variant, batches)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default=HERE)
    parser.add_argument("--only", nargs="+", choices=sorted(ARCHS), default=sorted(ARCHS))
    args = parser.parse_args()
    torch.set_num_threads(1)
    for arch in args.only:
        make(arch, args.root)


if __name__ == "__main__":
    main()
