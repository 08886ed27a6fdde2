#!/usr/bin/env python3
"""Writes the recorded peft reference for LoRA training (issue #28): lora_ref_<arch>/.

For each tiny base (hf_tiny_llama, hf_tiny_qwen2, hf_tiny_gpt2, loaded in float32 with
AutoModelForCausalLM, attn_implementation="eager") this script builds peft's own LoRA model
(get_peft_model with LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, bias="none",
task_type="CAUSAL_LM")), trains it for 10 steps of torch.optim.AdamW and writes:

  lora_ref_<arch>/adapter_init/     the adapter before training (peft's save_pretrained: README.md,
                                    adapter_config.json, adapter_model.safetensors; untouched)
  lora_ref_<arch>/adapter_trained/  the adapter after the 10 steps (the same files)
  lora_ref_<arch>/reference.json    hyperparameters, every step's tokens / targets / loss, the
                                    base model's loss, peft's tensor names and shapes, versions

The C++ side loads adapter_init through lora.init_from, runs the same 10 steps on the same tokens
and must reproduce every loss within 1e-5 relative and adapter_trained within 1e-5.
CI never runs Python; it uses the committed files.

What the run does, exactly (everything a reimplementation has to match):
- Targets: target_modules llama / qwen2 ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
  "up_proj", "down_proj"]; gpt2 ["c_attn", "c_proj", "c_fc"] with fan_in_fan_out=True (Conv1D;
  "c_proj" matches both attn.c_proj and mlp.c_proj). Scale lora_alpha / r = 2.
- Initial adapter: torch.manual_seed(SEED) before get_peft_model, so lora_A is peft's
  Kaiming-uniform draw from that seed. peft initialises every lora_B to zero, which would make the
  first step's loss independent of the adapter and hide a wrong B-path; so after get_peft_model
  EVERY lora_B is overwritten with N(0, 0.02^2) values from torch.Generator seeded SEED + 1,
  visited in named_parameters() order (forward order). adapter_init/ holds these values, so a
  reader takes them from the file and never has to redraw them.
- Base dropout: GPT-2's config has attn_pdrop / resid_pdrop / embd_pdrop 0.1; they are loaded as
  0.0 (config overrides to from_pretrained) so training is deterministic and matches a base
  without dropout. Llama / Qwen2 have attention_dropout 0.0 already. LoRA dropout is 0.0.
- RoPE: the base directories were written by transformers 5 (rope_parameters). transformers
  4.57.6 does not read that key, so its rope_theta / rope_scaling are passed explicitly from
  config.json's rope_parameters (llama: llama3 scaling, theta 500000; qwen2: default, theta 1e6);
  reference.json records the values the loaded model used.
- Data: step s, micro-batch m: B = 2 rows of T + 1 = 17 tokens uniform in [0, vocab) from
  torch.Generator seeded SEED + 100; tokens = the first 16, targets = the last 16 (next token);
  then K targets per micro-batch, K uniform in [1, 4], at distinct positions of the flattened
  [B * T] targets, are set to -100 (ignored). reference.json records them all.
- Loss: logits = model(tokens).logits [B, T, V] (float32);
  loss = F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100): the mean over
  the non-ignored targets of this micro-batch (not the model's internal shifted loss).
- Optimizer: torch.optim.AdamW(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01) over the
  trainable parameters only (all lora_A / lora_B; decoupled decay applied to both), constant lr,
  10 steps; optimizer.zero_grad() before each step.
- gpt2: torch.nn.utils.clip_grad_norm_(trainable, max_norm=1.0) before each optimizer.step()
  (torch's rule: scale = max_norm / (total_norm + 1e-6) when that is < 1). reference.json records
  every step's pre-clip norm ("grad_norm") and whether it clipped.
- qwen2: gradient accumulation of 2 micro-batches per step (each B = 2): each micro-batch's loss is
  divided by 2 and backpropagated, the gradients sum, then one optimizer step. The step's recorded
  "loss" is the mean of the two micro-batch losses (each itself a mean over its own non-ignored
  targets; the micro-batches ignore different counts, so this is not the mean over all targets).
- "loss" of a step is the loss of the forward before that step's update; "loss_after" in
  reference.json is the loss on step 0's data after the last step (the trained adapter).
  "base_loss" is the base model's loss (adapter disabled) on step 0's data, before training.
Losses are float32 values printed as Python floats (repr of the exact f32 value).

What peft writes (seen in this run; reference.json's "peft_tensors" lists every name and shape):
  names "base_model.model." + the HF module name + ".lora_A.weight" / ".lora_B.weight", e.g.
  base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight [r, in] and
  base_model.model.transformer.h.0.attn.c_attn.lora_B.weight [out, r]: float32, no adapter name
  ("default") in the key. GPT-2's Conv1D (weight stored [in, out]) has the same A [r, in],
  B [out, r] (c_attn: A [4, 16], B [48, 4]); fan_in_fan_out only transposes the merged delta.
  modules_to_save (not used here; checked with a throwaway model) saves the module's full
  weight under its plain name, e.g. base_model.model.lm_head.weight [vocab, hidden], with no
  "modules_to_save.default" in the key; peft matches modules_to_save names as suffixes, so
  "norm" also selects every layer's input_layernorm / post_attention_layernorm.

Recorded run (from the repository root, so peft records base_model_name_or_path as the relative
path model/testdata/hf_tiny_<arch>):
  python3 -m venv /tmp/venv && /tmp/venv/bin/pip install torch transformers==4.57.6 peft \
      safetensors numpy
  # python 3.11.7, torch 2.15.0+cu132 (run on the CPU, one thread), transformers 4.57.6,
  # peft 0.21.2, safetensors 0.8.0, numpy 2.4.6, huggingface_hub 0.36.2, accelerate 1.15.0
  PYTHONHASHSEED=0 /tmp/venv/bin/python model/testdata/make_lora_testdata.py
  # gpt2:  base_loss 4.820796966552734, step 0 4.826286792755127, step 9 4.779566287994385
  #        (pre-clip grad norms 0.46 .. 1.69: steps 3, 4, 6, 9 clip, the others do not)
  # llama: base_loss 5.2813334465026855, step 0 5.301762104034424, step 9 5.233958721160889
  # qwen2: base_loss 5.471534252166748, step 0 5.471137046813965, step 9 5.112974166870117
Two runs give identical bytes in every file. PYTHONHASHSEED only fixes the order peft writes
target_modules in adapter_config.json (a Python set); the tensors and reference.json do not depend
on it, and readers must not depend on that order.
"""
import argparse
import json
import os
import platform
import shutil
import sys

import numpy as np
import peft
import safetensors
import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open

SEED = 28  # issue #28
STEPS = 10
MICRO_BATCH = 2
SEQ_LEN = 16
R = 4
LORA_ALPHA = 8
B_INIT_STD = 0.02
ADAMW = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
LLAMA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
GPT2_TARGETS = ["c_attn", "c_proj", "c_fc"]

# arch -> (base directory name, target modules, fan_in_fan_out, micro-batches per step,
#          clip max_norm or None)
ARCHS = {
    "llama": ("hf_tiny_llama", LLAMA_TARGETS, False, 1, None),
    "qwen2": ("hf_tiny_qwen2", LLAMA_TARGETS, False, 2, None),
    "gpt2": ("hf_tiny_gpt2", GPT2_TARGETS, True, 1, 1.0),
}


def versions():
    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "peft": peft.__version__,
            "safetensors": safetensors.__version__, "numpy": np.__version__}


def load_base(base_dir):
    """The base in float32, eager attention, no base dropout, RoPE as config.json says."""
    with open(os.path.join(base_dir, "config.json")) as f:
        cfg = json.load(f)
    overrides = {}
    if cfg["model_type"] == "gpt2":
        overrides.update(attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    rope = cfg.get("rope_parameters")
    if rope is not None and int(transformers.__version__.split(".")[0]) < 5:
        rope = dict(rope)
        overrides["rope_theta"] = rope.pop("rope_theta")
        overrides["rope_scaling"] = None if rope.get("rope_type") == "default" else rope
    model = transformers.AutoModelForCausalLM.from_pretrained(
        base_dir, dtype=torch.float32, attn_implementation="eager", **overrides)
    return model, cfg


def rope_used(model):
    c = model.config
    if hasattr(c, "rope_parameters"):
        return c.rope_parameters
    if hasattr(c, "rope_theta"):
        return {"rope_theta": c.rope_theta, "rope_scaling": c.rope_scaling}
    return None


def make_batches(vocab, micro_batches):
    """[step][micro-batch] -> (tokens [B, T], targets [B, T]) as int64 tensors."""
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


def tensor_table(path):
    with safe_open(path, framework="pt") as f:
        return [{"name": k, "shape": list(f.get_tensor(k).shape),
                 "dtype": str(f.get_tensor(k).dtype).replace("torch.", "")}
                for k in sorted(f.keys())]


def make(arch, root):
    base_name, targets_list, fan_in_fan_out, micro_batches, clip = ARCHS[arch]
    out = os.path.join(root, f"lora_ref_{arch}")
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    base_dir = os.path.join(root, base_name)
    base, cfg = load_base(base_dir)
    vocab = cfg["vocab_size"]
    batches = make_batches(vocab, micro_batches)

    torch.manual_seed(SEED)
    lcfg = peft.LoraConfig(r=R, lora_alpha=LORA_ALPHA, lora_dropout=0.0, bias="none",
                           task_type="CAUSAL_LM", target_modules=targets_list,
                           fan_in_fan_out=fan_in_fan_out)
    model = peft.get_peft_model(base, lcfg)
    g = torch.Generator().manual_seed(SEED + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * B_INIT_STD)
    trainable = [p for p in model.parameters() if p.requires_grad]
    trainable_names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert all(("lora_A" in n or "lora_B" in n) for n in trainable_names), trainable_names
    model.save_pretrained(os.path.join(out, "adapter_init"))
    model.train()

    tokens0, targets0 = batches[0][0]
    with torch.no_grad(), model.disable_adapter():
        base_loss = loss_of(model, tokens0, targets0).item()

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
        rec = {"step": s, "loss": float(np.float32(np.mean(np.float32(micro_losses)))),
               "micro_batch_losses": micro_losses, "grad_norm": grad_norm,
               "micro_batches": [{"tokens": t.tolist(), "targets": y.tolist()}
                                 for t, y in batches[s]]}
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(trainable, max_norm=clip)
            rec["clipped"] = grad_norm > clip
        opt.step()
        steps.append(rec)
        print(f"{arch} step {s}: loss {rec['loss']!r} grad_norm {grad_norm:.6g}")
    model.save_pretrained(os.path.join(out, "adapter_trained"))
    with torch.no_grad():
        loss_after = loss_of(model, tokens0, targets0).item()

    ref = {
        "generator": "make_lora_testdata.py",
        "versions": versions(),
        "base": f"model/testdata/{base_name}",
        "base_dtype_on_disk": cfg.get("dtype", cfg.get("torch_dtype")),
        "compute_dtype": "float32",
        "rope_used": rope_used(base),
        "base_dropout_overrides": ({"attn_pdrop": 0.0, "resid_pdrop": 0.0, "embd_pdrop": 0.0}
                                   if cfg["model_type"] == "gpt2" else {}),
        "lora": {"r": R, "lora_alpha": LORA_ALPHA, "scale": LORA_ALPHA / R, "lora_dropout": 0.0,
                 "bias": "none", "target_modules": targets_list,
                 "fan_in_fan_out": fan_in_fan_out},
        "init": {"seed": SEED, "lora_A": "peft's kaiming_uniform_(a=sqrt(5)) after "
                 "torch.manual_seed(seed)",
                 "lora_B": f"N(0, {B_INIT_STD}^2), torch.Generator seeded seed + 1, "
                 "named_parameters() order; adapter_init/ holds the values"},
        "optimizer": {"type": "torch.optim.AdamW", "lr": ADAMW["lr"],
                      "betas": list(ADAMW["betas"]), "eps": ADAMW["eps"],
                      "weight_decay": ADAMW["weight_decay"], "schedule": "constant"},
        "clip_grad_norm": clip,
        "gradient_accumulation_steps": micro_batches,
        "micro_batch": MICRO_BATCH, "seq_len": SEQ_LEN, "vocab_size": vocab, "steps": STEPS,
        "loss": "F.cross_entropy(logits.view(-1, V), targets.view(-1), ignore_index=-100) per "
                "micro-batch; a step's loss is the mean of its micro-batch losses",
        "base_loss": base_loss,
        "loss_after": loss_after,
        "peft_tensors": tensor_table(os.path.join(out, "adapter_init",
                                                  "adapter_model.safetensors")),
        "trainable_parameter_names": trainable_names,
        "history": steps,
    }
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1)
        f.write("\n")
    print(f"{arch}: base_loss {base_loss!r} first {steps[0]['loss']!r} "
          f"last {steps[-1]['loss']!r} after {loss_after!r}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("root", nargs="?", default="model/testdata",
                        help="the testdata directory (holds hf_tiny_*; lora_ref_* go there). Run "
                        "from the repository root with the default so adapter_config.json's "
                        "base_model_name_or_path is the relative model/testdata/hf_tiny_<arch>")
    parser.add_argument("--only", nargs="+", choices=sorted(ARCHS), default=sorted(ARCHS))
    args = parser.parse_args()
    torch.set_num_threads(1)  # one thread: the reductions' order, hence the bits, are fixed
    for arch in args.only:
        make(arch, args.root)


if __name__ == "__main__":
    main()
