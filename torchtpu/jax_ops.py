"""JAX functions (``jnp``/``lax`` code, Pallas kernels) as PyTorch ops on tpu tensors: ``torchtpu.jax_op``.

    @torchtpu.jax_op
    def rms_norm(x, w):
        return x * jax.lax.rsqrt((x * x).mean(-1, keepdims=True) + 1e-6) * w

    y = rms_norm(x_tpu, w_tpu)          # a real torch op: torch.ops.torchtpu_jax.rms_norm

Each decorated function becomes a ``torch.library`` op ``torchtpu_jax::<name>(Tensor[] args) -> Tensor[]`` with
- on tpu: the C++ kernel of every other op. Its lowering rule lowers the JAX function for the argument types
  once (``jaxfn.call``: ``jax.jit(f).lower(...)``, inlined as a private function of the op's fragment), so the
  op costs what any op costs, fuses with its neighbours in fused mode and is captured into compiled graphs. No
  copies: the function reads the storages' device buffers inside the program.
- a fake/meta implementation from ``jax.eval_shape`` (torch.compile, meta tensors);
- autograd from ``jax.vjp`` of the function (recomputing the forward inside the backward op), or from a given
  ``backward(*inputs, *output_cotangents) -> input cotangents`` written in JAX (Pallas kernels need one);
- on cpu tensors: the function runs through JAX on the host CPU (XLA:CPU), the values copied both ways.
Errors name the JAX function, the argument shapes and dtypes. Pallas runs on XLA:CPU only with ``interpret=True``.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from . import _C, jaxfn, kernels, tables
from . import dtypes as D

NAMESPACE = "torchtpu_jax"
_lib = torch.library.Library(NAMESPACE, "FRAGMENT")
_ops: dict = {}


class JaxOpError(RuntimeError):
    pass


def _describe(fn_name, args) -> str:
    parts = [
        f"{D.to_numpy(a.dtype).name if hasattr(a, 'dtype') else type(a).__name__}{list(a.shape)}"
        if hasattr(a, "shape")
        else repr(a)
        for a in args
    ]
    return f"jax_op {fn_name}({', '.join(parts)})"


def _flat(fn):
    """fn returning an array or a tuple/list of arrays -> a function returning a tuple of arrays."""

    def flat(*args):
        import jax

        return tuple(jax.tree_util.tree_leaves(fn(*args)))

    return flat


def _eval_shape(fn, fn_name, specs):
    import jax

    try:
        return jax.eval_shape(fn, *[jax.ShapeDtypeStruct(tuple(s), D.to_numpy(d)) for s, d in specs])
    except Exception as e:  # noqa: BLE001 (JAX's own error, with the shapes it saw)
        shapes = ", ".join(f"{D.to_numpy(d).name}{list(s)}" for s, d in specs)
        raise JaxOpError(
            f"jax_op {fn_name}({shapes}): the JAX function fails on these shapes: {type(e).__name__}: {e}"
        ) from None


def _define(name: str, fn, fn_name: str):
    """Registers torchtpu_jax::name for the flat function fn; returns the OpOverload."""
    flat = _flat(fn)
    _lib.define(f"{name}(Tensor[] args) -> Tensor[]")
    qual = f"{NAMESPACE}::{name}"

    def fake(args):
        outs = _eval_shape(flat, fn_name, [(a.shape, a.dtype) for a in args])
        dev = args[0].device if args else torch.device("cpu")
        return [torch.empty(o.shape, dtype=D.from_numpy(o.dtype), device=dev) for o in outs]

    torch.library.register_fake(qual, fake, lib=_lib)

    def cpu(args):
        import jax

        cpu_dev = jax.devices("cpu")[0]
        xs = [
            jax.device_put(
                np.asarray(
                    a.detach().contiguous().numpy()
                    if a.dtype != torch.bfloat16
                    else a.detach().float().numpy().astype(D.to_numpy(a.dtype))
                ),
                cpu_dev,
            )
            for a in args
        ]
        try:
            outs = jax.jit(flat)(*xs)
        except Exception as e:  # noqa: BLE001
            raise JaxOpError(f"{_describe(fn_name, args)}: {type(e).__name__}: {e}") from None
        return [
            torch.from_numpy(np.array(o))
            if o.dtype != D.to_numpy(torch.bfloat16)
            else torch.from_numpy(np.array(o.astype(np.float32))).to(torch.bfloat16)
            for o in outs
        ]

    _lib.impl(name, cpu, "CPU")

    def rule(tr, args):
        try:
            return list(jaxfn.call(tr, f"{name}", flat, list(args)))
        except Exception as e:  # noqa: BLE001
            raise JaxOpError(
                f"{_describe(fn_name, args)}: lowering the JAX function failed: {type(e).__name__}: {e}"
            ) from None

    tables.RULES[qual] = rule
    kernels.KERNELS[qual] = ("functional", qual, rule, None)
    _C._register_kernels([qual])
    return getattr(getattr(torch.ops, NAMESPACE), name).default


def jax_op(fn=None, *, name: str | None = None, backward=None):
    """Turns a JAX function of arrays into a PyTorch op (see the module's doc). ``backward(*inputs, *cotangents)``
    (a JAX function returning one cotangent per input) replaces ``jax.vjp`` where JAX cannot differentiate
    (Pallas kernels)."""
    if fn is None:
        return functools.partial(jax_op, name=name, backward=backward)
    fn_name = getattr(fn, "__name__", "fn")
    name = name or "".join(c if c.isalnum() else "_" for c in fn_name)
    if name in _ops:
        raise ValueError(f"torchtpu.jax_op: an op named {name!r} exists already (pass name=...)")
    op = _define(name, fn, fn_name)
    flat = _flat(fn)
    bwd_ops: dict = {}

    def make_bwd(n_inputs):
        def bwd(*a):
            import jax

            primals, cots = a[:n_inputs], a[n_inputs:]
            if backward is not None:
                return tuple(jax.tree_util.tree_leaves(backward(*primals, *cots)))
            _, pull = jax.vjp(flat, *primals)
            return tuple(pull(tuple(cots)))

        return bwd

    def bwd_op(n_inputs):
        if n_inputs not in bwd_ops:
            bwd_ops[n_inputs] = _define(f"{name}_backward_{n_inputs}", make_bwd(n_inputs), f"{fn_name} (backward)")
        return bwd_ops[n_inputs]

    def setup(ctx, inputs, output):
        ctx.save_for_backward(*inputs[0])
        ctx.out_specs = [(o.shape, o.dtype, o.device) for o in output]

    def backward_impl(ctx, grads):
        xs = ctx.saved_tensors
        cots = [
            g if g is not None else torch.zeros(s, dtype=d, device=dev) for g, (s, d, dev) in zip(grads, ctx.out_specs)
        ]
        return (list(bwd_op(len(xs))(list(xs) + cots)),)

    torch.library.register_autograd(f"{NAMESPACE}::{name}", backward_impl, setup_context=setup, lib=_lib)

    @functools.wraps(fn)
    def call(*tensors):
        for i, t in enumerate(tensors):
            if not isinstance(t, torch.Tensor):
                raise TypeError(
                    f"jax_op {fn_name}: argument {i} is a {type(t).__name__}; jax ops take tensors "
                    "(close over other values in the JAX function)"
                )
        outs = op(list(tensors))
        return outs[0] if len(outs) == 1 else tuple(outs)

    call.op = op
    _ops[name] = call
    return call


__all__ = ["jax_op", "JaxOpError"]
