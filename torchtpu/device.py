"""``torch.tpu``: the device module (registered with torch._register_device_module)."""

from __future__ import annotations

import contextlib

import torch

from . import _C, executor, runtime

_initialized = False


def is_available() -> bool:
    return device_count() > 0


def device_count() -> int:
    return _C._device_count()


def current_device() -> int:
    return _C._current_device()


def _index(device) -> int:
    if device is None:
        return current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    if device.type != "tpu":
        raise ValueError(f"expected a tpu device, got {device}")
    return device.index if device.index is not None else current_device()


def set_device(device) -> None:
    _C._set_device(_index(device))


class device:
    """Context manager that sets the current tpu device."""

    def __init__(self, dev):
        self.idx = _index(dev)
        self.prev = None

    def __enter__(self):
        self.prev = current_device()
        set_device(self.idx)

    def __exit__(self, *exc):
        set_device(self.prev)
        return False


def init() -> None:
    global _initialized
    runtime.get().devices()
    _initialized = True


def is_initialized() -> bool:
    """True once the XLA client has started (the first tpu op, or init()), as cuda's context starts lazily."""
    return _initialized or runtime.get()._backend is not None


def _is_in_bad_fork() -> bool:
    return False


def synchronize(device=None) -> None:
    executor.synchronize(_index(device))


# -- RNG -------------------------------------------------------------------------------------------
def _gen(device=None) -> torch.Generator:
    return _C._default_generator(_index(device))


def manual_seed(seed: int) -> None:
    _gen().manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for i in range(device_count()):
        _gen(i).manual_seed(int(seed))


def seed() -> None:
    _gen().seed()


def seed_all() -> None:
    s = _gen().seed()
    for i in range(device_count()):
        _gen(i).manual_seed(s)


def initial_seed() -> int:
    return _gen().initial_seed()


def get_rng_state(device="tpu") -> torch.Tensor:
    return _gen(device).get_state()


def get_rng_state_all() -> list:
    return [get_rng_state(i) for i in range(device_count())]


def set_rng_state(new_state: torch.Tensor, device="tpu") -> None:
    _gen(device).set_state(new_state.to("cpu", torch.uint8))


def set_rng_state_all(states) -> None:
    for i, s in enumerate(states):
        set_rng_state(s, i)


# -- streams and events: one in-order queue per device ------------------------------------------------
Stream = torch.Stream
Event = torch.Event


def current_stream(device=None):
    return torch.Stream(device=torch.device("tpu", _index(device)))


def default_stream(device=None):
    return current_stream(device)


@contextlib.contextmanager
def stream(s=None):
    yield s


# -- properties -----------------------------------------------------------------------------------------
def get_amp_supported_dtype():
    return [torch.bfloat16, torch.float16]


def get_device_name(device=None) -> str:
    rt = runtime.get()
    d = rt.device(_index(device))
    return f"{d.device_kind} (PJRT platform '{rt.platform}')"


class _Properties:
    def __init__(self, idx):
        rt = runtime.get()
        d = rt.device(idx)
        self.name = get_device_name(idx)
        self.platform = rt.platform
        self.device_kind = d.device_kind
        self.total_memory = int(rt.memory_stats(idx).get("bytes_limit", 0))
        self.index = idx

    def __repr__(self):
        return f"_TpuDeviceProperties(name='{self.name}', total_memory={self.total_memory})"


def get_device_properties(device=None):
    return _Properties(_index(device))


# -- memory ---------------------------------------------------------------------------------------------
def memory_allocated(device=None) -> int:
    """Bytes of live device buffers on the device (what is pending in fused mode is launched first)."""
    executor.cut(None)
    return _C._memory_stats(_index(device))["allocated_bytes"]


def max_memory_allocated(device=None) -> int:
    return _C._memory_stats(_index(device))["peak_bytes"]


def reset_peak_memory_stats(device=None) -> None:
    executor.cut(None)
    _C._reset_peak_memory(_index(device))


def memory_stats(device=None) -> dict:
    executor.cut(None)
    s = _C._memory_stats(_index(device))
    out = {
        "allocated_bytes.all.current": s["allocated_bytes"],
        "allocated_bytes.all.peak": s["peak_bytes"],
        "active.all.current": s["live_buffers"],
        "allocation.all.allocated": s["total_buffers"],
        "storages.all.current": s["live_storages"],
        "donated_bytes.all.allocated": s["donated_bytes"],
    }
    out.update({"device." + k: v for k, v in runtime.get().memory_stats(_index(device)).items()})
    return out


def empty_cache() -> None:
    executor.cut(None)
