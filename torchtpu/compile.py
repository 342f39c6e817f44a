"""``torch.compile(model, backend="tpu")``: AOTAutograd graphs run as single tpu programs.

Dynamo captures the Python; AOTAutograd (with the Core ATen decompositions) turns each captured region into
functionalized forward and backward graphs (an inference graph under ``no_grad``), each an FX graph of ATen ops.
Each graph becomes a :class:`TpuGraph`. Its first call with a given input layout runs the graph's ops once in
fused mode through the same C++ kernels and Python rules as eager, and captures them (csrc/graph/capture.h):
the recorded ops become one fragment, a *program*, whose StableHLO module XLA compiles through the shared cache.
Every later call whose inputs have that layout records one node of the program (no per-op dispatch, no Python
per op): in fused mode it fuses with the eager ops around it (the optimizer step, the loss read), in strict mode
it launches at once. Buffers the graph overwrites are donated as in eager mode.

A graph that reads values on the host (``.item()`` inside, a data-dependent size, a CPU fallback), takes CPU
tensors as inputs (a non-capturable optimizer's step counters), or hands back values made outside its ops runs
op by op instead, in the current mode: correct, counted (``compile.eager_graphs``) and reported once per
graph with the reason. New input layouts capture again, up to ``TORCHTPU_COMPILE_MAX_PROGRAMS`` (8) per graph,
then run op by op.

``dynamic=True`` / ``mark_dynamic``: Dynamo and AOTAutograd give symbolic graphs; each distinct concrete
shape is one capture (one compile), as with ``dynamic=False``. Bucketed sizes (one program per bucket) are
the dynamic-shapes issue's work.
"""
from __future__ import annotations

import os
import warnings

import torch

from . import _C, checks, executor, metrics

MAX_PROGRAMS = int(os.environ.get("TORCHTPU_COMPILE_MAX_PROGRAMS", "8"))


class TpuGraph:
    """An ATen FX graph from AOTAutograd, run as captured programs (boxed calling convention)."""

    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule, kind: str):
        self.gm = gm
        self.kind = kind
        self.programs: list = []  # (non-tensor arguments, program id, output template)
        self.eager: dict = {}  # non-tensor arguments -> why these calls run op by op
        self.warned = False

    def __call__(self, *args):
        # boxed (one list) as AOTAutograd calls forward graphs; unpacked as its backward wrappers may
        args = list(args[0]) if len(args) == 1 and isinstance(args[0], list) else list(args)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        key = tuple(a for a in args if not isinstance(a, torch.Tensor))
        for k, pid, template in self.programs:
            if k == key:
                outs = _C._run_program(pid, tensors)
                if outs is not None:
                    metrics.inc("compile.program_runs")
                    return _assemble(template, outs)
        why = self.eager.get(key) or _why_not(tensors)
        if why is None and len(self.programs) >= MAX_PROGRAMS:
            why = f"more than TORCHTPU_COMPILE_MAX_PROGRAMS={MAX_PROGRAMS} input layouts"
        if why is not None:
            return self._op_by_op(args, key, why)
        return self._capture(args, tensors, key)

    def _op_by_op(self, args, key, why):
        self._goes_op_by_op(key, why, _n_ops(self.gm))
        metrics.inc("compile.eager_graph_runs")
        return list(self.gm(*args))

    def _goes_op_by_op(self, key, why, n_ops):
        """Calls with these non-tensor arguments run op by op from now on: counted, and said once per graph."""
        self.eager.setdefault(key, why)
        if not self.warned:
            self.warned = True
            metrics.inc("compile.eager_graphs")
            warnings.warn(f"torchtpu: a compiled {self.kind} graph of {n_ops} ops runs op by op: {why}", stacklevel=3)

    def _capture(self, args, tensors, key):
        device = tensors[0].device.index or 0
        with executor.mode("fused"):
            _C._capture_begin(device, tensors)
            try:
                outs = self.gm(*args)
            except BaseException:
                _C._capture_end(device, tensors, [])  # what ran is launched as an ordinary chunk
                raise
            outs = list(outs)
            touts = [o for o in outs if isinstance(o, torch.Tensor)]
            pid, why, check_frags, n_ops = _C._capture_end(device, tensors, touts)
        if executor.get_mode() == "debug":
            executor.synchronize(device)
        if pid < 0:
            self._goes_op_by_op(key, why, n_ops)
            return outs
        info = _C._program_info(pid)
        if check_frags:
            messages = []
            for fid in check_frags:
                opname, msgs = checks._MESSAGES[fid]
                messages += [(exc, f"{opname}: {m}") for exc, m in msgs]
            checks.register(info["fragment"], f"compiled {self.kind} graph", messages)
        template = [None if isinstance(o, torch.Tensor) else (o,) for o in outs]
        self.programs.append((key, pid, template))
        metrics.inc("compile.captures")
        metrics.inc("compile.captured_ops", info["ops"])
        return outs


def _assemble(template, touts):
    it = iter(touts)
    return [next(it) if t is None else t[0] for t in template]


def _why_not(tensors) -> str | None:
    if not tensors:
        return "it takes no tensors"
    devices = {(t.device.type, t.device.index) for t in tensors}
    if len(devices) > 1:
        kinds = ", ".join(sorted(f"{d}:{i}" if i is not None else d for d, i in devices))
        return f"its inputs are on several devices ({kinds}); CPU inputs (e.g. an optimizer's step counters) " \
               "are read on the host at every call"
    if tensors[0].device.type != "tpu":
        return "its inputs are not on tpu"
    return None


def _n_ops(gm) -> int:
    return sum(1 for n in gm.graph.nodes if n.op == "call_function")


def _compiler(kind):
    def compile_graph(gm, example_inputs):
        metrics.inc(f"compile.graphs.{kind}")
        return TpuGraph(gm, kind)

    return compile_graph


def _decompositions():
    from torch._decomp import core_aten_decompositions

    return core_aten_decompositions()


def backend(gm, example_inputs, **kwargs):
    """The Dynamo backend "tpu" (registered through the ``torch_dynamo_backends`` entry point)."""
    from torch._dynamo.backends.common import aot_autograd

    _register_device_interface()
    # NOTE: min_cut_rematerialization_partition (Inductor's) measured no faster on the small GPT step here
    return aot_autograd(fw_compiler=_compiler("forward"), bw_compiler=_compiler("backward"),
                        inference_compiler=_compiler("inference"), decompositions=_decompositions(),
                        keep_inference_input_mutations=True)(gm, example_inputs, **kwargs)


_interface_registered = False


def _register_device_interface() -> None:
    """Replaces torch 2.13's own Dynamo ``TpuInterface`` for "tpu" (written for another package: device 0 only,
    no float64/half) with one that asks torch.tpu."""
    global _interface_registered
    if _interface_registered:
        return
    from torch._dynamo import device_interface as di
    from torch._dynamo import trace_rules

    # Our Python runs under the C++ kernels (lowering a new signature, the Python kernels, host reads); Dynamo must
    # never trace those frames when they run inside a compiled function's graph breaks.
    trace_rules.add("torchtpu")
    di.get_registered_device_interfaces()  # torch's own registrations first, so that ours replace its "tpu"

    class TorchTpuInterface(di.DeviceInterface):
        device = torch.device  # noqa: A003 (DeviceInterface's own spelling)

        @staticmethod
        def current_device():
            return torch.tpu.current_device()

        @staticmethod
        def set_device(device):
            torch.tpu.set_device(device)

        @staticmethod
        def device_count():
            return torch.tpu.device_count()

        @staticmethod
        def is_available():
            return torch.tpu.is_available()

        @staticmethod
        def synchronize(device=None):
            torch.tpu.synchronize(device)

        @staticmethod
        def is_bf16_supported(including_emulation: bool = False):
            return True

        @classmethod
        def is_dtype_supported(cls, dtype, including_emulation: bool = False):
            return dtype is not torch.complex32

        @staticmethod
        def get_compute_capability(device=None):
            return ""

        @staticmethod
        def memory_allocated(device=None):
            return torch.tpu.memory_allocated(device)

    di.register_interface_for_device("tpu", TorchTpuInterface)
    for i in range(torch.tpu.device_count()):
        di.register_interface_for_device(f"tpu:{i}", TorchTpuInterface)
    _interface_registered = True


__all__ = ["backend", "TpuGraph"]
