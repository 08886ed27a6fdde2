#!/usr/bin/env python3
"""Writes the PyTorch reference vectors for optimizer/torch_reference_test.cc.

Not run by the build. Produced with PyTorch 2.15.0 (CPU) from PyPI, installed outside the
repository:

    pip install --target /tmp/torchenv/site torch numpy
    PYTHONPATH=/tmp/torchenv/site python3 optimizer/testdata/make_reference.py optimizer/testdata

For each case, torch.optim.Adam or torch.optim.AdamW (foreach=False, the single-tensor CPU path)
takes STEPS steps on one f32 parameter of N elements, with the learning rate changed before every
step (param_group["lr"] = LRS[t]) so that a kernel which froze lr would fail. The gradients are
chosen to be exactly representable in f16 and in bf16, so the C++ test can feed the very same
values as f32, f16 or bf16 gradients, and multiplied by a power-of-two loss scale.

File format (text, one record per line, floats as %.9e, which round-trips f32 exactly):
    # comment lines
    config <mode> <beta1> <beta2> <eps> <weight_decay> <n> <steps>
    param0 <n floats>
    step <t> <lr> then on the next lines: grad <n floats> / param <n floats>
    exp_avg <n floats> / exp_avg_sq <n floats>   (after the last step)
"""
import os
import sys

import torch

N = 257
STEPS = 4
LRS = [1e-3, 3e-3, 2e-3, 5e-4]
CASES = [
    # name, optimizer class, betas, eps, weight decay
    ("adam_l2", torch.optim.Adam, (0.9, 0.999), 1e-8, 0.01),
    ("adamw", torch.optim.AdamW, (0.9, 0.999), 1e-8, 0.01),
    ("adamw_beta_eps", torch.optim.AdamW, (0.8, 0.99), 1e-6, 0.1),
]


def representable_in_f16_and_bf16(x):
    """Rounds to bf16, then keeps magnitudes inside f16's normal range (2^-14 .. 65504)."""
    x = x.to(torch.bfloat16).to(torch.float32)
    tiny = 2.0 ** -14
    x = torch.where(x.abs() < tiny, torch.sign(x) * tiny + (x == 0) * tiny, x)
    assert torch.equal(x, x.to(torch.float16).to(torch.float32))
    assert torch.equal(x, x.to(torch.bfloat16).to(torch.float32))
    return x


def fmt(values):
    return " ".join("%.9e" % v for v in values.tolist())


def write_case(out_dir, name, cls, betas, eps, weight_decay, seed):
    gen = torch.Generator().manual_seed(seed)
    p = torch.nn.Parameter(torch.randn(N, generator=gen, dtype=torch.float32))
    opt = cls([p], lr=LRS[0], betas=betas, eps=eps, weight_decay=weight_decay, foreach=False)
    lines = [
        "# PyTorch %s reference for %s; produced by optimizer/testdata/make_reference.py"
        % (torch.__version__, cls.__name__),
        "# (see that script for the exact command). Do not edit by hand.",
        "config %s %.9e %.9e %.9e %.9e %d %d"
        % ("adamw" if cls is torch.optim.AdamW else "adam", betas[0], betas[1], eps,
           weight_decay, N, STEPS),
        "param0 " + fmt(p.detach()),
    ]
    for t in range(STEPS):
        grad = representable_in_f16_and_bf16(torch.randn(N, generator=gen) * 0.5)
        p.grad = grad.clone()
        for group in opt.param_groups:
            group["lr"] = LRS[t]
        opt.step()
        lines.append("step %d %.9e" % (t + 1, LRS[t]))
        lines.append("grad " + fmt(grad))
        lines.append("param " + fmt(p.detach()))
    state = opt.state[p]
    lines.append("exp_avg " + fmt(state["exp_avg"]))
    lines.append("exp_avg_sq " + fmt(state["exp_avg_sq"]))
    with open(os.path.join(out_dir, name + ".txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    torch.manual_seed(0)
    for i, (name, cls, betas, eps, wd) in enumerate(CASES):
        write_case(out_dir, name, cls, betas, eps, wd, seed=1234 + i)


if __name__ == "__main__":
    main()
