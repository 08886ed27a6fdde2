#!/usr/bin/env python3
"""Reference vectors for model/kernels/masked_attention_vectors_test.cc, from torch and transformers.

The kernels' mask (model/kernels/gqa_attention.h): query t of batch row b sees keys j with
    max(key_start[b, t], t - window + 1) <= j <= t        (window 0: no sliding window)
where key_start[b, t] is the row position at which t's document starts (packed documents never see
each other). This script builds that mask independently, as the boolean block-causal (+ window)
matrix a packed batch gives transformers: from random document boundaries per row, mask[b, i, j] =
same_document(i, j) & (j <= i) & (window == 0 | j > i - window). It then computes, in float64:
  attention   out = softmax(q k^T / sqrt(D) masked with -inf) v per head, GQA through
              repeat_interleave of the kv heads (transformers' repeat_kv), lse = logsumexp of the
              masked scores, and dq, dk, dv = autograd of sum(out * dout). Checked against
              torch.nn.functional.scaled_dot_product_attention with the boolean mask.
  rope        transformers' LlamaRotaryEmbedding + apply_rotary_pos_emb with position_ids that
              restart at 0 at every document (float32, as transformers computes), and the input
              gradient of sum(q_embed * g) (autograd, float32).
  positions   GPT-2's learned positions with position ids: out = x + wpe[pos],
              dwpe = index_add of dout over pos (float64).
and writes one safetensors file (all small; the C++ test never runs Python):
  att<i>.shape      I64 [6]: B, T, Hq, Hkv, D, window
  att<i>.key_start  I32 [B, T]
  att<i>.q          F64 [B, T, Hq, D]; att<i>.k, att<i>.v F64 [B, T, Hkv, D]
  att<i>.dout, att<i>.out  F64 [B, T, Hq, D];  att<i>.lse F64 [B, Hq, T]
  att<i>.dq, att<i>.dk, att<i>.dv   F64, the gradients (q's and k/v's shapes)
  rope.shape        I64 [5]: B, T, Hq, Hkv, D;  rope.theta F64 [1]
  rope.positions    I32 [B, T];  rope.q, rope.k F32 [B, T, H, D] (inputs);  rope.q_embed,
  rope.k_embed      F32 outputs;  rope.gq, rope.gk F32 (upstream grads);  rope.dq, rope.dk F32
  pos.shape         I64 [4]: B, T, C, P;  pos.positions I32 [B, T];  pos.x, pos.wpe, pos.dout,
  pos.out, pos.dwpe F64

Recorded run (the file checked in was made by it):
  /work/venv-peftnew/bin/python model/kernels/testdata/make_masked_attention_vectors.py \\
      model/kernels/testdata/masked_attention_vectors.safetensors
  # torch 2.15.0, transformers 4.57.6, safetensors 0.8.0, numpy 2.4.6 (CPU only)
"""
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb


def random_key_start(rng, B, T, force_single=True):
    """Per row, random document boundaries; key_start[b, t] = start of t's document."""
    ks = np.zeros((B, T), dtype=np.int32)
    for b in range(B):
        cuts = sorted(set(rng.choice(np.arange(1, T), size=rng.integers(1, max(2, T // 3)),
                                     replace=False).tolist()))
        if force_single and b == 0 and T >= 4:  # a document of length 1
            cuts = sorted(set(cuts) | {T - 2, T - 1})
        starts = [0] + cuts
        for s, e in zip(starts, starts[1:] + [T]):
            ks[b, s:e] = s
    return ks


def block_mask(ks, window):
    """Boolean [B, T, T]: same document (key_start equal), causal, window."""
    B, T = ks.shape
    i = torch.arange(T).view(T, 1)
    j = torch.arange(T).view(1, T)
    ks_t = torch.from_numpy(ks.astype(np.int64))
    same_doc = ks_t.view(B, T, 1) == ks_t.view(B, 1, T)  # documents are contiguous runs
    m = same_doc & (j <= i)
    if window > 0:
        m = m & (j > i - window)
    return m


def attention_case(rng, B, T, Hq, Hkv, D, window, with_segments):
    ks = random_key_start(rng, B, T) if with_segments else np.zeros((B, T), np.int32)
    q = torch.from_numpy(rng.uniform(-2, 2, (B, T, Hq, D))).requires_grad_()
    k = torch.from_numpy(rng.uniform(-2, 2, (B, T, Hkv, D))).requires_grad_()
    v = torch.from_numpy(rng.uniform(-2, 2, (B, T, Hkv, D))).requires_grad_()
    dout = torch.from_numpy(rng.uniform(-1, 1, (B, T, Hq, D)))
    mask = block_mask(ks, window)  # [B, T, T]
    G = Hq // Hkv
    qh = q.transpose(1, 2)                                   # [B, Hq, T, D]
    kh = k.transpose(1, 2).repeat_interleave(G, dim=1)       # repeat_kv
    vh = v.transpose(1, 2).repeat_interleave(G, dim=1)
    scores = (qh @ kh.transpose(-1, -2)) / np.sqrt(D)
    scores = scores.masked_fill(~mask.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)                    # [B, Hq, T]
    p = torch.softmax(scores, dim=-1)
    out = (p @ vh).transpose(1, 2).contiguous()              # [B, T, Hq, D]
    sdpa = torch.nn.functional.scaled_dot_product_attention(
        qh, kh, vh, attn_mask=mask.unsqueeze(1)).transpose(1, 2)
    assert torch.allclose(sdpa, out, atol=1e-12, rtol=0), "explicit softmax != sdpa"
    (out * dout).sum().backward()
    return {
        "shape": torch.tensor([B, T, Hq, Hkv, D, window], dtype=torch.int64),
        "key_start": torch.from_numpy(ks),
        "q": q.detach(), "k": k.detach(), "v": v.detach(), "dout": dout,
        "out": out.detach(), "lse": lse.detach().contiguous(),
        "dq": q.grad, "dk": k.grad, "dv": v.grad,
    }


def rope_case(rng):
    B, T, Hq, Hkv, D, theta = 2, 12, 3, 1, 8, 10000.0
    ks = random_key_start(rng, B, T)
    positions = (np.arange(T)[None, :] - ks).astype(np.int32)  # restart at every document
    config = LlamaConfig(hidden_size=Hq * D, num_attention_heads=Hq, num_key_value_heads=Hkv,
                         head_dim=D, rope_theta=theta, max_position_embeddings=T)
    rotary = LlamaRotaryEmbedding(config)
    q = torch.from_numpy(rng.uniform(-1, 1, (B, T, Hq, D)).astype(np.float32)).requires_grad_()
    k = torch.from_numpy(rng.uniform(-1, 1, (B, T, Hkv, D)).astype(np.float32)).requires_grad_()
    gq = torch.from_numpy(rng.uniform(-1, 1, (B, T, Hq, D)).astype(np.float32))
    gk = torch.from_numpy(rng.uniform(-1, 1, (B, T, Hkv, D)).astype(np.float32))
    cos, sin = rotary(q, torch.from_numpy(positions.astype(np.int64)))
    # apply_rotary_pos_emb wants [B, H, T, D] (unsqueeze_dim=1).
    qe, ke = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos, sin)
    qe, ke = qe.transpose(1, 2).contiguous(), ke.transpose(1, 2).contiguous()
    ((qe * gq).sum() + (ke * gk).sum()).backward()
    return {
        "shape": torch.tensor([B, T, Hq, Hkv, D], dtype=torch.int64),
        "theta": torch.tensor([theta], dtype=torch.float64),
        "positions": torch.from_numpy(positions),
        "q": q.detach(), "k": k.detach(), "q_embed": qe.detach(), "k_embed": ke.detach(),
        "gq": gq, "gk": gk, "dq": q.grad, "dk": k.grad,
    }


def position_case(rng):
    B, T, C, P = 3, 10, 5, 12
    ks = random_key_start(rng, B, T)
    positions = (np.arange(T)[None, :] - ks).astype(np.int32)
    x = torch.from_numpy(rng.uniform(-1, 1, (B, T, C)))
    wpe = torch.from_numpy(rng.uniform(-1, 1, (P, C)))
    dout = torch.from_numpy(rng.uniform(-1, 1, (B, T, C)))
    pos = torch.from_numpy(positions.astype(np.int64))
    out = x + wpe[pos]
    dwpe = torch.zeros(P, C, dtype=torch.float64).index_add_(0, pos.reshape(-1),
                                                             dout.reshape(-1, C))
    return {"shape": torch.tensor([B, T, C, P], dtype=torch.int64),
            "positions": torch.from_numpy(positions), "x": x, "wpe": wpe, "dout": dout,
            "out": out, "dwpe": dwpe}


def main():
    path = sys.argv[1]
    rng = np.random.default_rng(20261207)
    tensors = {}
    cases = [  # B, T, Hq, Hkv, D, window, with_segments
        (2, 13, 4, 2, 6, 0, True),    # packed documents, GQA groups of 2
        (1, 17, 3, 1, 8, 5, True),    # documents and a sliding window, multi-query
        (2, 9, 2, 2, 4, 3, False),    # a sliding window alone, multi-head
        (1, 70, 2, 1, 5, 0, True),    # longer than one 64-row block of the f32 schedule
    ]
    for i, c in enumerate(cases):
        for name, t in attention_case(rng, *c).items():
            tensors[f"att{i}.{name}"] = t.contiguous()
    for name, t in rope_case(rng).items():
        tensors[f"rope.{name}"] = t.contiguous()
    for name, t in position_case(rng).items():
        tensors[f"pos.{name}"] = t.contiguous()
    save_file(tensors, path)


if __name__ == "__main__":
    main()
