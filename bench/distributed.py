"""DDP on 2 processes: the small GPT's training step on tpu (c10d backend "tpu", XLA collectives) against the same
DDP on CPU with gloo, measured in one run.

Run: .venv/bin/python bench/distributed.py [--steps 24]
Each configuration starts 2 ranks on loopback (one XLA:CPU device each for tpu); each rank trains its half of every
batch (AdamW, loss.item() every step, dropout off); the time per step is the median over the steps after the
first 4, on rank 0. The 2-core machine runs both ranks: read the ratio, not the milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import ranks  # bench/ranks.py: starting the ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rank_job(device, mode, steps):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import torch
    import torch.distributed as dist
    import train_gpt
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torchtpu

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("tpu" if device == "tpu" else "gloo")
    torch.manual_seed(0)
    model = train_gpt.GPT(vocab=64, d=128, heads=4, layers=2, ctx=64)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    model = model.to(device)
    net = DDP(model)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    share = 8 // world
    times, losses = [], []
    with torchtpu.mode(mode):
        for x, y in train_gpt.batches(steps, 8, 64, 64):
            t0 = time.perf_counter()
            loss = net(x[rank * share : (rank + 1) * share].to(device), y[rank * share : (rank + 1) * share].to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            times.append(time.perf_counter() - t0)
    if rank == 0:
        print(json.dumps({"ms": statistics.median(times[4:]) * 1e3, "losses": losses}), flush=True)
    dist.destroy_process_group()


def launch(device, mode, steps):
    return ranks.launch(__file__, ["--rank-job", device, mode, steps], 2)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--rank-job", nargs=3)
    args = ap.parse_args()
    if args.rank_job:
        device, mode, steps = args.rank_job
        return rank_job(device, mode, int(steps))
    runs = {
        "CPU, gloo": launch("cpu", "strict", args.steps),
        "tpu, strict": launch("tpu", "strict", args.steps),
        "tpu, fused": launch("tpu", "fused", args.steps),
    }
    cpu = runs["CPU, gloo"]
    print(f"DDP, small GPT (d=128, 2 layers, ctx 64), batch 8 over 2 processes, {args.steps} AdamW steps\n")
    print(
        "| configuration | ms per step (rank 0) | / CPU with gloo | max loss diff vs CPU |\n| --- | --- | --- | --- |"
    )
    for name, r in runs.items():
        diff = max(abs(a - b) / abs(a) for a, b in zip(cpu["losses"], r["losses"]))
        print(f"| {name} | {r['ms']:.1f} | {r['ms'] / cpu['ms']:.2f}x | {diff:.1e} |")


if __name__ == "__main__":
    main()
