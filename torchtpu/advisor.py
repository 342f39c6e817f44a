"""What a training step costs on a TPU: ``torchtpu.advise(fn, *args)`` and ``python -m torchtpu advise script.py``.

The advisor runs the step to warm up, then once plainly (its time, host syncs, recompiles, fallbacks), then once
in strict mode while it records every ATen op (a dispatch mode: name, shapes, dtypes, the Python line that issued
it) with XLA's cost analysis (flops, bytes) of the op's own program. Per op it models flops and bytes (matmuls and
convolutions exactly, other ops as their element and byte counts), places each op on the roofline of a TPU generation
(``TPUS``: peak bfloat16 matmul flops and HBM bandwidth from Google's public specs) and reports:
- matmul/convolution dimensions that are not multiples of the matrix unit (128 on v5e/v5p, 256 on v6e), with the
  padding waste in percent;
- attention head dimensions outside {128, 256} (the contraction of a ``q @ k^T`` whose result is square);
- float32 matmuls that could run in bfloat16 (``torch.autocast("tpu")``), with their share of the matmul flops;
- small ops that cannot reach the roofline (modelled below ``SMALL_OP_US`` on the chosen TPU), which fused mode or
  ``torch.compile`` merges;
- host syncs in the step by Python line, recompiles in the step and their cause (the ops lowered anew), CPU
  fallbacks;
- an estimated step time on the chosen TPU against the step time measured here.
Text report (``Report.text()``) plus a roofline plot (``Report.plot(path)``, PNG).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import time
import traceback

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from . import _C, cache, executor, kernels, metrics

# Public specs, per chip: peak dense bfloat16 flops/s and HBM bandwidth bytes/s; the matrix unit's side.
TPUS = {
    "v5e": {
        "bf16_flops": 197e12,
        "hbm_bytes": 819e9,
        "mxu": 128,
        "source": "https://cloud.google.com/tpu/docs/v5e (197 TFLOPs bf16, 819 GB/s HBM2)",
    },
    "v5p": {
        "bf16_flops": 459e12,
        "hbm_bytes": 2765e9,
        "mxu": 128,
        "source": "https://cloud.google.com/tpu/docs/v5p (459 TFLOPs bf16, 2765 GB/s HBM2e)",
    },
    "v6e": {
        "bf16_flops": 918e12,
        "hbm_bytes": 1640e9,
        "mxu": 256,
        "source": "https://cloud.google.com/tpu/docs/v6e (918 TFLOPs bf16, 1640 GB/s HBM)",
    },
}
# float32 matmuls at full precision run as several bfloat16 passes on the matrix unit (XLA's HIGHEST: 6, HIGH: 3);
# the model takes 3 (an optimistic bound for what bfloat16 saves).
F32_MATMUL_PASSES = 3
# Vector (non-matmul) work: the VPU's rate is taken as 1/16 of the bfloat16 matmul peak (a model, not a spec).
VPU_FRACTION = 1 / 16
SMALL_OP_US = 1.0  # ops modelled below this cannot amortize a program launch / kernel prologue
# attention (csrc/aten/attention.cpp): (index of q, matmuls of (B*heads, Lq, E) x (E, Lk) sizes): scores and output
# forward; the backward recomputes the scores and takes four more (value, probability, query and key gradients)
_ATTENTION = {
    "_scaled_dot_product_fused_attention_overrideable": (0, 2),
    "_scaled_dot_product_fused_attention_overrideable_backward": (1, 5),
}
_CONVS = {"convolution", "convolution_backward"}
_METADATA = {
    "detach",
    "alias",
    "_unsafe_view",
    "lift_fresh",
    "set_",
    "resize_",
    "empty",
    "empty_strided",
    "_local_scalar_dense",
}


@dataclasses.dataclass
class Op:
    name: str
    shapes: list
    dtypes: list
    out_shapes: list
    line: str
    flops: float = 0.0
    bytes: float = 0.0
    kind: str = "vector"  # matmul | conv | vector
    dims: tuple = ()  # matmul: (batch, M, K, N)
    xla: tuple | None = None  # XLA's cost analysis of the op's own program (strict mode): (flops, bytes)

    def seconds(self, tpu: dict) -> float:
        flops, nbytes = self.xla if self.xla else (self.flops, self.bytes)
        peak = tpu["bf16_flops"]
        if self.kind in ("matmul", "conv"):
            if any(d == torch.float32 for d in self.dtypes[:2]):
                peak /= F32_MATMUL_PASSES
        else:
            peak *= VPU_FRACTION
        return max(flops / peak, nbytes / tpu["hbm_bytes"])


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms" if seconds >= 1e-3 else f"{seconds * 1e6:.2f} µs"


def _nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _user_line() -> str:
    for fr in reversed(traceback.extract_stack()[:-3]):
        f = fr.filename
        if "/torch/" in f or "/torchtpu/" in f or f.startswith("<"):
            continue
        return f"{f.rsplit('/', 1)[-1]}:{fr.lineno} ({fr.line.strip() if fr.line else ''})"
    return "(backward or library code)"


def _model(op: Op, args, out) -> None:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    outs = [o for o in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(o, torch.Tensor)]
    op.bytes = float(sum(_nbytes(t) for t in tensors) + sum(_nbytes(o) for o in outs))
    base = op.name.split(".")[0]
    if base in ("mm", "addmm", "bmm", "baddbmm") and len(tensors) >= 2:
        a, b = (tensors[0], tensors[1]) if base in ("mm", "bmm") else (tensors[1], tensors[2])
        if a.dim() == 2:
            (m, k), n, batch = a.shape, b.shape[-1], 1
        else:
            batch, m, k = a.shape[-3:]
            n = b.shape[-1]
        op.kind, op.dims, op.flops = "matmul", (batch, m, k, n), 2.0 * batch * m * k * n
    elif base in _ATTENTION and len(tensors) >= 3:
        first, matmuls = _ATTENTION[base]
        q, k = tensors[first], tensors[first + 1]
        batch = math.prod(q.shape[:-2])
        (lq, e), lk = q.shape[-2:], k.shape[-2]
        op.kind, op.dims, op.flops = "matmul", (batch, lq, e, lk), 2.0 * matmuls * batch * lq * e * lk
    elif base in _CONVS and len(tensors) >= 2:
        o = outs[0] if outs else None
        w = tensors[1] if base == "convolution" else tensors[2]
        if o is not None and w.dim() >= 3:
            per_out = w.shape[1] * math.prod(w.shape[2:])  # cin/groups * kernel
            flops = 2.0 * o.numel() * per_out
            op.kind, op.flops = "conv", flops * (2 if base == "convolution_backward" else 1)
            op.dims = (1, o.numel() // max(o.shape[1], 1), per_out, w.shape[0])
    else:
        op.flops = float(sum(o.numel() for o in outs))


class _Recorder(TorchDispatchMode):
    def __init__(self, programs):
        super().__init__()
        self.ops: list[Op] = []
        self.programs = programs  # the programs compiled so far; those an op adds are its own (strict mode)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        n0 = len(self.programs)
        _C._clear_chunk_cache()  # the op's chunk asks the executable cache (a memory hit), which reports its cost
        out = func(*args, **kwargs)
        mine = self.programs[n0:]
        if func.is_view or func.name().split("::")[-1].split(".")[0] in _METADATA:
            return out  # views and metadata: no device work
        flat = [a for a in args if isinstance(a, torch.Tensor)]
        for a in args:
            if isinstance(a, (list, tuple)):
                flat += [x for x in a if isinstance(x, torch.Tensor)]
        if any(t.device.type == "tpu" for t in flat) or (isinstance(out, torch.Tensor) and out.device.type == "tpu"):
            name = func.name().split("::")[-1]
            outs = out if isinstance(out, (list, tuple)) else [out]
            op = Op(
                name,
                [tuple(t.shape) for t in flat],
                [t.dtype for t in flat],
                [tuple(o.shape) for o in outs if isinstance(o, torch.Tensor)],
                _user_line(),
            )
            _model(op, flat, out)
            if mine:
                op.xla = (sum(p[0] for p in mine), sum(p[1] for p in mine))
            self.ops.append(op)
        return out


@dataclasses.dataclass
class Report:
    ops: list
    programs: list  # XLA cost analysis per program compiled in the step: (flops, bytes)
    measured_s: float
    host_syncs: list
    recompiles: int
    lowered: list
    fallbacks: dict
    generation: str

    # -- findings ---------------------------------------------------------------------------------------
    @classmethod
    def of(cls, probe: "_Probe", record: "_Record", generation: str) -> "Report":
        return cls(
            record.rec.ops,
            record.programs,
            probe.seconds,
            probe.syncs,
            probe.compiles,
            probe.lowered,
            probe.fallbacks,
            generation,
        )

    def tpu(self):
        return TPUS[self.generation]

    def padding(self):
        """(waste fraction, op) for matmuls/convs whose K or N is not a multiple of the matrix unit, worst first."""
        side = self.tpu()["mxu"]
        out = []
        for op in self.ops:
            if op.kind not in ("matmul", "conv") or not op.dims:
                continue
            _, _, k, n = op.dims
            pk, pn = math.ceil(k / side) * side, math.ceil(n / side) * side
            waste = 1 - (k * n) / (pk * pn)
            if waste > 0:
                out.append((waste, op))
        return sorted(out, key=lambda w: -w[0] * w[1].flops)

    def head_dims(self):
        out = collections.Counter()
        for op in self.ops:
            if op.kind == "matmul" and op.out_shapes and len(op.out_shapes[0]) >= 2:
                s = op.out_shapes[0]
                batch, m, k, n = op.dims
                if (
                    batch > 1
                    and s[-1] == s[-2]
                    and m == n
                    and k != m
                    and k not in (128, 256)
                    and not op.line.startswith("(")
                ):  # a forward q @ k^T (scores: square per batch)
                    out[(k, op.line)] += 1
        return out

    def f32_matmuls(self):
        mm = [o for o in self.ops if o.kind in ("matmul", "conv")]
        f32 = [o for o in mm if any(d == torch.float32 for d in o.dtypes[:2])]
        total = sum(o.flops for o in mm) or 1.0
        return f32, sum(o.flops for o in f32) / total

    def small_ops(self):
        tpu = self.tpu()
        return [o for o in self.ops if o.seconds(tpu) * 1e6 < SMALL_OP_US]

    def estimate_s(self, generation=None):
        tpu = TPUS[generation or self.generation]
        return sum(o.seconds(tpu) for o in self.ops)

    # -- output ---------------------------------------------------------------------------------------------
    def text(self) -> str:
        tpu = self.tpu()
        L = [
            f"torchtpu advisor: one step, {len(self.ops)} ops on tpu, modelled for TPU {self.generation} "
            f"({tpu['source']})"
        ]
        flops = sum(o.flops for o in self.ops)
        nbytes = sum(o.bytes for o in self.ops)
        xf = sum(p[0] for p in self.programs)
        xb = sum(p[1] for p in self.programs)
        with_xla = sum(1 for o in self.ops if o.xla)
        L.append(
            f"  XLA's cost analysis of the {len(self.programs)} program(s) the step ran (one per op): "
            f"{xf / 1e9:.3f} GFLOP, {xb / 2**20:.1f} MiB accessed; {with_xla} of {len(self.ops)} ops carry their "
            f"program's figures, the others the model's (matmul/conv flops exactly, elements and bytes "
            f"otherwise: {flops / 1e9:.3f} GFLOP, {nbytes / 2**20:.1f} MiB over all ops)"
        )
        est = self.estimate_s()
        L.append(
            f"  estimated step on {self.generation}: {_fmt(est)} (each op at its roofline, unfused); measured "
            f"here: {_fmt(self.measured_s)}. By generation: "
            + ", ".join(f"{g} {_fmt(self.estimate_s(g))}" for g in TPUS)
        )
        pad = self.padding()
        L.append(
            f"\n[matrix unit {tpu['mxu']}x{tpu['mxu']}] {len(pad)} matmul/conv op(s) with dimensions that are "
            f"not multiples of {tpu['mxu']}:"
        )
        seen = set()
        for waste, op in pad:
            key = (op.name, op.dims, op.line)
            if key in seen:
                continue
            seen.add(key)
            b, m, k, n = op.dims
            L.append(
                f"  {waste * 100:5.1f}% padding waste  {op.name} M={m} K={k} N={n}"
                f"{f' batch={b}' if b > 1 else ''}  at {op.line}"
            )
            if len(seen) >= 8:
                L.append(f"  ... {len(pad) - 8} more")
                break
        heads = self.head_dims()
        if heads:
            L.append("\n[attention] head dimensions outside {128, 256} (the MXU runs q@k^T at hd/128 of its width):")
            for (hd, line), n in heads.items():
                L.append(
                    f"  head dim {hd} ({n} score matmul(s)) at {line}: use 128 (or 256 on v6e), e.g. fewer, wider heads"
                )
        f32, share = self.f32_matmuls()
        if f32:
            L.append(
                f"\n[precision] {len(f32)} float32 matmul/conv op(s), {share * 100:.0f}% of the matmul flops: "
                f"on the MXU float32 costs ~{F32_MATMUL_PASSES} bfloat16 passes; "
                "`with torch.autocast('tpu', dtype=torch.bfloat16):` around the forward runs them in bfloat16 "
                f"(modelled step: {_fmt(self._estimate_bf16())} instead of {_fmt(est)})"
            )
        small = self.small_ops()
        L.append(
            f"\n[small ops] {len(small)} of {len(self.ops)} ops model below {SMALL_OP_US} µs on "
            f"{self.generation}: alone they cannot reach the roofline; fused mode (torchtpu.set_mode('fused')) "
            "or torch.compile(backend='tpu') runs them inside larger programs"
        )
        for name, n in collections.Counter(o.name for o in small).most_common(6):
            L.append(f"  {name:<32} {n}")
        L.append(f"\n[host syncs] {sum(n for _, n in self.host_syncs)} in the step")
        for line, n in self.host_syncs:
            L.append(f"  {n} at {line}")
        L.append(f"\n[recompiles] {self.recompiles} compile(s) in the step (after the warm-up steps)")
        for name, n in collections.Counter(self.lowered).most_common(8):
            L.append(f"  new signature of {name}: {n} (shapes or dtypes that change between steps)")
        L.append(f"\n[CPU fallbacks] {sum(self.fallbacks.values())}")
        for name, n in self.fallbacks.items():
            L.append(f"  {name}: {n}")
        return "\n".join(L)

    def _estimate_bf16(self):
        tpu = self.tpu()
        total = 0.0
        for o in self.ops:
            if o.kind in ("matmul", "conv"):
                o2 = dataclasses.replace(
                    o,
                    dtypes=[torch.bfloat16] * len(o.dtypes),
                    bytes=o.bytes / 2,
                    xla=(o.xla[0], o.xla[1] / 2) if o.xla else None,
                )
                total += o2.seconds(tpu)
            else:
                total += o.seconds(tpu)
        return total

    def plot(self, path: str) -> str:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        tpu = self.tpu()
        fig, ax = plt.subplots(figsize=(7, 5))
        xs = [max(o.flops / max(o.bytes, 1.0), 1e-3) for o in self.ops]
        perf = [o.flops / max(o.seconds(tpu), 1e-15) for o in self.ops]
        colors = [
            "tab:red" if o.kind == "matmul" else "tab:orange" if o.kind == "conv" else "tab:blue" for o in self.ops
        ]
        ax.scatter(xs, perf, c=colors, s=12, alpha=0.6)
        grid = [10 ** (i / 20) for i in range(-60, 100)]
        ax.plot(grid, [min(tpu["bf16_flops"], g * tpu["hbm_bytes"]) for g in grid], "k-", label="bf16 matmul roof")
        ax.plot(
            grid,
            [min(tpu["bf16_flops"] * VPU_FRACTION, g * tpu["hbm_bytes"]) for g in grid],
            "k--",
            label="vector roof (model)",
        )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (flop/byte)")
        ax.set_ylabel("modelled flop/s")
        ax.set_title(f"ops of one step on TPU {self.generation} (red: matmul, orange: conv, blue: other)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


class _Probe:
    """A plain step (after warm-up): its time, host syncs by line, compiles, the ops lowered anew, fallbacks."""

    def __enter__(self):

        torch.tpu.synchronize()
        self.c0 = metrics.counters()
        with metrics._lock:
            self.s0 = collections.Counter(metrics._sync_lines)
        self.lowered = []
        self._cb = kernels.callbacks()
        orig = self._cb["lower"]

        def lower(name, *a):
            self.lowered.append(name)
            return orig(name, *a)

        _C._set_callbacks(dict(self._cb, lower=lower))
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        torch.tpu.synchronize()
        self.seconds = time.perf_counter() - self.t0
        _C._set_callbacks(self._cb)
        c1 = metrics.counters()
        with metrics._lock:
            s1 = collections.Counter(metrics._sync_lines)
        self.syncs = sorted((s1 - self.s0).items(), key=lambda kv: -kv[1])
        self.compiles = c1.get("compiles", 0) - self.c0.get("compiles", 0)
        fb = {k[len("fallback.") :]: c1.get(k, 0) - self.c0.get(k, 0) for k in c1 if k.startswith("fallback.")}
        self.fallbacks = {k: v for k, v in fb.items() if v}
        return False


class _Record:
    """The step's ops (a dispatch mode) and XLA's cost analysis of every program it runs, in strict mode so that
    each op's program is its own: the chunk cache is emptied first, so each chunk asks the executable cache again
    (compiling each op's program once if the step ran fused until now)."""

    def __enter__(self):

        torch.tpu.synchronize()
        self._mode = executor.get_mode()
        executor.set_mode("strict")
        self.programs = []
        _C._clear_chunk_cache()
        self._orig_get = cache.get_or_compile

        def get_or_compile(rt, text, device_index=0):
            exe = self._orig_get(rt, text, device_index)
            try:
                ca = exe.cost_analysis()
                ca = ca[0] if isinstance(ca, list) else ca
                self.programs.append((float(ca.get("flops", 0.0)), float(ca.get("bytes accessed", 0.0))))
            except Exception:  # noqa: BLE001 (a backend without cost analysis)
                pass
            return exe

        cache.get_or_compile = get_or_compile
        self.rec = _Recorder(self.programs)
        self.rec.__enter__()
        return self

    def __exit__(self, *exc):

        try:
            torch.tpu.synchronize()
        finally:
            self.rec.__exit__(*exc)
            cache.get_or_compile = self._orig_get
            executor.set_mode(self._mode)
        return False


def advise(fn, *args, generation: str = "v5e", warmup: int = 2, png: str | None = None, **kwargs) -> Report:
    """Runs ``fn(*args, **kwargs)`` (one training step) ``warmup`` times, then once recorded; returns the Report
    (``print(report.text())``, ``report.plot("roofline.png")``)."""
    if generation not in TPUS:
        raise ValueError(f"torchtpu.advise: generation {generation!r}: expected one of {', '.join(TPUS)}")
    for _ in range(warmup):
        fn(*args, **kwargs)
    with _Probe() as p:
        fn(*args, **kwargs)
    with _Record() as r:
        fn(*args, **kwargs)
    rep = Report.of(p, r, generation)
    if png:
        rep.plot(png)
    return rep


__all__ = ["advise", "Report", "TPUS"]
