"""Executable cache shared by every mode and by compiled graphs: key = module text + everything that changes the code.

Tier 1 is in memory, least-recently-used first out beyond TORCHTPU_CACHE_ENTRIES executables (default 1024):
each loaded executable holds code pages and memory mappings, and a long run over many shapes (the full OpInfo
sweep compiles thousands) would otherwise exhaust them.

Tier 2 is on disk under TORCHTPU_CACHE_DIR (default ~/.cache/torchtpu; "" turns it off): one file per
executable, named by its key (sha256 of the platform, versions, host CPU features, device index and module
text). A file is the magic line, a header (the key's context string, the payload's length and sha256, the
seconds its compile took) and the serialized executable. It is written to a temporary file and renamed into
place, so readers see a whole entry or none and concurrent writers of one entry are safe. An entry that is
truncated, corrupt, of another version or unreadable is detected (header, length, digest) before anything is
deserialized, compiled anew and replaced, with one warning. A serialized executable is machine code: entries
are loaded only from a directory the user owns that no one else can write (else one warning and the memory
tier only). The directory is bounded by TORCHTPU_CACHE_MAX_BYTES (default 4 GiB), least recently used first
out (a hit refreshes the file's time).
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import platform
import stat
import tempfile
import threading
import time
import warnings

from . import config, metrics
from .version import __version__

_lock = threading.Lock()
_memory: collections.OrderedDict = collections.OrderedDict()
MAX_ENTRIES = config.get("cache_entries")
MAX_DISK_BYTES = config.get("cache_max_bytes")
MAGIC = b"torchtpu-executable-v1\n"
ENTRY_SUFFIXES = (
    ".xla",
    ".aot",
    ".bin",
)  # executables; compiled graphs' AOTAutograd results (compile.py); op tables (optable.py)
_context: str | None = None
_disk_state: dict = {}  # "dir": the directory in use (None: off), "why": why not


def context_key(runtime) -> str:
    global _context
    if _context is None:
        import jaxlib
        import torch

        info = runtime.platform_info()
        cpu = ""
        try:
            with open("/proc/cpuinfo") as f:
                cpu = next((l for l in f if l.startswith("flags")), "")
        except OSError:
            cpu = platform.processor()
        _context = "|".join(
            [
                info["platform"],
                info["platform_version"],
                info["device_kind"],
                jaxlib.__version__,
                torch.__version__,
                __version__,
                os.environ.get("XLA_FLAGS", ""),
                hashlib.sha256(cpu.encode()).hexdigest()[:16],
            ]
        )
    return _context


def key(runtime, text: str, device_index: int) -> str:
    h = hashlib.sha256()
    h.update(context_key(runtime).encode())
    h.update(str(device_index).encode())
    h.update(text.encode())
    return h.hexdigest()


# -- the disk tier --------------------------------------------------------------------------------------------
def disk_dir() -> str | None:
    """The cache directory in use, or None (turned off, or refused: see ``disk_status()``)."""
    if "dir" in _disk_state:
        return _disk_state["dir"]
    path = config.get("cache_dir")
    if path:
        path = os.path.expanduser(path)
    why = None
    if path == "":
        why = "TORCHTPU_CACHE_DIR is empty"
    else:
        path = os.path.abspath(path)
        try:
            os.makedirs(path, mode=0o700, exist_ok=True)
            st = os.stat(path)
            if not stat.S_ISDIR(st.st_mode):
                why = f"{path} is not a directory"
            elif st.st_uid != os.getuid():
                why = f"{path} belongs to another user (uid {st.st_uid})"
            elif st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
                why = f"{path} is writable by others (mode {stat.S_IMODE(st.st_mode):o})"
        except OSError as e:
            why = f"{path}: {e}"
        if why is not None:
            warnings.warn(
                f"torchtpu: the disk cache is off: {why}; serialized executables are machine code, so "
                "they are only loaded from a directory only you can write. Using the memory cache only.",
                stacklevel=3,
            )
    _disk_state["dir"] = None if why else path
    _disk_state["why"] = why
    return _disk_state["dir"]


def disk_status() -> dict:
    disk_dir()
    return dict(_disk_state)


def _reset_disk_state() -> None:
    """Re-reads TORCHTPU_CACHE_DIR (tests)."""
    _disk_state.clear()


def _entry_path(d: str, k: str) -> str:
    return os.path.join(d, k + ".xla")


def bad_entry(path: str, why: str) -> None:
    metrics.inc("cache_disk.bad_entries")
    warnings.warn(f"torchtpu: cache entry {path} {why}; compiling anew and replacing it", stacklevel=4)


def read_entry(path: str, magic: bytes, context: str):
    """(header, payload) of the entry file at path, checked (magic, header, context, length, sha256) before anything
    reads its payload; None when there is none or it is bad (one warning: the caller makes the entry anew)."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        bad_entry(path, f"is unreadable ({e})")
        return None
    if not data.startswith(magic):
        bad_entry(path, "is not a torchtpu cache entry (or a foreign version)")
        return None
    end = data.find(b"\n", len(magic))
    try:
        header = json.loads(data[len(magic) : end])
        size, digest, ctx = int(header["size"]), header["sha256"], header["context"]
    except (ValueError, KeyError, TypeError):
        bad_entry(path, "has a corrupt header")
        return None
    if ctx != context:
        bad_entry(path, "was written by another version or platform")
        return None
    payload = data[end + 1 :]
    if len(payload) != size:
        bad_entry(path, f"is truncated ({len(payload)} of {size} bytes)")
        return None
    if hashlib.sha256(payload).hexdigest() != digest:
        bad_entry(path, "fails its digest (corrupt)")
        return None
    try:
        os.utime(path)  # least recently used goes first
    except OSError:
        pass
    metrics.inc("bytes.disk_read", len(data))
    return header, payload


def write_entry(path: str, magic: bytes, context: str, payload: bytes, **extra) -> bool:
    """Writes an entry file (magic, header with the context, payload length and sha256, payload) to a temporary file
    in its directory and renames it into place: readers see the whole entry or none, concurrent writers are safe."""
    d = os.path.dirname(path)
    header = json.dumps(
        {"size": len(payload), "sha256": hashlib.sha256(payload).hexdigest(), "context": context, **extra}
    )
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.splitext(path)[1])
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(magic + header.encode() + b"\n" + payload)
        os.replace(tmp, path)  # atomic: readers see the whole entry or none
    except OSError as e:
        _unlink(tmp)
        warnings.warn(f"torchtpu: writing cache entry {path} failed ({e}); not cached on disk", stacklevel=4)
        return False
    metrics.inc("bytes.disk_written", len(payload))
    _evict(d)
    return True


def _load(runtime, d: str, k: str, device_index: int, text: str):
    """(executable, compile seconds it saves) from the disk tier, or None."""
    path = _entry_path(d, k)
    got = read_entry(path, MAGIC, context_key(runtime))
    if got is None:
        return None
    header, payload = got
    try:
        exe = runtime.deserialize(payload, device_index, text)
    except Exception as e:  # noqa: BLE001 (any failure: recompile)
        bad_entry(path, f"does not deserialize ({type(e).__name__}: {e})")
        return None
    return exe, float(header.get("compile_seconds", 0.0))


def _store(runtime, d: str, k: str, exe, compile_seconds: float) -> None:
    try:
        payload = runtime.serialize(exe)
    except Exception as e:  # noqa: BLE001 (a backend that cannot serialize: memory tier only)
        metrics.inc("cache_disk.unserializable")
        warnings.warn(f"torchtpu: an executable could not be serialized ({e}); not cached on disk", stacklevel=4)
        return
    write_entry(_entry_path(d, k), MAGIC, context_key(runtime), payload, compile_seconds=round(compile_seconds, 6))


def _evict(d: str) -> None:
    """Keeps the directory under MAX_DISK_BYTES, least recently used entries first out; removes temporary files
    left by killed writers after an hour."""
    entries, total, now = [], 0, time.time()
    try:
        with os.scandir(d) as it:
            for e in it:
                if not e.is_file(follow_symlinks=False):
                    continue
                st = e.stat(follow_symlinks=False)
                if e.name.startswith(".tmp-"):
                    if now - st.st_mtime > 3600:
                        _unlink(e.path)
                    continue
                if e.name.endswith(ENTRY_SUFFIXES):
                    entries.append((st.st_mtime, st.st_size, e.path))
                    total += st.st_size
    except OSError:
        return
    if total <= MAX_DISK_BYTES:
        return
    for _, size, path in sorted(entries):
        if total <= MAX_DISK_BYTES:
            break
        if _unlink(path):
            total -= size
            metrics.inc("cache_disk.evictions")


def _unlink(path: str) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False


# -- both tiers -------------------------------------------------------------------------------------------------
def get_or_compile(runtime, text: str, device_index: int = 0):
    # NOTE: a dict lookup on the text itself is cheaper than hashing it; the hash is only needed for the disk tier,
    # so it is computed on a memory miss.
    mk = (device_index, text)
    with _lock:
        exe = _memory.get(mk)
        if exe is not None:
            _memory.move_to_end(mk)
    if exe is not None:
        metrics.inc("cache_hits.memory")
        return exe
    d = disk_dir()
    k = key(runtime, text, device_index) if d else None
    loaded = _load(runtime, d, k, device_index, text) if d else None
    if loaded is not None:
        exe, saved = loaded
        metrics.inc("cache_hits.disk")
        metrics.add_time("compile_seconds_saved", saved)
    else:
        metrics.inc("cache_misses")
        if d:
            metrics.inc("cache_misses.disk")
        t0 = time.perf_counter()
        exe = runtime.compile(text, device_index)
        dt = time.perf_counter() - t0
        metrics.add_time("compile_seconds", dt)
        metrics.inc("compiles")
        if d:
            _store(runtime, d, k, exe, dt)
    with _lock:
        _memory[mk] = exe
        while len(_memory) > MAX_ENTRIES:
            _memory.popitem(last=False)
            metrics.inc("cache_evictions")
    return exe


def clear() -> None:
    """Empties the memory tier (the disk tier stays)."""
    with _lock:
        _memory.clear()


def size() -> int:
    return len(_memory)
