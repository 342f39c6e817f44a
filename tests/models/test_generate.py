"""Hugging Face `generate` on tpu as a user runs it: greedy and sampling, the dynamic cache in every eager mode and
the static cache through Hugging Face's fast path (transformers compiles the decode step with
torch.compile(backend="tpu") for tpu models), token for token as on cpu; the compiled decode step is one program
per token with no host read inside (bench/generate.py measures the speed)."""

import copy

import pytest
import torch
from conftest import modes_by_pass

import torchtpu
from torchtpu import metrics

PROMPT, NEW = 7, 10


def _llama():
    import transformers as T

    torch.manual_seed(0)
    cfg = T.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        initializer_range=0.2,  # so that greedy decoding does not repeat one token
        bos_token_id=0,
        eos_token_id=None,
        pad_token_id=0,
    )
    return T.LlamaForCausalLM(cfg).eval()


def _prompt(n=PROMPT, seed=1):
    return torch.randint(1, 256, (1, n), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def models():
    cpu = _llama()
    return cpu, copy.deepcopy(cpu).to("tpu")


def _fallbacks():
    return {k: v for k, v in metrics.counters().items() if k.startswith("fallback.")}


@pytest.mark.parametrize("mode", modes_by_pass("strict", "fused", "debug"))
def test_greedy_with_the_dynamic_cache_matches_cpu_in_every_mode(models, mode):
    cpu, tpu = models
    ids = _prompt()
    with torch.no_grad():
        want = cpu.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
        before = _fallbacks()
        with torchtpu.mode(mode):
            got = tpu.generate(ids.to("tpu"), max_new_tokens=NEW, do_sample=False, pad_token_id=0).cpu()
    assert len(set(want[0, PROMPT:].tolist())) > 3  # a sequence worth comparing
    assert torch.equal(want, got), (want, got)
    assert _fallbacks() == before


def test_static_cache_fast_path_is_one_program_per_token_and_compiles_once(models):
    cpu, tpu = models
    tpu = copy.deepcopy(tpu)
    tpu.generation_config.cache_implementation = "static"
    ids = _prompt()
    with torch.no_grad():
        want = cpu.generate(ids, max_new_tokens=NEW, do_sample=False, pad_token_id=0)
        got = tpu.generate(ids.to("tpu"), max_new_tokens=NEW, do_sample=False, pad_token_id=0).cpu()
        assert torch.equal(want, got), (want, got)
        # the first call ran its first decode step while capturing it (op by op), so in fused mode the chunks
        # around that step differ once more in the second call: 2 small chunks compile there, none after
        tpu.generate(ids.to("tpu"), max_new_tokens=NEW, do_sample=False, pad_token_id=0).cpu()
        metrics.reset()
        again = tpu.generate(ids.to("tpu"), max_new_tokens=NEW, do_sample=False, pad_token_id=0).cpu()
    c = metrics.counters()
    assert torch.equal(again, want)
    # the prefill runs eagerly; each of the other NEW - 1 tokens is one run of the compiled decode program
    assert c.get("compile.program_runs", 0) == NEW - 1, c.get("compile.program_runs")
    assert c.get("compile.eager_graph_runs", 0) == 0
    # no host read inside the step: they all come from Hugging Face's loop (its stop check, once a token) and
    # the test's .cpu(), none from the model's code
    lines = metrics.host_sync_lines()
    assert all(line.startswith(("utils.py", "test_generate.py")) for line in lines), lines
    assert c.get("host_syncs", 0) <= NEW + 3, lines
    assert c.get("compiles", 0) == 0 and not any(k.startswith("compile.graphs.") for k in c)
    assert not any(k.startswith("fallback.") for k in c)


@pytest.mark.pins_mode  # runs every mode itself
def test_sampling_runs_on_the_device_the_same_in_every_mode_and_compiled(models):
    _, tpu = models
    ids = _prompt().to("tpu")
    kw = dict(max_new_tokens=NEW, do_sample=True, top_k=20, top_p=0.9, temperature=0.8, pad_token_id=0)
    outs = {}
    before = _fallbacks()
    with torch.no_grad():
        for mode in ("strict", "fused", "debug"):
            with torchtpu.mode(mode):
                torch.manual_seed(3)
                outs[mode] = tpu.generate(ids, **kw).cpu()
        static = copy.deepcopy(tpu)
        static.generation_config.cache_implementation = "static"
        torch.manual_seed(3)
        outs["compiled"] = static.generate(ids, **kw).cpu()
        torch.manual_seed(4)
        other = tpu.generate(ids, **kw).cpu()
    first = outs["strict"]
    assert all(torch.equal(first, o) for o in outs.values()), outs
    assert not torch.equal(first, other)  # drawn, not greedy
    assert first.shape == (1, PROMPT + NEW) and int(first.max()) < 256
    assert _fallbacks() == before  # torch.multinomial runs on the device (lowering/random.py)
