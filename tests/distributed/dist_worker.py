"""One rank of a distributed test (tests/distributed/test_distributed.py starts the ranks): ``python dist_worker.py
<job> [args]``.

Each job prints one JSON line on stdout (every rank). The ranks find each other through torch's own env
rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), one XLA:CPU device per process.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys
import traceback

if os.environ.get("DIST_WORKER_STACKS_AFTER"):  # the harness's deadline nears: every thread's stack to stderr
    faulthandler.dump_traceback_later(float(os.environ["DIST_WORKER_STACKS_AFTER"]), exit=False)

sys.path.insert(
    0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import torchtpu  # noqa: E402

RANK, WORLD = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
STEPS = 3


def _init(backend="cpu:gloo,tpu:tpu", seconds=60):
    import datetime

    dist.init_process_group(backend, rank=RANK, world_size=WORLD, timeout=datetime.timedelta(seconds=seconds))


# -- collectives, each against gloo on CPU ---------------------------------------------------------------------
def collectives():
    _init()
    res = {}

    def base(dev, dtype=torch.float32, n=6):
        return (torch.arange(n, dtype=torch.float64) * (RANK + 1) + RANK).to(dtype).to(dev)

    def check(name, fn):
        try:
            a, b = fn("cpu"), fn("tpu")
            a = [x.cpu() for x in (a if isinstance(a, (list, tuple)) else [a])]
            b = [x.cpu() for x in (b if isinstance(b, (list, tuple)) else [b])]
            same = len(a) == len(b) and all(
                x.dtype == y.dtype
                and x.shape == y.shape
                and (torch.equal(x, y) if not x.is_floating_point() else torch.allclose(x, y, rtol=1e-6, atol=1e-6))
                for x, y in zip(a, b)
            )
            res[name] = "ok" if same else f"cpu={[x.tolist() for x in a]} tpu={[y.tolist() for y in b]}"
        except Exception:  # noqa: BLE001 (reported to the test)
            res[name] = traceback.format_exc()[-1500:]

    for op in ("SUM", "AVG", "MAX", "MIN", "PRODUCT"):

        def reduce(dev, op=op):
            t = base(dev)
            dist.all_reduce(t, getattr(dist.ReduceOp, op))
            return t

        check(f"all_reduce.{op}", reduce)

    def bor(dev):
        t = base(dev, torch.int64)
        dist.all_reduce(t, dist.ReduceOp.BOR)
        return t

    def view(dev):
        t = base(dev).reshape(2, 3).t()  # a non-contiguous view, written in place
        dist.all_reduce(t)
        return t

    def zero_d(dev):
        t = torch.tensor(float(RANK + 2), device=dev)
        dist.all_reduce(t)
        return t

    def broadcast(dev):
        t = base(dev)
        dist.broadcast(t, src=1)
        return t

    def broadcast_bool(dev):
        t = base(dev, torch.bool)
        dist.broadcast(t, src=0)
        return t

    def all_gather(dev):
        outs = [torch.empty(6, device=dev) for _ in range(WORLD)]
        dist.all_gather(outs, base(dev))
        return outs

    def all_gather_into_tensor(dev):
        out = torch.empty(WORLD * 6, device=dev)
        dist.all_gather_into_tensor(out, base(dev))
        return out

    def reduce_scatter_tensor(dev, op=dist.ReduceOp.SUM):
        out = torch.empty(3, device=dev)
        dist.reduce_scatter_tensor(out, base(dev), op=op)
        return out

    def reduce_scatter(dev):
        out = torch.empty(3, device=dev)
        dist.reduce_scatter(out, list(base(dev).chunk(WORLD)))
        return out

    def all_to_all(dev):
        out = torch.empty(6, device=dev)
        dist.all_to_all_single(out, base(dev))
        return out

    def all_to_all_uneven(dev):
        ins = [2, 4] if RANK == 0 else [3, 3]
        outs = [2, 3] if RANK == 0 else [4, 3]
        out = torch.empty(sum(outs), device=dev)
        dist.all_to_all_single(out, base(dev), outs, ins)
        return out

    def reduce(dev):
        t = base(dev)
        dist.reduce(t, dst=0)
        return t if RANK == 0 else torch.zeros(1)

    def gather(dev):
        outs = [torch.empty(6, device=dev) for _ in range(WORLD)] if RANK == 0 else None
        dist.gather(base(dev), outs, dst=0)
        return outs if RANK == 0 else [torch.zeros(1)]

    def scatter(dev):
        out = torch.empty(6, device=dev)
        dist.scatter(out, [base(dev) + i for i in range(WORLD)] if RANK == 1 else None, src=1)
        return out

    def send_recv(dev):
        t = base(dev)
        if RANK == 0:
            dist.send(t * 10, dst=1)
        else:
            dist.recv(t, src=0)
        return t

    def async_work(dev):
        t = base(dev)
        w = dist.all_reduce(t, async_op=True)
        w.wait()
        return t

    def subgroup(dev):
        t = base(dev)
        dist.all_reduce(t, group=sub)
        return t

    def fused(dev):
        with torchtpu.mode("fused"):
            t = base(dev) * 2 + 1
            dist.all_reduce(t)
            return t * 3

    def made_on_device(dev):
        # values the program builds from constants of its own, different on each rank: XLA, which assumes every
        # rank runs one program, must not fold their collectives (a sum into a multiply by the group's size)
        with torchtpu.mode("fused"):
            a = torch.full((3,), float(RANK + 1), device=dev)
            dist.all_reduce(a)
            b = (torch.ones if RANK else torch.zeros)(4, device=dev)
            dist.all_reduce(b, dist.ReduceOp.MAX)
            g = torch.empty(2 * WORLD, device=dev)
            dist.all_gather_into_tensor(g, torch.full((2,), float(RANK), device=dev))
            r = torch.empty(2, device=dev)
            dist.reduce_scatter_tensor(r, torch.full((2 * WORLD,), float(RANK + 1), device=dev))
            return [a, b, g, r]

    def chunk_then_own_program(dev):
        # a collective in the pending chunk, then one that runs as its own program (a bool MAX): every rank must
        # launch the chunk first, also rank 0, whose all-False operand (never written) needs no launch to be read
        with torchtpu.mode("fused"):
            a = torch.full((3,), float(RANK + 1), device=dev)
            dist.all_reduce(a)
            b = torch.full((2,), bool(RANK), device=dev)
            dist.all_reduce(b, dist.ReduceOp.MAX)
            return [a, b]

    for name, fn in [
        ("all_reduce.BOR", bor),
        ("all_reduce.view", view),
        ("all_reduce.0d", zero_d),
        ("broadcast", broadcast),
        ("broadcast.bool", broadcast_bool),
        ("all_gather", all_gather),
        ("all_gather_into_tensor", all_gather_into_tensor),
        ("reduce_scatter_tensor", reduce_scatter_tensor),
        ("reduce_scatter_tensor.MAX", lambda d: reduce_scatter_tensor(d, dist.ReduceOp.MAX)),
        ("reduce_scatter", reduce_scatter),
        ("all_to_all_single", all_to_all),
        ("all_to_all_single.uneven", all_to_all_uneven),
        ("reduce", reduce),
        ("gather", gather),
        ("scatter", scatter),
        ("send_recv", send_recv),
        ("async_op", async_work),
    ]:
        check(name, fn)
    sub = dist.new_group([0, 1], backend="cpu:gloo,tpu:tpu")
    check("new_group.all_reduce", subgroup)
    check("fused_mode.all_reduce", fused)
    check("fused_mode.constants_made_on_device", made_on_device)
    check("fused_mode.chunk_then_own_program", chunk_then_own_program)
    dist.barrier()
    res["counters"] = {
        k: v
        for k, v in torchtpu.metrics.counters().items()
        if k.startswith(("collective", "cuts.coll", "op.torchtpu_c10d"))
    }
    dist.destroy_process_group()
    # a new default group in the same process, after destroy_process_group. On a port of its own: this job still
    # holds objects of the old group (`sub`, the checks), and torch's rendezvous server is shared per port within a
    # process, so on the old port the new group could read the old group's gloo addresses (so with plain gloo too)
    os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT2", os.environ["MASTER_PORT"])
    _init()
    t = base("tpu")
    dist.all_reduce(t)
    res["second_group"] = (
        "ok"
        if torch.equal(
            t.cpu(),
            base("cpu") * 0 + sum((torch.arange(6, dtype=torch.float64) * (r + 1) + r).float() for r in range(WORLD)),
        )
        else t.cpu().tolist()
    )
    print(json.dumps(res), flush=True)
    dist.destroy_process_group()


# -- training, each against one process on CPU (the test computes it) --------------------------------------
def _gpt():
    import train_gpt

    torch.manual_seed(0)
    model = train_gpt.GPT(vocab=64, d=64, heads=4, layers=2, ctx=32)
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return model


def _opt(params):
    """SGD: its update scales with the gradient, so a wrong gradient reduction shows (Adam would hide a factor)."""
    return torch.optim.SGD(params, lr=0.1)


def batches(steps=STEPS, batch=8):
    import train_gpt

    return list(train_gpt.batches(steps, batch, 32, 64))


def _report(losses, model, **extra):
    state = {k: v.detach().float().sum().item() for k, v in _full_state(model).items()}
    print(json.dumps({"losses": losses, "param_sums": state, **extra}), flush=True)


def _full_state(model):
    out = {}
    for k, v in model.state_dict().items():
        if hasattr(v, "full_tensor"):  # a DTensor (FSDP2, tensor parallel): the whole parameter
            v = v.full_tensor()
        out[k] = v.cpu()
    return out


def ddp():
    from torch.nn.parallel import DistributedDataParallel as DDP

    _init()
    model = _gpt().to("tpu")
    net = DDP(model, bucket_cap_mb=1)
    opt = _opt(net.parameters())
    losses = []
    half = 8 // WORLD
    for x, y in batches():
        x, y = x[RANK * half : (RANK + 1) * half].to("tpu"), y[RANK * half : (RANK + 1) * half].to("tpu")
        opt.zero_grad()
        # two micro-batches: the first accumulates without a gradient all-reduce (no_sync), the second reduces both
        q = half // 2
        with net.no_sync():
            first = net(x[:q], y[:q]) / 2
            first.backward()
        second = net(x[q:], y[q:]) / 2
        second.backward()
        opt.step()
        losses.append(first.item() + second.item())
    _report(losses, model)
    dist.destroy_process_group()


def _train_on_shares(model):
    """Each rank trains on its share of every batch (data parallel); its losses."""
    opt = _opt(model.parameters())
    losses = []
    half = 8 // WORLD
    for x, y in batches():
        x, y = x[RANK * half : (RANK + 1) * half], y[RANK * half : (RANK + 1) * half]
        loss = model(x.to("tpu"), y.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.float().item())
    return losses


def fsdp2():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    _init()
    mesh = init_device_mesh("tpu", (WORLD,))
    model = _gpt().to("tpu")
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh, reshard_after_forward=True)
    fully_shard(model, mesh=mesh)
    _report(_train_on_shares(model), model, sharded=[type(p).__name__ for p in model.parameters()][:1])
    dist.destroy_process_group()


def fsdp2_mixed():
    """FSDP2 with a mixed-precision policy: bfloat16 compute, float32 gradient reduction and float32 parameters."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    _init()
    mesh = init_device_mesh("tpu", (WORLD,))
    model = _gpt().to("tpu")
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    losses = _train_on_shares(model)
    dtypes = sorted({str(p.dtype) for p in model.parameters()} | {str(p.grad.dtype) for p in model.parameters()})
    _report(losses, model, dtypes=dtypes)
    dist.destroy_process_group()


def tensor_parallel():
    """Each block's MLP split over the ranks (fc column-wise, out row-wise, DTensor); every rank takes the whole
    batch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    _init()
    mesh = init_device_mesh("tpu", (WORLD,))
    model = _gpt().to("tpu")
    for blk in model.blocks:
        parallelize_module(blk, mesh, {"fc": ColwiseParallel(), "out": RowwiseParallel()})
    # the parameters are DTensors and plain tensors: torch's foreach kernels take one kind per call (as on cuda)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    losses = []
    for x, y in batches():
        loss = model(x.to("tpu"), y.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    _report(losses, model)
    dist.destroy_process_group()


class _Stage0(torch.nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.tok, self.pos, self.block = gpt.tok, gpt.pos, gpt.blocks[0]

    def forward(self, idx):
        return self.block(self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device)))


class _Stage1(torch.nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.block, self.ln, self.head = gpt.blocks[1], gpt.ln, gpt.head

    def forward(self, x):
        return self.head(self.ln(self.block(x)))


def _run_pipeline(gpt, module, microbatches, prefixes):
    """GPipe over the ranks, one stage each (module: this rank's); the last rank computes the loss. Prints the last
    rank's losses and this rank's parameter sums (the parameters whose names start with prefixes)."""
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    stage = PipelineStage(module, RANK, WORLD, torch.device("tpu", 0))

    def loss_fn(logits, y):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    schedule = ScheduleGPipe(stage, n_microbatches=microbatches, loss_fn=loss_fn)
    opt = _opt(module.parameters())
    losses = []
    for x, y in batches():
        opt.zero_grad()
        if RANK == 0:
            schedule.step(x.to("tpu"))
        elif RANK == WORLD - 1:
            mb = []
            schedule.step(target=y.to("tpu"), losses=mb)
            losses.append(sum(m.item() for m in mb) / len(mb))
        else:
            schedule.step()
        opt.step()
    state = {
        k: v.detach().float().sum().item()
        for k, v in _full_state(gpt).items()
        if any(k.startswith(p) for p in prefixes)
    }
    print(json.dumps({"losses": losses, "param_sums": state}), flush=True)
    dist.destroy_process_group()


def pipeline():
    """Two stages, one per rank (rank 0 embeds and runs block 0; rank 1 runs block 1, the head and the loss): each
    rank runs different code (MPMD); activations and gradients go by send/recv. GPipe, 2 microbatches."""
    _init()
    gpt = _gpt()
    module = (_Stage0 if RANK == 0 else _Stage1)(gpt).to("tpu")
    _run_pipeline(gpt, module, 2, ("tok.", "pos.", "blocks.0.") if RANK == 0 else ("blocks.1.", "ln.", "head."))


def compiled():
    """Collectives inside a torch.compile graph (c10d's and the functional ones, traced by Dynamo) against the same
    function run eagerly; the second compiled call runs them inside its program (the process group sees none)."""
    import torch.distributed._functional_collectives as fc

    _init()

    def f(x, w):
        y = x @ w
        dist.all_reduce(y)
        z = fc.all_gather_tensor(y, 0, dist.group.WORLD)
        r = fc.reduce_scatter_tensor(z * 2, "sum", 0, dist.group.WORLD)
        a = fc.all_reduce(r, "avg", dist.group.WORLD)
        return y.relu() + 1, z, r, a

    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(RANK)).to("tpu")
    w = torch.randn(4, 4, generator=torch.Generator().manual_seed(7)).to("tpu")
    eager = [t.cpu() for t in f(x, w)]
    g = torch.compile(f, backend="tpu")
    first = [t.cpu() for t in g(x, w)]
    before = torchtpu.metrics.counters()
    second = [t.cpu() for t in g(x, w)]
    after = torchtpu.metrics.counters()
    diff = {k: after[k] - before.get(k, 0) for k in after if k.startswith(("collective.", "compile.program_runs"))}
    out = {
        "first": [torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(eager, first)],
        "second": [torch.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(eager, second)],
        "counters": {k: v for k, v in diff.items() if v},
    }
    print(json.dumps(out), flush=True)
    dist.destroy_process_group()


# -- beyond 2 ranks -----------------------------------------------------------------------------------------------
def data_parallel_many():
    """DDP, then FSDP2, over every rank (4 or 8): each rank trains on its share of every batch."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.nn.parallel import DistributedDataParallel as DDP

    _init(seconds=120)
    out = {}
    model = _gpt().to("tpu")
    out["ddp"] = _train_on_shares(DDP(model, bucket_cap_mb=1))
    out["ddp_sums"] = {k: v.detach().float().sum().item() for k, v in _full_state(model).items()}
    mesh = init_device_mesh("tpu", (WORLD,))
    model = _gpt().to("tpu")
    for blk in model.blocks:
        fully_shard(blk, mesh=mesh)
    fully_shard(model, mesh=mesh)
    out["fsdp2"] = _train_on_shares(model)
    out["fsdp2_sums"] = {k: v.detach().float().sum().item() for k, v in _full_state(model).items()}
    print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def fsdp_tp_2d():
    """A 2-D mesh (dp x tp = 2 x WORLD/2): each block's MLP split over tp (DTensor), the blocks sharded over dp
    (FSDP2); the dp ranks train on their share of every batch, the tp ranks of one dp rank on the same share."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    _init(seconds=120)
    mesh = init_device_mesh("tpu", (2, WORLD // 2), mesh_dim_names=("dp", "tp"))
    model = _gpt().to("tpu")
    for blk in model.blocks:
        parallelize_module(blk, mesh["tp"], {"fc": ColwiseParallel(), "out": RowwiseParallel()})
        fully_shard(blk, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, foreach=False)
    dp = mesh["dp"].get_local_rank()
    losses = []
    for x, y in batches():
        x, y = x[dp * 4 : (dp + 1) * 4], y[dp * 4 : (dp + 1) * 4]
        loss = model(x.to("tpu"), y.to("tpu"))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    _report(losses, model, dp=dp)
    dist.destroy_process_group()


class _Embed(torch.nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.tok, self.pos = gpt.tok, gpt.pos

    def forward(self, idx):
        return self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))


class _Head(torch.nn.Module):
    def __init__(self, gpt):
        super().__init__()
        self.ln, self.head = gpt.ln, gpt.head

    def forward(self, x):
        return self.head(self.ln(x))


def pipeline4():
    """Four stages, one per rank: the embedding, block 0, block 1, the head (GPipe, 4 microbatches)."""
    _init(seconds=120)
    gpt = _gpt()
    module = [_Embed(gpt), gpt.blocks[0], gpt.blocks[1], _Head(gpt)][RANK].to("tpu")
    prefixes = ["tok.", "pos."], ["blocks.0."], ["blocks.1."], ["ln.", "head."]
    _run_pipeline(gpt, module, 4, prefixes[RANK])


def checkpoint_save(path):
    """An FSDP2-sharded model (2 ranks) written with torch.distributed.checkpoint."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    _init()
    mesh = init_device_mesh("tpu", (WORLD,))
    model = _gpt().to("tpu")
    fully_shard(model, mesh=mesh)
    opt = _opt(model.parameters())
    x, y = batches(1)[0]
    loss = model(x.to("tpu"), y.to("tpu"))
    loss.backward()
    opt.step()
    dcp.save({"model": model.state_dict()}, checkpoint_id=path)
    sums = {k: v.detach().float().sum().item() for k, v in _full_state(model).items()}
    print(json.dumps({"param_sums": sums}), flush=True)
    dist.destroy_process_group()


def lost_rank(seconds):
    """Rank 1 dies after two all-reduces; rank 0's next collective must fail within the group's timeout (seconds
    "default": torch's default timeout, 30 minutes). The collective sits between two ops (inside a fused chunk)."""
    import time

    if seconds == "default":
        dist.init_process_group("cpu:gloo,tpu:tpu", rank=RANK, world_size=WORLD)
    else:
        _init(seconds=int(seconds))
    t = torch.ones(4, device="tpu")
    for i in range(2):
        dist.all_reduce(t)
    t.cpu()
    if RANK == 1:
        os._exit(3)
    t0 = time.time()
    try:
        for _ in range(3):
            t = t * 2
            dist.all_reduce(t)
            t = t + 1
            t.cpu()
        print(json.dumps({"raised": None, "seconds": time.time() - t0}), flush=True)
    except Exception as e:  # noqa: BLE001 (what the survivor sees is the result)
        print(json.dumps({"raised": f"{type(e).__name__}: {e}"[:2000], "seconds": time.time() - t0}), flush=True)
    os._exit(0)


def dtensor():
    """Shard / Replicate / Partial placements on a 1-D mesh and on 2-D meshes (2x1, 1x2), redistributed: every
    rank's full tensor equals the original; a sharded matmul's result too."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor

    _init()
    res = {}
    torch.manual_seed(0)
    full = torch.randn(4, 6)
    w = torch.randn(6, 8)
    for shape in ((WORLD,), (WORLD, 1), (1, WORLD)):
        mesh = init_device_mesh("tpu", shape)
        n = len(shape)
        for name, placements in [
            ("shard0", [Shard(0)] * n),
            ("shard1", [Shard(1)] * n),
            ("replicate", [Replicate()] * n),
        ]:
            d = distribute_tensor(full.to("tpu"), mesh, placements)
            ok = torch.allclose(d.full_tensor().cpu(), full)
            r = d.redistribute(mesh, [Replicate()] * n)
            ok = ok and torch.allclose(r.to_local().cpu(), full)
            s = r.redistribute(mesh, [Shard(1)] * n)
            ok = ok and torch.allclose(s.full_tensor().cpu(), full)
            res[f"{shape}.{name}"] = ok
        # a partial sum (each rank holds a part of the value) reduced to a replicated value
        share = (RANK + 1) / sum(range(1, WORLD + 1))
        part = DTensor.from_local((full * share).to("tpu"), mesh, [Partial()] * n)
        res[f"{shape}.partial"] = torch.allclose(
            part.redistribute(mesh, [Replicate()] * n).to_local().cpu(), full, atol=1e-6
        )
        # a matmul with the input sharded by rows and the weight replicated
        x = distribute_tensor(full.to("tpu"), mesh, [Shard(0)] * n)
        y = distribute_tensor(w.to("tpu"), mesh, [Replicate()] * n)
        res[f"{shape}.matmul"] = torch.allclose((x @ y).full_tensor().cpu(), full @ w, atol=1e-5)
    print(json.dumps(res), flush=True)
    dist.destroy_process_group()


def mismatch():
    """The ranks call collectives that do not match (shapes, dtypes, order): each rank must raise, not hang or
    crash; the group stays usable."""
    import time

    _init(seconds=20)
    out = {}
    for kind in ("shape", "dtype", "order"):
        t0 = time.time()
        try:
            if kind == "shape":
                t = torch.ones(4 + RANK, device="tpu")
                dist.all_reduce(t)
            elif kind == "dtype":
                t = torch.ones(4, device="tpu", dtype=torch.float32 if RANK == 0 else torch.int32)
                dist.all_reduce(t)
            else:  # rank 0 all-reduces where rank 1 all-gathers
                t = torch.ones(4, device="tpu")
                if RANK == 0:
                    dist.all_reduce(t)
                else:
                    dist.all_gather_into_tensor(torch.empty(8, device="tpu"), t)
            t.cpu()
            out[kind] = {"raised": None}
        except Exception as e:  # noqa: BLE001
            out[kind] = {"raised": f"{type(e).__name__}: {e}"[:1500]}
        out[kind]["seconds"] = time.time() - t0
    t = torch.full((2,), float(RANK + 1), device="tpu")
    dist.all_reduce(t)
    out["after"] = t.cpu().tolist()
    print(json.dumps(out), flush=True)
    dist.destroy_process_group()


def main():
    job = sys.argv[1]
    globals()[job](*sys.argv[2:])


if __name__ == "__main__":
    main()
