"""bench_torch: the PyTorch peer of bench_train: the same GPT-2 model (pre-LN,
learned positions, tied embeddings, GELU tanh, biases, causal attention, fp32)
and the same step (zero_grad, forward, loss, backward, AdamW step), timed the
same way: warm-up, then the median of STEPS steps.

    /usr/bin/python3 bench_torch.py PRESET B T THREADS STEPS

PyTorch at its best on these machines (run.sh sets these three for this
command only): OPENBLAS_CORETYPE=SkylakeX, since PyTorch's matmuls are
OpenBLAS's sgemm and Debian's OpenBLAS 0.3.21 picks a slow core on some of
these processors; OMP_WAIT_POLICY=PASSIVE, since otherwise its OpenMP threads
spin while OpenBLAS's own threads work; and ATEN_CPU_CAPABILITY=avx512 where the
processor has it, since Debian's build otherwise runs its own kernels
(log-softmax, GELU, adds) at AVX2 (cpu_capability= on the line says which ran).
torch.set_num_threads does not reach OpenBLAS's pthread pool, so its size is
set here through openblas_set_num_threads.

Written for Debian's torch 1.13 (no F.scaled_dot_product_attention): the
attention is one baddbmm with an additive causal mask (0 on and below the
diagonal, -inf above: the same numbers as masked_fill), softmax, and a bmm.
AdamW uses foreach (multi-tensor) updates (no slower than the per-tensor
loop here), and zero_grad sets gradients to None, PyTorch's default advice.
Prints one line:
    bench: torch model=... B= T= threads= step_ms= tokens_per_s= kernel= params= ...
"""
import ctypes
import math
import os
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# (layers, channels, heads, vocab, context): the same presets as
# daemon/train/gpt.c (run.sh checks that both report the same params=).
PRESETS = {
    "tiny": (2, 64, 4, 256, 64),
    "small": (4, 256, 4, 256, 256),
    "gpt2-124m": (12, 768, 12, 50257, 1024),
    "gpt2-350m": (24, 1024, 16, 50257, 1024),
    "gpt2-774m": (36, 1280, 20, 50257, 1024),
    "gpt2-1558m": (48, 1600, 25, 50257, 1024),
}


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def attention(self, x, mask):
        B, T, C = x.shape
        NH, hs = self.NH, C // self.NH
        q, k, v = self.qkv(x).split(C, dim=2)
        # (B*NH, T, hs)
        q = q.view(B, T, NH, hs).transpose(1, 2).reshape(B * NH, T, hs)
        k = k.view(B, T, NH, hs).transpose(1, 2).reshape(B * NH, T, hs)
        v = v.view(B, T, NH, hs).transpose(1, 2).reshape(B * NH, T, hs)
        att = torch.baddbmm(mask[:T, :T], q, k.transpose(1, 2), beta=1.0,
                            alpha=1.0 / math.sqrt(hs))
        att = att.softmax(dim=-1)
        y = torch.bmm(att, v).view(B, NH, T, hs).transpose(1, 2).reshape(B, T, C)
        return self.proj(y)

    def forward(self, x, mask):
        x = x + self.attention(self.ln1(x), mask)
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, C, NH, V, ctx):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(ctx, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        mask = torch.full((ctx, ctx), float("-inf")).triu(1)
        self.register_buffer("mask", mask, persistent=False)
        for name, p in self.named_parameters():
            if p.dim() == 2:  # GPT-2 init: N(0, 0.02), residual projections scaled
                std = 0.02 / math.sqrt(2 * L) if name.endswith("proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(T))
        for blk in self.blocks:
            x = blk(x, self.mask)
        logits = F.linear(self.lnf(x), self.wte.weight)  # tied embeddings
        return F.cross_entropy(logits.view(B * T, -1), targets.view(B * T))


def openblas():
    """The libopenblas this process loaded (through libblas.so.3), or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if "libopenblas" in os.path.basename(path) and ".so" in path:
                try:
                    return ctypes.CDLL(path)
                except OSError:
                    return None
    return None


def cpu_capability():
    """The kernel set ATen dispatches to (AVX2, AVX512, ...)."""
    for line in torch.__config__.show().splitlines():
        if "CPU capability usage:" in line:
            return line.split(":", 1)[1].strip()
    return "unknown"


def main():
    if len(sys.argv) != 6 or sys.argv[1] not in PRESETS:
        sys.exit("usage: bench_torch.py PRESET B T THREADS STEPS (presets: %s)"
                 % ", ".join(PRESETS))
    preset = sys.argv[1]
    B, T, threads, steps = (int(a) for a in sys.argv[2:])
    L, C, NH, V, ctx = PRESETS[preset]
    if T > ctx:
        sys.exit("bench_torch: T=%d exceeds the context %d of %s" % (T, ctx, preset))

    torch.set_num_threads(threads)
    torch.manual_seed(1337)
    blas = openblas()
    kernel = "unknown"
    if blas is not None:
        blas.openblas_get_corename.restype = ctypes.c_char_p
        kernel = blas.openblas_get_corename().decode()
        blas.openblas_set_num_threads(threads)

    model = GPT(L, C, NH, V, ctx)
    params = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]  # matrices and embeddings
    no_decay = [p for p in model.parameters() if p.dim() < 2]  # biases, norms
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    g = torch.Generator().manual_seed(42)
    tok = torch.randint(0, V, (B, T + 1), generator=g)
    inputs, targets = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(inputs, targets)
        loss.backward()
        opt.step()
        return loss.item()

    step()  # warm-up: allocates gradients and optimizer state
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    if not math.isfinite(loss):
        sys.exit("bench_torch: loss is not finite (%g)" % loss)
    med = statistics.median(times)
    print("bench: torch model=%s B=%d T=%d threads=%d step_ms=%.1f tokens_per_s=%.1f "
          "kernel=%s params=%d step_ms_min=%.1f steps=%d loss=%.4f lib=openblas torch=%s "
          "cpu_capability=%s"
          % (preset, B, T, threads, med * 1e3, B * T / med, kernel, params, min(times) * 1e3,
             steps, loss, torch.__version__, cpu_capability()), flush=True)


if __name__ == "__main__":
    main()
