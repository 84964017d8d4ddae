"""bench_ddp: the PyTorch peer of bench_fsdp's NO_SHARD: DistributedDataParallel
over gloo with 2 rank processes on 127.0.0.1, 1 thread each, on bench_torch.py's
model (imported from it, so both benchmarks time the same network), AdamW as
bench_torch.py sets it up, the same per-rank B and T (global batch B x ranks).

    /usr/bin/python3 bench_ddp.py PRESET B T STEPS [RANKS]

A step is bench_torch.py's (zero_grad to None, forward, loss, backward with
DDP's bucketed all-reduces overlapping it, AdamW step) and starts after a
barrier; its time is the slower rank's; two warm-up steps, then the median of
STEPS. Each rank trains on its own rows of a fixed token sequence.

run.sh runs it like bench_torch.py, PyTorch at its best on these machines:
OPENBLAS_CORETYPE=SkylakeX, OMP_WAIT_POLICY=PASSIVE, ATEN_CPU_CAPABILITY=avx512
(where the processor has them). Prints one line:
    bench: ddp model=... ranks=2 B= T= step_ms= tokens_per_s= kernel= ...
"""
import os
import socket
import statistics
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_torch  # noqa: E402  (the model and the helpers)

WARMUP = 2


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, preset, B, T, steps, out):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    blas = bench_torch.openblas()
    kernel = "unknown"
    if blas is not None:
        blas.openblas_get_corename.restype = bench_torch.ctypes.c_char_p
        kernel = blas.openblas_get_corename().decode()
        blas.openblas_set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(minutes=5))

    L, C, NH, V, ctx = bench_torch.PRESETS[preset]
    torch.manual_seed(1337)  # the same initial weights on every rank (DDP broadcasts rank 0's)
    model = bench_torch.GPT(L, C, NH, V, ctx)
    params = sum(p.numel() for p in model.parameters())
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    decay = [p for p in ddp.parameters() if p.dim() >= 2]
    no_decay = [p for p in ddp.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.95), eps=1e-8, foreach=True)
    g = torch.Generator().manual_seed(42)
    tok = torch.randint(0, V, (world * B, T + 1), generator=g)[rank * B:(rank + 1) * B]
    inputs, targets = tok[:, :-1].contiguous(), tok[:, 1:].contiguous()

    def step():
        opt.zero_grad(set_to_none=True)
        loss = ddp(inputs, targets)
        loss.backward()
        opt.step()
        return loss.item()

    times = []
    for i in range(WARMUP + steps):
        dist.barrier()
        t0 = time.perf_counter()
        loss = step()
        if i >= WARMUP:
            times.append(time.perf_counter() - t0)
    # the slower rank's time per step
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    if rank == 0:
        out.put((t.tolist(), loss, kernel, params))
    dist.barrier()
    dist.destroy_process_group()


def main():
    if len(sys.argv) not in (5, 6) or sys.argv[1] not in bench_torch.PRESETS:
        sys.exit("usage: bench_ddp.py PRESET B T STEPS [RANKS] (presets: %s)"
                 % ", ".join(bench_torch.PRESETS))
    preset = sys.argv[1]
    B, T, steps = (int(a) for a in sys.argv[2:5])
    world = int(sys.argv[5]) if len(sys.argv) == 6 else 2
    if T > bench_torch.PRESETS[preset][4]:
        sys.exit("bench_ddp: T=%d exceeds the context of %s" % (T, preset))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, preset, B, T, steps, out))
             for r in range(world)]
    for p in procs:
        p.start()
    res = None
    while res is None:
        try:
            res = out.get(timeout=5)
        except Exception:  # queue.Empty: check that the ranks still run
            if any(p.exitcode not in (None, 0) for p in procs):
                break
    if res is None:  # a rank died: the others would wait in gloo for it
        for p in procs:
            if p.exitcode is None:
                p.terminate()
    for p in procs:
        p.join()
    if res is None or any(p.exitcode != 0 for p in procs):
        sys.exit("bench_ddp: a rank failed (exit codes %s)" % [p.exitcode for p in procs])
    times, loss, kernel, params = res
    med = statistics.median(times)
    print("bench: ddp model=%s ranks=%d B=%d T=%d threads=1 step_ms=%.1f tokens_per_s=%.1f "
          "kernel=%s params=%d step_ms_min=%.1f steps=%d loss=%.4f backend=gloo torch=%s "
          "cpu_capability=%s"
          % (preset, world, B, T, med * 1e3, world * B * T / med, kernel, params,
             min(times) * 1e3, steps, loss, torch.__version__, bench_torch.cpu_capability()),
          flush=True)


if __name__ == "__main__":
    main()
