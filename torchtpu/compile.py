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

``dynamic=True`` / ``mark_dynamic``: Dynamo and AOTAutograd give symbolic graphs; each bucket of their sizes
(``torchtpu.set_shape_buckets``) is one capture: the graph runs padded through torchtpu/shapes' interpreter,
the true sizes are runtime values of the program, inputs and outputs are compact tensors of their exact sizes.
A graph the interpreter cannot run padded is captured per exact size (counted, warned once).
"""

from __future__ import annotations

import collections.abc
import contextlib
import os
import warnings

import torch

from . import _C, cache, checks, config, executor, metrics, shapes
from .lowering.matmul import grouped_mm_meta
from .shapes import plan as shape_plan

MAX_PROGRAMS = config.get("compile_max_programs")

# This module is imported when torch.compile(..., backend="tpu") looks the backend up (the torch_dynamo_backends
# entry point), not at `import torchtpu`; what the backend's first call needs is imported now, with the rest of
# Dynamo, rather than inside the first compiled step.
import torch._dynamo.backends.common  # noqa: E402,F401
import torch._functorch._aot_autograd.autograd_cache  # noqa: E402,F401
import torch._inductor.debug  # noqa: E402,F401  (aot_autograd's enable_aot_logging)
import torch._inductor.output_code  # noqa: E402,F401


def _register_fake_impls() -> None:
    """Fake-tensor rules for ops whose torch meta kernel refuses what tpu runs (Dynamo traces with them)."""
    from torch._subclasses import fake_impls
    from torch._subclasses.fake_tensor import FakeTensor, in_kernel_invocation_manager

    def on_tpu(args):
        return isinstance(args[0], torch.Tensor) and args[0].device.type == "tpu"

    @fake_impls.register_op_impl(lambda func: func is torch.ops.aten._grouped_mm.default)
    def _grouped_mm(fake_mode, func, *args, **kwargs):
        if not on_tpu(args):
            return NotImplemented
        with in_kernel_invocation_manager(fake_mode):
            out = grouped_mm_meta(*args, **kwargs)
        return FakeTensor(fake_mode, out, args[0].device)


def _register_traced_decompositions() -> None:
    """Decompositions that Dynamo and AOTAutograd trace (the Python dispatcher) in place of torch's C++ composite
    kernels where those read a size as a plain int, which pins a symbolic size to its value (one frame per size):
    `max_pool1d`'s C++ shape check guards its output length (`F.max_pool1d` over a varying length re-traced every
    new length). On tpu tensors only; elsewhere torch's own kernel runs, as before."""
    from torch._C import DispatchKey

    aten = torch.ops.aten
    composite = DispatchKey.CompositeImplicitAutograd

    @aten.max_pool1d.default.py_impl(composite)
    def _max_pool1d(x, kernel_size, stride=(), padding=(0,), dilation=(1,), ceil_mode=False):
        if x.device.type != "tpu":
            return aten.max_pool1d.default._op_dk(composite, x, kernel_size, stride, padding, dilation, ceil_mode)
        # the same values and checks (max_pool1d_with_indices validates its arguments as max_pool1d does)
        return aten.max_pool1d_with_indices.default(x, kernel_size, stride, padding, dilation, ceil_mode)[0]


_register_fake_impls()
_register_traced_decompositions()


class TpuGraph:
    """An ATen FX graph from AOTAutograd, run as captured programs (boxed calling convention)."""

    _boxed_call = True

    def __init__(self, gm: torch.fx.GraphModule, kind: str):
        self.gm = gm
        self.kind = kind
        self.programs: list = []  # (non-tensor arguments, program id, output template)
        self.eager: dict = {}  # non-tensor arguments -> why these calls run op by op
        self.warned = False
        # CPU values made inside the graph are constants (its inputs are on the device) unless it draws random
        # numbers on the CPU
        self.cpu_constants = not _draws_on_cpu(gm)
        self.scalar_inputs = _scalar_inputs(gm)
        self.bucket_warned = False
        self.plan = _bucket_plan(gm)  # a symbolic graph: one program per bucket of its sizes (torchtpu/shapes)

    def __call__(self, *args):
        # boxed (one list) as AOTAutograd calls forward graphs; unpacked as its backward wrappers may
        args = list(args[0]) if len(args) == 1 and isinstance(args[0], list) else list(args)
        if self.scalar_inputs:
            _upload_scalars(args, self.scalar_inputs)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        key = tuple(a for a in args if not isinstance(a, torch.Tensor))
        baked = [t for t in tensors if t.device.type == "cpu" and t.dim() == 0] if self.kind == "backward" else []
        if baked:
            # a CPU scalar the forward graph saved for its backward (DeBERTa's attention scale): the ops read it as a
            # scalar, which a program bakes, so programs are keyed by its value (a forward's constants: one program)
            key += tuple(("cpu", t.dtype, t.item()) for t in baked)
            tensors = [t for t in tensors if not any(t is b for b in baked)]
        if self.plan is not None and shapes.enabled():
            out = self._bucketed(args, tensors)
            if out is not None:
                return out
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
        if not self.warned and n_ops:  # a graph of no ops (only views, or nothing on tpu) loses nothing
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
            touts = [o for o in outs if isinstance(o, torch.Tensor) and not self._constant_output(o)]
            pid, why, check_frags, n_ops = _C._capture_end(device, tensors, touts)
        if executor.get_mode() == "debug":
            executor.synchronize(device)
        if pid < 0:
            self._goes_op_by_op(key, why, n_ops)
            return outs
        info = _C._program_info(pid)
        self._register_checks(info, check_frags)
        template = [
            _CpuConstant(o)
            if isinstance(o, torch.Tensor) and self._constant_output(o)
            else None
            if isinstance(o, torch.Tensor)
            else (o,)
            for o in outs
        ]
        self.programs.append((key, pid, template))
        metrics.inc("compile.captures")
        metrics.inc("compile.captured_ops", info["ops"])
        return outs

    # -- bucketed sizes ----------------------------------------------------------------------------------------------
    def _bucketed(self, args, tensors):
        """The call through its bucket's program (captured on the bucket's first call); None: not bucketed."""
        plan = self.plan
        if _why_not(tensors) is not None or len(tensors) != sum(isinstance(a, torch.Tensor) for a in args):
            return None
        values = plan.values(args)
        key = ("bucket",) + plan.key(values)
        if key in self.eager:
            return None
        captured = [k for k, _, _ in self.programs if k[0] == "bucket"]
        if key not in captured and len(captured) >= MAX_PROGRAMS:  # before any copy for its layout
            return None
        device = tensors[0].device
        flats = [None] * len(args)
        try:
            caps = {
                i: plan.capacity(plan.in_shapes[i][1], values) for i in plan.tensor_inputs() if plan.padded_input(i)
            }
        except shapes.Unsupported as e:  # a size expression without a rule
            self._declines(key, str(e))
            return None
        for i, cap in caps.items():
            flats[i] = _flat_capacity(args[i], cap)
        with executor.exact_uploads():
            sizes = torch.tensor(values, dtype=torch.int64).to(device)
        prog_tensors = [
            flats[i] if flats[i] is not None else a for i, a in enumerate(args) if isinstance(a, torch.Tensor)
        ] + [sizes]
        for k, pid, template in self.programs:
            if k == key:
                outs = _C._run_program(pid, prog_tensors)
                if outs is not None:
                    metrics.inc("compile.program_runs")
                    metrics.inc("compile.bucketed_runs")
                    return shape_plan.exact_outputs(plan, values, _assemble(template, outs))
        if len(captured) >= MAX_PROGRAMS:
            return None
        dev = device.index or 0
        with executor.mode("fused"):
            _C._capture_begin(dev, prog_tensors)
            try:
                outs = shape_plan.execute(plan, args, flats, sizes)
                touts = [o for o in outs if isinstance(o, torch.Tensor)]
                if any(t.device.type != "tpu" for t in touts):
                    raise shapes.Unsupported("an output is not on the device")
            except shapes.Unsupported as e:
                _C._capture_end(dev, prog_tensors, [])
                self._declines(key, str(e))
                return None
            except Exception as e:  # noqa: BLE001 — a defect of a padded rule: fail closed, the sizes run exactly
                _C._capture_end(dev, prog_tensors, [])
                self._declines(key, f"the bucketed interpreter failed ({type(e).__name__}: {e}); please report it")
                return None
            except BaseException:
                _C._capture_end(dev, prog_tensors, [])
                raise
            pid, why, check_frags, n_ops = _C._capture_end(dev, prog_tensors, touts)
        if executor.get_mode() == "debug":
            executor.synchronize(dev)
        if pid < 0:
            self._declines(key, why)
            return shape_plan.exact_outputs(plan, values, outs)
        info = _C._program_info(pid)
        self._register_checks(info, check_frags)
        template = [None if isinstance(o, torch.Tensor) else (o,) for o in outs]
        self.programs.append((key, pid, template))
        metrics.inc("compile.captures")
        metrics.inc("compile.bucketed_captures")
        metrics.inc("compile.captured_ops", info["ops"])
        return shape_plan.exact_outputs(plan, values, outs)

    def _register_checks(self, info, check_frags):
        """The device-side checks of the captured ops (index bounds...) raise with their op's message."""
        if not check_frags:
            return
        messages = []
        for fid in check_frags:
            opname, msgs = checks._MESSAGES[fid]
            messages += [(exc, f"{opname}: {m}") for exc, m in msgs]
        checks.register(info["fragment"], f"compiled {self.kind} graph", messages)

    def _declines(self, key, why):
        """This bucket's calls capture per exact size from now on (correct, a program per size): said once."""
        self.eager[key] = why
        metrics.inc("compile.bucket_declined")
        if not self.bucket_warned:
            self.bucket_warned = True
            warnings.warn(
                f"torchtpu: a compiled {self.kind} graph with symbolic sizes is captured per exact size, "
                f"not per bucket: {why}",
                stacklevel=4,
            )

    def _constant_output(self, t) -> bool:
        """A CPU tensor the graph returns, made from its constants (DeBERTa's forward returns its attention scale,
        computed on the CPU, for its backward): each call returns a copy of the captured value."""
        return t.device.type == "cpu" and self.cpu_constants


class _CpuConstant:
    __slots__ = ("value",)

    def __init__(self, value):
        self.value = value.detach().clone()


def _assemble(template, touts):
    it = iter(touts)
    return [next(it) if t is None else t.value.clone() if isinstance(t, _CpuConstant) else t[0] for t in template]


def _scalar_inputs(gm):
    """Inputs that may be CPU scalars the graph only reads: Dynamo's unspecialized Python floats (a dynamic graph
    takes a model's float attributes as 0-dim float64 CPU tensors), a scale its forward computed on the CPU for its
    backward. Each call copies them to the device, so that a program reads them as runtime values; an input the
    graph writes (an optimizer's CPU step counter) stays on the CPU (and the graph runs op by op)."""
    graph = getattr(gm, "graph", None)
    if graph is None:
        return ()
    out = []
    for i, n in enumerate(n for n in graph.nodes if n.op == "placeholder"):
        val = n.meta.get("val")
        if not (isinstance(val, torch.Tensor) and val.dim() == 0 and val.device.type == "cpu"):
            continue
        if any(isinstance(u.target, torch._ops.OpOverload) and u.target._schema.is_mutable for u in n.users):
            continue
        out.append(i)
    return tuple(out)


def _upload_scalars(args, which):
    device = next((a.device for a in args if isinstance(a, torch.Tensor) and a.device.type == "tpu"), None)
    if device is None:
        return
    for i in which:
        a = args[i]
        if isinstance(a, torch.Tensor) and a.device.type == "cpu" and a.dim() == 0:
            args[i] = a.to(device)


def _bucket_plan(gm):
    """The graph's bucketing plan when it has symbolic sizes (an FX graph with its symbolic metadata; a graph read
    back from the disk cache keeps only its code, and runs per exact size)."""
    if not isinstance(gm, torch.fx.GraphModule):
        return None
    try:
        plan = shape_plan.Plan(gm)
    except shapes.Unsupported:
        return None
    return plan if plan.symbolic() else None


def _flat_capacity(t, capacity):
    """t's storage as a flat tensor of `capacity` elements holding t's values first. t is compact (contiguous from
    the storage's start) in a storage at least that large when a bucketed program made it; a storage that holds no
    value stays so (it reads as zeros); else (a batch just copied from the host at its exact size) its values are
    copied anew with the capacity, from the host bytes of a small upload (compile.bucket_input_host_copies) or read
    back (a host read, host_sync.bucket_input): never a program per size."""
    vt = _C._storage_value_type(t)
    if vt is None:  # a storage that holds no value reads as zeros (torch.zeros, autograd's zero gradients)
        return torch.empty(capacity, dtype=t.dtype, device=t.device)
    whole = t.is_contiguous() and t.storage_offset() == 0
    if whole and t.untyped_storage().nbytes() == capacity * t.element_size():
        if tuple(vt[0]) == (capacity,) and vt[1] == t.dtype:  # the program reads the storage's buffer: the flat one
            return t.as_strided((capacity,), (1,), 0)
    host = torch.zeros(capacity, dtype=t.dtype)
    kept = executor.uploaded_values(t) if whole else None
    if kept is not None:
        host[: t.numel()] = kept.reshape(-1)  # the bytes it was uploaded from (shapes/policy.py UPLOAD_HOST_COPY_BYTES)
        metrics.inc("compile.bucket_input_host_copies")
    else:
        host[: t.numel()] = executor.read_host(t, "bucket_input").reshape(-1)
    metrics.inc("compile.bucket_input_copies")
    with executor.exact_uploads():
        return host.to(t.device)


def _draws_on_cpu(gm) -> bool:
    """Whether the graph draws random numbers on the CPU (values no program may bake); True when it cannot tell."""
    if isinstance(gm, _GraphCode):
        return gm.draws_on_cpu
    graph = getattr(gm, "graph", None)
    if graph is None:
        return True
    for n in graph.nodes:
        if (
            n.op == "call_function"
            and isinstance(n.target, torch._ops.OpOverload)
            and torch.Tag.nondeterministic_seeded in n.target.tags
        ):
            val = n.meta.get("val")
            vals = [v for v in (val if isinstance(val, (tuple, list)) else [val]) if isinstance(v, torch.Tensor)]
            if not vals or any(v.device.type == "cpu" for v in vals):
                return True
    return False


def _why_not(tensors) -> str | None:
    if not tensors:
        return "it takes no tensors"
    devices = {(t.device.type, t.device.index) for t in tensors}
    if len(devices) > 1:
        kinds = ", ".join(sorted(f"{d}:{i}" if i is not None else d for d, i in devices))
        return (
            f"its inputs are on several devices ({kinds}); CPU inputs (e.g. an optimizer's step counters) "
            "are read on the host at every call"
        )
    if tensors[0].device.type != "tpu":
        return "its inputs are not on tpu"
    return None


def _n_ops(gm) -> int:
    if isinstance(gm, _GraphCode):
        return gm.n_ops
    return sum(1 for n in gm.graph.nodes if n.op == "call_function")


def _compiler(kind):
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    def compile_graph(gm, example_inputs):
        metrics.inc(f"compile.graphs.{kind}")
        return TpuOutputCode(TpuGraph(gm, kind))

    return SerializableAOTDispatchCompiler(TpuOutputCode, compile_graph)


class _Decompositions(collections.abc.Mapping):
    """The Core ATen decomposition table, built on first use: building it takes ~0.1 s, and a graph whose AOTAutograd
    result comes from the disk cache never reads it."""

    _table = None

    def _get(self):
        if _Decompositions._table is None:
            from torch._decomp import core_aten_decompositions

            _Decompositions._table = core_aten_decompositions()
        return _Decompositions._table

    def __getitem__(self, op):
        return self._get()[op]

    def __iter__(self):
        return iter(self._get())

    def __len__(self):
        return len(self._get())

    def __contains__(self, op):
        return op in self._get()


def _decompositions():
    return _Decompositions()


# torch.compile's modes name Inductor's trade-offs; every graph here is one XLA program launched without per-op
# host work (what "reduce-overhead" buys with CUDA graphs), so each mode compiles the same program. Hugging Face's
# generate passes "reduce-overhead" unless told otherwise.
_MODES = {None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"}


def backend(gm, example_inputs, **kwargs):
    """The Dynamo backend "tpu" (registered through the ``torch_dynamo_backends`` entry point)."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.utils import counters

    _register_device_interface()
    mode = kwargs.pop("mode", None)
    if mode not in _MODES:
        known = sorted(m for m in _MODES if m)
        raise ValueError(f"torch.compile(backend='tpu'): unknown mode {mode!r}; one of {known}")
    before = dict(counters["aot_autograd"])
    # NOTE: min_cut_rematerialization_partition (Inductor's) measured no faster on the small GPT step here
    with _aot_cache():
        out = aot_autograd(
            fw_compiler=_compiler("forward"),
            bw_compiler=_compiler("backward"),
            inference_compiler=_compiler("inference"),
            decompositions=_decompositions(),
            keep_inference_input_mutations=True,
        )(gm, example_inputs, **kwargs)
    for what in ("hit", "miss", "bypass"):
        if counters["aot_autograd"][f"autograd_cache_{what}"] > before.get(f"autograd_cache_{what}", 0):
            metrics.inc(f"compile.aot_cache_{what}")
    return out


# -- AOTAutograd's results on disk -----------------------------------------------------------------------------
# A new process spends most of its first compiled step in Dynamo and AOTAutograd (tracing the joint graph,
# partitioning it), not in XLA. torch's AOTAutogradCache keeps AOTAutograd's results, but only for Inductor's
# output; ours is a TpuGraph. So each graph is handed back as a TpuOutputCode (torch's cacheable OutputCode, kept
# "bundled": pickled whole), and while our backend runs, torch's cache is pointed at our disk tier: the entries
# live in TORCHTPU_CACHE_DIR next to the executables, with the same header, length and sha256 checked before
# anything is unpickled, the same owner-only directory rule and the same size bound. Its key is torch's own
# (the Dynamo graph, the inputs' metadata, grad/autocast state, AOTAutograd's config), minus Inductor's part
# (Inductor's config and code hash, whose computation imports Inductor's code generators: 1.3 s here) and plus
# the torch version and AOT_FORMAT.
AOT_FORMAT = "tpu-aot-1"  # bump when what TpuOutputCode pickles, or the backend's AOTAutograd options, change
AOT_MAGIC = b"torchtpu-aot-v1\n"


class TpuOutputCode(torch._inductor.output_code.OutputCode):
    """A TpuGraph as torch's cacheable OutputCode. It pickles as the graph's code, never its programs (the executables
    come from the executable cache, the programs are captured again on the first call)."""

    _boxed_call = True

    def __init__(self, graph: TpuGraph):
        self.graph = graph
        # also on the instance: Dynamo wraps a backward compiler's result in disable(), whose functools.wraps copies
        # the instance's __dict__ only; without it AOTAutograd calls the backward unboxed and warns users about it
        self._boxed_call = True

    def __call__(self, *args):
        return self.graph(*args)

    def prepare_for_serialization(self) -> None:
        self.graph = TpuGraph(_GraphCode(self.graph.gm), self.graph.kind)

    def post_compile(self, example_inputs, constants, graph_kwargs) -> None:
        pass

    def set_triton_bundle(self, triton_bundle) -> None:
        pass

    def __getstate__(self):
        return {"code": _GraphCode(self.graph.gm), "kind": self.graph.kind}

    def __setstate__(self, state):
        self.__init__(TpuGraph(state["code"], state["kind"]))


class _GraphCode:
    """An FX graph kept as its Python code. A GraphModule pickles as its code too, but unpickles by tracing that code
    symbolically, which runs factory calls with constant arguments (``arange(64)``, a causal mask) and bakes their
    values into the graph as tensor constants; this one executes the code as it was generated."""

    def __init__(self, gm):
        if isinstance(gm, _GraphCode):
            self.__dict__.update(gm.__dict__)
            return
        from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache
        from torch.fx.graph_module import _format_import_block
        from torch.package import sys_importer

        if _bucket_plan(gm) is not None:
            # its calls are bucketed by the FX graph's symbolic metadata, which its code alone does not keep
            raise BypassAOTAutogradCache("torchtpu: a graph with symbolic sizes (bucketed) is not kept on disk")
        code = gm.graph.python_code(root_module="self")
        self.src = _format_import_block(code.globals, sys_importer) + "\n" + code.src
        self.n_ops = _n_ops(gm)
        self.draws_on_cpu = _draws_on_cpu(gm)
        self.attrs = {}
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        for node in gm.graph.nodes:
            if node.op == "get_attr":
                value = getattr(gm, node.target, None)
                if "." in node.target or not isinstance(value, torch.Tensor) or type(value) is not torch.Tensor:
                    raise BypassAOTAutogradCache(f"torchtpu: the graph reads {node.target} ({type(value).__name__})")
                with unset_fake_temporarily():  # AOTAutograd saves its entry inside its fake mode
                    self.attrs[node.target] = (value.detach().cpu(), str(value.device))
        self._fn = None

    def __getstate__(self):
        return {"src": self.src, "n_ops": self.n_ops, "attrs": self.attrs, "draws_on_cpu": self.draws_on_cpu}

    def __setstate__(self, state):
        self.draws_on_cpu = True  # entries written before it was kept: assume the worst
        self.__dict__.update(state)
        self._fn = None

    def __call__(self, *args):
        if self._fn is None:
            import types

            from torch.fx.graph_module import _forward_from_src

            owner = types.SimpleNamespace(**{k: t.to(d) for k, (t, d) in self.attrs.items()})
            fn = _forward_from_src(self.src, {})
            self._fn = lambda *a: fn(owner, *a)
        return self._fn(*args)


def _aot_dir() -> str | None:
    return cache.disk_dir()


@contextlib.contextmanager
def _aot_cache():
    """torch's AOTAutogradCache on our disk tier for the duration of one backend call (see above)."""
    import unittest.mock

    import torch._functorch.config as fconfig
    from torch._functorch._aot_autograd import autograd_cache as ac

    d = _aot_dir()
    if d is None:
        with fconfig.patch(enable_autograd_cache=False):
            yield
        return
    context = AOT_FORMAT + "|" + torch.__version__

    def details(self, gm, example_inputs, fx_config):
        self.gm, self.example_inputs, self.torchtpu = gm, example_inputs, context

    def write(key, content):
        cache.write_entry(os.path.join(d, key + ".aot"), AOT_MAGIC, context, content)

    def candidates(local, remote_cache, key):
        import pickle

        path = os.path.join(d, key + ".aot")
        got = cache.read_entry(path, AOT_MAGIC, context)
        if got is None:
            return
        try:
            entry = pickle.loads(got[1])
        except Exception as e:  # noqa: BLE001 (checked bytes that still do not load: make it anew)
            cache.bad_entry(path, f"does not unpickle ({type(e).__name__}: {e})")
            return
        yield entry, got[1], True

    # force_non_lazy_backward_lowering: the backward graph is handed to us (and its entry saved) inside this call,
    # not at the first backward, when torch's cache would no longer point here
    with (
        fconfig.patch(enable_autograd_cache=True, bundled_autograd_cache=True, force_non_lazy_backward_lowering=True),
        unittest.mock.patch.object(ac.AOTAutogradCacheDetails, "_init_fx_graph_hash_details", details),
        unittest.mock.patch.object(ac.AOTAutogradCache, "_write_to_local_cache", staticmethod(write)),
        unittest.mock.patch.object(ac.AOTAutogradCache, "iterate_over_candidates", staticmethod(candidates)),
    ):
        yield


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
