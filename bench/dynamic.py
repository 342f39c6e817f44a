"""Sizes that change every step, on tpu next to PyTorch CPU eager in one run (the bounded-dynamic-shapes issue).

Run: .venv/bin/python bench/dynamic.py [--steps 8] [models...]
Rows (tests/tools/zoo.py): the issue's tiny Mixtral (hidden 64, batches 4 x 32; `--steps 20` for its done criterion),
Hugging Face Mixtral with its default experts (`torch._grouped_mm`: the counts stay on the
device) and with its "eager" experts (the per-expert loop: nonzero, where, index_add_ — how every MoE written by
hand routes), a hand-written top-k router LM, and GPT-2 and Mixtral over batches whose length varies between 17 and 64.
For each mode: step time / CPU eager (medians after step 2), compiles per step after step 2, host reads per step, the
loss difference to cpu. The machines are shared and noisy: read the ratios, not the milliseconds. The varying-length
loops also run compiled (torch.compile(backend="tpu", dynamic=True), strict mode): there its sizes are bucketed
(torchtpu/shapes), one program per bucket; the lengths' power-of-two buckets are printed with it. The eager
modes bucket the varying length too (torchtpu/shapes/eager_symbolic.py); their "exact sizes" rows are the before.
`--math-attention` adds, per eager mode, a row with PyTorch's math attention path (`sdpa_kernel([SDPBackend.MATH])`,
~19 ops a call) instead of torchtpu's one attention op each way (csrc/aten/attention.cpp): that op's before.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "tools"))

import torch  # noqa: E402
import zoo  # noqa: E402

import torchtpu  # noqa: E402
import torchtpu.cache  # noqa: E402

ROWS = [
    "mixtral_issue",
    "mixtral_issue_eager_experts",
    "mixtral",
    "mixtral_eager_experts",
    "topk_moe",
    "gpt2_varlen",
    "mixtral_varlen",
]
COMPILED = {"gpt2_varlen", "mixtral_varlen"}  # also under torch.compile(backend="tpu", dynamic=True): bucketed sizes
# data-dependent counts: eager modes bucket them (before: exact sizes)
ROUTED = {"topk_moe", "mixtral_eager_experts", "mixtral_issue_eager_experts", "gpt2_varlen", "mixtral_varlen"}


def _bucket(n, lo=16):
    b = lo
    while b < n:
        b *= 2
    return b


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--modes", default="strict,fused")
    ap.add_argument(
        "--no-compiled",
        dest="compiled",
        action="store_false",
        help="skip the torch.compile(dynamic=True) row of the varying-length loop",
    )
    ap.add_argument(
        "--no-exact", dest="exact", action="store_false", help="skip the eager modes' exact-sizes rows (the before)"
    )
    ap.add_argument(
        "--math-attention",
        action="store_true",
        help="also run each eager mode with PyTorch's math attention (the before of torchtpu's attention op)",
    )
    ap.add_argument("models", nargs="*", default=ROWS)
    args = ap.parse_args()
    print(f"torchtpu on {torch.tpu.get_device_name()}, {args.steps} AdamW steps per model and mode\n")
    print(
        "| model | mode | step time / cpu eager | compiles per step after step 2 | compiles after step 5 | "
        "host reads per step | loss vs cpu (max rel.) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in args.models:
        eager = args.modes.split(",")
        modes = (
            ([f"{m}, exact sizes" for m in eager] if name in ROUTED and args.exact else [])
            + eager
            + ([f"{m}, math attention" for m in eager] if args.math_attention else [])
            + (["compiled, exact sizes", "compiled"] if name in COMPILED and args.compiled else [])
        )
        for mode in modes:
            torch._dynamo.reset()
            torchtpu.cache.clear()  # each row compiles what it runs (no executables left by the row before)
            torchtpu._C._clear_chunk_cache()
            compiled = mode.startswith("compiled")
            torchtpu.set_shape_buckets(None if mode.endswith("exact sizes") else "pow2")  # before / after
            attention = contextlib.nullcontext()
            if mode.endswith("math attention"):
                from torch.nn.attention import SDPBackend, sdpa_kernel

                attention = sdpa_kernel([SDPBackend.MATH])
            with torchtpu.mode("strict" if compiled else mode.split(",")[0]), attention:
                r = zoo.side_by_side(name, steps=args.steps, compiled=compiled)
            torchtpu.set_shape_buckets("pow2")
            cpu_t = statistics.median(r["cpu"]["times"][2:])
            tpu_t = statistics.median(r["tpu"]["times"][2:])
            later = r["tpu"]["compiles"][2:]
            print(
                f"| {name} | {mode} | {tpu_t / cpu_t:.1f}x ({tpu_t * 1e3:.0f} / {cpu_t * 1e3:.1f} ms) | "
                f"{statistics.mean(later):.1f} (max {max(later)}) | {sum(r['tpu']['compiles'][5:])} | "
                f"{statistics.mean(r['tpu']['host_syncs']):.1f} | "
                f"{r['max_rel_diff']:.1e} |",
                flush=True,
            )
    if "gpt2_varlen" in args.models or "mixtral_varlen" in args.models:
        lengths = [b["input_ids"].shape[1] for b in zoo._varlen_batches(args.steps)]
        print(
            f"\nvarying-length rows' lengths: {lengths}; {len(set(lengths))} distinct, "
            f"{len({_bucket(t) for t in lengths})} power-of-two buckets (>= 16)"
        )


if __name__ == "__main__":
    main()
