"""ATen call arguments: the overload of a name, their tensors, and the device an op runs on.

Shared by the op table's kernels (kernels.py), the lowering rules that run on real tensors (lowering/copy.py) and
the CPU fallback (fallback.py).
"""

from __future__ import annotations

import torch

from .errors import op_error


def overload(name: str):
    ns, _, rest = name.rpartition("::")  # "add.Tensor", or "ns::name.overload" (torchtpu.jax_op's ops)
    packet, _, ov = rest.partition(".")
    return getattr(getattr(getattr(torch.ops, ns or "aten"), packet), ov or "default")


def is_tpu(x):
    return isinstance(x, torch.Tensor) and x.device.type == "tpu"


def flat(args, kwargs):
    for a in (*args, *kwargs.values()):
        if isinstance(a, (list, tuple)):
            yield from a
        else:
            yield a


def device_index(opname, args, kwargs) -> int:
    """The tpu device of the op; rejects tensors on two devices (0-d CPU tensors are scalars, as on cuda)."""
    dev = None
    for x in flat(args, kwargs):
        if isinstance(x, torch.Tensor):
            if x.device.type == "tpu":
                if dev is None:
                    dev = x.device
                elif x.device != dev:
                    raise op_error(
                        opname,
                        args,
                        kwargs,
                        "Expected all tensors to be on the same device, but found at least two devices, "
                        f"{dev} and {x.device}",
                    )
            elif x.dim() != 0 or x.device.type != "cpu":
                raise op_error(
                    opname,
                    args,
                    kwargs,
                    "Expected all tensors to be on the same device, but found at least two devices, "
                    f"tpu and {x.device} (move the {x.device} tensor with .to('tpu'))",
                )
    if dev is None:
        d = kwargs.get("device")
        return (d.index or 0) if isinstance(d, torch.device) and d.index is not None else torch.tpu.current_device()
    return dev.index or 0


def map_args(fn, args, kwargs):
    """tree_map for ATen arguments (values, or lists/tuples of them): much cheaper than pytree."""

    def one(x):
        return type(x)(fn(v) for v in x) if isinstance(x, (list, tuple)) else fn(x)

    return [one(a) for a in args], {k: one(v) for k, v in kwargs.items()}
