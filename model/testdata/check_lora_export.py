#!/usr/bin/env python3
"""Checks a LoRA adapter directory (and its merged model) written by this project, with peft itself.

Usage: check_lora_export.py DIR_BASE DIR_ADAPTER [DIR_MERGED] [LOSSES_JSON]
(a third argument that names a .json file is LOSSES_JSON; DIR_MERGED may also be given as "-" to
skip it).

1. DIR_ADAPTER loads with peft.PeftModel.from_pretrained over DIR_BASE (AutoModelForCausalLM,
   float32, eager attention): every tensor of adapter_model.safetensors is one of the model's
   adapter tensors and every adapter tensor of the model is in the file (peft's own
   get_peft_model_state_dict names), with the file's values exactly.
2. With DIR_MERGED (an HF directory, loaded with AutoModelForCausalLM in float32): on the tokens of
   LOSSES_JSON (or, without it, one row 0, 1, ..., 15 mod vocab) max |logits(peft) -
   logits(merged)| <= --logits_tol * max(1, max |logits(peft)|); default 1e-5, i.e. 1e-5 absolute
   for logits of magnitude <= 1 and 1e-5 relative to the largest logit otherwise (the merged
   weight W + s B A rounds differently from W x + s B (A x), so bit equality is not expected).
   A merged directory stored in 16 bits rounds W + s B A to 16 bits and needs a looser tolerance.
3. With LOSSES_JSON ({"tokens": [[...]], "targets": [[...]], "loss": x} as the C++ side writes it;
   targets -100 are ignored): the peft model's F.cross_entropy(logits.view(-1, V),
   targets.view(-1), ignore_index=-100) equals "loss" within --loss_rtol (default 1e-5) relative;
   with DIR_MERGED, the merged model's loss too.
Base dropout is switched off as in make_lora_testdata.py (GPT-2's *_pdrop loaded as 0; the models
run in eval mode anyway) and RoPE is read from rope_parameters when transformers 4 is used.
Exits 1 (after printing every number) when a check fails.

Recorded run (the adapter make_lora_testdata.py trained, merged by peft itself; the losses json
made from reference.json's step 0 tokens/targets and the trained adapter's loss on them, which
make_lora_testdata.py records as "loss_after"):
  # python 3.11.7, torch 2.15.0+cu132 (CPU), transformers 4.57.6, peft 0.21.2, safetensors 0.8.0
  # /tmp/lora_check/merged_<arch>: peft.PeftModel.from_pretrained(base float32,
  #   lora_ref_<arch>/adapter_trained).merge_and_unload().save_pretrained(...) (float32);
  # /tmp/lora_check/losses_<arch>.json: {"tokens": step 0 micro-batch 0 tokens, "targets": its
  #   targets, "loss": reference.json's loss_after}
  for a in llama qwen2 gpt2; do /tmp/venv/bin/python model/testdata/check_lora_export.py \
      model/testdata/hf_tiny_$a model/testdata/lora_ref_$a/adapter_trained \
      /tmp/lora_check/merged_$a /tmp/lora_check/losses_$a.json; done
  # llama: max |peft - merged| 4.172e-06 (bound 4.780e-05); loss 5.196938991546631 both, rel 0
  # qwen2: max |peft - merged| 2.384e-06 (bound 5.300e-05); loss rel 0 (merged 8.9e-08)
  # gpt2:  max |peft - merged| 2.354e-06 (bound 3.595e-05); loss rel 0
  # All OK. It fails (exit 1) as it should on: a loss off by 3e-5 relative; adapter_init checked
  # against the trained merge (logits 0.37 apart, loss 2e-2); an adapter file missing one tensor
  # ("missing from the file [...gate_proj.lora_B.weight]"); an adapter over the wrong base (peft's
  # own size-mismatch error).

Recorded run against the trainer's own export (issue #28's acceptance: an adapter we export,
loaded by peft, gives our model's numbers), 2026-11-28, main after the LoRA merge, same venv:
  # token files of random tokens below the base's vocabulary (64 llama, 50 gpt2; llm.c format,
  # magic 20240520 version 1), val.bin exactly one 2 x 16 batch (33 tokens); LOSSES_JSON holds
  # that batch's tokens/targets and the trainer's final val_loss from --metrics_out.
  bazel-bin/trainer/train --config=cfg.json --train_data=train.bin --val_data=val.bin --steps=6 \
      --accelerator_memory=300KiB --metrics_out=m.jsonl
  # cfg.json: data {seq_len 16, eval_every 6, eval_batches 1}, micro batch 2, AdamW lr 1e-2,
  # lora {r 4, lora_alpha 8, lora_dropout 0.1, every linear}, checkpoint {init_from
  # model/testdata/hf_tiny_llama, export out/adapter, export_merged out/merged}
  /tmp/venv/bin/python model/testdata/check_lora_export.py model/testdata/hf_tiny_llama \
      out/adapter out/merged losses.json
  # llama: logits max |peft - merged| 7.868e-06 (bound 4.585e-05); loss C++ 4.759882450569421,
  #        peft 4.759882926940918 (rel 1.0e-07), merged rel 9.8e-11. OK
  # gpt2 (c_attn, c_proj, c_fc; --accelerator_memory=400KiB): logits 1.073e-06 apart (bound
  #        2.847e-05); loss C++ 4.216502926545218, peft 4.216503143310547 (rel 5.1e-08). OK
check_peft_versions.py runs this script under several peft releases (0.10.0 and 0.21.2) on
adapters the trainer exported, and records the numbers.
"""
import argparse
import json
import os
import sys

import numpy as np
import peft
import torch
import torch.nn.functional as F
import transformers
from safetensors import safe_open


def load_hf(directory):
    with open(os.path.join(directory, "config.json")) as f:
        cfg = json.load(f)
    overrides = {}
    if cfg["model_type"] == "gpt2":
        overrides.update(attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    rope = cfg.get("rope_parameters")
    if rope is not None and int(transformers.__version__.split(".")[0]) < 5:
        rope = dict(rope)
        overrides["rope_theta"] = rope.pop("rope_theta")
        if rope.get("rope_type") != "default":  # transformers 4.40's Qwen2 has no rope_scaling
            overrides["rope_scaling"] = rope
    # transformers before 4.56 names the argument torch_dtype.
    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    overrides["dtype" if (major, minor) >= (4, 56) else "torch_dtype"] = torch.float32
    model = transformers.AutoModelForCausalLM.from_pretrained(
        directory, attn_implementation="eager", **overrides)
    return model.eval(), cfg


def loss_of(logits, targets):
    v = logits.shape[-1]
    return F.cross_entropy(logits.reshape(-1, v), targets.reshape(-1), ignore_index=-100).item()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("base")
    p.add_argument("adapter")
    p.add_argument("rest", nargs="*", metavar="[DIR_MERGED] [LOSSES_JSON]")
    p.add_argument("--logits_tol", type=float, default=1e-5)
    p.add_argument("--loss_rtol", type=float, default=1e-5)
    args = p.parse_args()
    merged_dir, losses_path = None, None
    rest = list(args.rest)
    if len(rest) > 2:
        p.error("at most DIR_MERGED and LOSSES_JSON after DIR_ADAPTER")
    if rest and rest[-1].endswith(".json") and os.path.isfile(rest[-1]):
        losses_path = rest.pop()
    if rest:
        merged_dir = None if rest[0] == "-" else rest[0]
    ok = True

    # 1. The adapter loads, tensor for tensor.
    base, cfg = load_hf(args.base)
    model = peft.PeftModel.from_pretrained(base, args.adapter).eval()
    with open(os.path.join(args.adapter, "adapter_config.json")) as f:
        acfg = json.load(f)
    file_tensors = {}
    with safe_open(os.path.join(args.adapter, "adapter_model.safetensors"), framework="pt") as f:
        for key in f.keys():
            file_tensors[key] = f.get_tensor(key)
    state = peft.get_peft_model_state_dict(model)
    missing = sorted(set(state) - set(file_tensors))
    unexpected = sorted(set(file_tensors) - set(state))
    if missing or unexpected:
        print(f"FAIL adapter keys: missing from the file {missing}, not in the model {unexpected}")
        ok = False
    for key in sorted(set(state) & set(file_tensors)):
        want = file_tensors[key].to(torch.float32)
        if state[key].shape != want.shape or not torch.equal(state[key].float(), want):
            print(f"FAIL {key}: model {tuple(state[key].shape)} != file {tuple(want.shape)} "
                  "or values differ")
            ok = False
    print(f"adapter: {len(file_tensors)} tensors, r {acfg['r']}, lora_alpha "
          f"{acfg['lora_alpha']}, target_modules {acfg['target_modules']}, "
          f"modules_to_save {acfg.get('modules_to_save')}")

    # The tokens to compare on.
    if losses_path:
        with open(losses_path) as f:
            losses = json.load(f)
        tokens = torch.tensor(losses["tokens"], dtype=torch.int64)
        targets = torch.tensor(losses["targets"], dtype=torch.int64)
        if tokens.dim() == 1:
            tokens, targets = tokens[None], targets[None]
    else:
        losses = None
        tokens = (torch.arange(16) % cfg["vocab_size"])[None]
        targets = None
    with torch.no_grad():
        logits = model(input_ids=tokens).logits

    # 2. Merged == peft.
    if merged_dir:
        merged, _ = load_hf(merged_dir)
        with torch.no_grad():
            mlogits = merged(input_ids=tokens).logits
        diff = (logits - mlogits).abs().max().item()
        bound = args.logits_tol * max(1.0, logits.abs().max().item())
        print(f"logits: max |peft - merged| {diff:.3e} (bound {bound:.3e}, max |logit| "
              f"{logits.abs().max().item():.4g})")
        if not diff <= bound:
            print("FAIL merged logits")
            ok = False

    # 3. The loss.
    if losses is not None:
        want = float(losses["loss"])
        got = loss_of(logits, targets)
        rel = abs(got - want) / max(abs(want), 1e-30)
        print(f"loss: C++ {want!r}, peft {got!r}, relative difference {rel:.3e} "
              f"(bound {args.loss_rtol:g})")
        if not rel <= args.loss_rtol:
            print("FAIL loss")
            ok = False
        if merged_dir:
            mgot = loss_of(mlogits, targets)
            mrel = abs(mgot - want) / max(abs(want), 1e-30)
            print(f"loss: merged {mgot!r}, relative difference {mrel:.3e}")
            if not mrel <= args.loss_rtol:
                print("FAIL merged loss")
                ok = False
    print("OK" if ok else "FAILED")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
