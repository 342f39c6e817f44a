"""Weak scaling of DDP and FSDP2 on tpu (c10d backend "tpu", fused mode): 1, 2, 4 and 8 ranks on this machine, and a
model that projects the step onto a TPU pod slice.

Run: .venv/bin/python bench/scaling.py [--worlds 1 2 4 8] [--steps 8] [--mode fused]

Every rank trains the small GPT (d=128, 2 layers, ctx 64) on its own batch of 4 sequences (weak scaling: the global
batch grows with the ranks), AdamW, loss.item() every step. Per configuration, on rank 0, in one run:
- step: the median step time of the wrapped model (DDP or FSDP2);
- local: the median step time of the same model without any wrapper, in the same processes (what the step costs
  here when nothing is communicated, under the same oversubscription of the 2 cores);
- collectives: the step's collectives alone (the sequence the process group issued in one step, replayed with a
  sync per step): their time when nothing else runs;
- exposed = step - local (the communication the step did not hide), overlap = 1 - exposed / collectives (0..1);
- bytes: what the step's collectives move per rank over the wire, from their payloads (ring algorithms: an
  all-reduce moves 2(n-1)/n of its payload, an all-gather or reduce-scatter (n-1)/n of the whole tensor).
The machine has 2 cores: 4 and 8 ranks oversubscribe them, so read ratios within a row, not milliseconds across.

The projection takes the step's model FLOPs (6 x parameters x tokens, the attention's 12 x layers x ctx x d per
token) and the measured bytes and overlap onto N chips with the numbers printed at the end (defaults: TPU v5e, 197
TFLOP/s bf16 at 40% utilisation, 4 ICI links of 50 GB/s per chip, all-reduce / all-gather on a ring over them).
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
PER_RANK_BATCH, CTX, D, LAYERS = 4, 64, 128, 2


def _model():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import torch
    import train_gpt

    torch.manual_seed(0)
    model = train_gpt.GPT(vocab=64, d=D, heads=4, layers=LAYERS, ctx=CTX)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def _steps(net, batches, warm, calls=None, marks=None):
    import torch

    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    times = []
    for x, y in batches:
        if marks is not None:
            marks.append(len(calls))
        t0 = time.perf_counter()
        loss = net(x.to("tpu"), y.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[warm:])


def rank_job(kind, mode, steps):
    import torch.distributed as dist

    import torchtpu
    from torchtpu import distributed as tdist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("cpu:gloo,tpu:tpu")
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import train_gpt

    warm = 3
    batches = [
        (x[:PER_RANK_BATCH], y[:PER_RANK_BATCH])
        for x, y in train_gpt.batches(steps + warm, PER_RANK_BATCH * world, CTX, 64)
    ]
    batches = [(x.roll(rank, 0), y.roll(rank, 0)) for x, y in batches]  # each rank its own sequences
    with torchtpu.mode(mode):
        local = _steps(_model().to("tpu"), batches, warm)
        model = _model().to("tpu")
        if kind == "ddp":
            from torch.nn.parallel import DistributedDataParallel as DDP

            net = DDP(model)
        else:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import fully_shard

            mesh = init_device_mesh("tpu", (world,))
            for blk in model.blocks:
                fully_shard(blk, mesh=mesh)
            net = fully_shard(model, mesh=mesh)
        # the collectives of one step, as the process group issues them
        calls = []
        orig = tdist.ProcessGroupTpu._as_op

        def logged(self, name, op, t):
            ok = orig(self, name, op, t)
            if ok:
                calls.append((name, op, t.numel(), t.dtype, self._size, self._global_ranks))
            return ok

        tdist.ProcessGroupTpu._as_op = logged
        marks = []
        step = _steps(net, batches, warm, calls, marks)
        tdist.ProcessGroupTpu._as_op = orig
        per_step = calls[marks[-1] :]
        coll = _replay(per_step, world, steps)
    if rank == 0:
        params = sum(p.numel() for p in _model().parameters())
        print(
            json.dumps(
                {
                    "step": step * 1e3,
                    "local": local * 1e3,
                    "collectives": coll * 1e3,
                    "bytes": _wire_bytes(per_step),
                    "calls": len(per_step),
                    "params": params,
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()


def _replay(calls, world, steps):
    """The median time of the step's collectives alone (a sync per step)."""
    import torch

    import torchtpu
    from torchtpu import collectives

    ts = [torch.ones(n, dtype=dt, device="tpu") for _, _, n, dt, _, _ in calls]
    times = []
    for i in range(steps + 2):
        t0 = time.perf_counter()
        outs = []  # kept: a result nobody holds would not be computed
        for (name, op, n, dt, size, group), t in zip(calls, ts):
            if name == "all_reduce":
                outs.append(collectives.all_reduce(t, op, group, world))
            elif name == "all_gather":
                outs.append(collectives.all_gather(t, group, world))
            else:
                outs.append(collectives.reduce_scatter(t, op, group, world))
        torchtpu.sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[2:]) if calls else 0.0


def _wire_bytes(calls):
    total = 0.0
    for name, _, n, dt, size, _ in calls:
        import torch

        b = n * torch.empty((), dtype=dt).element_size()
        if name == "all_reduce":
            total += 2 * (size - 1) / size * b
        elif name == "all_gather":
            total += (size - 1) * b  # n is the shard: the whole tensor is size * n
        else:
            total += (size - 1) / size * b  # n is the whole tensor
    return total


def launch(kind, mode, world, steps):
    return ranks.launch(__file__, ["--rank-job", kind, mode, steps], world)


def project(r, world, chips, flops, mfu, ici):
    """(compute ms, communication ms, step ms) of the same per-chip work on `chips` TPU chips."""
    tokens = PER_RANK_BATCH * CTX
    step_flops = 6 * r["params"] * tokens + 12 * LAYERS * CTX * D * tokens
    compute = step_flops / (flops * mfu)
    # bytes per rank scale as (n-1)/n: the measured world's bytes, rescaled to the slice
    per_rank = r["bytes"] / ((world - 1) / world) * ((chips - 1) / chips) if world > 1 else 0.0
    comm = per_rank / ici
    overlap = r["overlap"]
    return compute * 1e3, comm * 1e3, (compute + (1 - overlap) * comm) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worlds", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--mode", default="fused")
    ap.add_argument("--rank-job", nargs=3)
    ap.add_argument("--chips", type=int, default=256, help="the pod slice the projection is for")
    ap.add_argument("--chip-flops", type=float, default=197e12, help="peak FLOP/s per chip (v5e bf16: 197e12)")
    ap.add_argument("--mfu", type=float, default=0.4, help="the fraction of peak a step reaches")
    ap.add_argument("--ici", type=float, default=4 * 50e9, help="ICI bytes/s per chip (v5e: 4 links x 50 GB/s)")
    args = ap.parse_args()
    if args.rank_job:
        kind, mode, steps = args.rank_job
        return rank_job(kind, mode, int(steps))
    print(
        f"Weak scaling, small GPT (d={D}, {LAYERS} layers, ctx {CTX}), {PER_RANK_BATCH} sequences per rank, "
        f"AdamW, {args.mode} mode, {args.steps} steps (median), rank 0\n"
    )
    print(
        "| wrapper | ranks | step ms | local ms (no wrapper) | step / local | collectives alone ms | exposed ms | "
        "overlap | collectives per step | bytes per rank per step |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    rows = []
    for kind in ("ddp", "fsdp2"):
        for world in args.worlds:
            r = launch(kind, args.mode, world, args.steps)
            exposed = max(0.0, r["step"] - r["local"])
            r["overlap"] = min(1.0, max(0.0, 1 - exposed / r["collectives"])) if r["collectives"] > 0 else 1.0
            rows.append((kind, world, r))
            print(
                f"| {kind} | {world} | {r['step']:.1f} | {r['local']:.1f} | {r['step'] / r['local']:.2f}x | "
                f"{r['collectives']:.1f} | {exposed:.1f} | {r['overlap']:.2f} | {r['calls']} | "
                f"{r['bytes'] / 1e6:.2f} MB |",
                flush=True,
            )
    print(
        f"\nProjection onto {args.chips} TPU chips (the per-chip work above; {args.chip_flops / 1e12:.0f} TFLOP/s "
        f"per chip at {args.mfu:.0%}, ICI {args.ici / 1e9:.0f} GB/s per chip, ring collectives, the overlap "
        "measured here):\n"
    )
    print("| wrapper | measured at ranks | compute ms | communication ms | projected step ms |")
    print("| --- | --- | --- | --- | --- |")
    for kind, world, r in rows:
        if world == max(args.worlds) and world > 1:
            c, m, s = project(r, world, args.chips, args.chip_flops, args.mfu, args.ici)
            print(f"| {kind} | {world} | {c:.3f} | {m:.3f} | {s:.3f} |")


if __name__ == "__main__":
    main()
