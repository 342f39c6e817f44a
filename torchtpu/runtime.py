"""JaxlibRuntime: the PJRT client, the one place that compiles and runs executables and moves buffers.

Other modules use jax for what it is, not for the device: the lowering rules and jax_ops.py trace JAX functions to
StableHLO (jaxfn.py), distributed.py joins the processes' runtimes (jax.distributed) and jits its collectives over
the client's devices, cache.py reads jaxlib's version for its keys.

Compiles StableHLO text with ``Client.compile_and_load``, runs executables
asynchronously with ``execute_sharded``, moves data host<->device and reports
memory. jaxlib releases the GIL while compiling and executing.
"""

from __future__ import annotations

import re
import threading

import numpy as np
import torch

from . import config
from . import dtypes as D
from .untraced import untraced

_PLATFORMS = ("cpu", "tpu", "cuda")
_GROUP = re.compile(r'torchtpu_group = "([0-9,]+)/([0-9]+)"')


class JaxlibRuntime:
    def __init__(self, platform: str | None = None):
        platform = platform or config.get("platform")
        if platform not in _PLATFORMS:
            raise ValueError(f"TORCHTPU_PLATFORM={platform!r}: expected one of {', '.join(_PLATFORMS)}")
        self.platform = platform
        self._lock = threading.Lock()
        self._backend = None
        self._devices = None
        self._jax = None
        self.world: list = []  # the jax device of each global rank, once distributed.py joined a world
        self.on_group_failure = None  # ranks -> text naming the lost ones (distributed.py)

    # -- start-up ---------------------------------------------------------------------------
    def _start(self):
        with self._lock:
            if self._backend is not None:
                return
            import jax

            jax.config.update("jax_enable_x64", True)  # int64/float64 keep their width
            jax.config.update("jax_platforms", self.platform)
            if self.platform == "cpu" and config.given("num_cpu_devices"):
                jax.config.update("jax_num_cpu_devices", config.get("num_cpu_devices"))
            from jax.extend.backend import get_backend

            self._jax = jax
            self._backend = get_backend(self.platform)
            self._devices = self._backend.local_devices()

    @property
    def backend(self):
        if self._backend is None:
            self._start()
        return self._backend

    def device_count(self) -> int:
        if self.platform == "cpu" and self._backend is None:
            return config.get("num_cpu_devices")
        return len(self.devices())

    def devices(self):
        if self._devices is None:
            self._start()
        return self._devices

    def device(self, index: int):
        return self.devices()[index]

    def platform_info(self) -> dict:
        be = self.backend
        import jaxlib

        return {
            "platform": be.platform,
            "platform_version": be.platform_version,
            "jaxlib": jaxlib.__version__,
            "device_kind": self.devices()[0].device_kind,
        }

    # -- compile / execute -----------------------------------------------------------------
    def compile(self, text: str, device_index: int = 0):
        devs, opts = self._compile_options(device_index, text)
        return self.backend.compile_and_load(text, devs, opts)

    def _compile_options(self, device_index: int, text: str | None = None):
        from jax.extend.backend import get_compile_options

        group = self.group_of(text)
        if group is not None:  # a program with collectives (collectives.py): one replica per rank of the group
            devs = self.group_devices(group)
            return devs, get_compile_options(
                num_replicas=len(devs),
                num_partitions=1,
                device_assignment=[[d] for d in devs],
                backend=self.backend,
            )
        devs = [self.device(device_index)]
        return devs, get_compile_options(
            num_replicas=1, num_partitions=1, device_assignment=[devs], backend=self.backend
        )

    @staticmethod
    def group_of(text: str | None):
        """(global ranks, world size) of the collectives in a program's text, or None without any."""
        if not text or "torchtpu_group" not in text:
            return None
        groups = set(_GROUP.findall(text))
        if len(groups) != 1:
            raise RuntimeError(
                f"torchtpu: one program holds collectives of several process groups ({sorted(groups)}); "
                "each program runs the collectives of one group"
            )
        ranks, world = groups.pop()
        return tuple(int(r) for r in ranks.split(",")), int(world)

    def group_devices(self, group):
        ranks, world = group
        if len(self.world) != world:
            raise RuntimeError(
                f"torchtpu: a program with collectives over ranks {list(ranks)} of a world of {world}, but this "
                f"process {f'joined a world of {len(self.world)}' if self.world else 'joined no distributed world'}"
                " (torch.distributed.init_process_group('tpu'))"
            )
        return [self.world[r] for r in ranks]

    def serialize(self, exe) -> bytes:
        """The executable as bytes (machine code for XLA:CPU): the disk tier of cache.py."""
        return self.backend.serialize_executable(exe)

    def deserialize(self, payload: bytes, device_index: int = 0, text: str | None = None):
        if b"lapack_" in payload:
            # jaxlib registers its LAPACK custom calls at import but loads the LAPACK functions they call only when
            # it lowers one: a process whose first triangular solve comes from the disk cache ran it with none
            # loaded and crashed (SIGSEGV)
            from jax._src.lax import linalg

            linalg.initialize_lapack()
        devs, opts = self._compile_options(device_index, text)
        return self.backend.deserialize_executable(payload, devs, opts)

    def execute(self, exe, args):
        """Launches asynchronously; the returned arrays are futures."""
        res = exe.execute_sharded(args)
        return [o[0] for o in res.disassemble_into_single_device_arrays()]

    def launcher(self, exe, device_index: int, ins, outs):
        """A callable running `exe` on jax Arrays (and numpy vectors, transferred on the way) that returns the
        result arrays: jax's own C++ dispatch fast path (what a `jax.jit` call takes after its first call), so
        a launch costs what a jitted call does. ins/outs: (shape, torch dtype) of the parameters and results.

        NOTE: this builds jax's `pjit` fast-path object around an executable we compiled ourselves (jax 0.10.2
        internals: `_jax.pjit`, `pxla.MeshExecutableFastpathData`); the first call goes through `cache_miss`,
        which runs the executable with `execute_sharded` and hands jax the fast-path data.
        """
        jax = self._jax
        from jax._src import core, tree_util
        from jax._src.interpreters import pxla
        from jax._src.lib import _jax
        from jax._src.sharding_impls import SingleDeviceSharding

        dev = self.device(device_index)
        sh = SingleDeviceSharding(dev)
        in_avals = [core.ShapedArray(tuple(s), D.to_numpy(d)) for s, d in ins]
        out_avals = [core.ShapedArray(tuple(s), D.to_numpy(d)) for s, d in outs]

        @untraced  # jax's dispatch calls it from the user's frame, inside a compiled function's graph breaks too
        def cache_miss(*args):
            arrays = [a if isinstance(a, jax.Array) else jax.device_put(a, dev) for a in args]
            res = exe.execute_sharded(arrays).disassemble_into_single_device_arrays()
            results = [r[0] for r in res]
            _, tree = tree_util.dispatch_registry.flatten(results, None)
            fast = pxla.MeshExecutableFastpathData(
                exe,
                tree,
                [sh] * len(in_avals),
                [sh] * len(out_avals),
                out_avals,
                [True] * len(out_avals),
                [True] * len(in_avals),
                [None] * len(in_avals),
                [],
            )
            return results, fast, False

        return _jax.pjit(
            "torchtpu_chunk",
            None,
            cache_miss,
            (),
            (),
            pxla.JitGlobalCppCacheKeys(),
            tree_util.dispatch_registry,
            pxla.cc_shard_arg,
            _jax.PjitFunctionCache(capacity=2),
        )

    def group_launcher(self, exe, device_index: int, group):
        """The launcher of a program compiled for a group (one replica per rank): it runs this process's replica
        with execute_sharded (jax's fast path knows single-device programs only); Python per chunk, not per op.
        A collective that fails (a lost peer) names the group and, once the runtime sees them gone, the lost
        ranks."""
        jax = self._jax
        dev = self.device(device_index)

        def launch(*args):
            arrays = [a if isinstance(a, jax.Array) else jax.device_put(a, dev) for a in args]
            try:
                res = exe.execute_sharded(arrays)
            except Exception as e:  # noqa: BLE001
                lost = self.on_group_failure(group[0]) if self.on_group_failure else ""
                raise RuntimeError(f"collectives over global ranks {list(group[0])} failed{lost}: {e}") from e
            return [r[0] for r in res.disassemble_into_single_device_arrays()]

        return launch

    def wait_device(self, device_index: int):
        """Waits for every live array of the device."""
        if self._backend is None:
            return
        dev = self.device(device_index)
        for a in self._backend.live_arrays():
            try:
                if dev in a.devices():
                    a.block_until_ready()
            except RuntimeError as e:
                if "deleted" not in str(e):  # a donated buffer
                    raise

    # -- buffers -----------------------------------------------------------------------------
    def to_device(self, t: torch.Tensor, device_index: int = 0):
        """Contiguous CPU tensor -> device array. The caller hands over ownership of ``t``."""
        if self._jax is None:
            self._start()
        dev = self.device(device_index)
        if t.dtype == torch.bool or t.numel() == 0:
            return self._jax.device_put(t.numpy(), dev)
        # NOTE: DLPack shares t's memory with the array (no copy on XLA:CPU); the caller
        # passes a private copy, so nothing can mutate it afterwards.
        arr = self._jax.dlpack.from_dlpack(t)
        if arr.devices() != {dev}:
            arr = self._jax.device_put(arr, dev)
        return arr

    def scalar(self, value, dtype: torch.dtype, device_index: int = 0):
        return self.from_numpy(np.asarray(value, dtype=D.to_numpy(dtype)), device_index)

    def from_numpy(self, a: np.ndarray, device_index: int = 0):
        if self._jax is None:
            self._start()
        return self._jax.device_put(a, self.device(device_index))

    def move(self, arr, device_index: int):
        """A copy of device array `arr` on another device of this client."""
        return self._jax.device_put(arr, self.device(device_index))

    def to_host(self, arr) -> torch.Tensor:
        """Device array -> CPU tensor (a view of the array's memory where possible; copy it before keeping)."""
        if arr.dtype == np.bool_ or arr.size == 0:
            return torch.from_numpy(np.array(arr))
        return torch.from_dlpack(arr)

    def wait(self, arrays):
        for a in arrays:
            a.block_until_ready()

    def memory_stats(self, device_index: int = 0) -> dict:
        try:
            return dict(self.device(device_index).memory_stats() or {})
        except Exception:  # XLA:CPU has no allocator stats
            return {}


_runtime: JaxlibRuntime | None = None


def get() -> JaxlibRuntime:
    global _runtime
    if _runtime is None:
        _runtime = JaxlibRuntime()
    return _runtime
