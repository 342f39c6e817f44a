"""Modules move to tpu and back as they do to cuda: tied parameters stay one Parameter, `param.data = t`
swaps the data in place, optimizer state keyed by those parameters keeps working."""

import torch
import torch.nn as nn


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight  # what GPT-2, T5, BERT and Llama do with tie_word_embeddings

    def forward(self, idx):
        return self.head(self.emb(idx))


def test_tied_weights_stay_tied_through_moves():
    m = Tied()
    p0 = m.emb.weight
    for move in (
        lambda: m.to("tpu"),
        lambda: m.to(torch.float64),
        lambda: m.tpu(),
        lambda: m.float(),
        lambda: m.cpu(),
        lambda: m.to("tpu:0"),
    ):
        move()
        assert len(list(m.parameters())) == 1
        assert m.head.weight is m.emb.weight
        assert m.emb.weight is p0  # the same Parameter object, as on cuda
    assert m.emb.weight.device.type == "tpu" and m.emb.weight.dtype == torch.float32


def test_param_data_assignment_between_devices():
    p = nn.Parameter(torch.arange(4.0))
    p.data = torch.ones(4, device="tpu")
    assert p.device.type == "tpu" and isinstance(p, nn.Parameter)
    assert torch.equal(p.cpu(), torch.ones(4))
    p.data = torch.zeros(4)
    assert p.device.type == "cpu"
    assert torch._has_compatible_shallow_copy_type(torch.ones(1), torch.ones(1, device="tpu"))
    assert torch._has_compatible_shallow_copy_type(torch.ones(1, device="tpu"), torch.ones(1))
    assert not torch._has_compatible_shallow_copy_type(torch.ones(1, device="tpu"), torch.ones(1, device="meta"))


def test_tied_training_matches_cpu_and_optimizer_state_survives_a_move():
    torch.manual_seed(0)
    cpu = Tied()
    tpu = Tied()
    tpu.load_state_dict(cpu.state_dict())
    tpu.to("tpu")
    idx = torch.randint(0, 10, (6,))
    tgt = torch.randint(0, 10, (6,))
    opts = [torch.optim.AdamW(m.parameters(), lr=1e-2) for m in (cpu, tpu)]
    for step in range(4):
        for m, opt, dev in ((cpu, opts[0], "cpu"), (tpu, opts[1], "tpu")):
            opt.zero_grad()
            nn.functional.cross_entropy(m(idx.to(dev)), tgt.to(dev)).backward()
            opt.step()
        if step == 1:  # the optimizer keys its state by Parameter: a move must keep those objects
            tpu.cpu()
            tpu.to("tpu")
            for st in opts[1].state.values():
                for k, v in st.items():
                    st[k] = v.to("tpu")
    assert len(opts[1].state) == 1
    torch.testing.assert_close(tpu.emb.weight.cpu(), cpu.emb.weight, rtol=1e-5, atol=1e-6)
