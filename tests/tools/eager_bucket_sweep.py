"""The OpInfo sweep over bucketed rows in eager mode (torchtpu/shapes/eager_buckets.py), on tpu against cpu.

Per float32 sample, the reference is the op on tpu at exact sizes (tests/lowering/test_opinfo.py checks that against
cpu). The input (and any argument of its shape) goes to the device in a
bucketed storage of n + 3 rows whose padding is NaN (floats), 10**6 (integers: an index read from the padding would
be out of range) or True, so a rule that reads padding into a valid value answers wrong or raises. The op runs on
those (forward, and backward from random cotangents, bucketed for outputs with the rows, when the sample needs
gradients); outputs and gradients must equal the reference's. The
sample then runs again with n - 1 rows (inside the same capacity) and must lower nothing new: one table entry per
bucket, not one per count. Verdicts:
  ok        every op of the call ran bucketed, equal to cpu, and the second count lowered nothing
  exact     some op of the call declined (eager_buckets.py's reason; it ran at exact sizes, equal to cpu)
  static    no tensor argument has rows to bucket
  wrong     a value differs from the reference (a defect)
  error     bucketed, tpu raised where the reference did not (a defect)
  skip      cpu rejects the sample (or its n - 1 rows), or the exact-size reference fails on tpu
`python tests/tools/eager_bucket_sweep.py [op ...]` prints every op's verdict; tests/shapes/test_eager_buckets.py runs a
list."""

from __future__ import annotations

import collections
import contextlib
import sys
import warnings

import opinfo_sweep
import torch
from torch.utils._pytree import tree_flatten, tree_unflatten

import torchtpu
import torchtpu.shapes
from torchtpu import _C, kernels, metrics

PAD_ROWS = 3


def bucketed(t: torch.Tensor, cap: int, requires_grad=False) -> torch.Tensor:
    """t (CPU, rows along dim 0) on tpu in a bucketed storage of `cap` rows whose padding is poison."""
    n = t.shape[0]
    if t.numel() == 0:
        return t.detach().to("tpu").requires_grad_(requires_grad)
    pad = float("nan") if t.dtype.is_floating_point or t.dtype.is_complex else True if t.dtype == torch.bool else 10**6
    host = torch.full((cap, *t.shape[1:]), pad, dtype=t.dtype)
    host[:n] = t.detach()
    dev = host.to("tpu")[:n]
    _C._set_rows(dev, n, dev.stride(0) * dev.element_size() if t.dim() > 1 else dev.element_size())
    return dev.requires_grad_(requires_grad)


def _call(op, flat, spec, idx, tensors):
    vals = list(flat)
    for i, t in zip(idx, tensors):
        vals[i] = t
    inp, args, kwargs = tree_unflatten(vals, spec)
    return op.op(inp, *args, **kwargs)


def _backward(out, rows, cap):
    """Backward from a random cotangent per float output (seeded by its shape); on tpu (rows, cap) an output whose
    dim 0 has the rows gets its cotangent bucketed, as gradients flowing back to routed tensors are."""
    flat, _ = tree_flatten(out)
    outs, cots = [], []
    for o in flat:
        if isinstance(o, torch.Tensor) and o.requires_grad and o.dtype.is_floating_point and o.numel():
            g = torch.Generator().manual_seed(o.numel())
            c = torch.randn(o.shape, generator=g).to(o.dtype)
            tpu = o.device.type == "tpu"
            c = bucketed(c, cap) if tpu and rows is not None and o.dim() and o.shape[0] == rows else c.to(o.device)
            outs.append(o)
            cots.append(c)
    if outs:
        torch.autograd.backward(outs, cots)


def _grads(tensors):
    return [t.grad for t in tensors if isinstance(t, torch.Tensor) and t.requires_grad]


def _tpu_run(op, flat, spec, idx, cpu_in, rows, n, cap):
    """(outputs, grads, counter deltas) on tpu: the rows bucketed (cap) or, cap None, at exact sizes."""
    c0 = metrics.counters()
    _LOWERED.clear()
    tpu_in = [
        bucketed(t, cap, t.requires_grad)
        if k in rows and cap is not None
        else t.detach().to("tpu").requires_grad_(t.requires_grad)
        for k, t in enumerate(cpu_in)
    ]
    got = _call(op, flat, spec, idx, tpu_in)
    _backward(got, n if cap is not None else None, cap)
    torch.tpu.synchronize()
    c1 = metrics.counters()
    delta = {k: c1.get(k, 0) - c0.get(k, 0) for k in ("lowerings", "op_table.bucket_exact")}
    delta["lowered"] = sorted(set(_LOWERED))
    return got, _grads(tpu_in), delta


class _ReferenceFailed(Exception):
    pass


def _once(op, flat, spec, idx, rows, n, cap):
    """(reference outputs, grads: tpu at exact sizes; bucketed outputs, grads, counter deltas), rows cut to n."""
    cpu_in = []
    for k, i in enumerate(idx):
        t = flat[i].detach()
        if k in rows:
            t = t[:n]
        cpu_in.append(t.clone().requires_grad_(flat[i].requires_grad and t.dtype.is_floating_point))
    policy = torchtpu.shapes.get_shape_buckets()
    torchtpu.set_shape_buckets(None)
    try:
        want, wgrads, _ = _tpu_run(op, flat, spec, idx, cpu_in, rows, n, None)
    except Exception as e:  # noqa: BLE001
        raise _ReferenceFailed(f"{type(e).__name__}") from e
    finally:
        torchtpu.set_shape_buckets(policy)
    got, ggrads, delta = _tpu_run(op, flat, spec, idx, cpu_in, rows, n, cap)
    return want, wgrads, got, ggrads, delta


def _same(expected, actual):
    """Bucketed results equal the exact ones (the same XLA per row; sums over rows may associate differently)."""
    ef, _ = tree_flatten(expected)
    af, _ = tree_flatten(actual)
    assert len(ef) == len(af), f"{len(ef)} results at exact sizes, {len(af)} bucketed"
    for e, a in zip(ef, af):
        if isinstance(e, torch.Tensor):
            assert isinstance(a, torch.Tensor) and a.shape == e.shape and a.dtype == e.dtype, (e.shape, a)
            torch.testing.assert_close(a.cpu(), e.cpu(), equal_nan=True, atol=1e-5, rtol=1e-4)
        else:
            assert e == a or (e != e and a != a), (e, a)


def run_sample(op, sample) -> tuple[str, str]:
    flat, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    idx = [i for i, x in enumerate(flat) if isinstance(x, torch.Tensor)]
    if not isinstance(sample.input, torch.Tensor) or sample.input.dim() == 0 or sample.input.shape[0] < 3:
        return "static", "no rows"
    n = sample.input.shape[0]
    # the input's rows, and those of arguments of the input's shape (a binary op's other operand)
    rows = {k for k, i in enumerate(idx) if flat[i].shape == sample.input.shape}
    for attempt, m in enumerate((n, n - 1)):
        try:
            _call(
                op,
                flat,
                spec,
                idx,
                [flat[i].detach()[:m] if k in rows else flat[i].detach() for k, i in enumerate(idx)],
            )
        except Exception as e:  # noqa: BLE001
            if attempt == 0:
                return "skip", f"cpu rejects it: {type(e).__name__}"
            return "skip-second", "cpu rejects n - 1 rows"
        try:
            want, wgrads, got, ggrads, delta = _once(op, flat, spec, idx, rows, m, n + PAD_ROWS)
        except _ReferenceFailed as e:
            return "skip", f"the exact-size reference fails on tpu: {e}"
        except Exception as e:  # noqa: BLE001
            return "error", f"{m} rows: {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
        try:
            _same(want, got)
            _same([g for g in wgrads if g is not None], [g for g in ggrads if g is not None])
        except AssertionError as e:
            return "wrong", f"{m} rows: {str(e).splitlines()[0][:200]}"
        if delta["op_table.bucket_exact"]:
            return "exact", f"{delta['op_table.bucket_exact']} calls at exact sizes"
        if attempt == 1 and delta["lowerings"]:
            return "recompiled", f"{delta['lowerings']} new lowerings at {m} rows: {', '.join(delta['lowered'])}"
    return "ok", ""


_LOWERED: list = []  # op names lowered since the sample's tpu run began


@contextlib.contextmanager
def _recording_lowerings():
    """Op names lowered go to _LOWERED (the executor's callbacks are restored after: errors name the user's line)."""
    cbs = kernels.callbacks()
    orig = cbs["lower"]

    def lower(name, *a):
        _LOWERED.append(name)
        return orig(name, *a)

    _C._set_callbacks(dict(cbs, lower=lower))
    try:
        yield
    finally:
        _C._set_callbacks(cbs)


def sweep(ops=None, max_samples=1):
    from torch.testing._internal.common_methods_invocations import op_db

    results = {}
    warnings.simplefilter("ignore")
    with torchtpu.mode("strict"), _recording_lowerings():
        for op in op_db:
            if ops is not None and op.name not in ops:
                continue
            if opinfo_sweep.skip_reason(op) or torch.float32 not in op.supported_dtypes("cpu"):
                continue
            out = []
            try:
                for j, s in enumerate(op.sample_inputs("cpu", torch.float32, requires_grad=op.supports_autograd)):
                    if j >= max_samples:
                        break
                    out.append(run_sample(op, s))
            except Exception as e:  # noqa: BLE001 — the sample generator failed
                out.append(("skip", f"sample generation: {type(e).__name__}"))
            results[(op.name, op.variant_test_name)] = out
    return results


def summarize(results):
    return collections.Counter(v for outs in results.values() for v, _ in outs)


if __name__ == "__main__":
    import os

    res = sweep(ops=sys.argv[1:] or None, max_samples=int(os.environ.get("SAMPLES", "1")))
    for (name, variant), outs in sorted(res.items()):
        for v, d in outs:
            print(f"{v:9s} {name}{'.' + variant if variant else ''}: {d}")
    print(dict(summarize(res)))
