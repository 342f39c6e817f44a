"""An optimizer step alone (AdamW, or SGD with Nesterov momentum; the README example GPT's parameters, fresh gradients
each step): foreach vs fused=True, on CPU
and on tpu (strict and fused eager), as ratios to PyTorch CPU's foreach step, measured in one run in interleaved
blocks. A tpu step is timed to its end (synchronize), and its host part (until opt.step() returns) is shown too.

Run: .venv/bin/python bench/optim.py [--steps 40] [--opt adamw|sgd]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "examples"), os.path.join(ROOT, "tests", "tools"), os.path.join(ROOT, "bench")]

import torch  # noqa: E402
from eager import MODELS  # noqa: E402

import torchtpu  # noqa: E402

OPTIMIZERS = {
    "adamw": ("AdamW", lambda params, **kw: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01, **kw)),
    "sgd": (
        "SGD (momentum 0.9, Nesterov)",
        lambda params, **kw: torch.optim.SGD(params, lr=3e-3, momentum=0.9, nesterov=True, weight_decay=0.01, **kw),
    ),
}


def variant(build, make_opt, device, fused, mode=None):
    model = build().to(device)
    opt = make_opt(model.parameters(), fused=fused, foreach=None if fused else True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, 1000)  # a new learning rate every step
    grads = [torch.randn_like(p) for p in model.parameters()]

    def step():
        with torchtpu.mode(mode) if mode else contextlib.nullcontext():
            for p, g in zip(model.parameters(), grads):
                p.grad = g.clone()
            if device == "tpu":
                torch.tpu.synchronize()
            t0 = time.perf_counter()
            opt.step()
            t1 = time.perf_counter()
            if device == "tpu":
                torch.tpu.synchronize()
            sched.step()
            return time.perf_counter() - t0, t1 - t0

    return step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--opt", choices=sorted(OPTIMIZERS), default="adamw")
    a = ap.parse_args()
    label, make_opt = OPTIMIZERS[a.opt]
    name = next(k for k in MODELS if "README" in k)
    build = MODELS[name]()[0]
    variants = {
        "CPU foreach": variant(build, make_opt, "cpu", False),
        "CPU fused": variant(build, make_opt, "cpu", True),
    }
    for mode in ("strict", "fused"):
        for fused in (False, True):
            variants[f"tpu {mode} mode, {'fused=True' if fused else 'foreach'}"] = variant(
                build, make_opt, "tpu", fused, mode
            )
    times = {k: [] for k in variants}
    c0 = torchtpu.metrics.counters().get("compiles", 0)
    for block in range(a.steps // 4):
        if block == 2:
            c0 = torchtpu.metrics.counters().get("compiles", 0)  # after warm-up
        for k, run in variants.items():
            for _ in range(4):
                times[k].append(run())
    compiles = torchtpu.metrics.counters().get("compiles", 0) - c0
    med = {
        k: (statistics.median(t for t, _ in v[8:]), statistics.median(h for _, h in v[8:])) for k, v in times.items()
    }
    base = med["CPU foreach"][0]
    n = sum(p.numel() for p in build().parameters())
    print(
        f"torchtpu {torchtpu.__version__}, torch {torch.__version__}; {label} over {n} parameters ({name}); "
        f"CPU foreach step {base * 1e3:.2f} ms\n"
    )
    print(f"| {label} step | time / CPU foreach | host part / CPU foreach |\n| --- | --- | --- |")
    for k, (t, h) in med.items():
        print(f"| {k} | {t / base:.2f}x | {h / base:.2f}x |")
    fb = [k for k in torchtpu.metrics.counters() if k.startswith("fallback.")]
    print(f"\ncompiles after warm-up (every variant, a new learning rate each step): {compiles}; CPU fallbacks: {fb}")


if __name__ == "__main__":
    main()
