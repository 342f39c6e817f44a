"""Writes docs/ops.md: the OpInfo sweep's per-op status, then every ATen overload with a tpu kernel.

.venv/bin/python scripts/gen_ops_doc.py          # sweep subset: float32, first 2 samples per op (~2 min)
.venv/bin/python scripts/gen_ops_doc.py --full   # every dtype and sample, dtypes over 2 processes
options: --jobs N (processes of the full run), --raw FILE (every sample's status and detail, as JSON),
         --rerun RAW OP[,OP...] [--seconds S] (a full run's --raw results with those ops run again),
         --tables-only (keeps the sweep section docs/ops.md has; rewrites the kernel tables: no sweep run)
"""

import os
import sys
import time

import torch

import torchtpu  # noqa: F401
from torchtpu import kernels, tables

C_METADATA = [
    "empty.memory_format",
    "empty_strided",
    "as_strided",
    "view",
    "view_as_real",
    "view_as_complex",
    "_reshape_alias",
    "unfold",
    "alias",
    "resize_",
    "set_.source_Storage_storage_offset",
    "set_.source_Storage",
    "set_.source_Tensor",
    "set_",
    "is_set_to",
    "_has_compatible_shallow_copy_type",
]


sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "tools"))
import opinfo_sweep  # noqa: E402


def _sweep_one(dtype_name):
    return opinfo_sweep.sweep(dtypes=[getattr(torch, dtype_name)])


def _full_sweep(jobs):
    """Every dtype and sample, the dtypes spread over `jobs` processes (each with its own runtime)."""
    import multiprocessing as mp

    names = [str(d)[6:] for d in opinfo_sweep.DTYPES]
    res = {}
    with mp.get_context("spawn").Pool(jobs) as pool:
        for part in pool.imap_unordered(_sweep_one, names):
            res.update(part)
    return res


def sweep_section(full, jobs):
    t0 = time.time()
    rerun_note = ""
    if "--rerun" in sys.argv:  # a full run's raw results, with some ops run again (every dtype and sample)
        import json

        i = sys.argv.index("--rerun")
        with open(sys.argv[i + 1]) as f:
            data = json.load(f)
        names = set(sys.argv[i + 2].split(","))
        raw = data.get("results", data)
        secs = data.get("seconds") or float(sys.argv[sys.argv.index("--seconds") + 1])
        res = {tuple(k.split(" | ")): [tuple(x) for x in v] for k, v in raw.items() if k.split(" | ")[0] not in names}
        part = opinfo_sweep.sweep(ops=names)
        res.update(part)
        rerun_note = (
            f" After that full run, {', '.join(f'`{n}`' for n in sorted(names))} were run again at a later "
            f"commit (every dtype and sample, {time.time() - t0:.0f} s) and replace its rows."
        )
    else:
        res = _full_sweep(jobs) if full else opinfo_sweep.sweep(dtypes=[torch.float32], max_samples=2)
        secs = time.time() - t0
    if "--raw" in sys.argv:  # every sample's (status, detail), for looking into a run without repeating it
        import json

        with open(sys.argv[sys.argv.index("--raw") + 1], "w") as f:
            json.dump({"seconds": secs, "results": {" | ".join(k): v for k, v in sorted(res.items())}}, f, indent=0)
    samples, ops, per_op = opinfo_sweep.summarize(res)
    core = opinfo_sweep.core_summary(res)
    ran = sum(v for k, v in core.items() if k != "skipped")
    scope = (
        "every dtype of " + ", ".join(str(d)[6:] for d in opinfo_sweep.DTYPES) + ", every sample"
        if full
        else "float32, the first 2 samples of each op"
    )
    where = f"{jobs} processes on the 2-core dev machine" if full else "the 2-core dev machine"
    lines = [
        "## OpInfo parity sweep",
        "",
        f"Scope: {scope} ({len(res)} op/dtype pairs, {secs:.0f} s wall with {where}). "
        "Each sample runs on cpu and tpu and is compared, forward and, for differentiable float samples, "
        "the gradient; an (op, dtype) takes the worst status of its samples. "
        "CI runs a subset: the first float32 and the first complex64 sample of every op in its strict pass, "
        "the second float32 sample in its fused-mode pass (tests/lowering/test_opinfo.py); `TORCHTPU_SWEEP=full` runs "
        "everything in pytest." + rerun_note,
        "Regenerate: `.venv/bin/python scripts/gen_ops_doc.py [--full [--jobs N]]`.",
        "",
        f"**Core ATen** (op_db entries whose ATen op carries `torch.Tag.core`, float32): {ran} samples ran; "
        f"lowered {core.get('lowered', 0)} ({100 * core.get('lowered', 0) / max(ran, 1):.1f}%), "
        f"decomposed {core.get('decomposed', 0)}, fallback {core.get('fallback', 0)}, "
        f"error {core.get('error', 0)}, wrong {core.get('wrong', 0)}.",
        "",
        "| status | samples | op/dtype pairs |",
        "| --- | --- | --- |",
    ]
    for k in ("lowered", "decomposed", "fallback", "error", "wrong", "skipped"):
        lines.append(f"| {k} | {samples.get(k, 0)} | {ops.get(k, 0)} |")
    lines += [
        "",
        "| op | variant | dtype | status | detail (first non-lowered sample) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key in sorted(per_op):
        status = per_op[key]
        detail = next((d for s_, d in res[key] if s_ == status and d), "")
        detail = detail.replace("|", "/").replace("\n", " ")[:120]
        lines.append(f"| `{key[0]}` | {key[1]} | {key[2]} | {status} | {detail} |")
    return lines


def main():
    full = "--full" in sys.argv or "--rerun" in sys.argv
    jobs = int(sys.argv[sys.argv.index("--jobs") + 1]) if "--jobs" in sys.argv else 2
    rules = sorted(tables.RULES)
    registered = {n for n in kernels.registered_ops() if n in kernels.KERNELS or n in tables.DIRECT}
    registered = {n for n in registered if (n + ".default") not in registered}
    foreach = sorted(n for n in registered if n.startswith("_foreach_"))
    derived = sorted(registered - set(rules) - set(tables.DIRECT) - set(tables.INPLACE_RULES) - set(foreach))
    path = os.path.join(os.path.dirname(__file__), "..", "docs", "ops.md")
    lines = [
        "# Op coverage on tpu",
        "",
        "Generated by `scripts/gen_ops_doc.py` from the OpInfo sweep and the lowering table (do not edit "
        "by hand). Status: lowered = only tpu rules ran; decomposed = PyTorch decompositions into tpu rules; "
        "fallback = the counted CPU round trip; error = a clear error on tpu (complex32, sparse layouts); "
        "wrong = values differ from CPU and from CPU's wider-precision result (tracked in "
        "tests/lowering/test_opinfo.py).",
        "",
    ]
    if "--tables-only" in sys.argv:
        with open(path) as f:
            lines = f.read().split("\n## Kernels registered for tpu\n")[0].rstrip("\n").split("\n")
    else:
        lines += sweep_section(full, jobs)
    lines += [
        "",
        "## Kernels registered for tpu",
        "",
        "| kind | count |",
        "| --- | --- |",
        f"| lowering rules (functional) | {len(rules)} |",
        f"| in-place / out= kernels derived from them | {len(derived)} |",
        f"| in-place-only rules (random fills, fused optimizers) | {len(tables.INPLACE_RULES)} |",
        f"| `_foreach_*` kernels generated from element rules (functional + in-place) | {len(foreach)} |",
        f"| direct kernels (copies, host reads, data-dependent shapes) | {len(tables.DIRECT)} |",
        f"| C++ metadata kernels (views, resize_, set_) | {len(C_METADATA)} |",
        "",
        "Every op with a rule is one boxed C++ kernel (csrc/executor/kernel.cpp): the rules lower each "
        "argument signature once, and later calls with that signature run without Python.",
        "",
        "Every other op reaches the boxed fallback: PyTorch's decomposition when one exists (counted as "
        "`decomposed.<op>`), else the CPU round trip (counted as `fallback.<op>`, warned once, an error under "
        "`TORCHTPU_FALLBACK=error`). CompositeImplicit ops (linear, matmul, cross_entropy, dropout, ...) "
        "decompose in the dispatcher before reaching us.",
        "",
        "## Lowering rules",
        "",
    ]
    lines += [f"- `{n}`" for n in rules]
    lines += ["", "## Derived in-place and out= kernels", ""] + [f"- `{n}`" for n in derived]
    lines += ["", "## _foreach_* kernels", ""] + [f"- `{n}`" for n in foreach]
    lines += ["", "## In-place-only rules", ""] + [f"- `{n}`" for n in sorted(tables.INPLACE_RULES)]
    lines += ["", "## Direct kernels", ""] + [f"- `{n}`" for n in sorted(tables.DIRECT)]
    lines += ["", "## C++ metadata kernels", ""] + [f"- `{n}`" for n in C_METADATA]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"wrote {os.path.normpath(path)}: {len(rules)} rules, {len(derived)} derived")


if __name__ == "__main__":
    main()
