#!/usr/bin/env python3
"""Trains tiny LoRA adapters with the trainer binary and loads each exported adapter directory with
several peft releases (issue #35: adapter_config.json must load in peft 0.10 through today).

Usage (from the repository root; this script needs only the standard library, each PYTHON a
virtual environment with torch, transformers, peft and safetensors):
  check_peft_versions.py --train=bazel-bin/trainer/train --out=/tmp/peft_versions \
      --check=PYTHON[:ARCH,ARCH...] [--check=...]

For each architecture (llama, qwen2, gpt2; the tiny bases model/testdata/hf_tiny_<arch>) it writes
random token files (llm.c format, magic 20240520 version 1, tokens below the base's vocabulary;
val.bin exactly one 2 x 16 batch, 33 tokens), runs
  TRAIN --config=cfg.json --init_from=model/testdata/hf_tiny_<arch> --train_data=train.bin
        --val_data=val.bin --steps=6 --metrics_out=metrics.jsonl
with the LoRA settings below (chosen so that the written keys differ: "all-linear" and
modules_to_save, a list of targets with no dropout, a fractional alpha on GPT-2's Conv1D), and
writes losses.json (that batch's tokens / targets, as the trainer's validation reads them, and
the trainer's last val_loss). Then, for every --check, it runs
  PYTHON model/testdata/check_lora_export.py hf_tiny_<arch> out/adapter out/merged losses.json
(the adapter loads with peft.PeftModel.from_pretrained tensor for tensor; its logits match the
trainer's merged export within 1e-5 of the largest logit; its loss matches the trainer's
val_loss within 1e-5 relative) for the architectures listed after the colon (all by default).
Exits 1 when a training run or a check fails.

Recorded run, 2026-12-07 (branch h-peft, issue #35; python 3.11.7 in both environments, CPU):
  # /work/venv-peft010: pip install torch==2.2.2 transformers==4.40.2 peft==0.10.0
  #   accelerate==0.28.0 safetensors "numpy<2"  (the oldest peft this issue names, with a
  #   transformers and torch of its era; transformers 4.40 has no "llama3" RoPE scaling, which
  #   came in 4.43, so hf_tiny_llama is checked with peft 0.10 under transformers 4.43.4:)
  # /work/venv-peft010-tf443/python: a shell wrapper, PYTHONPATH=/work/tf443 exec
  #   /work/venv-peft010/bin/python "$@", after pip install --no-deps --target /work/tf443
  #   transformers==4.43.4  (peft 0.10.0, torch 2.2.2, transformers 4.43.4)
  # /work/venv-peftnew: pip install torch==2.15.0 peft==0.21.2 transformers==4.57.6 safetensors
  #   numpy  (the newest peft on PyPI that day; torch 2.15.0+cu132 run on the CPU)
  bazel build //trainer:train
  python3 model/testdata/check_peft_versions.py --train=bazel-bin/trainer/train \
      --out=/tmp/peft_versions --check=/work/venv-peft010/bin/python:qwen2,gpt2 \
      --check=/work/venv-peft010-tf443/python --check=/work/venv-peftnew/bin/python
  # adapter_config.json as written (base_model_name_or_path: the absolute --init_from):
  #   llama {base_model_name_or_path, lora_alpha 8, lora_dropout 0.1, modules_to_save
  #          ["lm_head"], peft_type LORA, r 4, target_modules "all-linear", task_type CAUSAL_LM}
  #   qwen2 {base_model_name_or_path, lora_alpha 5, peft_type, r 2, target_modules [q_proj,
  #          v_proj, down_proj], task_type}
  #   gpt2  {base_model_name_or_path, fan_in_fan_out true, lora_alpha 6.5, lora_dropout 0.05,
  #          peft_type, r 4, target_modules [c_attn, c_proj, c_fc], task_type}
  # Every check OK, the same numbers under each peft (logits: peft's adapter over the base vs
  # the trainer's merged export; loss: peft vs the trainer's val_loss):
  #   arch   trainer val_loss   peft 0.10.0 (tf 4.40.2 / 4.43.4)    peft 0.21.2 (tf 4.57.6)
  #   llama  5.02666895344737   -- / logits 6.080e-06, loss 8.1e-08  logits 7.510e-06, loss 8.1e-08
  #   qwen2  4.717926816083491  logits 2.742e-06, loss 3.5e-08       logits 2.742e-06, loss 3.5e-08
  #   gpt2   4.37547226017341   logits 1.073e-06, loss 4.4e-08       logits 1.073e-06, loss 4.4e-08
  #   (logit bounds 4.4e-05, 4.7e-05, 3.0e-05: 1e-5 of the largest logit; loss bound 1e-5
  #   relative; the merged model's loss is within 1.4e-08 (llama), 3.5e-08, 4.4e-08.)
  # phi3 (added for issue #40, 2026-12-08, branch h-families2; peft 0.21.2 only):
  #   python3 model/testdata/check_peft_versions.py --train=bazel-bin/trainer/train \
  #       --out=/tmp/fam_peft --check=/work/venv-peftnew/bin/python:phi3
  #   adapter_config.json {base_model_name_or_path, lora_alpha 8, peft_type, r 4,
  #   target_modules [o_proj, down_proj], task_type}; 8 adapter tensors; trainer val_loss
  #   5.3755034360219724, peft 5.3755035400390625 (1.9e-08 relative), logits vs the merged export
  #   (written with the fused qkv_proj / gate_up_proj, loaded by Phi3ForCausalLM) 3.099e-06
  #   (bound 4.8e-05); the merged model's loss within 1.9e-08.
  # gemma3 (issue #40, 2026-12-08, branch h-families2; peft 0.21.2 only):
  #   python3 model/testdata/check_peft_versions.py --train=bazel-bin/trainer/train \
  #       --out=/tmp/gemma_peft --check=/work/venv-peftnew/bin/python:gemma3
  #   adapter_config.json {base_model_name_or_path, lora_alpha 8, peft_type, r 4,
  #   target_modules [q_proj, k_proj, v_proj, gate_proj, up_proj], task_type}; 30 adapter
  #   tensors; trainer val_loss 5.640983269549906, peft 5.6409831047058105 (2.9e-08 relative),
  #   logits vs the merged export (loaded by Gemma3ForCausalLM) 3.219e-06 (bound 5.2e-05); the
  #   merged model's loss within 2.9e-08.
  # peft 0.10's get_peft_model_state_dict (called by the check, not by from_pretrained) warns
  # that it cannot reach the hub for base_model_name_or_path's config.json; peft 0.21.2 warns
  # nothing. The same run with the trainer of main before this change (adapter_config.json with
  # corda_config, eva_config, ...) fails under peft 0.10.0 as the issue says:
  #   TypeError: LoraConfig.__init__() got an unexpected keyword argument 'corda_config'
"""
import argparse
import json
import os
import random
import struct
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

# LoRA settings per architecture: what adapter_config.json then holds differs between them.
RUNS = {
    # "all-linear" (a string key PEFT expands), lm_head in full (modules_to_save), dropout.
    "llama": {"lora": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.1,
                       "target_modules": "all-linear", "modules_to_save": ["lm_head"]}},
    # A list of targets, no dropout (lora_dropout left out of the file), tied embeddings.
    "qwen2": {"lora": {"r": 2, "lora_alpha": 5, "lora_dropout": 0.0,
                       "target_modules": ["q_proj", "v_proj", "down_proj"]}},
    # Conv1D (fan_in_fan_out true), a fractional lora_alpha.
    "gpt2": {"lora": {"r": 4, "lora_alpha": 6.5, "lora_dropout": 0.05,
                      "target_modules": ["c_attn", "c_proj", "c_fc"]}},
    # Phi-3 (issue #40; base parity_phi3: partial rotary, a window of 4 < SEQ_LEN, fused qkv_proj
    # and gate_up_proj in its files): the layers LoRA adapts there, o_proj and down_proj; the
    # merged export writes the fused tensors back.
    "phi3": {"lora": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0,
                      "target_modules": ["o_proj", "down_proj"]}},
    # Gemma 3 text (issue #40; base parity_gemma3: sliding / full / sliding layers, a window of
    # 4 < SEQ_LEN, (1 + w) norms, GeGLU, tied): q, k, v (read by the q/k norms) and gate, up.
    "gemma3": {"lora": {"r": 4, "lora_alpha": 8, "lora_dropout": 0.0,
                        "target_modules": ["q_proj", "k_proj", "v_proj", "gate_proj",
                                           "up_proj"]}},
}
# The base directory of each architecture (model/testdata/hf_tiny_<arch> unless named here).
BASES = {"phi3": "parity_phi3", "gemma3": "parity_gemma3"}
SEQ_LEN, MICRO_BATCH, STEPS = 16, 2, 6


def write_tokens(path, tokens):
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack(f"<{len(tokens)}H", *tokens))


def train(args, arch):
    base = os.path.join(HERE, BASES.get(arch, f"hf_tiny_{arch}"))
    with open(os.path.join(base, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    out = os.path.join(args.out, arch)
    os.makedirs(out, exist_ok=True)
    rng = random.Random(35 + len(arch))
    write_tokens(os.path.join(out, "train.bin"), [rng.randrange(vocab) for _ in range(4096)])
    val = [rng.randrange(vocab) for _ in range(MICRO_BATCH * SEQ_LEN + 1)]
    write_tokens(os.path.join(out, "val.bin"), val)
    cfg = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "data": {"seq_len": SEQ_LEN, "eval_every": STEPS, "eval_batches": 1},
        "lora": RUNS[arch]["lora"],
        "checkpoint": {"export": os.path.join(out, "adapter"),
                       "export_merged": os.path.join(out, "merged")},
    }
    with open(os.path.join(out, "cfg.json"), "w") as f:
        json.dump(cfg, f, indent=1)
    metrics = os.path.join(out, "metrics.jsonl")
    cmd = [args.train, f"--config={os.path.join(out, 'cfg.json')}", f"--init_from={base}",
           f"--train_data={os.path.join(out, 'train.bin')}",
           f"--val_data={os.path.join(out, 'val.bin')}", f"--steps={STEPS}",
           f"--metrics_out={metrics}"]
    print("$", " ".join(cmd), flush=True)
    run = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if run.returncode != 0:
        print(run.stdout)
        print(f"FAIL {arch}: the trainer exited {run.returncode}")
        return None
    val_loss = None
    with open(metrics) as f:
        for line in f:
            record = json.loads(line)
            if record.get("val_loss") is not None:
                val_loss = record["val_loss"]
    # The trainer's validation: row r holds tokens [r T, r T + T), targets shifted by one.
    losses = {
        "tokens": [val[r * SEQ_LEN:(r + 1) * SEQ_LEN] for r in range(MICRO_BATCH)],
        "targets": [val[r * SEQ_LEN + 1:(r + 1) * SEQ_LEN + 1] for r in range(MICRO_BATCH)],
        "loss": val_loss,
    }
    with open(os.path.join(out, "losses.json"), "w") as f:
        json.dump(losses, f)
    with open(os.path.join(out, "adapter", "adapter_config.json")) as f:
        print(f"{arch}: val_loss {val_loss!r}; adapter_config.json {json.dumps(json.load(f))}")
    return base, out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--train", required=True, help="the trainer binary")
    p.add_argument("--out", required=True, help="a scratch directory")
    p.add_argument("--check", action="append", required=True,
                   help="PYTHON[:ARCH,...]: a python with peft; the architectures it checks")
    args = p.parse_args()
    checks = []
    for c in args.check:
        py, _, archs = c.partition(":")
        checks.append((py, archs.split(",") if archs else list(RUNS)))
    ok = True
    trained = {}
    for arch in RUNS:
        if any(arch in archs for _, archs in checks):
            trained[arch] = train(args, arch)
            ok = ok and trained[arch] is not None
    for py, archs in checks:
        version = subprocess.run(
            [py, "-c", "import peft, transformers, torch; print('peft', peft.__version__, "
             "'transformers', transformers.__version__, 'torch', torch.__version__)"],
            stdout=subprocess.PIPE, text=True).stdout.strip()
        for arch in archs:
            if trained.get(arch) is None:
                continue
            base, out = trained[arch]
            print(f"== {arch} with {version}", flush=True)
            run = subprocess.run(
                [py, os.path.join(HERE, "check_lora_export.py"), base,
                 os.path.join(out, "adapter"), os.path.join(out, "merged"),
                 os.path.join(out, "losses.json")])
            if run.returncode != 0:
                print(f"FAIL {arch} with {version}")
                ok = False
    print("ALL OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
