"""OpInfo parity sweep: every op in PyTorch's op_db, every sample input, on "tpu" against "cpu".

Each sample is classified by the path it took on tpu and by its result:
  lowered     ran only through tpu lowering rules (and metadata kernels)
  decomposed  used at least one PyTorch decomposition, still no CPU fallback
  fallback    used the counted CPU fallback for at least one op
  error       raised on tpu where CPU did not
  wrong       ran, but the values differ from CPU (a defect: never allowed silently)
  skipped     with a reason (random ops, uninitialized memory)
Used by tests/test_opinfo.py (a fast subset in CI) and scripts/gen_ops_doc.py --sweep (docs/ops.md).
"""
from __future__ import annotations

import collections
import time
import warnings

import torch
from torch.utils._pytree import tree_flatten

import torchtpu

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.bool]
RANK = {"lowered": 0, "decomposed": 1, "fallback": 2, "skipped": 3, "error": 4, "wrong": 5}

# Values differ from CPU by design, or read uninitialized memory on CPU.
_RANDOM = ("rand", "normal", "bernoulli", "dropout", "multinomial", "uniform", "exponential", "cauchy",
           "geometric", "log_normal", "rrelu", "randint", "randperm", "fractional_max_pool",
           "multi_head_attention_forward")  # the last: its samples use dropout
# Samples that pass a tensor which must stay on the CPU (not movable by a generic transform).
_HOST_TENSOR_ARGS = {"tensor_split": "its tensor_indices_or_sections argument must be a CPU tensor"}
_VARIANT_SKIPS = {("as_strided", "partial_views"):
                  "reads storage outside the input view, which moving the input to another device does not carry"}
_UNINIT = ("empty", "new_empty", "empty_like", "empty_strided", "empty_permuted")


def skip_reason(op) -> str | None:
    if any(k in op.name for k in _RANDOM):
        return "random op: values come from the tpu generator, not the CPU one (tested in test_rng.py)"
    if op.name in _UNINIT or op.name.startswith("empty") or op.name.startswith("new_empty"):
        return "reads uninitialized memory on CPU"
    if (op.name, op.variant_test_name) in _VARIANT_SKIPS:
        return _VARIANT_SKIPS[(op.name, op.variant_test_name)]
    if op.name in _HOST_TENSOR_ARGS:
        return _HOST_TENSOR_ARGS[op.name]
    return None


# Ops that sum many products: an output near zero carries rounding error proportional to the magnitude of
# the terms, so atol scales with the largest output (PyTorch's own conv tests override tolerances too).
_MANY_TERMS = ("conv", "matmul", "mm", "einsum", "tensordot", "linear", "addm", "baddbmm", "bmm")


def _tol(dtype, op_name="", expected=None):
    tol = dict(rtol=2e-2, atol=2e-2) if dtype in (torch.bfloat16, torch.float16) else dict(rtol=1.3e-5, atol=1e-5)
    if any(k in op_name for k in _MANY_TERMS) and isinstance(expected, torch.Tensor) and expected.numel() \
            and expected.dtype.is_floating_point:
        tol["atol"] *= max(1.0, float(expected.abs().max()))
    return tol


def _to_tpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to("tpu")
    if isinstance(x, torch.device) and x.type == "cpu" or x == "cpu":
        return torch.device("tpu")  # factory samples name their device
    return x


def _compare(expected, actual, dtype, on_tpu=True, op_name=""):
    ef, _ = tree_flatten(expected)
    af, _ = tree_flatten(actual)
    if len(ef) != len(af):
        raise AssertionError(f"{len(ef)} outputs on cpu, {len(af)} on tpu")
    for e, a in zip(ef, af):
        if isinstance(e, torch.Tensor):
            if not isinstance(a, torch.Tensor):
                raise AssertionError(f"tensor on cpu, {type(a).__name__} on tpu")
            if on_tpu and a.device.type != "tpu" and e.device.type == "cpu" and a.numel() > 0:
                raise AssertionError(f"result on {a.device}, expected tpu")
            torch.testing.assert_close(a.cpu(), e, equal_nan=True, check_device=False, **_tol(dtype, op_name, e))
        elif isinstance(e, float) and e != e:
            assert a != a
        else:
            assert e == a, (e, a)


# Ops whose indices for equal elements are unspecified unless stable=True (CPU's own order is not stable on
# large inputs): compare the values, and check that the tpu indices pick those values from the input.
_TIE_ORDER_FREE = {"sort", "argsort", "topk"}


def _compare_tie_free(op, sample, expected, actual, dtype):
    dim = sample.kwargs.get("dim", sample.args[1] if op.name == "topk" and len(sample.args) > 1 else
                            (sample.args[0] if op.name != "topk" and sample.args and isinstance(sample.args[0], int) else -1))
    x = sample.input
    if op.name == "argsort":
        idx = actual.cpu()
        _compare(x.gather(dim, expected) if x.dim() else x, x.gather(dim, idx) if x.dim() else x, dtype, on_tpu=False)
        return
    _compare(expected[0], actual[0], dtype)
    if x.dim():
        _compare(expected[0], x.gather(dim, actual[1].cpu()), dtype, on_tpu=False)


def run_sample(op, sample, dtype) -> tuple[str, str]:
    try:
        expected = op(sample.input, *sample.args, **sample.kwargs)
    except Exception:
        return "skipped", "CPU raises on this sample"
    tpu = sample.transform(_to_tpu)
    if isinstance(tpu.kwargs.get("device"), (str, torch.device)):
        tpu.kwargs["device"] = _to_tpu(tpu.kwargs["device"])
    tpu.args = tuple(_to_tpu(a) if isinstance(a, (str, torch.device)) else a for a in tpu.args)
    torchtpu.metrics.reset()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = op(tpu.input, *tpu.args, **tpu.kwargs)
        if op.name in _TIE_ORDER_FREE and not sample.kwargs.get("stable", False):
            _compare_tie_free(op, sample, expected, actual, dtype)
        else:
            _compare(expected, actual, dtype, op_name=op.name)
    except AssertionError as e:
        return "wrong", str(e).splitlines()[0][:200] if str(e) else "mismatch"
    except Exception as e:
        return "error", f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    c = torchtpu.metrics.counters()
    if any(k.startswith("fallback.") for k in c):
        return "fallback", ", ".join(sorted(k[9:] for k in c if k.startswith("fallback.")))
    if any(k.startswith("decomposed.") for k in c):
        return "decomposed", ", ".join(sorted(k[11:] for k in c if k.startswith("decomposed.")))
    return "lowered", ""


def sweep(dtypes=DTYPES, max_samples=None, ops=None, progress=False):
    """Returns {(op name, variant, dtype): [(status, detail) per sample]}."""
    from torch.testing._internal.common_methods_invocations import op_db

    results = {}
    t0 = time.time()
    for k, op in enumerate(op_db):
        if ops is not None and op.name not in ops:
            continue
        reason = skip_reason(op)
        for dtype in dtypes:
            if dtype not in op.supported_dtypes("cpu"):
                continue
            key = (op.name, op.variant_test_name, str(dtype).replace("torch.", ""))
            if reason:
                results[key] = [("skipped", reason)]
                continue
            out = []
            try:
                samples = op.sample_inputs("cpu", dtype)
                for i, s in enumerate(samples):
                    if max_samples is not None and i >= max_samples:
                        break
                    out.append(run_sample(op, s, dtype))
            except Exception as e:  # the sample generator itself failed
                out.append(("skipped", f"sample generation failed: {type(e).__name__}"))
            results[key] = out
        if progress and k % 50 == 0:
            print(f"  {k}/{len(op_db)} ops, {time.time() - t0:.0f}s", flush=True)
    return results


def summarize(results):
    samples = collections.Counter(s for outs in results.values() for s, _ in outs)
    per_op = {}
    for key, outs in results.items():
        per_op[key] = max((s for s, _ in outs), key=RANK.get, default="skipped")
    ops = collections.Counter(per_op.values())
    return samples, ops, per_op
