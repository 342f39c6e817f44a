"""The op table on disk: what lowering each argument signature gave, so that a new process lowers nothing it lowered
before.

The C++ op table (csrc/executor/kernel.cpp) keeps, per argument signature, the entry the Python rules gave on a
miss (the fragment, where its parameters come from, what its results become). It lives as long as the process. A
new process would lower every signature of its first step again (a few hundred for a small model's training step,
~0.5 ms each), so each lowering is also kept here: the signature (the op's name and the C++ signature bytes, which
hold no address), the entry, the fragment's registration (its text, the private functions it calls, parameter and
result types) and its device-side check messages. On a miss the C++ kernel asks ``kernels.lower``, which asks here
first; a known signature re-registers its fragment (a new id in this process) and returns the entry without
running any rule.

The file, ``optable-<context>.bin`` in TORCHTPU_CACHE_DIR, is written at exit (merged with what the directory
holds then), as the executable cache writes its entries: a temporary file renamed into place, with a header, the
payload's length and sha256 checked before anything reads it, in a directory only the user can write. Its
context is the executable cache's (platform, versions, XLA_FLAGS, host CPU) and a hash of torchtpu's own code (its
rules and its extension), so an edited rule never serves a stale fragment.
Ops outside aten (``torchtpu.jax_op``'s, whose JAX functions can change under one name) are never kept.
``TORCHTPU_OPTABLE=0`` turns it off.
"""

from __future__ import annotations

import atexit
import builtins
import hashlib
import io
import os
import pickle
import threading

from . import cache, config, errors, metrics, runtime

MAGIC = b"torchtpu-optable-v1\n"
_lock = threading.Lock()
_state: dict = {}  # "dir", "context", "known": {key: record}, "new": {key: record}


def _code_hash() -> str:
    """sha256 over the name, size and modification time of torchtpu's Python sources and its extension (what
    Python itself checks before trusting a .pyc): any edit to a rule, any rebuild, makes a new table."""
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in sorted(filenames):
            if name.endswith((".py", ".so")):
                path = os.path.join(dirpath, name)
                st = os.stat(path)
                h.update(f"{os.path.relpath(path, root)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _setup() -> bool:
    if "dir" in _state:
        return _state["dir"] is not None

    d = cache.disk_dir() if config.get("optable") else None
    _state["dir"] = d
    if d is None:
        return False
    context = cache.context_key(runtime.get()) + "|" + _code_hash()
    _state["context"] = context
    _state["path"] = os.path.join(d, f"optable-{hashlib.sha256(context.encode()).hexdigest()[:24]}.bin")
    _state["known"] = _read(_state["path"], context)
    _state["new"] = {}
    atexit.register(save)
    return True


class _Unpickler(pickle.Unpickler):
    """Records hold plain values, torch dtypes and exception classes: nothing else is loaded."""

    def find_class(self, module, name):
        import torch

        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        if (
            module == "builtins"
            and isinstance(getattr(builtins, name, None), type)
            and issubclass(getattr(builtins, name), BaseException)
        ):
            return getattr(builtins, name)
        if module == "torchtpu.errors":
            obj = getattr(errors, name, None)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                return obj
        raise pickle.UnpicklingError(f"torchtpu: the op table holds {module}.{name}")


def _read(path: str, context: str) -> dict:

    got = cache.read_entry(path, MAGIC, context)
    if got is None:
        return {}
    try:
        table = _Unpickler(io.BytesIO(got[1])).load()
        if not isinstance(table, dict):
            raise pickle.UnpicklingError("not a table")
    except Exception as e:  # noqa: BLE001 (checked bytes that do not load: start afresh)
        cache.bad_entry(path, f"does not load ({type(e).__name__}: {e})")
        return {}
    metrics.inc("optable.loaded", len(table))
    return table


def save() -> None:
    """Writes what this process lowered (merged with the file as it is now). Runs at exit."""

    with _lock:
        new = _state.get("new")
        if not new:
            return
        table = _read(_state["path"], _state["context"])
        table.update(new)
        new.clear()
        payload = pickle.dumps(table, protocol=pickle.HIGHEST_PROTOCOL)
    cache.write_entry(_state["path"], MAGIC, _state["context"], payload, records=len(table))


def lookup(key: bytes, name: str, values):
    """The record of this signature from an earlier process, or None. For a rule that looked at some runtime
    scalars' values (value slots), the record holds one entry per value."""
    if "::" in name or not _setup():
        return None
    rec = _state["known"].get(key) or _state["new"].get(key)
    if rec is None:
        return None
    if rec[0] == "values":
        rec = rec[2].get(_values_of(rec[1], values))
    return rec


def remember(key: bytes, name: str, values, record) -> None:
    if "::" in name or not _setup():
        return
    with _lock:
        slots = record[1][7] if record[1][0] == "program" else []
        if not slots:
            _state["new"][key] = record
            return
        old = _state["new"].get(key) or _state["known"].get(key)
        by_value = dict(old[2]) if old is not None and old[0] == "values" else {}
        by_value[_values_of(slots, values)] = record
        _state["new"][key] = ("values", [tuple(s) for s in slots], by_value)


def _values_of(slots, values) -> tuple:
    out = []
    for a, e in slots:
        v = values[a] if e < 0 else values[a][e]
        if hasattr(v, "item"):  # a 0-d CPU tensor
            v = v.item()
        out.append((type(v).__name__, v))
    return tuple(out)


def _reset() -> None:
    """Forgets the state (tests: a new TORCHTPU_CACHE_DIR)."""
    with _lock:
        _state.clear()
