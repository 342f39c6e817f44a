"""``--cuda-as-tpu``: a script written for ``device="cuda"`` runs on tpu without edits.

``enable()`` installs (1) a TorchFunctionMode that rewrites every cuda device a torch function or tensor method
receives (``device=`` of factories, ``.to("cuda")``, ``.cuda()``, hence ``module.cuda()`` / ``module.to("cuda")``)
to the tpu device of the same index, and (2) ``torch.cuda``'s device-management calls (``is_available``,
``device_count``, ``current_device``, ``set_device``, ``device``, ``synchronize``, seeds, memory statistics,
``get_device_name``), ``torch.autocast("cuda")`` and ``GradScaler("cuda")`` as their tpu twins. Every redirect is
counted; ``redirected()`` lists them (``python -m torchtpu run --cuda-as-tpu`` prints the list at exit).
"""

from __future__ import annotations

import collections

import torch
from torch.overrides import TorchFunctionMode

_counts: collections.Counter = collections.Counter()
_mode = None


def _tpu(dev):
    """The tpu twin of a cuda device (str, torch.device or int index as cuda's); anything else unchanged."""
    if isinstance(dev, str) and (dev == "cuda" or dev.startswith("cuda:")):
        return dev.replace("cuda", "tpu", 1)
    if isinstance(dev, torch.device) and dev.type == "cuda":
        return torch.device("tpu", dev.index)
    return dev


class _Redirect(TorchFunctionMode):
    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        name = getattr(func, "__name__", str(func))
        if name == "cuda" and args and isinstance(args[0], torch.Tensor):  # Tensor.cuda(device=None, ...)
            idx = args[1] if len(args) > 1 else kwargs.pop("device", None)
            dev = torch.device("tpu", idx if isinstance(idx, int) else torch.device(idx).index if idx else None)
            _counts["Tensor.cuda"] += 1
            return args[0].to(dev, non_blocking=kwargs.get("non_blocking", False))
        changed = False
        if "device" in kwargs:
            new = _tpu(kwargs["device"])
            changed = new is not kwargs["device"]
            kwargs["device"] = new
        new_args = []
        for a in args:
            b = _tpu(a)
            changed |= b is not a
            new_args.append(b)
        if changed:
            _counts[f"{name} (device cuda -> tpu)"] += 1
        return func(*new_args, **kwargs)


def _patch(obj, attr, fn, label=None):
    def wrapper(*a, **k):
        _counts[label or f"torch.cuda.{attr}"] += 1
        return fn(*a, **k)

    setattr(obj, attr, wrapper)


def enable() -> None:
    global _mode
    if _mode is not None:
        return
    tpu = torch.tpu
    for attr, fn in {
        "is_available": lambda: True,
        "device_count": tpu.device_count,
        "current_device": tpu.current_device,
        "set_device": lambda d: tpu.set_device(_tpu(d) if not isinstance(d, int) else d),
        "synchronize": lambda device=None: tpu.synchronize(_tpu(device) if not isinstance(device, int) else device),
        "get_device_name": lambda device=None: tpu.get_device_name(),
        "manual_seed": tpu.manual_seed,
        "manual_seed_all": tpu.manual_seed_all,
        "memory_allocated": lambda device=None: tpu.memory_allocated(),
        "max_memory_allocated": lambda device=None: tpu.max_memory_allocated(),
        "reset_peak_memory_stats": lambda device=None: tpu.reset_peak_memory_stats(),
        "empty_cache": lambda: None,
        "is_bf16_supported": lambda *a, **k: True,
        "device": lambda d: tpu.device(_tpu(d) if not isinstance(d, int) else d),
    }.items():
        _patch(torch.cuda, attr, fn)

    autocast = torch.amp.autocast

    class _Autocast(autocast):
        def __init__(self, device_type="cuda", *a, **k):
            if device_type == "cuda":
                _counts["torch.autocast('cuda')"] += 1
                device_type = "tpu"
            super().__init__(device_type, *a, **k)

    torch.autocast = torch.amp.autocast = _Autocast
    torch.cuda.amp.autocast = lambda *a, **k: _Autocast("cuda", *a, **k)
    scaler = torch.amp.GradScaler

    class _Scaler(scaler):
        def __init__(self, device="cuda", *a, **k):
            if device == "cuda":
                _counts["GradScaler('cuda')"] += 1
                device = "tpu"
            super().__init__(device, *a, **k)

    torch.amp.GradScaler = _Scaler
    torch.cuda.amp.GradScaler = lambda *a, **k: _Scaler("cuda", *a, **k)
    _mode = _Redirect()
    _mode.__enter__()


def redirected() -> list[tuple[str, int]]:
    return _counts.most_common()


__all__ = ["enable", "redirected"]
