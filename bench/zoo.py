"""The model zoo (tests/tools/zoo.py) on tpu next to PyTorch CPU eager, measured in one run.

Run: .venv/bin/python bench/zoo.py [--steps 8] [models...]
Prints a markdown table: loss difference to cpu (max relative over the steps), CPU fallbacks, parameter counts,
tpu step time / cpu step time (medians after the first two steps), compiles after step 2. The machines are
shared and noisy: read the ratio, not the milliseconds.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "tools"))

import torch  # noqa: E402
import zoo  # noqa: E402

import torchtpu  # noqa: E402,F401


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("models", nargs="*", default=list(zoo.MODELS))
    args = ap.parse_args()
    print(f"torchtpu strict mode on {torch.tpu.get_device_name()}, {args.steps} AdamW steps per model\n")
    print(
        "| model | loss vs cpu (max rel.) | params cpu/tpu | CPU fallbacks | step time / cpu eager "
        "| compiles after step 2 |"
    )
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.models:
        r = zoo.side_by_side(name, steps=args.steps)
        cpu_t = statistics.median(r["cpu"]["times"][2:])
        tpu_t = statistics.median(r["tpu"]["times"][2:])
        fb = sum(r["fallbacks"].values())
        print(
            f"| {name} | {r['max_rel_diff']:.1e} | {r['params']['cpu']}/{r['params']['tpu']} | {fb} | "
            f"{tpu_t / cpu_t:.1f}x ({tpu_t * 1e3:.0f} / {cpu_t * 1e3:.1f} ms) | {r['compiles_after_step2']} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
