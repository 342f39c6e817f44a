"""torch.optim.Adam/AdamW/SGD(fused=True) (Hugging Face Trainer's default optimizer): one tpu op per step, the same
numbers as PyTorch's CPU fused kernel, no CPU fallback, and a learning-rate schedule that compiles nothing new."""

import pytest
import torch

import torchtpu


def _train(device, opt_cls, steps=5, tensor_lr=False, **kw):
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3)).to(device)
    lr = torch.tensor(1e-2) if tensor_lr else 1e-2  # a tensor: the .tensor_lr overload
    opt = opt_cls(m.parameters(), lr=lr, fused=True, **kw)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, 0.7)  # a new learning rate every step
    x, y = torch.randn(5, 8).to(device), torch.randn(5, 3).to(device)
    compiles = []
    for _ in range(steps):
        c0 = torchtpu.metrics.counters().get("compiles", 0)
        opt.zero_grad()
        torch.nn.functional.mse_loss(m(x), y).backward()
        opt.step()
        sched.step()
        torchtpu.sync()
        compiles.append(torchtpu.metrics.counters().get("compiles", 0) - c0)
    state = [v for st in opt.state.values() for k, v in sorted(st.items())]
    return [p.detach().cpu() for p in m.parameters()] + [s.cpu() for s in state], compiles


@pytest.mark.parametrize(
    "opt_cls,kw",
    [
        (torch.optim.AdamW, {}),
        (torch.optim.Adam, dict(weight_decay=0.1, amsgrad=True)),
        (torch.optim.AdamW, dict(maximize=True, amsgrad=True, betas=(0.8, 0.9), eps=1e-6)),
        (torch.optim.AdamW, dict(tensor_lr=True)),
        (torch.optim.SGD, {}),
        (torch.optim.SGD, dict(momentum=0.9, nesterov=True, weight_decay=0.1)),
        (torch.optim.SGD, dict(momentum=0.8, dampening=0.3, maximize=True, tensor_lr=True)),
    ],
)
def test_fused_optimizer_matches_cpu_in_one_op_and_a_schedule_compiles_nothing(opt_cls, kw):
    cpu, _ = _train("cpu", opt_cls, **kw)
    tpu, compiles = _train("tpu", opt_cls, **kw)
    for a, b in zip(cpu, tpu):  # params, step counters, moments
        torch.testing.assert_close(b, a, rtol=2e-5, atol=1e-7)
    c = torchtpu.metrics.counters()
    assert not [k for k in c if k.startswith("fallback.")], c
    name = {torch.optim.AdamW: "op._fused_adamw_", torch.optim.Adam: "op._fused_adam_"}.get(opt_cls, "op._fused_sgd_")
    assert c.get(name, 0) + c.get(name + ".tensor_lr", 0) == 5, c
    assert sum(compiles[2:]) == 0, compiles  # the learning rate is a runtime value


def test_grad_scale_and_found_inf_as_cpu():
    """GradScaler's arguments: grads are unscaled (and written back), a step with found_inf set changes nothing."""
    g = torch.Generator().manual_seed(1)
    lists = [[torch.randn(4, 3, generator=g) for _ in range(2)] for _ in range(4)]
    lists[3] = [x.abs() for x in lists[3]]  # exp_avg_sq >= 0
    for inf in (0.0, 1.0):
        outs = []
        for dev in ("cpu", "tpu"):
            p, gr, m, v = [[x.clone().to(dev) for x in lst] for lst in lists]
            steps = [torch.tensor(3.0).to(dev) for _ in p]
            torch._fused_adamw_(
                p,
                gr,
                m,
                v,
                [],
                steps,
                lr=0.01,
                beta1=0.9,
                beta2=0.99,
                weight_decay=0.01,
                eps=1e-8,
                amsgrad=False,
                maximize=False,
                grad_scale=torch.tensor(4.0).to(dev),
                found_inf=torch.tensor(inf).to(dev),
            )
            outs.append([x.cpu() for x in p + gr + m + v])
        for a, b in zip(*outs):
            torch.testing.assert_close(b, a, rtol=2e-6, atol=1e-7)
        if inf:
            assert all(torch.equal(a, b) for a, b in zip(outs[1], [x for lst in lists for x in lst]))


@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_fused_sgd_grad_scale_and_found_inf_as_cpu(momentum):
    g = torch.Generator().manual_seed(2)
    lists = [[torch.randn(4, 3, generator=g) for _ in range(2)] for _ in range(3)]
    for inf in (0.0, 1.0):
        outs = []
        for dev in ("cpu", "tpu"):
            p, gr, buf = [[x.clone().to(dev) for x in lst] for lst in lists]
            torch._fused_sgd_(
                p,
                gr,
                buf if momentum else [],
                weight_decay=0.01,
                momentum=momentum,
                lr=0.1,
                dampening=0.0,
                nesterov=False,
                maximize=False,
                is_first_step=False,
                grad_scale=torch.tensor(4.0).to(dev),
                found_inf=torch.tensor(inf).to(dev),
            )
            outs.append([x.cpu() for x in p + gr + buf])
        for a, b in zip(*outs):
            torch.testing.assert_close(b, a, rtol=2e-6, atol=1e-7)
        if inf:
            assert all(torch.equal(a, b) for a, b in zip(outs[1], [x for lst in lists for x in lst]))
