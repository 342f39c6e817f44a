"""Random ops from the tpu generator: counter-based Philox (seed, offset) as a runtime parameter,
so streams are reproducible and identical in every mode."""

from __future__ import annotations

import math

import torch

from .. import emit as E
from .. import jaxfn
from ..tables import inplace_lowering, lowering, out_meta


def _state(tr, generator, numel):
    return tr.rng_state(generator, max(1, numel))


def uniform01(tr, generator, shape, dtype):
    """Uniform [0, 1) in dtype (f64 from 52 random bits, everything else from 23-bit f32)."""
    n = max(1, math.prod(shape))
    st = _state(tr, generator, n)
    if dtype == torch.float64:
        _, bits = E.rng_bit_generator(st, shape, torch.uint64)
        mant = E.binary("shift_right_logical", bits, E.const(tr.fn, 12, torch.uint64, shape))
        one = E.binary("or", mant, E.const(tr.fn, 0x3FF0000000000000, torch.uint64, shape))
        return E.sub(E.bitcast(one, torch.float64), E.const(tr.fn, 1.0, torch.float64, shape))
    _, bits = E.rng_bit_generator(st, shape, torch.uint32)
    mant = E.binary("shift_right_logical", bits, E.const(tr.fn, 9, torch.uint32, shape))
    one = E.binary("or", mant, E.const(tr.fn, 0x3F800000, torch.uint32, shape))
    u = E.sub(E.bitcast(one, torch.float32), E.const(tr.fn, 1.0, torch.float32, shape))
    return u


def _clamp_below(u, hi, lo):
    """Rounding to a narrower float may reach the open upper bound: map it back to lo."""
    return E.select(E.compare(u, hi, "GE"), lo, u)


@inplace_lowering("uniform_")
def uniform_(tr, x, from_=0.0, to=1.0, generator=None):
    if from_ > to:
        raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found from={from_} > to={to}")
    dt = x.dtype
    u = uniform01(tr, generator, x.shape, dt)
    ct = u.dtype
    lo, hi = E.broadcast_to(tr.scalar(from_, ct), x.shape), E.broadcast_to(tr.scalar(to, ct), x.shape)
    v = E.convert(E.add(lo, E.mul(u, E.sub(hi, lo))), dt)
    return _clamp_below(v, E.convert(hi, dt), E.convert(lo, dt)) if dt != ct else v


def normal01(tr, generator, shape, dtype):
    """Box-Muller over two uniforms; computed in f32 (f64 for f64)."""
    ct = torch.float64 if dtype == torch.float64 else torch.float32
    n = max(1, math.prod(shape))
    u = uniform01(tr, generator, (2, n), ct)
    u1 = E.reshape(E.slice_(u, [0, 0], [1, n]), (n,))
    u2 = E.reshape(E.slice_(u, [1, 0], [2, n]), (n,))
    one = E.const(tr.fn, 1.0, ct, (n,))
    r = E.unary("sqrt", E.mul(E.const(tr.fn, -2.0, ct, (n,)), E.unary("log", E.sub(one, u1))))
    z = E.mul(r, E.unary("cosine", E.mul(E.const(tr.fn, 2 * math.pi, ct, (n,)), u2)))
    return E.reshape(z, shape)


@inplace_lowering("normal_")
def normal_(tr, x, mean=0.0, std=1.0, generator=None):
    z = normal01(tr, generator, x.shape, x.dtype)
    ct = z.dtype
    v = E.add(E.mul(z, E.broadcast_to(tr.scalar(std, ct), x.shape)), E.broadcast_to(tr.scalar(mean, ct), x.shape))
    return E.convert(v, x.dtype)


@inplace_lowering("bernoulli_.float")
def bernoulli_float_(tr, x, p=0.5, generator=None):
    u = uniform01(tr, generator, x.shape, torch.float32)
    return E.convert(E.compare(u, E.broadcast_to(tr.scalar(p, torch.float32), x.shape), "LT"), x.dtype)


@inplace_lowering("bernoulli_.Tensor")
def bernoulli_tensor_(tr, x, p, generator=None):
    ct = torch.float64 if p.dtype == torch.float64 else torch.float32
    u = uniform01(tr, generator, x.shape, ct)
    return E.convert(E.compare(u, E.broadcast_to(E.convert(p, ct), x.shape), "LT"), x.dtype)


@inplace_lowering("random_.from")
def random_from_(tr, x, from_, to=None, generator=None):
    if to is None:
        to = (
            2**63 - 1
            if x.dtype == torch.int64
            else (2 ** (torch.finfo(x.dtype).nmant + 1) if x.dtype.is_floating_point else torch.iinfo(x.dtype).max + 1)
        )
    span = to - from_
    u = uniform01(tr, generator, x.shape, torch.float64)
    v = E.unary("floor", E.mul(u, E.const(tr.fn, float(span), torch.float64, x.shape)))
    v = E.add(E.convert(v, torch.int64), E.broadcast_to(tr.scalar(from_, torch.int64), x.shape))
    return E.convert(v, x.dtype)


@inplace_lowering("random_.to")
def random_to_(tr, x, to, generator=None):
    return random_from_(tr, x, 0, to, generator)


@lowering("multinomial")
def multinomial(tr, probs, num_samples, replacement=False, generator=None):
    """Samples from the tpu generator (not cpu's stream, as on cuda), in one program: without replacement an
    exponential race (the num_samples largest p / E with E ~ Exp(1), distinct categories, which is sampling
    without replacement); with it, each draw u ~ U[0, 1) finds its category in the running sum. cpu's checks of
    the values run on the device (Trace.check): a negative, inf or nan probability, a row summing to 0, fewer
    nonzero categories than samples without replacement."""
    if probs.rank not in (1, 2):
        raise RuntimeError(f"multinomial: prob_dist must be 1 or 2 dim, got {probs.rank} dims")
    if not probs.dtype.is_floating_point:
        raise RuntimeError(f"multinomial only supports floating-point dtypes for input, got: {probs.dtype}")
    n = probs.shape[-1]
    if num_samples <= 0:
        raise RuntimeError(f"multinomial: cannot sample n_sample <= 0 samples, got {num_samples}")
    if not replacement and num_samples > n:
        raise RuntimeError(
            f"multinomial: cannot sample n_sample > prob_dist.size(-1) samples without replacement "
            f"({num_samples} > {n})"
        )
    if n == 0:
        raise RuntimeError("multinomial: number of categories cannot be zero")
    if n > 1 << 24:  # cpu's and cuda's limit (float32 counts categories exactly up to 2^24)
        raise RuntimeError(f"multinomial: number of categories cannot exceed 2^24, got {n} ({probs.dtype})")
    m = out_meta(tr)
    rows = probs.numel // n
    if rows == 0:
        return E.const(tr.fn, 0, torch.int64, tuple(m.shape))
    ct = torch.float64 if probs.dtype == torch.float64 else torch.float32
    p = E.reshape(E.convert(probs, ct), (rows, n))
    u = uniform01(tr, generator, (rows, num_samples if replacement else n), ct)

    def checks(pv):
        import jax.numpy as jnp

        bad_value = ~jnp.isfinite(pv) | (pv < 0)
        total = jnp.sum(jnp.where(bad_value, 0, pv), axis=-1)
        nonzero = jnp.sum(pv > 0, axis=-1)
        return bad_value.any(axis=-1), total <= 0, nonzero < num_samples

    bad_value, bad_sum, too_few = jaxfn.call(tr, "multinomial_checks", checks, [p], static=(num_samples,))
    zeros = E.const(tr.fn, 0, torch.int64, (rows,))
    tr.check(bad_value, zeros, RuntimeError, "probability tensor contains either `inf`, `nan` or element < 0")
    tr.check(bad_sum, zeros, RuntimeError, "invalid multinomial distribution (sum of probabilities <= 0)")
    if not replacement:
        tr.check(
            too_few,
            zeros,
            RuntimeError,
            "invalid multinomial distribution (with replacement=False, not enough non-negative category to sample)",
        )

    def draw(pv, uv):
        import jax
        import jax.numpy as jnp

        if replacement:
            cdf = jnp.cumsum(pv, axis=-1)
            cdf = cdf / cdf[:, -1:]
            idx = jax.vmap(lambda c, x: jnp.searchsorted(c, x, side="right"))(cdf, uv)
            return jnp.minimum(idx, n - 1).astype(jnp.int64)
        # Exp(1) = -log(1 - u); zero-probability categories get key 0 (chosen last, and only if too few)
        keys = pv / -jnp.log1p(-uv)
        return jax.lax.top_k(keys, num_samples)[1].astype(jnp.int64)

    (idx,) = jaxfn.call(tr, "multinomial", draw, [p, u], static=(num_samples, bool(replacement)))
    return E.reshape(idx, tuple(m.shape))
