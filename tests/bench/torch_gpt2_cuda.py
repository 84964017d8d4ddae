#!/usr/bin/env python3
"""torch_gpt2_cuda: the PyTorch peer of bench_cuda (tests/bench/bench_cuda.c).

GPT-2 (pre-LayerNorm blocks, tanh GELU, tied head, learned positions, GPT-2's
init) trained the way users run it on a GPU: bf16 autocast around forward and
loss, fp32 master weights, fused AdamW (lr 6e-4, betas 0.9/0.95, weight decay
0.1 on 2-D tensors), clipping at 1.0, on random tokens made on the device.
Each mode (eager, torch.compile) runs --warmup untimed steps, then --steps
timed ones. A bf16 GEMM of --gemm^3 is timed too: the ceiling MFU is read
against besides the datasheet peak.

One line per result, `torch: mode=... tokens_per_s=... mfu_peak=... mfu_gemm=...
step_ms=... loss=... peak_mem_mib=...` and `torch: gemm n=... tflops=...`
(with --json, one JSON object per line instead). A mode that fails prints
`torch: mode=M error=...` and the others go on; the exit status is 0 only when
eager worked. --device cpu with --model tiny checks the script on a machine
without a GPU.
"""
import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

MODELS = {  # layers, channels, heads, vocab, context
    "gpt2-124m": (12, 768, 12, 50257, 1024),
    "gpt2-350m": (24, 1024, 16, 50257, 1024),
    "gpt2-774m": (36, 1280, 20, 50257, 1024),
    "tiny": (2, 64, 4, 256, 64),
}


class Block(nn.Module):
    def __init__(self, C, NH, L):
        super().__init__()
        self.nh = NH
        self.ln1, self.ln2 = nn.LayerNorm(C), nn.LayerNorm(C)
        self.qkv, self.proj = nn.Linear(C, 3 * C), nn.Linear(C, C)
        self.fc, self.fcproj = nn.Linear(C, 4 * C), nn.Linear(4 * C, C)
        for p in (self.proj, self.fcproj):  # GPT-2: residual projections scaled by depth
            nn.init.normal_(p.weight, std=0.02 / math.sqrt(2 * L))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # PyTorch 2: the fused kernels
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:  # older PyTorch (Debian's, where this script is checked on a CPU)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            mask = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1)
            y = att.masked_fill(mask, float("-inf")).softmax(-1) @ v
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, NH, V, ctx):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(V, C), nn.Embedding(ctx, C)
        self.blocks = nn.ModuleList(Block(C, NH, L) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        # GPT-2's init: biases 0, matrices and embeddings N(0, 0.02), the
        # residual projections (proj, fcproj: set in Block) N(0, 0.02/sqrt(2L))
        for name, p in self.named_parameters():
            if name.endswith(".bias") and p.dim() == 1 and "ln" not in name:
                nn.init.zeros_(p)
            elif p.dim() == 2 and not name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        T = idx.shape[1]
        x = self.wte(idx) + self.wpe(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.lnf(x), self.wte.weight)  # tied head
        return F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), targets.reshape(-1))


def emit(args, **kv):
    if args.json:
        print(json.dumps(kv), flush=True)
    else:
        print("torch: " + " ".join(f"{k}={v}" for k, v in kv.items()), flush=True)


def sync(dev):
    if dev == "cuda":
        torch.cuda.synchronize()


def gemm_tflops(n, dev):
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    sync(dev)
    return 2 * n**3 * 10 / (time.perf_counter() - t0) / 1e12


def run_mode(args, mode, cfg, peak, gemm):
    L, C, NH, V, ctx = cfg
    dev = args.device
    torch.manual_seed(1337)
    model = GPT(L, C, NH, V, ctx).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    other = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if dev == "cuda" else {}))
    step_fn = torch.compile(model) if mode == "compile" else model
    gen = torch.Generator(device=dev).manual_seed(7)
    B, T = args.batch, args.seq
    if dev == "cuda":
        torch.cuda.reset_peak_memory_stats()
    loss = None
    t0 = 0.0
    for s in range(args.warmup + args.steps):
        if s == args.warmup:
            sync(dev)
            t0 = time.perf_counter()
        tok = torch.randint(0, V, (B, T + 1), device=dev, generator=gen)
        with torch.autocast(device_type=dev, dtype=torch.bfloat16):
            loss = step_fn(tok[:, :-1], tok[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    sync(dev)
    secs = time.perf_counter() - t0
    tps = B * T * args.steps / secs
    fpt = 6 * nparams + 12 * L * C * T  # per token, forward and backward (llm.c's count)
    mem = torch.cuda.max_memory_allocated() / 2**20 if dev == "cuda" else 0.0
    emit(args, mode=mode, tokens_per_s=round(tps), mfu_peak=round(tps * fpt / peak, 4),
         mfu_gemm=round(tps * fpt / gemm, 4) if gemm else 0, step_ms=round(secs / args.steps * 1e3, 2),
         loss=round(loss.item(), 4), params=nparams, flops_per_token=fpt,
         peak_mem_mib=round(mem, 1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="gpt2-124m", choices=sorted(MODELS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--gemm", type=int, default=8192, help="n of the bf16 GEMM timed (0: none)")
    ap.add_argument("--peak-tflops", type=float, default=989.4,
                    help="the device's dense bf16 peak (H100 SXM: 989.4)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("torch_gpt2_cuda: no CUDA device (use --device cpu to check the script)")
    cfg = MODELS[args.model]
    peak = args.peak_tflops * 1e12
    emit(args, device=torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
         torch=torch.__version__, peak_tflops=args.peak_tflops)
    gemm = 0.0
    if args.gemm > 0:
        g = gemm_tflops(args.gemm, args.device)
        if args.json:
            emit(args, gemm="bf16", n=args.gemm, tflops=round(g, 1))
        else:  # bench_cuda reads "torch: gemm ... tflops="
            print(f"torch: gemm n={args.gemm} dtype=bf16 tflops={g:.1f}", flush=True)
        gemm = g * 1e12
    eager_ok = False
    for mode in args.modes.split(","):
        try:
            run_mode(args, mode, cfg, peak, gemm)
            eager_ok |= mode == "eager"
        except Exception as e:  # one mode's failure must not hide the others' figures
            emit(args, mode=mode, error=str(e).splitlines()[0][:200] if str(e) else type(e).__name__)
    raise SystemExit(0 if eager_ok else 1)


if __name__ == "__main__":
    main()
