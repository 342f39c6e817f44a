"""OpInfo parity sweep: every op in PyTorch's op_db, every sample input, on "tpu" against "cpu".

Each sample is classified by the path it took on tpu and by its result:
  lowered     ran only through tpu lowering rules (and metadata kernels)
  decomposed  used at least one PyTorch decomposition, still no CPU fallback
  fallback    used the counted CPU fallback for at least one op
  error       raised on tpu where CPU did not
  wrong       ran, but the values differ from CPU (a defect: never allowed silently)
  skipped     with a reason (random ops, uninitialized memory)
Used by tests/lowering/test_opinfo.py (a fast subset in CI) and scripts/gen_ops_doc.py --sweep (docs/ops.md).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import math
import time
import warnings

import torch
from torch.utils._pytree import tree_flatten

import torchtpu

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int32, torch.int64, torch.bool, torch.complex64]
RANK = {"lowered": 0, "decomposed": 1, "fallback": 2, "skipped": 3, "error": 4, "wrong": 5}

# Values differ from CPU by design (they draw from the tpu generator), or read uninitialized memory on CPU.
_RANDOM = {
    "bernoulli",
    "cauchy",
    "exponential",
    "geometric",
    "log_normal",
    "multinomial",
    "normal",
    "uniform",
    "rand_like",
    "randint",
    "randint_like",
    "randn",
    "randn_like",
    "nn.functional.alpha_dropout",
    "nn.functional.dropout",
    "nn.functional.dropout2d",
    "nn.functional.dropout3d",
    "nn.functional.feature_alpha_dropout",
    "nn.functional.fractional_max_pool2d",
    "nn.functional.fractional_max_pool3d",
    "nn.functional.rrelu",
    "nn.functional.multi_head_attention_forward",  # its samples use dropout
    "svd_lowrank",
    "pca_lowrank",
}  # random projections
# Samples that pass a tensor which must stay on the CPU (not movable by a generic transform).
_HOST_TENSOR_ARGS = {"tensor_split": "its tensor_indices_or_sections argument must be a CPU tensor"}
_VARIANT_SKIPS = {
    (
        "as_strided",
        "partial_views",
    ): "reads storage outside the input view, which moving the input to another device does not carry"
}
_UNINIT = ("empty", "new_empty", "empty_like", "empty_strided", "empty_permuted")


def skip_reason(op) -> str | None:
    if op.name in _RANDOM:
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
_MANY_TERMS = (
    "conv",
    "matmul",
    "mm",
    "einsum",
    "tensordot",
    "linear",
    "addm",
    "baddbmm",
    "bmm",
    "grid_sample",  # the grid gradient sums channels x taps, scaled by the image size
    "matrix_exp",  # products of matrices: entries near 0 next to entries of 1e5
    "svd",  # its gradient divides by gaps between singular values
    "householder_product",
)  # its gradient is a chain of matmuls (entries of 0.47 next to 34)


def _tol(dtype, op_name="", expected=None):
    tol = dict(rtol=2e-2, atol=2e-2) if dtype in (torch.bfloat16, torch.float16) else dict(rtol=1.3e-5, atol=1e-5)
    if (
        any(k in op_name for k in _MANY_TERMS)
        and isinstance(expected, torch.Tensor)
        and expected.numel()
        and (expected.dtype.is_floating_point or expected.dtype.is_complex)
    ):
        tol["atol"] *= max(1.0, float(expected.abs().max()))
    return tol


def _cotangent(shape, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=g, dtype=torch.float32).to(dtype).to(device)


def _normalize_grad_tol(sample, dtype):
    """x / ‖x‖ has the gradient (g − y·⟨y, g⟩) / ‖x‖: two terms of size |g| / ‖x‖ that cancel (to exactly 0
    along a dimension of size 1). In half precision what is left is an ulp of those terms, on CPU as on tpu
    (a bfloat16 sample with |x| = 0.064 and g = −2.1 leaves ±0.25 of a true 0), so the absolute tolerance
    scales with the largest term."""
    if dtype not in _HALF:
        return None
    x = sample.input.detach().float()
    dim, p, eps = sample.kwargs.get("dim", 1), sample.kwargs.get("p", 2.0), sample.kwargs.get("eps", 1e-12)
    norm = torch.linalg.vector_norm(x, p, dim, keepdim=True).clamp_min(eps) if x.dim() else x.abs().clamp_min(eps)
    term = float((_cotangent(x.shape, dtype, "cpu").float().abs() / norm).max()) if x.numel() else 1.0
    return dict(rtol=2e-2, atol=2e-2 * max(1.0, term))


def _attention_grad_tol(sample, dtype):
    """The query and key gradients of attention sum p * (g.v - g.out) * k * scale over the keys: terms of size
    |g| |v| |k| scale that cancel wherever the softmax is sharp (OpInfo's values in [-9, 9] give scores of ~200).
    What is left is a few ulps of those terms on CPU as on tpu: float32 CPU is 1.5e-5 off its float64 gradient on
    values of 33, tpu 2.6e-5; bfloat16 both 0.1 (one ulp at 20) where the true value is near 0."""
    k, v = sample.args[0], sample.args[1]
    scale = sample.kwargs.get("scale") or 1.0 / math.sqrt(sample.input.shape[-1])
    term = 3.0 * float(k.detach().abs().max()) * float(v.detach().abs().max()) * scale
    base = _tol(dtype)
    return dict(rtol=base["rtol"], atol=max(base["atol"], 4 * torch.finfo(dtype).eps * term))


# Gradient tolerances per op (a dict, or a function of the sample and dtype), each with why.
_GRAD_TOL = {
    "nn.functional.scaled_dot_product_attention": _attention_grad_tol,
    # A sample holds values of 1e4, where a float32 ulp is 1e-3: one ulp of difference in the forward output
    # becomes ~0.2% in its gradient exp(x - out) * grad.
    "logcumsumexp": dict(rtol=1e-2, atol=1e-3),
    "nn.functional.normalize": _normalize_grad_tol,
    # exp(lcab + nll - lp): nll and lcab are running sums of T log-sum-exps (about 60 for T = 50); float32
    # rounding along them leaves CPU itself 1.2e-4 away from its float64 gradient (tpu: the same), 4e-5 apart.
    "nn.functional.ctc_loss": dict(rtol=1e-4, atol=2e-4),
}


def _grad_tol(op, sample, dtype):
    tol = _GRAD_TOL.get(op.name)
    return tol(sample, dtype) if callable(tol) else tol


# Ops whose output dtype follows cuda (and PyTorch's meta kernel) rather than CPU: values still compared.
_CUDA_DTYPES = {
    "native_layer_norm": "mean and rstd are float32 for half-precision inputs, as on cuda; CPU keeps the input dtype",
}


def _device_resolved_options(sample, dtype):
    """linear_cross_entropy resolves acc_policy="auto" and acc_dtype=None per device type: float32 accumulation
    and the "accurate" policy on CPU, the input dtype and "compact" on any device it does not know (cuda below
    SM 8.0, tpu). Both sides run the options tpu resolves, so the comparison is of kernels, not policies."""
    opts = sample.kwargs.get("options")
    if opts is None or dtype not in _HALF or opts.acc_policy != "auto":
        return sample
    from torch.nn.modules.linear_cross_entropy_options import _AUTO_FALLBACK

    sample.kwargs["options"] = dataclasses.replace(
        opts, acc_policy=_AUTO_FALLBACK.acc_policy, acc_dtype=opts.acc_dtype or dtype
    )
    return sample


# Ops whose options resolve per device type, and how the sweep pins them.
_DEVICE_POLICY = {"nn.functional.linear_cross_entropy": _device_resolved_options}


def _to_tpu(x):
    if isinstance(x, torch.Tensor):
        return x.detach().to("tpu").requires_grad_(x.requires_grad)
    if isinstance(x, torch.device) and x.type == "cpu" or x == "cpu":
        return torch.device("tpu")  # factory samples name their device
    return x


def _compare(expected, actual, dtype, on_tpu=True, op_name="", tol=None):
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
            torch.testing.assert_close(
                a.cpu(),
                e,
                equal_nan=True,
                check_device=False,
                check_dtype=op_name not in _CUDA_DTYPES,
                **(tol or _tol(dtype, op_name, e)),
            )
        elif isinstance(e, float) and e != e:
            assert a != a
        else:
            assert e == a, (e, a)


# Ops whose indices for equal elements are unspecified unless stable=True (CPU's own order is not stable on
# large inputs): compare the values, and check that the tpu indices pick those values from the input.
_TIE_ORDER_FREE = {"sort", "argsort", "topk"}
# Selections whose index among equal values is unspecified (CPU's quickselect): the values must match and
# the tpu index must point at an element equal to the value.
_SELECT_TIES = {"kthvalue", "median", "nanmedian", "mode"}
# Sorts that return values only: the forward is compared; the gradient only when the input has no ties.
_TIE_ROUTED = {"msort"}


def _compare_selection(op, sample, expected, actual, dtype):
    _compare(expected[0], actual[0], dtype)
    x, idx = sample.input, actual[1].cpu()
    if x.dim() and idx.numel():
        rest = list(sample.args[1:] if op.name == "kthvalue" else sample.args)  # (dim, keepdim) after k
        dim = sample.kwargs.get("dim", rest[0] if rest else -1)
        keep = sample.kwargs.get("keepdim", rest[1] if len(rest) > 1 else False)
        picked = x.gather(dim, idx if keep else idx.unsqueeze(dim))
        _compare(expected[0] if keep else expected[0].unsqueeze(dim), picked, dtype, on_tpu=False)


def _compare_tie_free(op, sample, expected, actual, dtype):
    dim = sample.kwargs.get(
        "dim",
        sample.args[1]
        if op.name == "topk" and len(sample.args) > 1
        else (sample.args[0] if op.name != "topk" and sample.args and isinstance(sample.args[0], int) else -1),
    )
    x = sample.input
    if op.name == "argsort":
        idx = actual.cpu()
        _compare(x.gather(dim, expected) if x.dim() else x, x.gather(dim, idx) if x.dim() else x, dtype, on_tpu=False)
        return
    _compare(expected[0], actual[0], dtype)
    if x.dim():
        _compare(expected[0], x.gather(dim, actual[1].cpu()), dtype, on_tpu=False)


# -- Core ATen ---------------------------------------------------------------------------------------
# An op_db entry is a Core ATen op when the ATen op it names carries torch.Tag.core (the set that
# torch._decomp.core_aten_decompositions() decomposes to), found by its aten_name or its name without the
# namespace prefix; entries whose Python name differs from the core op they reach are listed by hand.
_CORE_BY_HAND = {
    **{
        f"nn.functional.conv{k}": "convolution"
        for k in ("1d", "2d", "3d", "_transpose1d", "_transpose2d", "_transpose3d")
    },
    "nn.functional.interpolate": "upsample_bilinear2d",
    "nn.functional.upsample_bilinear": "upsample_bilinear2d",
    "nn.functional.upsample_nearest": "upsample_nearest2d",
    "nn.functional.batch_norm": "_native_batch_norm_legit",
    "nn.functional.embedding_bag": "_embedding_bag",
    "cdist": "_cdist_forward",
    "nn.functional.pdist": "_pdist_forward",
    "nn.functional.grid_sample": "grid_sampler_2d",
    "nn.functional.max_pool1d": "max_pool2d_with_indices",
    **{f"fft.{k}": "_fft_r2c" for k in ("rfft", "rfft2", "rfftn")},
    **{f"fft.{k}": "_fft_c2r" for k in ("irfft", "irfft2", "irfftn")},
}
_NOT_CORE_PREFIXES = ("masked.", "sparse.", "_refs.")
_core_names = None


def core_aten_op(op) -> str | None:
    """The Core ATen op an op_db entry exercises, or None."""
    global _core_names
    if _core_names is None:
        _core_names = set()
        for name in dir(torch.ops.aten):
            packet = getattr(torch.ops.aten, name, None)
            if hasattr(packet, "overloads") and any(
                torch.Tag.core in getattr(packet, o).tags for o in packet.overloads()
            ):
                _core_names.add(name)
    if op.name.startswith(_NOT_CORE_PREFIXES):
        return None
    if op.name in _CORE_BY_HAND:
        return _CORE_BY_HAND[op.name]
    last = op.name.split(".")[-1]
    return next(
        (c for c in (op.aten_name, op.name, last, "_" + last, last + "_with_indices") if c in _core_names), None
    )


# Decompositions unique only up to the sign of each vector: compared by absolute values when the signs
# differ (LAPACK builds may flip them); their gradients go through the sample's output_process_fn_grad,
# which PyTorch's OpInfo defines to make them sign-invariant.
_SIGN_GAUGE = {"linalg.eigh", "svd", "linalg.svd", "svd_lowrank", "pca_lowrank"}


def _abs_outputs(x):
    return [t.abs() if isinstance(t, torch.Tensor) else t for t in tree_flatten(x)[0]]


def _compare_gauge(op, expected, actual, dtype):
    """Sign-invariant comparison; for a complete SVD of a non-square matrix the extra singular vectors
    only need to be an orthonormal completion, so those compare by orthonormality instead."""
    if op.name in ("svd", "linalg.svd") and isinstance(expected, tuple) and len(expected) == 3:
        u, s_, v = expected
        au, as_, av = (t.cpu() for t in actual)
        k = s_.shape[-1]
        vdim = -1 if op.name == "svd" else -2  # torch.svd returns V, linalg.svd Vh
        cut = lambda t, dim: t.narrow(dim, 0, min(k, t.shape[dim]))  # noqa: E731
        _compare(
            [cut(u, -1).abs(), s_, cut(v, vdim).abs()],
            [cut(au, -1).abs(), as_, cut(av, vdim).abs()],
            dtype,
            on_tpu=False,
            op_name=op.name,
        )
        for full in (au, av if op.name == "svd" else av.mT):  # singular vectors as columns
            if full.numel():
                eye = torch.eye(full.shape[-1], dtype=full.dtype).expand(full.mT.shape[:-2] + (full.shape[-1],) * 2)
                _compare(eye, full.mT @ full, dtype, on_tpu=False, op_name="matmul")
        return
    _compare(_abs_outputs(expected), _abs_outputs(actual), dtype, op_name=op.name)


def _grad_leaves(sample):
    return [
        t
        for t in tree_flatten((sample.input, sample.args, sample.kwargs))[0]
        if isinstance(t, torch.Tensor) and t.requires_grad
    ]


def _grads(outputs, leaves, seed=0):
    """Gradients of the float outputs (with fixed random cotangents) with respect to the leaves, or None."""
    outs = [
        o
        for o in tree_flatten(outputs)[0]
        if isinstance(o, torch.Tensor) and o.grad_fn is not None and (o.dtype.is_floating_point or o.dtype.is_complex)
    ]
    if not outs or not leaves:
        return None
    g = torch.Generator().manual_seed(seed)
    cots = [
        torch.randn(o.shape, generator=g, dtype=torch.complex64 if o.dtype.is_complex else torch.float32)
        .to(o.dtype)
        .to(o.device)
        for o in outs
    ]
    return torch.autograd.grad(outs, leaves, cots, allow_unused=True)


_HALF = (torch.float16, torch.bfloat16)


def _differentiable(dtype):
    return dtype.is_floating_point or dtype.is_complex


_WIDER = {
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    torch.float32: torch.float64,
    torch.complex64: torch.complex128,
}


def _close_to_wider_reference(op, sample, dtype, cpu, actual, grad_mask=None) -> bool:
    """When tpu and CPU disagree, the op computed by CPU in a wider float type decides, element by element: a
    tpu element within the dtype's tolerance of CPU's or of the wider reference is right (CPU's own kernel
    rounds intermediates, e.g. bf16 trilinear upsampling, overflows, e.g. a float16 gradient that is NaN on
    CPU and finite in float32, or cancels, e.g. layer norm's weight gradient over one element, exactly 0).
    With grad_mask (which leaves' gradients `cpu` and `actual` hold), gradients are compared."""
    wide = _WIDER.get(dtype)
    if wide is None:
        return False

    def up(x):
        if isinstance(x, torch.Tensor) and x.dtype == dtype:
            return x.detach().to(wide).requires_grad_(x.requires_grad)
        return x

    try:
        ref_sample = sample.transform(up)
        with torch.enable_grad() if grad_mask else torch.no_grad():
            ref = op(ref_sample.input, *ref_sample.args, **ref_sample.kwargs)
            if grad_mask:
                ref = [
                    g
                    for g, keep in zip(
                        _grads(ref_sample.output_process_fn_grad(ref), _grad_leaves(ref_sample)), grad_mask
                    )
                    if keep
                ]
        tol = _grad_tol(op, sample, dtype) if grad_mask else None
        narrow = [r.to(dtype) if isinstance(r, torch.Tensor) and r.dtype == wide else r for r in tree_flatten(ref)[0]]
        got = tree_flatten(actual)[0]
        merged = []  # tpu elements that match CPU's answer take the reference's value
        for n, c, a in zip(narrow, tree_flatten(cpu)[0], got):
            if (
                isinstance(a, torch.Tensor)
                and isinstance(c, torch.Tensor)
                and _differentiable(a.dtype)
                and a.shape == c.shape
            ):
                a = a.detach().cpu()
                same = torch.isclose(a, c.detach(), equal_nan=True, **(tol or _tol(dtype, op.name, c)))
                a = torch.where(same, n, a)
            merged.append(a)
        _compare(narrow, merged, dtype, on_tpu=False, op_name=op.name, tol=tol)
        return True
    except Exception:
        return False


def _fresh_cpu_grads(op, sample):
    """CPU's gradients recomputed on fresh leaves. NOTE: CPU's istft returns no window gradient for some
    OpInfo samples when called on the sample's own tensors, and the full gradient for the same values in fresh
    leaves (the tpu result equals the latter)."""
    fresh = sample.transform(
        lambda t: t.detach().clone().requires_grad_(t.requires_grad) if isinstance(t, torch.Tensor) else t
    )
    with torch.enable_grad():
        out = op(fresh.input, *fresh.args, **fresh.kwargs)
        return _grads(fresh.output_process_fn_grad(out), _grad_leaves(fresh))


def run_sample(op, sample, dtype, grad=False) -> tuple[str, str]:
    """Runs one sample on cpu and tpu; with grad, also the gradient of its float outputs (same cotangents)."""
    if sample.kwargs.get("dropout_p", 0) > 0:
        return "skipped", "dropout draws from the tpu generator, not the CPU one (tested in test_rng.py)"
    grad = grad and _differentiable(dtype) and op.supports_autograd and op.name not in _TIE_ORDER_FREE
    if (
        op.name in _TIE_ROUTED
        and isinstance(sample.input, torch.Tensor)
        and sample.input.unique().numel() < sample.input.numel()
    ):
        grad = False  # equal elements route their gradient by the (unspecified) tie order
    if op.name in _DEVICE_POLICY:
        sample = _DEVICE_POLICY[op.name](sample, dtype)
    try:
        with torch.enable_grad() if grad else torch.no_grad():
            expected = op(sample.input, *sample.args, **sample.kwargs)
            expected_grads = _grads(sample.output_process_fn_grad(expected), _grad_leaves(sample)) if grad else None
    except Exception:
        return "skipped", "CPU raises on this sample"
    tpu = sample.transform(_to_tpu)
    if isinstance(tpu.kwargs.get("device"), (str, torch.device)):
        tpu.kwargs["device"] = _to_tpu(tpu.kwargs["device"])
    tpu.args = tuple(_to_tpu(a) if isinstance(a, (str, torch.device)) else a for a in tpu.args)
    if (
        not any(isinstance(x, torch.Tensor) for x in tree_flatten((tpu.input, tpu.args, tpu.kwargs))[0])
        and "device" not in tpu.kwargs
        and isinstance(expected, torch.Tensor)
    ):
        tpu.kwargs["device"] = torch.device("tpu")  # a factory sample that names no device: ask for tpu
    torchtpu.metrics.reset()
    stage = "forward"
    try:
        with warnings.catch_warnings(), torch.enable_grad() if grad else torch.no_grad():
            warnings.simplefilter("ignore")
            actual = op(tpu.input, *tpu.args, **tpu.kwargs)
            if op.name in _TIE_ORDER_FREE and not sample.kwargs.get("stable", False):
                _compare_tie_free(op, sample, expected, actual, dtype)
            elif op.name in _SELECT_TIES and isinstance(expected, tuple):
                _compare_selection(op, sample, expected, actual, dtype)
                if not torch.equal(expected[1], actual[1].cpu()):
                    expected_grads = None  # another (valid) tie index: the gradient lands there instead
            else:
                try:
                    _compare(expected, actual, dtype, op_name=op.name)
                except AssertionError:
                    if op.name in _SIGN_GAUGE:
                        _compare_gauge(op, expected, actual, dtype)
                    elif not _close_to_wider_reference(op, sample, dtype, expected, actual):
                        raise
            if expected_grads is not None:
                stage = "gradient"
                actual_grads = _grads(tpu.output_process_fn_grad(actual), _grad_leaves(tpu))
                if any(e is None and a is not None for e, a in zip(expected_grads, actual_grads)):
                    expected_grads = _fresh_cpu_grads(op, sample)
                mask = [e is not None or a is not None for e, a in zip(expected_grads, actual_grads)]
                pairs = [(e, a) for e, a, keep in zip(expected_grads, actual_grads, mask) if keep]
                try:
                    _compare(
                        [e for e, _ in pairs],
                        [a for _, a in pairs],
                        dtype,
                        op_name=op.name,
                        tol=_grad_tol(op, sample, dtype),
                    )
                except AssertionError:
                    if not _close_to_wider_reference(
                        op, sample, dtype, [e for e, _ in pairs], [a for _, a in pairs], grad_mask=mask
                    ):
                        raise
    except AssertionError as e:
        return "wrong", f"{stage}: " + (str(e).splitlines()[0][:200] if str(e) else "mismatch")
    except Exception as e:
        return "error", f"{stage}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    c = torchtpu.metrics.counters()
    if any(k.startswith("fallback.") for k in c):
        return "fallback", ", ".join(sorted(k[9:] for k in c if k.startswith("fallback.")))
    if any(k.startswith("decomposed.") for k in c):
        return "decomposed", ", ".join(sorted(k[11:] for k in c if k.startswith("decomposed.")))
    return "lowered", ""


def sweep(dtypes=DTYPES, max_samples=None, ops=None, progress=False, core_only=False, grad=True, sample_index=None):
    """Returns {(op name, variant, dtype): [(status, detail) per sample]}; with grad, differentiable float
    samples also compare their gradients. sample_index: only that sample of each op (its last one if it has
    fewer)."""
    from torch.testing._internal.common_methods_invocations import op_db

    results = {}  # {(name, variant, dtype): [(status, detail)]}
    t0 = time.time()
    for k, op in enumerate(op_db):
        if ops is not None and op.name not in ops or core_only and core_aten_op(op) is None:
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
                g = grad and _differentiable(dtype) and op.supports_autograd
                samples = op.sample_inputs("cpu", dtype, requires_grad=g)
                if sample_index is not None:
                    samples = list(itertools.islice(samples, sample_index + 1))[-1:]
                elif max_samples is not None:
                    samples = itertools.islice(samples, max_samples)
                for s in samples:
                    out.append(run_sample(op, s, dtype, grad=g))
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


def core_summary(results, dtype="float32"):
    """Samples of Core ATen op_db entries in dtype, by status."""
    from torch.testing._internal.common_methods_invocations import op_db

    core = {(op.name, op.variant_test_name) for op in op_db if core_aten_op(op)}
    return collections.Counter(
        s for (n, v, d), outs in results.items() if d == dtype and (n, v) in core for s, _ in outs
    )
