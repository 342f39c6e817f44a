"""DDP and FSDP2 on 2 processes: the small GPT's training step on tpu (c10d backend "tpu", XLA collectives) against
the same wrapper on CPU with gloo, and FSDP2 against one CPU process training the whole batch, measured in one run.

Run: .venv/bin/python bench/distributed.py [--steps 24] [--only ddp|fsdp]
Each configuration starts 2 ranks on loopback (one XLA:CPU device each for tpu); each rank trains its half of every
batch (AdamW, loss.item() every step, dropout off); the time per step is the median over the steps after the
first 4, on rank 0. The 2-core machine runs both ranks: read the ratio, not the milliseconds.
- DDP: the small GPT of bench/scaling.py (d=128, 2 layers, ctx 64), batch 8; the ratio is to DDP on CPU with gloo.
- FSDP2: examples/train_fsdp.py's model and wrapping (d=64, 2 layers, ctx 32, each block and the root
  fully_shard-ed), batch 16; the ratio is to one CPU process training the whole batch (issue 31's yardstick: a
  user who shards a model over 2 devices against that model on one machine), gloo's FSDP2 beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import ranks  # bench/ranks.py: starting the ranks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _train(net, device, mode, steps, batch, ctx, rank=0, world=1):
    """Trains net on its share of each batch; (median ms per step after the first 4, losses)."""
    import torch
    import train_gpt

    import torchtpu

    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    share = batch // world
    times, losses = [], []
    with torchtpu.mode(mode):
        for x, y in train_gpt.batches(steps, batch, ctx, 64):
            t0 = time.perf_counter()
            loss = net(x[rank * share : (rank + 1) * share].to(device), y[rank * share : (rank + 1) * share].to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
            times.append(time.perf_counter() - t0)
    return statistics.median(times[4:]) * 1e3, losses


def rank_job(kind, device, mode, steps):
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import torch
    import torch.distributed as dist
    import train_fsdp
    import train_gpt
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if kind == "fsdp":
        dist.init_process_group("cpu:gloo,tpu:tpu" if device == "tpu" else "gloo")
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(device, (world,))
        net = train_fsdp.build().to(device)
        for blk in net.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(net, mesh=mesh)
        ms, losses = _train(net, device, mode, steps, 16, 32, rank, world)
        mean = torch.tensor(losses, dtype=torch.float64)  # each rank's half: the whole batch's loss is their mean
        dist.all_reduce(mean)
        losses = (mean / world).tolist()
    else:
        dist.init_process_group("tpu" if device == "tpu" else "gloo")
        torch.manual_seed(0)
        model = train_gpt.GPT(vocab=64, d=128, heads=4, layers=2, ctx=64)
        for m in model.modules():
            if isinstance(m, torch.nn.Dropout):
                m.p = 0.0
        ms, losses = _train(DDP(model.to(device)), device, mode, steps, 8, 64, rank, world)
    if rank == 0:
        print(json.dumps({"ms": ms, "losses": losses}), flush=True)
    dist.destroy_process_group()


def one_cpu_process(steps):
    """examples/train_fsdp.py's model on the whole batch in one CPU process (torch's default threads)."""
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import train_fsdp

    ms, losses = _train(train_fsdp.build(), "cpu", "strict", steps, 16, 32)
    print(json.dumps({"ms": ms, "losses": losses}), flush=True)


def launch(kind, device, mode, steps):
    return ranks.launch(__file__, ["--rank-job", kind, device, mode, steps], 2)


def table(title, runs, base):
    print(f"{title}\n")
    print(f"| configuration | ms per step (rank 0) | / {base} | max loss diff |\n| --- | --- | --- | --- |")
    ref = runs[base]
    for name, r in runs.items():
        diff = max(abs(a - b) / abs(a) for a, b in zip(ref["losses"], r["losses"]))
        print(f"| {name} | {r['ms']:.1f} | {r['ms'] / ref['ms']:.2f}x | {diff:.1e} |")
    print()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--only", choices=["ddp", "fsdp"])
    ap.add_argument("--rank-job", nargs=4)
    ap.add_argument("--one-cpu-process", action="store_true")
    args = ap.parse_args()
    if args.rank_job:
        kind, device, mode, steps = args.rank_job
        return rank_job(kind, device, mode, int(steps))
    if args.one_cpu_process:
        return one_cpu_process(args.steps)
    if args.only != "fsdp":
        runs = {
            "DDP, CPU with gloo": launch("ddp", "cpu", "strict", args.steps),
            "DDP, tpu strict": launch("ddp", "tpu", "strict", args.steps),
            "DDP, tpu fused": launch("ddp", "tpu", "fused", args.steps),
        }
        title = f"DDP, small GPT (d=128, 2 layers, ctx 64), batch 8 over 2 processes, {args.steps} AdamW steps"
        table(title, runs, "DDP, CPU with gloo")
    if args.only != "ddp":
        cmd = [sys.executable, __file__, "--one-cpu-process", "--steps", str(args.steps)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=True).stdout
        runs = {
            "one CPU process, whole batch": json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1]),
            "FSDP2, CPU with gloo": launch("fsdp", "cpu", "strict", args.steps),
            "FSDP2, tpu strict": launch("fsdp", "tpu", "strict", args.steps),
            "FSDP2, tpu fused": launch("fsdp", "tpu", "fused", args.steps),
        }
        title = (
            "FSDP2, examples/train_fsdp.py's GPT (d=64, 2 layers, ctx 32), batch 16 over 2 processes, "
            f"{args.steps} AdamW steps"
        )
        table(title, runs, "one CPU process, whole batch")


if __name__ == "__main__":
    main()
