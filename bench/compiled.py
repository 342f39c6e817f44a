"""torch.compile(backend="tpu"), measured in one run against fused eager, Inductor on CPU, PyTorch CPU eager and the
JAX ceiling; and the time to the first step with a cold and a warm disk cache.

Run: .venv/bin/python bench/compiled.py [--steps 32] [--only small]

1. Training steps (AdamW, ``loss.item()`` every step, dropout off), time per step / PyTorch CPU eager: the model
   compiled with backend "tpu" (the optimizer step eager), in strict and in fused mode; tpu fused eager; the
   model compiled with Inductor on CPU; the same GPT in JAX with the whole step in one ``jax.jit``. The variants
   take blocks of steps in turn over the same batches, so the machine's noise falls on all alike.
2. Time to the first step: a new process trains the small GPT compiled (fused mode) with an empty cache
   directory, then another with the directory the first one filled. The first step's own time (not imports) and
   the compiles each process made.
The machines are shared and noisy: read the ratios, which come from one run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), os.path.join(ROOT, "tests", "tools"), os.path.join(ROOT, "bench")]

import torch  # noqa: E402
from eager import MODELS, jax_stepper, per_step, run_blocks  # noqa: E402
from eager import torch_stepper as stepper  # noqa: E402

import torchtpu  # noqa: E402

VARIANTS = ("tpu compiled, strict", "tpu compiled, fused", "tpu fused eager", "Inductor on CPU", "JAX ceiling")


def steps_table(steps, only):
    rows = []
    for name, make in MODELS.items():
        if "GPT" not in name or "Hugging" in name or (only and not any(o in name for o in only)):
            continue
        build, data, loss_fn, jax_cfg = make()
        torch._dynamo.reset()
        variants = {
            "cpu": stepper(build, loss_fn, "cpu"),
            "tpu compiled, strict": stepper(build, loss_fn, "tpu", "strict", "tpu"),
            "tpu compiled, fused": stepper(build, loss_fn, "tpu", "fused", "tpu"),
            "tpu fused eager": stepper(build, loss_fn, "tpu", "fused"),
            "Inductor on CPU": stepper(build, loss_fn, "cpu", None, "inductor"),
            "JAX ceiling": jax_stepper(build, jax_cfg),
        }
        res = run_blocks(variants, data(steps))
        cpu_l, cpu_t, _ = res["cpu"]
        cpu = per_step(cpu_t)
        row = {"model": name, "cpu_ms": cpu * 1e3}
        for k in VARIANTS:
            l, t, c = res[k]
            row[k] = per_step(t) / cpu
            row[k + " compiles"] = sum(c[2:])
            row[k + " diff"] = max(abs(a - b) / abs(a) for a, b in zip(cpu_l, l))
        row["compiled vs JAX"] = min(row["tpu compiled, strict"], row["tpu compiled, fused"]) / row["JAX ceiling"]
        rows.append(row)
        print(_row(row), flush=True)
    return rows


HEADER = (
    "| training step | PyTorch CPU eager | "
    + " | ".join(VARIANTS)
    + " | best compiled / JAX | compiles after step 2 (compiled strict / fused) | max loss diff vs CPU "
    "(compiled) |\n|" + " --- |" * (len(VARIANTS) + 5)
)


def _row(r):
    cells = " | ".join(f"{r[k]:.2f}x" for k in VARIANTS)
    diff = max(r["tpu compiled, strict diff"], r["tpu compiled, fused diff"])
    return (
        f"| {r['model']} | {r['cpu_ms']:.1f} ms | {cells} | {r['compiled vs JAX']:.2f}x | "
        f"{r['tpu compiled, strict compiles']} / {r['tpu compiled, fused compiles']} | {diff:.1e} |"
    )


FIRST_STEP = r"""
import json, sys, time, warnings
sys.path[:0] = [sys.argv[1]]
import torch, torchtpu
from eager import MODELS
build, data, loss_fn, _ = MODELS["small GPT (d=128, 2 layers, ctx 64, batch 8)"]()
model = build().to("tpu")
fwd = torch.compile(model, backend="tpu")
opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
out = []
with torchtpu.mode("fused"):
    for x, y in data(2):
        c0 = torchtpu.metrics.counters().get("compiles", 0)
        t0 = time.perf_counter()
        loss = loss_fn(fwd, x.to("tpu"), y.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
        out.append((time.perf_counter() - t0, torchtpu.metrics.counters().get("compiles", 0) - c0))
c = torchtpu.metrics.counters()
print(json.dumps({"steps": out, "disk_hits": c.get("cache_hits.disk", 0), "saved": c.get("compile_seconds_saved", 0)}))
"""


def first_step():
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, TORCHTPU_CACHE_DIR=os.path.join(d, "cache"))
        runs = []
        for _ in ("cold", "warm"):
            out = subprocess.run(
                [sys.executable, "-c", FIRST_STEP, os.path.join(ROOT, "bench")],
                env=env,
                capture_output=True,
                text=True,
                timeout=900,
            )
            if out.returncode:
                raise RuntimeError(out.stderr[-3000:])
            runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    cold, warm = runs
    lines = [
        "| small GPT compiled (fused), a new process | first step | its compiles | second step | disk hits |",
        "| --- | --- | --- | --- | --- |",
    ]
    for name, r in (("cold cache", cold), ("warm cache", warm)):
        (t1, c1), (t2, _) = r["steps"]
        lines.append(f"| {name} | {t1 * 1e3:.0f} ms | {c1} | {t2 * 1e3:.1f} ms | {r['disk_hits']} |")
    lines.append(
        f"\nwarm first step / cold first step: {warm['steps'][0][0] / cold['steps'][0][0]:.3f} "
        f"(compile seconds saved: {warm['saved']:.2f})"
    )
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--no-first-step", action="store_true")
    args = ap.parse_args()
    warnings.simplefilter("ignore")
    print(f"torchtpu {torchtpu.__version__} on {torch.tpu.get_device_name()}, torch {torch.__version__}\n")
    print(HEADER, flush=True)
    rows = steps_table(args.steps, args.only)
    if not args.no_first_step:
        print("\n" + "\n".join(first_step()), flush=True)
    return rows


if __name__ == "__main__":
    main()
