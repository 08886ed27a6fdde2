#!/usr/bin/env python3
"""Loads a directory that bazel-bin/trainer/train exported with transformers and recomputes the
trainer's validation loss on it.

The trainer's validation (trainer/evaluation.cc, trainer/data/data_loader.cc) reads the llm.c token
file in file order: batch b, row r is window w = b * micro_batch + r, its inputs are the seq_len
tokens from w * seq_len and its targets the same shifted by one; the loss is the mean token
cross-entropy of each batch, averaged over the first eval_batches batches. This script does the
same with AutoModelForCausalLM in float32 and prints both numbers and their relative difference;
it exits 1 when that exceeds --rtol. CI never runs it; it is the end-to-end proof that an exported
directory is the model the trainer trained.

Recorded runs (hf_tiny_qwen3 through the real binary, 2026-11-28; torch 2.15.0+cu132,
transformers 4.57.6; train.bin / val.bin: the bytes of docs/training.md as uint16 tokens, the first
90% / the rest, in llm.c's version-1 format):
  bazel build -c opt //trainer:train
  # 30 steps (f32, lr 1e-3), validation every 10 steps on 8 batches of 4 x 32, export:
  bazel-bin/trainer/train --config=<(echo '{"train_micro_batch_size_per_gpu": 4, "bf16":
      {"enabled": false}, "fp16": {"enabled": false}, "data": {"seq_len": 32, "eval_every": 10,
      "eval_batches": 8}, "checkpoint": {"export": "/tmp/q3e2e/exported"}}') \
      --init_from=model/testdata/hf_tiny_qwen3 --train_data=/tmp/q3e2e/train.bin \
      --val_data=/tmp/q3e2e/val.bin --steps=30 --metrics_out=/tmp/q3e2e/metrics.jsonl
  /tmp/venv-q3/bin/python model/testdata/check_trained_export.py /tmp/q3e2e/exported \
      /tmp/q3e2e/val.bin /tmp/q3e2e/metrics.jsonl --micro_batch=4 --seq_len=32 --eval_batches=8
  # -> trainer step 30 val_loss 5.8514239224335824, transformers 5.851423920558904 (3.2e-10)
  # The imported directory itself: one step at lr 0 (WarmupLR from 0), validation after it:
  bazel-bin/trainer/train --config=<(echo '{"train_micro_batch_size_per_gpu": 4, "scheduler":
      {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
      "warmup_num_steps": 10}}, "data": {"seq_len": 32, "eval_every": 1, "eval_batches": 8}}') \
      --init_from=model/testdata/hf_tiny_qwen3 --train_data=/tmp/q3e2e/train.bin \
      --val_data=/tmp/q3e2e/val.bin --steps=1 --metrics_out=/tmp/q3e2e/lr0.jsonl
  /tmp/venv-q3/bin/python model/testdata/check_trained_export.py model/testdata/hf_tiny_qwen3 \
      /tmp/q3e2e/val.bin /tmp/q3e2e/lr0.jsonl --micro_batch=4 --seq_len=32 --eval_batches=8 --step=1
  # -> trainer step 1 val_loss 7.574649393767004, transformers 7.574649439467313 (6.0e-9)
"""
import argparse
import json
import sys

import numpy as np
import torch
import transformers


def read_tokens(path):
    """Tokens of an llm.c .bin file (uint16 version 1 or uint32 version 7)."""
    with open(path, "rb") as f:
        header = np.frombuffer(f.read(1024), dtype=np.int32)
        count = int(header[2])
        dtype = {(20240520, 1): np.uint16, (20240801, 7): np.uint32}[(int(header[0]), int(header[1]))]
        return np.frombuffer(f.read(), dtype=dtype)[:count].astype(np.int64)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("exported")
    p.add_argument("val_bin")
    p.add_argument("metrics_jsonl", help="the trainer's --metrics_out; its last val_loss is compared")
    p.add_argument("--step", type=int, default=None,
                   help="compare the val_loss of this step instead (the first step of a run at "
                        "lr 0 checks the imported directory itself)")
    p.add_argument("--micro_batch", type=int, required=True)
    p.add_argument("--seq_len", type=int, required=True)
    p.add_argument("--eval_batches", type=int, required=True)
    p.add_argument("--rtol", type=float, default=1e-5)
    args = p.parse_args()

    last = None
    with open(args.metrics_jsonl) as f:
        for line in f:
            m = json.loads(line)
            if "val_loss" in m and (args.step is None or m["step"] == args.step):
                last = m
    if last is None:
        sys.exit(f"{args.metrics_jsonl} has no val_loss" +
                 ("" if args.step is None else f" at step {args.step}"))

    tokens = read_tokens(args.val_bin)
    b, t = args.micro_batch, args.seq_len
    windows = (len(tokens) - 1) // t
    batches = min(args.eval_batches, windows // b)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        args.exported, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    losses = []
    with torch.no_grad():
        for batch in range(batches):
            rows = [tokens[w * t:w * t + t + 1] for w in range(batch * b, batch * b + b)]
            x = torch.tensor(np.stack([r[:-1] for r in rows]))
            y = torch.tensor(np.stack([r[1:] for r in rows]))
            logits = model(input_ids=x).logits.double()
            losses.append(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                            y.reshape(-1)).item())
    ours = float(np.mean(losses))
    theirs = float(last["val_loss"])
    rel = abs(ours - theirs) / abs(theirs)
    print(f"model_type {model.config.model_type}, {type(model).__name__}, "
          f"{sum(p.numel() for p in model.parameters())} parameters")
    print(f"trainer step {last['step']} val_loss {theirs!r} over {batches} batches")
    print(f"transformers val_loss {ours!r}; relative difference {rel:.3e} (rtol {args.rtol:g})")
    sys.exit(0 if rel <= args.rtol else 1)


if __name__ == "__main__":
    main()
