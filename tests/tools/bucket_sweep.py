"""The OpInfo sweep over bucketed sizes (issue 8's item 4): every op of op_db, float32 samples, compiled with
dynamic sizes and run by the bucketed interpreter on NaN padding (tests/tools/bucket_check.py), forward and backward.

Per sample, every dimension of its tensor arguments whose size falls inside a bucket with room to spare (3, 5, 6,
7, 9, ...: a size that is its own bucket has no padding to read) is marked maybe-dynamic; Dynamo keeps the ones the
op does not specialize. Each graph with symbolic sizes is checked; the sample's verdict:
  ok           every symbolic graph's outputs equal the graph's own at the exact sizes
  declined     the interpreter has no rule for an op on a padded dimension (on tpu: that bucket compiles per size)
  static       no graph had a symbolic size (the op specializes every marked size, or the sample has none)
  wrong        outputs differ: padding was read into a valid value (a defect)
  error        Dynamo or the interpreter raised (other than declining)
  torch        PyTorch's own torch.compile(backend="aot_eager") fails on the sample too (jiterator: CUDA only)
Used by tests/shapes/test_bucket_sweep.py; `python tests/tools/bucket_sweep.py [op ...]` prints every op's verdict."""

from __future__ import annotations

import collections
import sys
import warnings

import opinfo_sweep
import torch
from bucket_check import checking_backend
from torch.utils._pytree import tree_flatten, tree_unflatten

from torchtpu import shapes


def _paddable(n: int) -> bool:
    return n >= 3 and shapes.bucket(n) > n


def _run(fn, tensors):
    out = fn(*tensors)
    flat, _ = tree_flatten(out)
    loss = [
        o.float().sum()
        for o in flat
        if isinstance(o, torch.Tensor)
        and o.requires_grad
        and (o.dtype.is_floating_point or o.dtype.is_complex)
        and o.numel()
    ]
    if loss:
        sum(x.real if x.is_complex() else x for x in loss).backward()


def run_sample(op, sample) -> tuple[str, str]:
    flat, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    idx = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
    if not any(_paddable(n) for i in idx for n in flat[i].shape):
        return "static", "no size with padding"

    def fn(*tensors):
        vals = list(flat)
        for i, t in zip(idx, tensors):
            vals[i] = t
        inp, args, kwargs = tree_unflatten(vals, spec)
        return op.op(inp, *args, **kwargs)

    def marked():
        tensors = []
        for i in idx:
            t = flat[i].detach().clone().requires_grad_(flat[i].requires_grad)
            for d, n in enumerate(t.shape):
                if _paddable(n):
                    torch._dynamo.maybe_mark_dynamic(t, d)
            tensors.append(t)
        return tensors

    report = []
    torch._dynamo.reset()
    try:
        _run(torch.compile(fn, backend=checking_backend(report), fullgraph=False), marked())
    except Exception as e:  # noqa: BLE001 — classified, not hidden
        why = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
        torch._dynamo.reset()
        try:  # PyTorch's own AOT path on the same sample
            _run(torch.compile(fn, backend="aot_eager", fullgraph=False), marked())
        except Exception:  # noqa: BLE001
            return "torch", f"fails under backend aot_eager too: {why}"
        return "error", why
    finally:
        torch._dynamo.reset()
    if not report:
        return "static", "no graph with a symbolic size"
    bad = [r for r in report if r[2] not in ("ok",) and not r[2].startswith("unsupported")]
    if bad:
        return "wrong", f"{bad[0][0]} graph at sizes {bad[0][1]}: {bad[0][2]}"
    declined = [r for r in report if r[2].startswith("unsupported")]
    if declined:
        return "declined", f"{declined[0][0]}: {declined[0][2]}"
    return "ok", ", ".join(sorted({r[0] for r in report}))


def sweep(ops=None, max_samples=1, progress=False):
    """{(op name, variant): [(verdict, detail) per sample]} over float32 samples."""
    from torch.testing._internal.common_methods_invocations import op_db

    results = {}
    warnings.simplefilter("ignore")
    for k, op in enumerate(op_db):
        if ops is not None and op.name not in ops:
            continue
        key = (op.name, op.variant_test_name)
        if opinfo_sweep.skip_reason(op) or torch.float32 not in op.supported_dtypes("cpu"):
            continue
        out = []
        try:
            samples = op.sample_inputs("cpu", torch.float32, requires_grad=op.supports_autograd)
            for j, s in enumerate(samples):
                if j >= max_samples:
                    break
                out.append(run_sample(op, s))
        except Exception as e:  # noqa: BLE001 — the sample generator failed
            out.append(("error", f"sample generation: {type(e).__name__}"))
        results[key] = out
        if progress and k % 50 == 0:
            print(f"  {k}/{len(op_db)} ops", flush=True)
    return results


def summarize(results):
    return collections.Counter(v for outs in results.values() for v, _ in outs)


if __name__ == "__main__":
    res = sweep(
        ops=sys.argv[1:] or None,
        max_samples=int(__import__("os").environ.get("SAMPLES", "1")),
        progress=not sys.argv[1:],
    )
    for (name, variant), outs in sorted(res.items()):
        for v, d in outs:
            print(f"{v:9s} {name}{'.' + variant if variant else ''}: {d}")
    print(dict(summarize(res)))
