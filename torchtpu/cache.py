"""Executable cache shared by every mode: key = module text + everything that changes the code.

Tier 1 is in memory, least-recently-used first out beyond TORCHTPU_CACHE_ENTRIES executables (default 1024):
each loaded executable holds code pages and memory mappings, and a long run over many shapes (the full OpInfo
sweep compiles thousands) would otherwise exhaust them. (A disk tier of serialized executables is the next
step; see docs.)
"""
from __future__ import annotations

import collections
import hashlib
import os
import platform
import threading
import time

from . import metrics

_lock = threading.Lock()
_memory: collections.OrderedDict = collections.OrderedDict()
MAX_ENTRIES = int(os.environ.get("TORCHTPU_CACHE_ENTRIES", "1024"))
_context: str | None = None


def _context_key(runtime) -> str:
    global _context
    if _context is None:
        import jaxlib
        import torch

        from . import __version__

        info = runtime.platform_info()
        cpu = ""
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next((l for l in f if l.startswith("flags")), "")
        except OSError:
            cpu = platform.processor()
        _context = "|".join([info["platform"], info["platform_version"], info["device_kind"], jaxlib.__version__,
                             torch.__version__, __version__, hashlib.sha256(cpu.encode()).hexdigest()[:16]])
    return _context


def key(runtime, text: str, device_index: int) -> str:
    h = hashlib.sha256()
    h.update(_context_key(runtime).encode())
    h.update(str(device_index).encode())
    h.update(text.encode())
    return h.hexdigest()


def get_or_compile(runtime, text: str, device_index: int = 0):
    # NOTE: a dict lookup on the text itself is cheaper than hashing it; the hash is only
    # needed for the (future) disk tier, so it is computed on a miss.
    k = (device_index, text)
    with _lock:
        exe = _memory.get(k)
        if exe is not None:
            _memory.move_to_end(k)
    if exe is not None:
        metrics.inc("cache_hits.memory")
        return exe
    metrics.inc("cache_misses")
    t0 = time.perf_counter()
    exe = runtime.compile(text, device_index)
    metrics.add_time("compile_seconds", time.perf_counter() - t0)
    metrics.inc("compiles")
    with _lock:
        _memory[k] = exe
        while len(_memory) > MAX_ENTRIES:
            _memory.popitem(last=False)
            metrics.inc("cache_evictions")
    return exe


def clear() -> None:
    with _lock:
        _memory.clear()


def size() -> int:
    return len(_memory)
