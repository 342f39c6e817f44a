"""Sizes that change every step, on tpu next to PyTorch CPU eager in one run (the bounded-dynamic-shapes issue).

Run: .venv/bin/python bench/dynamic.py [--steps 8] [models...]
Rows (tests/zoo.py): Hugging Face Mixtral with its default experts (`torch._grouped_mm`: the counts stay on the
device) and with its "eager" experts (the per-expert loop: nonzero, where, index_add_ — how every MoE written by
hand routes), a hand-written top-k router LM, and GPT-2 over batches whose length varies between 17 and 64. For
each mode: step time / CPU eager (medians after step 2), compiles per step after step 2, host reads per step, the
loss difference to cpu. The machines are shared and noisy: read the ratios, not the milliseconds. With bucketed
sizes (designed in docs/architecture.md, not built) the varying-length loop's target is one compile per bucket:
the lengths' power-of-two buckets are printed with it.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))

import torch  # noqa: E402

import torchtpu  # noqa: E402
import zoo  # noqa: E402

ROWS = ["mixtral", "mixtral_eager_experts", "topk_moe", "gpt2_varlen"]


def _bucket(n, lo=16):
    b = lo
    while b < n:
        b *= 2
    return b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--modes", default="strict,fused")
    ap.add_argument("models", nargs="*", default=ROWS)
    args = ap.parse_args()
    print(f"torchtpu on {torch.tpu.get_device_name()}, {args.steps} AdamW steps per model and mode\n")
    print("| model | mode | step time / cpu eager | compiles per step after step 2 | host reads per step | "
          "loss vs cpu (max rel.) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in args.models:
        for mode in args.modes.split(","):
            with torchtpu.mode(mode):
                r = zoo.side_by_side(name, steps=args.steps)
            cpu_t = statistics.median(r["cpu"]["times"][2:])
            tpu_t = statistics.median(r["tpu"]["times"][2:])
            later = r["tpu"]["compiles"][2:]
            print(f"| {name} | {mode} | {tpu_t / cpu_t:.1f}x ({tpu_t * 1e3:.0f} / {cpu_t * 1e3:.1f} ms) | "
                  f"{statistics.mean(later):.1f} (max {max(later)}) | {statistics.mean(r['tpu']['host_syncs']):.1f} | "
                  f"{r['max_rel_diff']:.1e} |", flush=True)
    if "gpt2_varlen" in args.models:
        lengths = [b["input_ids"].shape[1] for b in zoo._varlen_batches(args.steps)]
        print(f"\ngpt2_varlen lengths: {lengths}; {len(set(lengths))} distinct, "
              f"{len({_bucket(t) for t in lengths})} power-of-two buckets (>= 16)")


if __name__ == "__main__":
    main()
