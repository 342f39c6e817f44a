"""copy_ between cpu and tpu (both directions) and within tpu, and host reads of values."""

from __future__ import annotations

import torch

from .. import _C, metrics, runtime
from .. import emit as E
from .. import executor as X
from .. import views as V
from ..arguments import device_index as _device_index
from ..errors import op_error
from ..tables import direct, inplace_lowering


def _upload(dst: torch.Tensor, src_cpu: torch.Tensor) -> None:
    """Writes CPU values (already dst's dtype and shape) into tpu tensor dst."""
    buf = runtime.get().to_device(src_cpu.contiguous().clone(), dst.device.index or 0)
    metrics.inc("transfers.h2d")
    metrics.inc("bytes.h2d", src_cpu.numel() * src_cpu.element_size())
    _write_buffer(dst, buf)


def _copy_between_devices(dst: torch.Tensor, src: torch.Tensor) -> None:
    """tpu:i -> tpu:j: src's values (dst's dtype, broadcast to dst's shape) in one buffer on device i, moved to
    device j by PJRT (no host round trip through torch)."""
    tmp = torch.empty(dst.shape, dtype=dst.dtype, device=src.device)
    tr = X.direct_trace("copy_", src.device.index or 0)
    tr.write(tmp, _stored(E.convert(tr.read_value(src), dst.dtype), dst))
    tr.record()
    buf = runtime.get().move(X.buffer_of(tmp, X.Cut.host_read), dst.device.index or 0)
    metrics.inc("transfers.d2d")
    metrics.inc("bytes.d2d", dst.numel() * dst.element_size())
    _write_buffer(dst, buf)


def _write_buffer(dst: torch.Tensor, buf) -> None:
    """Stores device buffer `buf` (dst's dtype and shape, on dst's device) as dst's values."""
    if V.covers_storage(dst):
        _C._set_storage_buffer(dst, buf, dst.dtype, tuple(buf.shape))
        return
    tmp = torch.empty(dst.shape, dtype=dst.dtype, device=dst.device)
    _C._set_storage_buffer(tmp, buf, dst.dtype, tuple(buf.shape))
    tr = X.direct_trace("copy_", dst.device.index or 0)
    tr.write(dst, tr.read(tmp))
    tr.record()


@inplace_lowering("copy_")
def copy_rule(tr, self, src, non_blocking=False):
    """tpu -> tpu on one device (the C++ path): src in self's dtype and shape; under self's conj/neg bit, what
    self's storage holds for those values."""
    dst = tr.arg_of(self)
    return _stored(E.broadcast_to(E.convert(src, dst.dtype), tuple(dst.shape)), dst)


@direct("copy_")
def copy_(self: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """The copies the C++ path does not take: from or to the host, between devices."""
    metrics.inc("op.copy_")
    if self.numel() == 0:
        return self
    try:
        if torch.broadcast_shapes(src.shape, self.shape) != self.shape:
            raise RuntimeError(f"output with shape {list(self.shape)} doesn't match the broadcast shape")
    except RuntimeError as e:
        raise op_error("copy_", [self, src], {}, e) from None
    if self.device.type == "tpu" and src.device.type == "tpu":
        if self.device != src.device:
            _copy_between_devices(self, src)
            return self
        tr = X.direct_trace("copy_", self.device.index or 0)
        tr.write(self, _stored(tr.read_value(src), self))
        tr.record()
    elif self.device.type == "tpu":
        if src.device.type != "cpu":
            src = src.cpu()
        src = src.resolve_conj().resolve_neg().to(self.dtype).expand(self.shape)
        _upload(self, src.conj_physical() if self.is_conj() else -src if self.is_neg() else src)
    else:  # tpu -> host
        host = X.read_host(src, "copy_to_cpu")
        self.copy_(host.conj_physical() if src.is_conj() else -host if src.is_neg() else host)
    return self


def _stored(value, dst):
    """What dst's storage holds for these values of dst: their conjugate / negation under a conj / neg bit."""
    if dst.is_conj():
        value = E.conj(value)
    if dst.is_neg():
        value = E.unary("negate", value)
    return value


@direct("_copy_from")
def _copy_from(self, dst, non_blocking=False):
    return copy_(dst, self, non_blocking)


@direct("_copy_from_and_resize")
def _copy_from_and_resize(self, dst):
    if dst.shape != self.shape:
        dst.resize_(self.shape)
    return copy_(dst, self)


@direct("_local_scalar_dense")
def _local_scalar_dense(self):
    metrics.inc("op._local_scalar_dense")
    if self.numel() != 1:
        raise op_error(
            "_local_scalar_dense",
            [self],
            {},
            "a Tensor with more than one element cannot be converted to a Python scalar",
        )
    return X.read_host(self, "item").item()


@direct("equal")
def equal(self, other):
    metrics.inc("op.equal")
    _device_index("equal", [self, other], {})
    if self.shape != other.shape:
        return False
    return bool(torch.equal(X.read_host(self, "equal"), X.read_host(other, "equal")))


# -- GradScaler's ops, composed from tpu ops: no host sync, no CPU fallback --------------------------
@direct("_amp_foreach_non_finite_check_and_unscale_")
def amp_unscale_(grads, found_inf, inv_scale):
    metrics.inc("op._amp_foreach_non_finite_check_and_unscale_")
    if not grads:
        return None
    bad = torch.stack([(~torch.isfinite(g)).any() for g in grads]).any()
    found_inf.copy_(torch.maximum(found_inf, bad.to(found_inf.dtype)))
    torch._foreach_mul_(grads, inv_scale)
    return None


@direct("_amp_update_scale_")
def amp_update_scale_(scale, growth_tracker, found_inf, growth_factor, backoff_factor, growth_interval):
    metrics.inc("op._amp_update_scale_")
    inf = found_inf > 0
    grown = growth_tracker + 1
    do_grow = (~inf) & (grown >= growth_interval)
    new_scale = torch.where(inf, scale * backoff_factor, torch.where(do_grow, scale * growth_factor, scale))
    new_tracker = torch.where(inf | do_grow, torch.zeros_like(growth_tracker), grown)
    scale.copy_(new_scale)
    growth_tracker.copy_(new_tracker)
    return scale
