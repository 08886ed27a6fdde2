#!/usr/bin/env python3
"""One GPT-2 training step in the machine's PyTorch, timed: the reference our GPU step is compared to.

GPT-2 small (124M: 12 layers, 768 wide, 12 heads, vocabulary 50257, context 1024), bf16 autocast
over f32 parameters with fused AdamW (lr 3e-4, betas 0.9/0.95, weight decay 0.1): the setup our
trainer runs with bf16 compute and f32 master weights. Prints tokens/s and model TFLOP/s
(6 * params * tokens + 12 * layers * seq * width * tokens, the PaLM count) as the median of
--steps timed steps after --warmup steps, the MFU against a bf16 GEMM peak probed in the same run,
and the peak memory PyTorch held. Exits 1, saying why,
without a CUDA GPU.

    python3 tools/gpu_kit/torch_gpt2_step.py --batch 8 --seq 1024
"""
import argparse
import statistics
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="sequences per step")
    parser.add_argument("--seq", type=int, default=1024, help="tokens per sequence")
    parser.add_argument("--steps", type=int, default=10, help="timed steps")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    args = parser.parse_args()
    try:
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
    except ImportError as e:
        print(f"torch_gpt2_step: PyTorch is not importable here ({e})", file=sys.stderr)
        return 1
    if not torch.cuda.is_available():
        print("torch_gpt2_step: no CUDA device visible to PyTorch (torch.cuda.is_available() is "
              "False); run it on the GPU machine", file=sys.stderr)
        return 1

    layers, width, heads, vocab, context = 12, 768, 12, 50257, 1024
    if args.seq > context:
        print(f"torch_gpt2_step: --seq {args.seq} is above GPT-2's context {context}", file=sys.stderr)
        return 1

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(width)
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)
            self.ln2 = nn.LayerNorm(width)
            self.fc = nn.Linear(width, 4 * width)
            self.out = nn.Linear(4 * width, width)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(width, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class Gpt2(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(context, width)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
            for block in self.blocks:
                x = block(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
            return F.cross_entropy(logits.float().view(-1, vocab), targets.view(-1))

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = Gpt2().to(device)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    idx = torch.randint(0, vocab, (args.batch, args.seq), device=device)
    targets = torch.randint(0, vocab, (args.batch, args.seq), device=device)

    def step():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    t = statistics.median(times)
    tokens = args.batch * args.seq
    flops = 6 * params * tokens + 12 * layers * args.seq * width * tokens

    # The bf16 GEMM peak in the same run (cuBLAS through torch.matmul, 8192^3, best of 5).
    n = 8192
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    for _ in range(2):
        a @ b
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    peak = 2 * n**3 / best
    print(f"cuBLAS bf16 GEMM peak (torch.matmul {n}^3, best of 5): {peak / 1e12:.1f} TFLOP/s")
    print(f"torch {torch.__version__} on {torch.cuda.get_device_name(0)}: GPT-2 124M "
          f"({params / 1e6:.1f}M parameters) bf16 autocast + fused AdamW, batch {args.batch} x "
          f"{args.seq}: step {t * 1e3:.1f} ms (median of {args.steps}), {tokens / t:.0f} tokens/s, "
          f"{flops / t / 1e12:.1f} model TFLOP/s (MFU {flops / t / peak:.3f} of the GEMM peak), "
          f"loss {loss.item():.4f}, peak memory "
          f"{torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
