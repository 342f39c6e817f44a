"""torch.compile(backend="tpu"): compiled graphs against eager tpu and CPU, captures, guards, fallbacks."""

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchtpu
from torchtpu import _C


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _counters():
    return torchtpu.metrics.counters()


def _train(model, batches, device, compiled, steps, opt_cls=torch.optim.AdamW, loss_fn=None):
    torch.manual_seed(0)
    model = copy.deepcopy(model).to(device)
    fwd = torch.compile(model, backend="tpu") if compiled else model
    opt = opt_cls(model.parameters(), lr=1e-2)
    losses = []
    for i in range(steps):
        x, y = (t.to(device) for t in batches[i % len(batches)])
        loss = loss_fn(fwd, x, y) if loss_fn else F.cross_entropy(fwd(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


def _close(a, b, tol=1e-5):
    return max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b)) < tol


def _mlp_data():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(32, 16, generator=g), torch.randint(0, 4, (32,), generator=g)) for _ in range(3)]


def test_backend_is_registered_and_device_interface_is_ours():
    assert "tpu" in torch._dynamo.list_backends()
    fn = torch.compile(lambda x: (x * 2).sin(), backend="tpu")
    x = torch.randn(8, device="tpu")
    assert torch.allclose(fn(x).cpu(), (x.cpu() * 2).sin(), atol=1e-6)
    from torch._dynamo.device_interface import get_interface_for_device

    iface = get_interface_for_device("tpu")
    assert iface.is_dtype_supported(torch.float64) and iface.is_dtype_supported(torch.half)
    with torch.tpu.device(1):
        assert iface.current_device() == 1


@pytest.mark.pins_mode
@pytest.mark.parametrize("mode", ["strict", "fused"])
def test_mlp_trains_like_eager_and_cpu_and_replays_one_program_per_graph(mode):
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
    data = _mlp_data()
    cpu, _ = _train(model, data, "cpu", False, 6)
    with torchtpu.mode(mode):
        eager, _ = _train(model, data, "tpu", False, 6)
        torchtpu.metrics.reset()
        comp, _ = _train(model, data, "tpu", True, 6)
    assert _close(cpu, comp) and _close(eager, comp), (cpu, eager, comp)
    c = _counters()
    assert c.get("compile.captures") == 2, c  # forward and backward, captured once each
    assert c.get("compile.program_runs") == 10, c  # every later step: one node per graph
    assert not c.get("compile.eager_graphs"), c


@pytest.mark.pins_mode
def test_fused_mode_launches_programs_as_recorded_while_the_host_reads_every_step(monkeypatch):
    """The program rule (csrc/graph/graph.h): a loss read every step launches the forward and backward programs
    as they are recorded; a loop that stops reading fuses them with the ops around it again. Values stay CPU's."""
    from torchtpu import executor

    monkeypatch.setenv("TORCHTPU_FUSED_PROGRAM_CUT_OPS", "1")  # the MLP's programs are smaller than the default
    executor.fused_limits_from_env()
    try:
        model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
        data = _mlp_data()
        runs = {}
        for device in ("cpu", "tpu"):
            torch.manual_seed(0)
            m = copy.deepcopy(model).to(device)
            fwd = torch.compile(m, backend="tpu") if device == "tpu" else m
            opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
            losses, cuts = [], []
            with torchtpu.mode("fused"):
                for i in range(24):
                    x, y = (t.to(device) for t in data[i % len(data)])
                    before = _counters().get("cuts.program", 0)
                    loss = F.cross_entropy(fwd(x), y)
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                    cuts.append(_counters().get("cuts.program", 0) - before)
                    losses.append(loss.item() if i < 4 else loss)  # steps 4..23 read nothing
                losses[4:] = [t.item() for t in losses[4:]]
            runs[device] = losses, cuts, [p.detach().cpu() for p in m.parameters()]
        (cpu_l, _, cpu_p), (tpu_l, cuts, tpu_p) = runs["cpu"], runs["tpu"]
        assert _close(cpu_l, tpu_l), (cpu_l, tpu_l)
        assert all(torch.allclose(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(cpu_p, tpu_p))
        # forward and backward programs, launched as recorded and alone: the backward's program after a cut of the
        # loss ops pending before it (the forward finds nothing pending after the read)
        assert cuts[1:4] == [3, 3, 3], cuts
        # no reads: after 16 programs (a cut before and after each) they fuse with the rest
        assert sum(cuts[4:]) <= 32 and cuts[-8:] == [0] * 8, cuts
    finally:
        monkeypatch.delenv("TORCHTPU_FUSED_PROGRAM_CUT_OPS")
        executor.fused_limits_from_env()


def test_data_dependent_ops_inside_a_compiled_function_match_cpu():
    # their Python kernels run under the compiled function's graph breaks: Dynamo traced them as user code before
    # (repeat_interleave, bincount, unique raised from inside their own ops' lowering)
    x, r = torch.randn(6, 3), torch.tensor([1, 2, 0, 3, 1, 2])
    m, b = x[:, 0] > 0, torch.tensor([0, 3, 3, 1])
    fns = [
        lambda x, r, m, b: torch.repeat_interleave(x, r, dim=0) * 2,
        lambda x, r, m, b: torch.nonzero(m) + 1,
        lambda x, r, m, b: x.masked_select(m[:, None]) * 2,
        lambda x, r, m, b: x[m].sum(0),
        lambda x, r, m, b: torch.bincount(b) + 1,
        lambda x, r, m, b: torch.unique(b) * 2,
    ]
    for f in fns:
        torch._dynamo.reset()
        got = torch.compile(f, backend="tpu")(*(t.to("tpu") for t in (x, r, m, b)))
        assert torch.allclose(got.cpu(), f(x, r, m, b)), f


def test_warm_compiled_step_runs_no_lowering_and_compiles_nothing():
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to("tpu")
    fwd = torch.compile(model, backend="tpu")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x, y = torch.randn(32, 16, device="tpu"), torch.randint(0, 4, (32,), device="tpu")
    for step in range(4):
        if step == 2:
            before = _counters()
        loss = F.cross_entropy(fwd(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
    after = _counters()
    for k in ("compiles", "lowerings", "compile.captures"):
        assert after.get(k, 0) == before.get(k, 0), k


def test_small_gpt_compiled_matches_cpu_with_dropout_fresh_each_step():
    import train_gpt as gpt

    model, loss_fn = gpt.small_gpt(dropout=False)
    data = list(gpt.batches(4, 8, 32, 64))
    cpu, _ = _train(model, data, "cpu", False, 4, loss_fn=loss_fn)
    with torchtpu.mode("fused"):
        comp, _ = _train(model, data, "tpu", True, 4, loss_fn=loss_fn)
    assert _close(cpu, comp), (cpu, comp)
    assert not any(k.startswith("fallback.") for k in _counters())
    # dropout inside a compiled graph draws fresh random numbers on every run, from the tpu generator
    torch._dynamo.reset()
    drop = torch.compile(lambda x: F.dropout(x, 0.5, training=True), backend="tpu")
    x = torch.ones(4096, device="tpu")
    torch.tpu.manual_seed(3)
    a, b = drop(x).cpu(), drop(x).cpu()
    assert not torch.equal(a, b)
    for r in (a, b):
        assert set(r.unique().tolist()) <= {0.0, 2.0} and 0.4 < (r == 0).float().mean() < 0.6
    torch.tpu.manual_seed(3)
    assert torch.equal(drop(x).cpu(), a)  # the same seed gives the same numbers


def test_cnn_with_batchnorm_train_and_eval_updates_running_stats():
    model = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1),
        nn.BatchNorm2d(8),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(8, 5),
    )
    g = torch.Generator().manual_seed(2)
    data = [(torch.randn(4, 3, 8, 8, generator=g), torch.randint(0, 5, (4,), generator=g)) for _ in range(2)]
    cpu, cpu_model = _train(model, data, "cpu", False, 3, opt_cls=torch.optim.SGD)
    comp, tpu_model = _train(model, data, "tpu", True, 3, opt_cls=torch.optim.SGD)
    assert _close(cpu, comp, 1e-4), (cpu, comp)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        a, b = getattr(cpu_model[1], name), getattr(tpu_model[1], name).cpu()
        assert torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5), name
    cpu_model.eval()
    tpu_model.eval()
    x = data[0][0]
    with torch.no_grad():
        out = torch.compile(tpu_model, backend="tpu")(x.to("tpu"))
    assert torch.allclose(cpu_model(x), out.cpu(), rtol=1e-4, atol=1e-5)


# mixtral: _grouped_mm's fake rule for tpu. The graphs run as captured programs in either eager mode (only the
# optimizer runs in the suite's mode): each model in one pass of the suite (scripts/test.sh)
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.one_pass(p))
        for n, p in (("gpt2", "strict"), ("llama", "fused"), ("mixtral", "fused"))
    ],
)
def test_hugging_face_models_compiled_match_cpu(name):
    import zoo

    torch.manual_seed(0)
    model, make_batches, loss_fn = zoo.MODELS[name]()
    batches = make_batches(3)
    losses = {}
    for dev, compiled in (("cpu", False), ("tpu", True)):
        torch._dynamo.reset()
        torch.manual_seed(0)
        m = copy.deepcopy(model).to(dev)
        fwd = torch.compile(m, backend="tpu") if compiled else m
        opt = torch.optim.AdamW(m.parameters(), lr=1e-3)
        out = []
        for b in batches:
            loss = loss_fn(fwd, zoo._to(b, dev))
            opt.zero_grad()
            loss.backward()
            opt.step()
            out.append(loss.item())
        losses[dev] = out
    assert _close(losses["cpu"], losses["tpu"]), losses
    assert _counters().get("compile.captures", 0) >= 2


def test_graph_break_and_input_mutation():
    def f(x, buf):
        y = x.sin() * 2
        buf.add_(y)  # a mutation of an input lands on the real tensor
        print("graph break", end="\r")
        return (y + buf).cos()

    cf = torch.compile(f, backend="tpu")
    x = torch.randn(16)
    buf = torch.zeros(16)
    tb = buf.to("tpu")
    for _ in range(3):
        ref = f(x, buf)
        out = cf(x.to("tpu"), tb)
        assert torch.allclose(ref, out.cpu(), atol=1e-6)
        assert torch.allclose(buf, tb.cpu(), atol=1e-6)


def test_new_shape_recompiles_once_repeated_shape_does_not():
    fn = torch.compile(lambda x: (x @ x.T).relu().sum(0), backend="tpu", dynamic=False)
    sizes = [(4, 8), (4, 8), (6, 8), (6, 8), (4, 8)]
    captures = []
    for s in sizes:
        x = torch.randn(*s)
        assert torch.allclose(fn(x.to("tpu")).cpu(), (x @ x.T).relu().sum(0), atol=1e-5)
        captures.append(_counters().get("compile.captures", 0))
    assert captures == [1, 1, 2, 2, 2], captures


def test_same_shape_other_strides_capture_again_and_stay_right():
    fn = torch.compile(lambda x: x * 3 + 1, backend="tpu", dynamic=False)
    base = torch.randn(8, 8)
    t = base.to("tpu")
    assert torch.allclose(fn(t).cpu(), base * 3 + 1)
    # a non-contiguous view of another storage size: the program's guard refuses it, a new capture serves it
    v = t[::2]
    assert torch.allclose(fn(v.contiguous()).cpu(), base[::2] * 3 + 1)


def test_compiled_optimizer_step_works():
    torch.manual_seed(0)
    ref = nn.Linear(8, 2)
    m = copy.deepcopy(ref).to("tpu")
    opt, ref_opt = torch.optim.Adam(m.parameters(), lr=1e-2), torch.optim.Adam(ref.parameters(), lr=1e-2)
    step = torch.compile(opt.step, backend="tpu")
    x = torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(3):
            for model, o, s, xx in ((ref, ref_opt, ref_opt.step, x), (m, opt, step, x.to("tpu"))):
                o.zero_grad()
                model(xx).square().sum().backward()
                s()
    assert torch.allclose(ref.weight, m.weight.cpu(), rtol=1e-5, atol=1e-6)


def test_index_out_of_range_inside_a_compiled_graph_raises():
    fn = torch.compile(lambda w, i: w[i].sum(), backend="tpu")
    w = torch.randn(10, 4, device="tpu")
    assert torch.allclose(fn(w, torch.tensor([1, 2], device="tpu")).cpu(), w.cpu()[[1, 2]].sum())
    with pytest.raises(IndexError):
        fn(w, torch.tensor([1, 12], device="tpu")).item()
    torchtpu.sync()


def test_a_constant_the_graph_uploads_and_returns_is_part_of_its_program():
    """A CPU constant moved to the device and returned unread (Mistral's and Gemma 2's forward graphs return one
    for their backward) is an output of the program: the graph runs as one program, not op by op, and each call's
    output is the caller's own (changing it changes no later call's)."""

    def f(x):
        n = torch.tensor(3).to(x.device)
        return x * 2, n

    fn = torch.compile(f, backend="tpu")
    x = torch.randn(4, device="tpu")
    for _ in range(3):
        y, n = fn(x)
        assert n.item() == 3 and torch.equal(y.cpu(), x.cpu() * 2)
        n.add_(10)
    c = _counters()
    assert c.get("compile.eager_graphs", 0) == 0 and c.get("compile.program_runs", 0) == 2, c


def test_a_cpu_scalar_made_from_constants_and_saved_for_backward_is_part_of_the_programs():
    """DeBERTa-v2 computes its attention scale on the CPU (a scalar tensor from constants) and divides device
    tensors by it: the forward graph returns it for the backward, which takes it as an input. Both graphs are
    programs (the forward's CPU output is a constant; the backward is keyed by its value), with CPU's gradients."""

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)

        def forward(self, x):
            scale = torch.sqrt(torch.tensor(8, dtype=torch.float) * 2)
            return (self.lin(x) / scale).tanh().sum()

    torch.manual_seed(0)
    m, x = M(), torch.randn(4, 8)
    m(x).backward()
    mt = copy.deepcopy(m).to("tpu")
    fn = torch.compile(mt, backend="tpu")
    for _ in range(3):
        mt.zero_grad()
        fn(x.to("tpu")).backward()
    torch.testing.assert_close(mt.lin.weight.grad.cpu(), m.lin.weight.grad, rtol=1e-5, atol=1e-6)
    c = _counters()
    assert c.get("compile.eager_graphs", 0) == 0 and c.get("compile.captures", 0) == 2, c


def test_graph_with_a_host_read_runs_op_by_op_and_says_why():
    def f(x):
        return x[x > 0].sum()  # a data-dependent size: read on the host

    fn = torch.compile(f, backend="tpu")
    x = torch.randn(32)
    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        for _ in range(2):
            assert torch.allclose(fn(x.to("tpu")).cpu(), f(x), atol=1e-5)


def test_program_info_counts_one_node_per_call():
    fn = torch.compile(lambda a, b: (a @ b).tanh() + a.sum(), backend="tpu")
    a, b = torch.randn(4, 4, device="tpu"), torch.randn(4, 4, device="tpu")
    fn(a, b)
    with torchtpu.mode("fused"):
        torchtpu.sync()
        before = _C._pending_ops(0)
        fn(a, b)
        assert _C._pending_ops(0) == before + 1  # the whole graph is one pending node
        torchtpu.sync()


def test_scalars_baked_into_a_program_keep_their_exact_values():
    def f(x):
        return x * 1e-8 + x * 1e20 - 3.5e-300 * x + x / 123456789.0 + (x + 7).clamp(max=2.5) + 0.1

    fn = torch.compile(f, backend="tpu")
    x = torch.randn(16, dtype=torch.float64)
    for _ in range(2):
        assert torch.equal(fn(x.to("tpu")).cpu(), f(x))
    assert _counters().get("compile.captures") == 1 and not _counters().get("compile.eager_graphs")


def test_compiled_capturable_optimizer_step_is_one_program():
    torch.manual_seed(0)
    ref = nn.Linear(8, 2)
    m = copy.deepcopy(ref).to("tpu")
    opt = torch.optim.Adam(m.parameters(), lr=1e-2, capturable=True)
    ref_opt = torch.optim.Adam(ref.parameters(), lr=1e-2)
    step = torch.compile(opt.step, backend="tpu")
    x = torch.randn(4, 8)
    for _ in range(4):
        for model, o, s, xx in ((ref, ref_opt, ref_opt.step, x), (m, opt, step, x.to("tpu"))):
            o.zero_grad()
            model(xx).square().sum().backward()
            s()
    assert torch.allclose(ref.weight, m.weight.cpu(), rtol=1e-5, atol=1e-6)
    c = _counters()
    assert c.get("compile.program_runs", 0) >= 2 and not c.get("compile.eager_graphs"), c


def test_dynamic_true_and_mark_dynamic_capture_once_per_bucket():
    fn = torch.compile(lambda x: (x @ x.T).relu().sum(0) * x.shape[0], backend="tpu", dynamic=True)
    for n in (5, 6, 5, 7, 9):
        x = torch.randn(n, 8)
        assert torch.allclose(fn(x.to("tpu")).cpu(), (x @ x.T).relu().sum(0) * n, atol=1e-4)
    c = _counters()
    assert c.get("compile.graphs.inference") == 1  # one symbolic graph
    # sizes 5, 6, 7: bucket 8 (one capture, then its program); 9: bucket 16 (tests/shapes/test_buckets.py has the rest)
    assert c.get("compile.captures") == 2 and c.get("compile.program_runs") == 3
    m = nn.Linear(8, 3).to("tpu")
    cm = torch.compile(m, backend="tpu")
    for n in (2, 5):
        x = torch.randn(n, 8, device="tpu")
        torch._dynamo.mark_dynamic(x, 0)
        assert torch.allclose(cm(x).cpu(), m(x).cpu(), atol=1e-5)


def test_backward_graphs_take_boxed_arguments_so_users_see_no_aot_warning():
    # Dynamo wraps a backward compiler's result in disable(); AOTAutograd then warned each first backward that "your
    # compiler ... doesn't take boxed arguments" (users of the README's GPT saw it) and called it unboxed
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4)).to("tpu")
    fwd = torch.compile(model, backend="tpu")
    x = torch.randn(8, 16, device="tpu")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for _ in range(2):
            fwd(x).square().sum().backward()
    assert not [str(w.message) for w in seen if "boxed" in str(w.message)]
    assert model[0].weight.grad is not None


def test_new_programs_inside_a_compiled_functions_graph_breaks_run_untraced():
    # an expert loop (Longcat-Flash's): graph breaks at .item(), and the eager code between graphs lowers, compiles
    # and first launches new programs. Dynamo compiled the jax frames those callbacks call as user code, and jax's
    # pytree calls failed inside them ("flatten(): incompatible function arguments")
    def experts(h, mask):
        out = torch.zeros_like(h)
        for e in mask.sum(dim=(1, 2)).nonzero():
            j = int(e.item())
            sel, tok = torch.where(mask[j])
            out.index_add_(0, tok, h[tok] * (j + 1) + sel[:, None])
        return out

    g = torch.Generator().manual_seed(0)
    fn = torch.compile(experts, backend="tpu")
    for _ in range(2):
        h, mask = torch.randn(32, 16, generator=g), torch.rand(3, 2, 32, generator=g) > 0.5
        torch.testing.assert_close(fn(h.to("tpu"), mask.to("tpu")).cpu(), experts(h, mask))
