"""The c10d backend "tpu": collectives on tpu tensors are XLA collective programs over the group's devices.

``torch.distributed.init_process_group("tpu")`` (or ``"cpu:gloo,tpu:tpu"``) with torch's own rendezvous (torchrun's
environment, or a store). One process per device. At the default group's creation every process's XLA client
joins one distributed runtime (``jax.distributed``, its coordinator address agreed through torch's store), so each
collective is one XLA program over the participating processes' devices: XLA's own collectives (gloo between
processes on XLA:CPU here, ICI on TPU), never a copy through the host. The XLA client starts at the first tpu op,
so the group must be created before any.

A collective reads its inputs' values (what fused mode has pending is launched first: a cut, the same on every
rank because every rank calls the collective at the same point of its program) and its results become the
outputs' storage values; later ops consume them as any value, in order. Ranks may run different code (MPMD) as
long as they call the same collectives in the same order, as with NCCL. CPU tensors go to a gloo group over the
same ranks. ``Work.wait()`` returns at once: like a cuda stream, the results are futures that later ops wait on.
A rank that dies makes the others' next collective fail (XLA's collective or the distributed runtime's heartbeat)
within the process group's timeout (``timeout=`` of ``init_process_group``), naming the collective.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import gc
import os
import socket
import threading

import numpy as np
import torch
import torch.distributed as dist
from torch._C._distributed_c10d import _create_work_from_future

from . import _C, collectives, config, dtypes, executor, metrics, runtime, views

_joined: dict = {}  # "world", "rank": the distributed runtime this process joined
_lock = threading.Lock()


# -- joining ------------------------------------------------------------------------------------------------------
def _join(store, rank: int, world: int, timeout: datetime.timedelta) -> None:
    """Joins this process's XLA client to the other ranks' (once per process, before the client starts)."""
    import jax

    with _lock:
        if _joined:
            if (_joined["rank"], _joined["world"]) != (rank, world):
                raise RuntimeError(
                    f"torchtpu: this process joined a distributed run as rank {_joined['rank']} of "
                    f"{_joined['world']}; a default group as rank {rank} of {world} cannot join another"
                )
            return
        rt = runtime.get()
        if rt._backend is not None:
            raise RuntimeError(
                "torchtpu: init_process_group('tpu') must come before the first tpu op of the process: "
                "its XLA client joins the other ranks' when it starts, and it has started"
            )
        if rank == 0:
            store.set("torchtpu/coordinator", f"{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{_free_port()}")
        address = store.get("torchtpu/coordinator").decode()
        leave = _leave_store(store, rank, world, timeout)
        seconds = max(1, int(timeout.total_seconds()))
        if rt.platform == "cpu":
            jax.config.update("jax_cpu_collectives_implementation", "gloo")
        # by default jax's client terminates the process when the distributed runtime finds a rank gone (missed
        # heartbeats); torch's contract is an error in the collectives instead: the job stays "recoverable"
        jax.config.update("jax_enable_recoverability", True)
        jax.distributed.initialize(
            coordinator_address=address,
            num_processes=world,
            process_id=rank,
            initialization_timeout=seconds,
            # a failed collective can name the lost rank (the runtime's view, _lost) well within the timeout
            heartbeat_timeout_seconds=_heartbeat(seconds),
            shutdown_timeout_seconds=max(10, seconds),
        )
        _joined.update(rank=rank, world=world, store=leave, timeout=timeout)
        rt.on_group_failure = _lost  # a collective failing inside a program names the lost ranks too
        atexit.register(_leave)


def _heartbeat(seconds: int) -> int:
    """The distributed runtime's heartbeat timeout: a third of the group's timeout, at most 20 s, so that a lost rank
    is named well within a minute even under torch's default timeout (30 minutes)."""
    return min(20, max(5, seconds // 3))


def _master_host() -> str:
    host = os.environ.get("MASTER_ADDR", "127.0.0.1")
    return "127.0.0.1" if host == "localhost" else host


def _free_port() -> int:
    """A port free on the master's address (rank 0 serves what it names)."""
    with socket.socket() as s:
        s.bind((_master_host(), 0))
        return s.getsockname()[1]


def _leave_store(store, rank: int, world: int, timeout: datetime.timedelta):
    """A store of our own for leaving at exit (rank 0 serves it), so that the group's store is not kept alive: torch's
    rendezvous server is shared per port within a process, and a kept one would hand a later default group on the
    same port the destroyed group's keys (its gloo addresses: the new group's connect then waits on a dead peer)."""
    host = _master_host()
    if rank == 0:
        port = _free_port()
        own = dist.TCPStore(host, port, world, True, timeout, wait_for_workers=False, multi_tenant=False)
        store.set("torchtpu/leave_store", str(port))
        return own
    return dist.TCPStore(host, int(store.get("torchtpu/leave_store").decode()), world, False, timeout)


def _leave() -> None:
    """At exit, before jax's own clean-up: rank 0 hosts the distributed runtime's service, so it leaves last, once
    every other rank has disconnected (a rank still disconnecting from a service that is gone is aborted)."""
    import jax

    rank, world, store = _joined["rank"], _joined["world"], _joined["store"]
    try:
        if rank != 0:
            jax.distributed.shutdown()
            store.set(f"torchtpu/left/{rank}", "1")
        else:
            store.wait(
                [f"torchtpu/left/{r}" for r in range(1, world)],
                datetime.timedelta(seconds=min(30.0, _joined["timeout"].total_seconds())),
            )
            jax.distributed.shutdown()
    except Exception:  # noqa: BLE001 (a peer already gone: leave anyway)
        pass


def _lost(ranks, timeout: datetime.timedelta | None = None) -> str:
    """', global rank(s) ... lost' when the distributed runtime no longer sees some of these processes (it waits
    for the runtime's heartbeats to tell, at most the heartbeat timeout and 10 s)."""
    try:
        import time

        from jax._src import distributed as jd

        client = jd.global_state.client
        if client is None or not _joined:
            return ""
        seconds = (timeout or _joined["timeout"]).total_seconds()
        deadline = time.time() + min(seconds / 2, _heartbeat(int(seconds)) + 10)
        while True:
            live = client.get_live_nodes(list(ranks))
            gone = [r for r in ranks if r not in live]
            if gone or time.time() > deadline:
                break
            time.sleep(0.2)
    except Exception:  # noqa: BLE001 (best effort: the collective's own error follows)
        return ""
    return f": global rank(s) {gone} lost (their process is gone)" if gone else ""


# -- values in and out ----------------------------------------------------------------------------------------------
def _value(t: torch.Tensor):
    """t's value as a jax Array of t's shape (0-d: (1,)) on its device; pending work is launched first."""
    import jax.numpy as jnp

    shape = tuple(t.shape) or (1,)
    src = t.resolve_conj().resolve_neg()
    vt = _C._storage_value_type(src) if src.untyped_storage().nbytes() else None

    if vt is None or not views.covers_storage(src) or vt[1] != t.dtype:
        if t.numel() == 0 or vt is None:
            return jnp.zeros(shape, _np(t.dtype), device=runtime.get().device(t.device.index or 0))
        src = src.clone(memory_format=torch.contiguous_format)
    buf = executor.buffer_of(src, executor.Cut.collective)
    if buf.size != max(t.numel(), 1):  # a bucketed storage (its capacity): the tensor is its compact prefix
        buf = buf.reshape(-1)[: max(t.numel(), 1)]
    return buf if tuple(buf.shape) == shape else buf.reshape(shape)


def _assign(t: torch.Tensor, arr) -> None:
    """arr (of t's shape, 0-d as (1,)) becomes t's value."""
    shape = tuple(t.shape)
    if tuple(arr.shape) != shape:
        arr = arr.reshape(shape)

    if views.covers_storage(t) and not t.is_conj() and not t.is_neg():
        _C._set_storage_buffer(t, arr, t.dtype, shape)
        return
    tmp = torch.empty(shape, dtype=t.dtype, device=t.device)
    _C._set_storage_buffer(tmp, arr, t.dtype, shape)
    t.copy_(tmp)


def _np(dtype):

    return dtypes.to_numpy(dtype)


def _done(result):
    fut = torch.futures.Future()
    fut.set_result(result)
    return _create_work_from_future(fut)


def _is_tpu(ts) -> bool:
    return any(isinstance(t, torch.Tensor) and t.device.type == "tpu" for t in ts)


def _flat(x):
    for e in x:
        if isinstance(e, (list, tuple)):
            yield from _flat(e)
        else:
            yield e


def _op_name(op) -> str:
    for name in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
        if op == getattr(dist.ReduceOp, name):
            return name
    raise RuntimeError(f"torchtpu: reduce op {op} is not supported by the tpu backend")


# -- the process group ------------------------------------------------------------------------------------------------
class ProcessGroupTpu(dist.ProcessGroup):
    """One group of ranks; each collective on tpu tensors is a jitted XLA program over the group's devices."""

    def __init__(self, store, rank: int, size: int, timeout: datetime.timedelta, global_ranks):
        super().__init__(rank, size)
        self._rank, self._size, self._timeout = rank, size, timeout
        self._global_ranks = list(global_ranks) if global_ranks else list(range(size))
        import jax
        from jax.sharding import Mesh

        # each rank's device: the jax device of its current tpu device, exchanged through the group's store
        local = runtime.get().device(torch.tpu.current_device())
        store.set(f"torchtpu/device/{rank}", str(local.id))
        ids = [int(store.get(f"torchtpu/device/{r}").decode()) for r in range(size)]
        by_id = {d.id: d for d in jax.devices()}
        self._devices = [by_id[i] for i in ids]
        self._local_index = torch.tpu.current_device()
        self._mesh = Mesh(np.array(self._devices), ("r",))
        self._fns: dict = {}
        self._gloo = dist.ProcessGroupGloo(dist.PrefixStore("gloo/", store), rank, size, timeout)
        self._world = _joined["world"]
        if self._global_ranks == list(range(self._world)):  # the world's devices, by global rank (runtime.py)
            runtime.get().world = list(self._devices)
        self._seq, self._calls, self._checked = 0, 0, 0  # the collective checks (_agree)

    def getBackendName(self):
        return "tpu"

    # the names torch gives the group (a Python process group keeps them itself)
    def _set_group_name(self, name):
        self._group_name = name

    @property
    def group_name(self):
        return getattr(self, "_group_name", None) or dist.distributed_c10d._world.pg_names[self]

    def _set_group_desc(self, desc):
        self._group_desc = desc

    @property
    def group_desc(self):
        return getattr(self, "_group_desc", "")

    def __repr__(self):
        return f"ProcessGroupTpu(rank={self._rank}, size={self._size}, ranks={self._global_ranks})"

    # -- running one collective ----------------------------------------------------------------------------
    def _fn(self, key, body, in_spec, out_spec, mesh=None):
        """The jitted shard_map of body over the group's devices (one program per shape, cached by jax)."""
        f = self._fns.get(key)
        if f is None:
            import jax
            from jax.sharding import PartitionSpec as P

            specs = {"r": P("r"), "": P()}
            f = jax.jit(
                jax.shard_map(
                    body, mesh=mesh or self._mesh, in_specs=specs[in_spec], out_specs=specs[out_spec], check_vma=False
                )
            )
            self._fns[key] = f
        return f

    def _global(self, arr, mesh=None):
        """The group-wide array whose shard on this rank's device is arr (stacked along dim 0)."""
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P

        mesh = mesh or self._mesh
        n = mesh.devices.size
        return jax.make_array_from_single_device_arrays(
            (n * arr.shape[0],) + tuple(arr.shape[1:]), NamedSharding(mesh, P("r")), [arr]
        )

    def _run(self, name, key, body, arr, in_spec="r", out_spec="", mesh=None):
        metrics.inc(f"collective.{name}")
        _launch_recorded()  # the pending chunk's collectives run first on every rank
        if mesh is None and CHECKS:
            self._agree(name, key[0] if key and key[0] in _REDUCE else "", tuple(arr.shape), str(arr.dtype))
        try:
            out = self._fn((name,) + key, body, in_spec, out_spec, mesh)(self._global(arr, mesh))
            return out.addressable_data(0)
        except Exception as e:  # noqa: BLE001 (name the collective, the group, the shapes and who is gone)
            raise RuntimeError(
                f"torchtpu: collective {name} on group {self._global_ranks} (this is rank "
                f"{self._rank}) with {tuple(arr.shape)} {arr.dtype} failed{self._lost()}: {e}"
            ) from e

    def _agree(self, name, op, shape, dtype) -> None:
        """Before a collective the ranks compare what they are about to run (the collective, its reduce op, dtype
        and shape, and its number in the group's sequence) over the gloo group, on the host: ranks that would run
        different programs get an error naming each rank's call, instead of XLA aborting or hanging. A host round
        trip that waits for the slowest rank, so sampled (TORCHTPU_DISTRIBUTED_CHECKS=N): the first N collectives
        of the group and then every N-th; the calls in between are folded into a hash each check compares too."""
        self._seq += 1
        fp = _fingerprint(self._seq, name, op, shape, dtype)
        if CHECKS != 1 and self._seq > CHECKS and self._seq % CHECKS:
            self._calls = hash((self._calls, fp))
            return
        mine = torch.tensor(list(fp) + [self._calls], dtype=torch.int64)
        got = [torch.empty_like(mine) for _ in range(self._size)]
        try:
            self._gloo.allgather([got], [mine]).wait()
        except Exception as e:  # noqa: BLE001 (a rank that never arrives: the group's timeout)
            raise RuntimeError(
                f"torchtpu: collective {name} #{self._seq} on group {self._global_ranks} (this is rank "
                f"{self._rank}): not every rank arrived within the group's timeout "
                f"({self._timeout}){self._lost()}: {e}"
            ) from e
        since, self._calls, self._checked = self._checked, 0, self._seq
        if any(not torch.equal(g[:-1], mine[:-1]) for g in got):
            calls = "; ".join(f"rank {r}: {_describe(g[:-1])}" for r, g in enumerate(got))
            raise RuntimeError(
                f"torchtpu: the ranks of group {self._global_ranks} called different collectives: "
                f"{calls}. Every rank must call the same collectives, in the same order, with the same "
                "shapes and dtypes"
            )
        if any(int(g[-1]) != int(mine[-1]) for g in got):
            raise RuntimeError(
                f"torchtpu: the ranks of group {self._global_ranks} called different collectives between #{since} "
                f"and #{self._seq} (checked every {CHECKS}; TORCHTPU_DISTRIBUTED_CHECKS=1 checks each and names "
                "the first). Every rank must call the same collectives, in the same order, with the same shapes "
                "and dtypes"
            )

    # -- the collectives XLA has, as ops (collectives.py): recorded into fused chunks ----------------------------
    def _as_op(self, name, op, t) -> bool:
        """Whether t's collective runs as a torchtpu_c10d op; if so, checks the call and cuts a pending chunk that
        holds another group's collectives (a program runs the collectives of one group)."""
        if t.numel() == 0 or not collectives.supports(op or "SUM", t.dtype):
            return False
        self._check_device([t])
        if CHECKS:
            self._agree(name, op or "", tuple(t.shape) or (1,), str(_np(t.dtype)))
        global _recording
        if _recording is not self:
            if _recording is not None and executor.get_mode() == "fused":
                executor.cut(cause=executor.Cut.collective)
            _recording = self
        metrics.inc(f"collective.{name}")
        return True

    def _lost(self) -> str:
        return _lost(self._global_ranks, self._timeout)

    def _check_device(self, ts):
        for t in ts:
            if t.device.type == "tpu" and (t.device.index or 0) != self._local_index:
                raise RuntimeError(
                    f"torchtpu: rank {self._rank} of this group runs on tpu:{self._local_index}; got "
                    f"a tensor on {t.device}"
                )

    # -- reductions -------------------------------------------------------------------------------------------
    @staticmethod
    def _reducer(op, n, dtype):
        import jax.numpy as jnp
        from jax import lax

        if op == "AVG" and not (dtype.is_floating_point or dtype.is_complex):
            raise RuntimeError(f"torchtpu: ReduceOp.AVG needs a floating-point tensor, got {dtype}")

        def reduce(x):
            if x.dtype == jnp.bool_:
                y = reduce_int(x.astype(jnp.int32))
                return y.astype(jnp.bool_)
            return reduce_int(x)

        def reduce_int(x):
            if op in ("SUM", "AVG"):
                s = lax.psum(x, "r")
                return s / n if op == "AVG" else s
            if op == "MAX":
                return lax.pmax(x, "r")
            if op == "MIN":
                return lax.pmin(x, "r")
            g = lax.all_gather(x, "r")
            if op == "PRODUCT":
                return jnp.prod(g, axis=0, dtype=x.dtype)
            f = {"BAND": jnp.bitwise_and, "BOR": jnp.bitwise_or, "BXOR": jnp.bitwise_xor}[op]
            out = g[0]
            for i in range(1, n):
                out = f(out, g[i])
            return out

        return reduce

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        if not _is_tpu(tensors):
            return self._gloo.allreduce(tensors, opts)
        self._check_device(tensors)
        op = _op_name(opts.reduceOp)
        for t in tensors:
            if self._as_op("all_reduce", op, t):
                t.copy_(collectives.all_reduce(t, op, self._global_ranks, self._world))
                continue
            arr = _value(t)
            red = self._reducer(op, self._size, t.dtype)
            _assign(t, self._run("all_reduce", (op, t.dtype), red, arr))
        return _done(tensors)

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts or dist.AllreduceCoalescedOptions())

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        if not _is_tpu(tensors):
            return self._gloo.reduce(tensors, opts)
        op = _op_name(opts.reduceOp)
        for t in tensors:
            res = self._run("reduce", (op, t.dtype), self._reducer(op, self._size, t.dtype), _value(t))
            if self._rank == opts.rootRank:
                _assign(t, res)
        return _done(tensors)

    # -- one rank's value to all ------------------------------------------------------------------------------
    def _from_root(self, arr, root, name):
        """Every rank gets root's arr: a sum where only root contributes, over the bits (exact for any value)."""
        import jax.numpy as jnp
        from jax import lax

        dt = arr.dtype
        width = {1: jnp.int8, 2: jnp.int16, 4: jnp.int32, 8: jnp.int64}

        def body(x):
            bits = x.astype(jnp.int8) if x.dtype == jnp.bool_ else lax.bitcast_convert_type(x, width[x.dtype.itemsize])
            mine = jnp.where(lax.axis_index("r") == root, bits, jnp.zeros_like(bits))
            s = lax.psum(mine, "r")
            return s.astype(jnp.bool_) if x.dtype == jnp.bool_ else lax.bitcast_convert_type(s, x.dtype)

        if jnp.issubdtype(dt, jnp.complexfloating):
            re = self._from_root(jnp.real(arr), root, name)
            im = self._from_root(jnp.imag(arr), root, name)
            return lax.complex(re, im)
        return self._run(name, (root, str(dt)), body, arr)

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        if not _is_tpu(tensors):
            return self._gloo.broadcast(tensors, opts)
        self._check_device(tensors)
        for t in tensors:
            _assign(t, self._from_root(_value(t), opts.rootRank, "broadcast"))
        return _done(tensors)

    # -- gathers ----------------------------------------------------------------------------------------------
    def _all_gather(self, arr):
        from jax import lax

        return self._run("all_gather", (str(arr.dtype),), lambda x: lax.all_gather(x, "r", tiled=True), arr)

    def allgather(self, output_tensors, input_tensors, opts=None):
        if not _is_tpu(list(_flat(output_tensors)) + list(input_tensors)):
            return self._gloo.allgather(output_tensors, input_tensors, opts or dist.AllgatherOptions())
        for outs, t in zip(output_tensors, input_tensors):
            self._gather_into(outs, t)
        return _done(output_tensors)

    def _gather_into(self, outs, t):
        if outs and self._as_op("all_gather", None, t):
            whole = collectives.all_gather(t.reshape(-1), self._global_ranks, self._world)
            k = t.numel()
            for i, o in enumerate(outs):
                o.copy_(whole[i * k : (i + 1) * k].view(o.shape))
            return
        whole = self._all_gather(_value(t))  # every rank's t, stacked along dim 0
        rows = (tuple(t.shape) or (1,))[0]
        for i, o in enumerate(outs):
            _assign(o, whole[i * rows : (i + 1) * rows])

    def all_gather_single(self, output_tensor, input_tensor, opts=None):
        """all_gather_into_tensor: output is the inputs concatenated along dim 0."""
        if not _is_tpu([output_tensor, input_tensor]):
            return self._gloo._allgather_base(output_tensor, input_tensor, opts or dist.AllgatherOptions())
        if output_tensor.numel() != self._size * input_tensor.numel():
            raise RuntimeError(
                f"torchtpu: all_gather_into_tensor: the output {list(output_tensor.shape)} must hold the group's "
                f"{self._size} inputs of {list(input_tensor.shape)} {input_tensor.dtype}"
            )
        if self._as_op("all_gather", None, input_tensor):
            whole = collectives.all_gather(input_tensor.reshape(-1), self._global_ranks, self._world)
            output_tensor.copy_(whole.view(output_tensor.shape))
            return _done([output_tensor])
        _assign(output_tensor, self._all_gather(_value(input_tensor)).reshape(tuple(output_tensor.shape)))
        return _done([output_tensor])

    def _each(self, one, output_tensors, input_tensors, opts):
        """A coalesced call: the single-tensor collective per (output, input) pair, in order on every rank."""
        for o, i in zip(output_tensors, input_tensors):
            one(o, i, opts)
        return _done(output_tensors)

    def allgather_into_tensor_coalesced(self, output_tensors, input_tensors, opts=None):
        return self._each(self.all_gather_single, output_tensors, input_tensors, opts)

    def all_gather_single_coalesced(self, output_tensors, input_tensors, opts=None):
        return self.allgather_into_tensor_coalesced(output_tensors, input_tensors, opts)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self.allgather(output_lists, input_tensors, opts)

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        if not _is_tpu(list(_flat(output_tensors)) + list(input_tensors)):
            return self._gloo.gather(output_tensors, input_tensors, opts)
        self._gather_into(output_tensors[0] if self._rank == opts.rootRank else [], input_tensors[0])
        return _done(output_tensors)

    # -- reduce-scatters --------------------------------------------------------------------------------------
    def _reduce_scatter(self, arr, op, dtype):
        import jax.numpy as jnp
        from jax import lax

        n = self._size

        def body(x):
            if op in ("SUM", "AVG") and x.dtype != jnp.bool_:
                s = lax.psum_scatter(x, "r", scatter_dimension=0, tiled=True)
                return s / n if op == "AVG" else s
            full = self._reducer(op, n, dtype)(x)
            rows = x.shape[0] // n
            return lax.dynamic_slice_in_dim(full, lax.axis_index("r") * rows, rows, 0)

        return self._run("reduce_scatter", (op, str(arr.dtype)), body, arr, out_spec="r")

    def reduce_scatter_single(self, output_tensor, input_tensor, opts=None):
        """reduce_scatter_tensor: input is n chunks along dim 0; rank i gets the reduction of chunk i."""
        opts = opts or dist.ReduceScatterOptions()
        if not _is_tpu([output_tensor, input_tensor]):
            return self._gloo._reduce_scatter_base(output_tensor, input_tensor, opts)
        op = _op_name(opts.reduceOp)
        if input_tensor.numel() != self._size * output_tensor.numel():
            raise RuntimeError(
                f"torchtpu: reduce_scatter_tensor: the input {list(input_tensor.shape)} {input_tensor.dtype} must "
                f"hold the group's {self._size} outputs of {list(output_tensor.shape)}"
            )
        if self._as_op("reduce_scatter", op, input_tensor):
            part = collectives.reduce_scatter(input_tensor.reshape(-1), op, self._global_ranks, self._world)
            output_tensor.copy_(part.view(output_tensor.shape))
            return _done([output_tensor])
        arr = _value(input_tensor).reshape((self._size * max(1, output_tensor.numel()),))
        out = self._reduce_scatter(arr, op, input_tensor.dtype)
        _assign(output_tensor, out.reshape(tuple(output_tensor.shape)))
        return _done([output_tensor])

    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        if not _is_tpu(list(output_tensors) + list(_flat(input_lists))):
            return self._gloo.reduce_scatter(output_tensors, input_lists, opts)
        for o, ins in zip(output_tensors, input_lists):
            stacked = torch.cat([i.reshape(-1) for i in ins])
            self.reduce_scatter_single(o, stacked.reshape((self._size,) + tuple(o.shape)), opts)
        return _done(output_tensors)

    def reduce_scatter_tensor_coalesced(self, output_tensors, input_tensors, opts=None):
        return self._each(self.reduce_scatter_single, output_tensors, input_tensors, opts)

    def reduce_scatter_single_coalesced(self, output_tensors, input_tensors, opts=None):
        return self.reduce_scatter_tensor_coalesced(output_tensors, input_tensors, opts)

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ScatterOptions()
        if not _is_tpu(list(output_tensors) + list(_flat(input_tensors))):
            return self._gloo.scatter(output_tensors, input_tensors, opts)
        out = output_tensors[0]
        if self._rank == opts.rootRank:
            stacked = torch.cat([i.reshape(-1) for i in input_tensors[0]])
        else:
            stacked = torch.zeros(self._size * out.numel(), dtype=out.dtype, device=out.device)
        everyone = self._from_root(_value(stacked), opts.rootRank, "scatter")
        k = out.numel()
        _assign(out, everyone[self._rank * k : (self._rank + 1) * k])
        return _done(output_tensors)

    # -- all to all ----------------------------------------------------------------------------------------------
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts or dist.AllToAllOptions()
        if not _is_tpu([output, input]):
            return self._gloo.alltoall_base(output, input, output_split_sizes, input_split_sizes, opts)
        from jax import lax

        n = self._size
        rest = tuple(input.shape[1:])
        per = int(np.prod(rest)) if rest else 1
        if not input_split_sizes and not output_split_sizes:
            arr = _value(input).reshape((input.numel(),))
            body = lambda x: lax.all_to_all(x, "r", 0, 0, tiled=True)  # noqa: E731
            res = self._run("all_to_all", (str(arr.dtype),), body, arr, out_spec="r")
            _assign(output, res.reshape(tuple(output.shape)))
            return _done([output])
        ins = list(input_split_sizes) if input_split_sizes else [input.shape[0] // n] * n
        outs = list(output_split_sizes) if output_split_sizes else [output.shape[0] // n] * n
        # chunks of unequal sizes: every rank pads its chunks to the largest chunk of the group (agreed by a max
        # all-reduce, so that every rank runs the same program), exchanges them, and drops the padding
        m = torch.tensor([max(ins + outs + [0])], device=input.device)
        self.allreduce([m], _max_opts())
        width = int(m.cpu().item())
        chunks, start = [], 0
        flat = input.reshape(input.shape[0], per)
        for s in ins:
            c = flat[start : start + s]
            chunks.append(torch.nn.functional.pad(c, (0, 0, 0, width - s)))
            start += s
        padded = torch.cat(chunks) if chunks else flat.new_zeros((0, per))
        arr = _value(padded).reshape((n * width * per,))
        body = lambda x: lax.all_to_all(x, "r", 0, 0, tiled=True)  # noqa: E731
        got = self._run("all_to_all", (str(arr.dtype), "padded"), body, arr, out_spec="r")
        tmp = torch.empty((n * width, per), dtype=input.dtype, device=input.device)
        _assign(tmp, got.reshape((n * width, per)))
        pieces = [tmp[j * width : j * width + outs[j]] for j in range(n)]
        output.copy_(torch.cat(pieces).reshape(output.shape))
        return _done([output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        if not _is_tpu(list(output_tensors) + list(input_tensors)):
            return self._gloo.alltoall(output_tensors, input_tensors, opts or dist.AllToAllOptions())
        ins = [t.shape[0] if t.dim() else 1 for t in input_tensors]
        outs = [t.shape[0] if t.dim() else 1 for t in output_tensors]
        rest = tuple(input_tensors[0].shape[1:])
        inp = torch.cat([t.reshape((-1,) + rest) for t in input_tensors])
        out = torch.empty((sum(outs),) + rest, dtype=inp.dtype, device=inp.device)
        self.all_to_all_single(out, inp, outs, ins, opts)
        start = 0
        for o, s in zip(output_tensors, outs):
            o.copy_(out[start : start + s].reshape(o.shape))
            start += s
        return _done(output_tensors)

    # -- point to point -------------------------------------------------------------------------------------------
    def _pair(self, src: int, dst: int, arr):
        """The program both ranks of a send/recv run: a collective permute from src to dst over their two devices."""
        from jax import lax
        from jax.sharding import Mesh

        lo, hi = sorted((src, dst))
        mesh = Mesh(np.array([self._devices[lo], self._devices[hi]]), ("r",))
        perm = [(0, 1)] if src == lo else [(1, 0)]
        body = lambda x: lax.ppermute(x, "r", perm)  # noqa: E731
        return self._run("send_recv", (lo, hi, src, str(arr.dtype)), body, arr, out_spec="r", mesh=mesh)

    def send(self, tensors, dst, tag=0):
        if not _is_tpu(tensors):
            return self._gloo.send(tensors, dst, tag)
        for t in tensors:
            self._pair(self._rank, dst, _value(t))
        return _done(tensors)

    def recv(self, tensors, src, tag=0):
        if not _is_tpu(tensors):
            return self._gloo.recv(tensors, src, tag)
        import jax.numpy as jnp

        for t in tensors:
            blank = jnp.zeros(tuple(t.shape) or (1,), _np(t.dtype), device=self._devices[self._rank])
            _assign(t, self._pair(src, self._rank, blank))
        return _done(tensors)

    def recv_anysource(self, tensors, tag=0):
        raise RuntimeError(
            "torchtpu: recv from any source is not supported on tpu (an XLA program names its peers); pass src="
        )

    def barrier(self, opts=None):
        t = torch.zeros(1, device=torch.device("tpu", self._local_index))
        self.allreduce([t])
        t.cpu()
        return _done([t])

    def monitored_barrier(self, timeout=None, wait_all_ranks=False):
        return self._gloo.monitored_barrier(timeout or self._timeout, wait_all_ranks)

    def size(self):
        return self._size

    def rank(self):
        return self._rank


CHECKS = config.get("distributed_checks")
_recording = None  # the group whose collectives the pending chunk may hold (fused mode)


def _launch_recorded() -> None:
    """Launches a pending chunk that may hold collectives, before a collective that runs as its own program: the
    ranks must start their collectives in one order. Without it, a rank whose operand needed no launch (a zero fill
    is never written) ran the program's collective first while the other rank's chunk waited in its own."""
    global _recording
    if _recording is not None:
        if executor.get_mode() == "fused":
            executor.cut(cause=executor.Cut.collective)
        _recording = None


_NAMES = ["all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all", "scatter", "send_recv"]
_REDUCE = ["", "SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"]
_DTYPES = [
    "bool",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "complex128",
]
_FP = 12


def _fingerprint(seq, name, op, shape, dtype) -> tuple:
    shape = list(shape)
    v = [seq, _NAMES.index(name), _REDUCE.index(op), _DTYPES.index(dtype) if dtype in _DTYPES else -1, len(shape)]
    return tuple(v + (shape + [0] * (_FP - 5))[: _FP - 5])


def _describe(fp: torch.Tensor) -> str:
    v = fp.tolist()
    op = f" {_REDUCE[v[2]]}" if v[2] else ""
    return f"{_NAMES[v[1]]}{op} #{v[0]} of {tuple(v[5 : 5 + v[4]])} {_DTYPES[v[3]] if v[3] >= 0 else '?'}"


def _max_opts():
    o = dist.AllreduceOptions()
    o.reduceOp = dist.ReduceOp.MAX
    return o


def _create(opts, pg_options=None):
    """The backend's constructor (extended API: the global ranks of the group come with it)."""
    store, rank, size, timeout = opts.store, opts.group_rank, opts.group_size, opts.timeout
    if not _joined:
        if list(opts.global_ranks_in_group or range(size)) != list(range(size)):
            raise RuntimeError("torchtpu: the default process group must be created first")
        _join(store, rank, size, timeout)
    return ProcessGroupTpu(store, rank, size, timeout, opts.global_ranks_in_group)


def register() -> None:
    """Registers the backend "tpu" for device type "tpu" (at `import torchtpu`)."""
    if "tpu" in dist.Backend.backend_list:
        return
    dist.Backend.register_backend("tpu", _create, extended_api=True, devices=["tpu"])
    destroy = dist.destroy_process_group

    @functools.wraps(destroy)
    def destroy_process_group(group=None):
        destroy(group)
        if _joined:
            # a destroyed group with a tpu backend lingers in reference cycles with its store; torch's rendezvous
            # server is shared per port within a process, so a kept one would hand the next default group on that
            # port this group's keys (its gloo addresses: the next group's connect waits on a dead peer; seen in 3
            # of 8 re-inits). Collect them now, as the destroyed group would be freed without the tpu backend
            gc.collect()

    dist.destroy_process_group = destroy_process_group
    dist.distributed_c10d.destroy_process_group = destroy_process_group


__all__ = ["ProcessGroupTpu", "register"]
