"""Every ``TORCHTPU_*`` knob in one table: its environment variable, type, default and meaning.

The bottom of the package: it imports nothing of torchtpu, so any module may read a knob. ``get(name)`` parses the
environment each time it is called unless ``set(name, value)`` gave the knob a value in this process; modules that
need a knob once (the mode, the cache sizes, the fused-mode limits) read it at import, the others (the fallback
policy, the cache directory, debug output) at the call that needs it. ``set`` tells the knob's listeners
(``on_change``): that is how a setting reaches the modules above that depend on it (the shape-bucket policy and the
NaN check turn the C++ path's bucketing on or off) without this module knowing them. ``docs_table()`` is the table
in docs/modes.md (``scripts/gen_config_doc.py`` writes it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Callable


def _flag(text: str) -> bool:
    return text.strip().lower() not in ("", "0", "false", "off", "no")


def _period(text: str) -> int:
    """A period: 0 (off, as a false flag), 1 (a true flag) or a count."""
    t = text.strip().lower()
    return int(t) if t.isdigit() else int(_flag(t))


@dataclass(frozen=True)
class Knob:
    name: str  # the key of get/set
    env: str  # the environment variable
    type: Callable[[str], Any]  # parses the variable's text
    default: str  # the variable's text when unset
    doc: str
    read: str = "import"  # when the package reads it: "import" (once) or "call" (each use)
    choices: tuple = ()


KNOBS: dict[str, Knob] = {}


def _knob(name, env, type_, default, doc, read="import", choices=()):
    KNOBS[name] = Knob(name, env, type_, default, doc, read, choices)


_knob(
    "mode",
    "TORCHTPU_MODE",
    str,
    "strict",
    "The eager mode: strict, fused or debug (docs/modes.md).",
    choices=("strict", "debug", "fused"),
)
_knob("check_nans", "TORCHTPU_CHECK_NANS", _flag, "0", "debug mode: check every op's results for NaN/Inf.")
_knob("platform", "TORCHTPU_PLATFORM", str, "cpu", "The PJRT platform: cpu, tpu or cuda.")
_knob("num_cpu_devices", "TORCHTPU_NUM_CPU_DEVICES", int, "1", "XLA:CPU devices in this process (tests of tpu:1).")
_knob(
    "fallback",
    "TORCHTPU_FALLBACK",
    str,
    "warn",
    "Ops without a lowering rule: warn (once per op), error, or silent; always counted.",
    read="call",
    choices=("warn", "error", "silent"),
)
_knob(
    "cache_dir",
    "TORCHTPU_CACHE_DIR",
    str,
    "~/.cache/torchtpu",
    "The disk cache of executables, graphs and the op table; empty turns it off.",
    read="call",
)
_knob("cache_entries", "TORCHTPU_CACHE_ENTRIES", int, "1024", "Executables kept in memory (least recently used out).")
_knob("cache_max_bytes", "TORCHTPU_CACHE_MAX_BYTES", int, str(4 << 30), "The disk cache's size bound.")
_knob("optable", "TORCHTPU_OPTABLE", _flag, "1", "Keep the op table (lowered signatures) on disk.", read="call")
_knob(
    "shape_buckets",
    "TORCHTPU_SHAPE_BUCKETS",
    str,
    "pow2",
    "How varying sizes are bucketed: pow2, a list of sizes (8,16,64) or off (torchtpu.set_shape_buckets).",
)
_knob(
    "buckets_debug",
    "TORCHTPU_BUCKETS_DEBUG",
    _flag,
    "0",
    "Say why a bucketed op runs at its exact sizes (each argument's forms and storage codes).",
    read="call",
)
_knob(
    "compile_max_programs",
    "TORCHTPU_COMPILE_MAX_PROGRAMS",
    int,
    "8",
    "Input layouts captured per torch.compile graph before it runs op by op.",
)
_knob("fused_max_ops", "TORCHTPU_FUSED_MAX_OPS", int, "4096", "fused: ops in one chunk before a size cut.")
_knob(
    "fused_repeat_min_ops",
    "TORCHTPU_FUSED_REPEAT_MIN_OPS",
    int,
    "256",
    "fused: the shortest repeated body that is cut so one program serves every repeat.",
)
_knob(
    "fused_read_split_min_ops",
    "TORCHTPU_FUSED_READ_SPLIT_MIN_OPS",
    int,
    "64",
    "fused: a host read of a value this many ops before the chunk's end launches the ops it needs first.",
)
_knob(
    "fused_repeat_min_weight",
    "TORCHTPU_FUSED_REPEAT_MIN_WEIGHT",
    int,
    "1024",
    "fused: the least weight (ops times tensor size) of a repeated body worth a cut.",
)
_knob(
    "fused_program_cut_ops",
    "TORCHTPU_FUSED_PROGRAM_CUT_OPS",
    int,
    "64",
    "fused: a compiled graph's program of this many ops or more launches at once, alone, instead of fusing.",
)
_knob(
    "distributed_checks",
    "TORCHTPU_DISTRIBUTED_CHECKS",
    _period,
    "16",
    "Check that every rank issues the same collectives (a fingerprint over gloo): 0 never, 1 at every collective, "
    "N the first N of each group and then every N-th, each check also comparing all calls since the last.",
)

_set: dict[str, Any] = {}
_listeners: dict[str, list] = {}


def _parse(k: Knob, text: str):
    try:
        v = k.type(text)
    except ValueError:
        raise ValueError(f"{k.env}={text!r}: expected {k.type.__name__}") from None
    if k.choices and v not in k.choices:
        raise ValueError(f"{k.env}={text!r}: expected one of {', '.join(k.choices)}")
    return v


def get(name: str):
    """The knob's value: set() in this process, else its environment variable, else its default."""
    if name in _set:
        return _set[name]
    k = KNOBS[name]
    return _parse(k, os.environ.get(k.env, k.default))


def given(name: str) -> bool:
    """Whether the knob was set in this process or in the environment (not left at its default)."""
    return name in _set or KNOBS[name].env in os.environ


def set(name: str, value) -> None:  # noqa: A001  (config.set reads as it should)
    """Gives the knob a value for this process (over the environment) and tells its listeners."""
    if name not in KNOBS:
        raise KeyError(f"torchtpu.config: no knob {name!r}; the knobs: {', '.join(sorted(KNOBS))}")
    k = KNOBS[name]
    if k.choices and value not in k.choices:
        raise ValueError(f"torchtpu.config.set({name!r}, {value!r}): expected one of {', '.join(k.choices)}")
    _set[name] = value
    for fn in list(_listeners.get(name, ())):
        fn(value)


def on_change(name: str, fn: Callable[[Any], None]) -> None:
    """Calls fn(value) after each set(name, value)."""
    if name not in KNOBS:
        raise KeyError(name)
    _listeners.setdefault(name, []).append(fn)


def docs_table() -> str:
    rows = ["| variable | default | read | meaning |", "| --- | --- | --- | --- |"]
    for k in KNOBS.values():
        rows.append(f"| `{k.env}` | `{k.default}` | at {k.read} | {k.doc} |")
    return "\n".join(rows) + "\n"
