"""Train the small GPT with FSDP2 on 2 processes on tpu, next to the same training in one process on CPU.

Run: .venv/bin/torchrun --standalone --nproc-per-node 2 examples/train_fsdp.py [--steps 20]
(examples/train_gpt.py, the main job, runs it at its end.)

Each rank owns one tpu device and half of every batch; fully_shard splits each block's parameters over the two
ranks (all-gathered for compute, gradients reduce-scattered): XLA collective programs through the c10d backend
"tpu". Rank 0 also trains the same model on the whole batches in one process on CPU and prints both losses.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import train_gpt  # noqa: E402

import torchtpu  # noqa: E402,F401  (the "tpu" device and c10d backend)


def build():
    torch.manual_seed(0)
    model = train_gpt.GPT(vocab=64, d=64, heads=4, layers=2, ctx=32)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0  # the same numbers on every rank and on CPU
    return model


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("cpu:gloo,tpu:tpu")  # torchrun's environment: RANK, WORLD_SIZE, MASTER_ADDR/PORT
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("tpu", (world,))
    model = build().to("tpu")
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = list(train_gpt.batches(args.steps, args.batch, 32, 64))
    share = args.batch // world
    losses, times = [], []
    for x, y in batches:
        t0 = time.perf_counter()
        x, y = x[rank * share : (rank + 1) * share].to("tpu"), y[rank * share : (rank + 1) * share].to("tpu")
        loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        total = loss.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.AVG)  # the whole batch's loss
        losses.append(total.item())
        times.append(time.perf_counter() - t0)
    if rank == 0:
        cpu = build()
        copt = torch.optim.AdamW(cpu.parameters(), lr=3e-3)
        ref = []
        for x, y in batches:
            loss = cpu(x, y)
            copt.zero_grad()
            loss.backward()
            copt.step()
            ref.append(loss.item())
        print(
            f"FSDP2 on {world} processes (tpu, c10d backend 'tpu') vs one process on CPU, {args.steps} AdamW "
            f"steps, batch {args.batch}"
        )
        print(f"{'step':>4}  {'cpu':>9}  {'fsdp2 tpu':>9}")
        for i, (a, b) in enumerate(zip(ref, losses)):
            if i < 3 or i % 5 == 4 or i == len(ref) - 1:
                print(f"{i + 1:4d}  {a:9.5f}  {b:9.5f}")
        diff = max(abs(a - b) / abs(a) for a, b in zip(ref, losses))
        steady = sorted(times[2:])[len(times[2:]) // 2] if len(times) > 2 else times[-1]
        c = torchtpu.metrics.counters()
        print(
            f"max relative loss difference {diff:.1e}; {steady * 1e3:.1f} ms per step after warm-up; "
            f"collectives: {sum(v for k, v in c.items() if k.startswith('collective.'))}, compiles "
            f"{c.get('compiles', 0)}, CPU fallbacks {sum(v for k, v in c.items() if k.startswith('fallback.'))}"
        )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
