"""The ceiling for a training step: the examples' GPT written in JAX, the whole AdamW step in one ``jax.jit`` on the
same XLA (here XLA:CPU). It starts from the PyTorch model's own parameters and takes the same batches, so its
losses match PyTorch's (checked by bench/eager.py)."""

from __future__ import annotations

import math

import numpy as np


def params_of(model):
    """The PyTorch GPT's parameters as a dict of numpy arrays (same names)."""
    return {k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}


def make_step(heads, layers, lr=3e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
    """(init(params) -> state, step(state, idx, targets) -> (state, loss)), the step jitted whole."""
    import jax
    import jax.numpy as jnp

    def layer_norm(x, w, b, eps=1e-5):
        m = x.mean(-1, keepdims=True)
        v = ((x - m) ** 2).mean(-1, keepdims=True)
        return (x - m) / jnp.sqrt(v + eps) * w + b

    def linear(x, p, name, bias=True):
        y = x @ p[name + ".weight"].T
        return y + p[name + ".bias"] if bias else y

    def loss_fn(p, idx, targets):
        b, t = idx.shape
        x = p["tok.weight"][idx] + p["pos.weight"][jnp.arange(t)]
        d = x.shape[-1]
        hd = d // heads
        mask = jnp.tril(jnp.ones((t, t), bool))
        for i in range(layers):
            pre = f"blocks.{i}."
            h = layer_norm(x, p[pre + "ln1.weight"], p[pre + "ln1.bias"])
            q, k, v = jnp.split(linear(h, p, pre + "qkv"), 3, axis=-1)
            q, k, v = (z.reshape(b, t, heads, hd).transpose(0, 2, 1, 3) for z in (q, k, v))
            att = (q @ k.transpose(0, 1, 3, 2)) / math.sqrt(hd)
            att = jax.nn.softmax(jnp.where(mask, att, -jnp.inf), axis=-1)
            y = (att @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
            x = x + linear(y, p, pre + "proj")
            h = layer_norm(x, p[pre + "ln2.weight"], p[pre + "ln2.bias"])
            x = x + linear(jax.nn.gelu(linear(h, p, pre + "fc"), approximate=False), p, pre + "out")
        logits = linear(layer_norm(x, p["ln.weight"], p["ln.bias"]), p, "head", bias=False)
        logp = jax.nn.log_softmax(logits.reshape(-1, logits.shape[-1]), axis=-1)
        return -jnp.take_along_axis(logp, targets.reshape(-1, 1), axis=1).mean()

    def init(params):
        p = {k: jnp.asarray(v) for k, v in params.items()}
        zeros = {k: jnp.zeros_like(v) for k, v in p.items()}
        return p, zeros, dict(zeros), jnp.zeros((), jnp.float32)

    @jax.jit
    def step(state, idx, targets):
        p, m, v, n = state
        loss, g = jax.value_and_grad(loss_fn)(p, idx, targets)
        n = n + 1
        b1, b2 = betas
        c1, c2 = 1 - b1**n, 1 - b2**n
        newp, newm, newv = {}, {}, {}
        for k in p:
            w = p[k] * (1 - lr * weight_decay)
            newm[k] = b1 * m[k] + (1 - b1) * g[k]
            newv[k] = b2 * v[k] + (1 - b2) * g[k] * g[k]
            newp[k] = w - lr * (newm[k] / c1) / (jnp.sqrt(newv[k] / c2) + eps)
        return (newp, newm, newv, n), loss

    return init, step


def as_jax(batch):
    import jax.numpy as jnp

    return [jnp.asarray(np.asarray(x)) for x in batch]
