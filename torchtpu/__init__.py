"""torchtpu: TPUs (and any PJRT device) as the native PyTorch device ``"tpu"``.

``import torchtpu`` (or plain ``import torch``, through the ``torch.backends`` entry point)
renames PrivateUse1 to "tpu", registers ``torch.tpu`` and every kernel.
"""

from __future__ import annotations

from . import config  # noqa: F401  (every TORCHTPU_* knob)
from .version import __version__


def _autoload():
    """Entry point for torch.backends autoload: importing this module does the work.

    NOTE: defined before `import torch`, because that import may itself autoload us.
    """


import atexit  # noqa: E402  (after _autoload: see its note)

import torch  # noqa: E402

if torch._C._get_privateuse1_backend_name() != "tpu":
    torch.utils.rename_privateuse1_backend("tpu")

# the order below is the order of registration
# isort: off
from . import _C  # noqa: E402  (the C++ half: allocator, guard, hooks, generator, metadata ops)
from . import device as _device_module  # noqa: E402
from . import runtime as _runtime  # noqa: E402

_C._set_device_count(_runtime.get().device_count())
torch._register_device_module("tpu", _device_module)
torch.utils.generate_methods_for_privateuse1_backend(for_tensor=True, for_module=True, for_storage=True)

from . import metrics  # noqa: E402
from .executor import get_mode, mode, set_mode, synchronize as _sync  # noqa: E402
from . import lowering  # noqa: E402,F401  (fills the lowering tables)
from . import kernels as _kernels  # noqa: E402
from . import fallback as _fallback  # noqa: E402
from . import shapes as _shapes  # noqa: E402  (registers the eager bucketing lowerers and its Python kernels)
from .shapes import set_shape_buckets  # noqa: E402
from . import collectives as _collectives  # noqa: E402
# isort: on

_shapes.eager_buckets.sync()  # the C++ path's bucketing, as the policy says
_C._set_callbacks(_kernels.callbacks())
if torch.distributed.is_available():
    from . import distributed as _distributed  # noqa: E402  (the c10d backend "tpu")

    _distributed.register()
_kernels.register_all()
_collectives.register()  # the collectives as ops (torchtpu_c10d::*), after the aten kernels
_fallback.register()  # after the kernels: every op without one
# TPUs compute in bfloat16 natively: make it torch.autocast("tpu")'s default (CUDA's is float16).
torch.set_autocast_dtype("tpu", torch.bfloat16)
_C._set_synchronize_callback(lambda idx: _sync(idx))
# NOTE: the callback holds a Python object inside a C++ static; drop it before the
# interpreter finalizes, or its destructor would run without a live interpreter.
atexit.register(_C._clear_synchronize_callback)


def jax_op(fn=None, **kwargs):
    """A JAX function (jnp/lax code, a Pallas kernel) as a PyTorch op on tpu tensors (torchtpu/jax_ops.py)."""
    from .jax_ops import jax_op as make

    return make(fn, **kwargs)


def advise(fn, *args, **kwargs):
    """What one training step ``fn(*args)`` costs on a TPU (torchtpu/advisor.py): ``print(advise(step).text())``."""
    from .advisor import advise as run

    return run(fn, *args, **kwargs)


def sync() -> None:
    """Launches what is pending (fused mode) and waits for every queued tpu op."""
    _sync()


__all__ = [
    "__version__",
    "advise",
    "config",
    "get_mode",
    "jax_op",
    "metrics",
    "mode",
    "set_mode",
    "set_shape_buckets",
    "sync",
]
