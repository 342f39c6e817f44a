"""JAX functions as StableHLO inside our programs.

`call(tr, name, f, args, static)` lowers the JAX function `f` for the argument types once (cached), makes
its `@main` a private function of the module being traced and calls it. Rules use this where JAX already
has a careful lowering (convolutions and their gradients); the custom-kernel interop issue builds on it.
"""

from __future__ import annotations

import hashlib
import re

from . import dtypes as D
from . import runtime
from .hlo import Value

_cache: dict = {}
_FUNC = re.compile(r"func\.func (?:public |private )?@([\w$.]+)")
_RESULT_ATTRS = re.compile(r" \{jax\.result_info = \"[^\"]*\"\}")


def _lower(name, f, avals):
    import jax

    runtime.get().backend  # jax configured (x64, platform) before tracing anything
    specs = [jax.ShapeDtypeStruct(s, D.to_numpy(d)) for s, d in avals]
    text = jax.jit(f, keep_unused=True).lower(*specs).as_text()
    outs = jax.tree_util.tree_leaves(jax.eval_shape(f, *specs))
    results = [(tuple(o.shape), D.from_numpy(o.dtype)) for o in outs]
    fname = f"jax_{name}_{hashlib.sha1(text.encode()).hexdigest()[:12]}"
    body = text[text.index("{", text.index("attributes {") + len("attributes {")) + 1 : text.rindex("}")]
    for sym in set(_FUNC.findall(body)):
        new = fname if sym == "main" else f"{fname}__{sym}"
        body = re.sub(rf"@{re.escape(sym)}\b", f"@{new}", body)
    body = body.replace(f"func.func public @{fname}", f"func.func private @{fname}")
    body = _RESULT_ATTRS.sub("", body)
    return fname, body.strip("\n"), results


def call(tr, name: str, f, args: list[Value], static=()) -> list[Value]:
    key = (name, static, tuple((a.shape, a.dtype) for a in args))
    entry = _cache.get(key)
    if entry is None:
        entry = _cache[key] = _lower(name, f, [(a.shape, a.dtype) for a in args])
    fname, body, results = entry
    tr.fn.funcs[fname] = body
    return tr.fn.op_multi("func.call", args, results, attrs=f"callee = @{fname}")


def acc_dtype(dt):
    """The JAX twin of emit.acc_dtype: float32 for bfloat16/float16 arrays, the dtype itself otherwise."""
    import jax.numpy as jnp

    return jnp.float32 if dt in (jnp.bfloat16, jnp.float16) else dt


def vjp_in_acc(f, grad, x):
    """The gradient of f at x for the cotangent grad (broadcast to f's output), computed in acc_dtype and
    rounded once to x's dtype."""
    import jax
    import jax.numpy as jnp

    wide = acc_dtype(x.dtype)
    out, vjp = jax.vjp(f, x.astype(wide))
    return vjp(jnp.broadcast_to(grad.astype(wide), out.shape))[0].astype(x.dtype)


__all__ = ["acc_dtype", "call", "vjp_in_acc"]
