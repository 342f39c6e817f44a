"""Autograd and optimizers end to end: the done-criteria of the foundation."""

import pytest
import torch
import torch.nn.functional as F

import torchtpu


def _mlp_losses(device, opt_name="adam", steps=20):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to(device)
    opt = {
        "adam": lambda p: torch.optim.Adam(p, lr=1e-2),
        "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    }[opt_name](model.parameters())
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 16, generator=g).to(device), torch.randint(0, 4, (64,), generator=g).to(device)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("opt_name", ["adam", "adamw", "sgd"])
def test_mlp_matches_cpu_losses(opt_name):
    cpu = _mlp_losses("cpu", opt_name)
    tpu = _mlp_losses("tpu", opt_name)
    rel = max(abs(a - b) / abs(a) for a, b in zip(cpu, tpu))
    assert rel < 1e-4, (rel, cpu, tpu)
    assert not any(k.startswith("fallback.") for k in torchtpu.metrics.counters())


def test_no_compile_after_first_step_and_lr_schedule_never_recompiles():
    _mlp_losses("tpu", "adam", steps=2)
    torchtpu.metrics.reset()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).to("tpu")
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.7)  # a new lr every step
    x, y = torch.randn(64, 16, device="tpu"), torch.randint(0, 4, (64,), device="tpu")
    for step in range(6):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
        sched.step()
        if step == 0:
            after_first = torchtpu.metrics.counters().get("compiles", 0)
    assert torchtpu.metrics.counters().get("compiles", 0) == after_first


def test_small_gpt_step_runs_with_zero_cpu_fallbacks_and_matches_cpu():
    import train_gpt as gpt

    for build in (lambda: gpt.small_gpt(dropout=False), gpt.hf_gpt2):
        cpu, _, _ = gpt.train(build, "cpu", 3)
        tpu, _, _ = gpt.train(build, "tpu", 3)
        assert max(abs(a - b) / abs(a) for a, b in zip(cpu, tpu)) < 1e-5
    tpu_drop, _, _ = gpt.train(lambda: gpt.small_gpt(dropout=True), "tpu", 2)
    assert all(v == v for v in tpu_drop)
    c = torchtpu.metrics.counters()
    assert not any(k.startswith("fallback.") for k in c), c


def test_backward_runs_on_autograd_thread_and_grad_accumulates():
    w = torch.randn(3, 3, device="tpu", requires_grad=True)
    for _ in range(2):
        (w * w).sum().backward()
    assert torch.allclose(w.grad.cpu(), 4 * w.detach().cpu())
