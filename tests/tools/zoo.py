"""A model zoo for parity tests and benchmarks: model code nobody here wrote (Hugging Face transformers,
torchvision) and Meta's Llama structure with complex rotary embeddings, in tiny configs with random init (no
downloads). Each entry builds (model, batches, loss_fn) for a seed; `side_by_side` trains the same model on cpu
and tpu and reports what the zoo test and bench/zoo.py compare."""

from __future__ import annotations

import copy
import functools
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

VOCAB = 128
_TV_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), ".venv", "extra", "torchvision"
)


def torchvision():
    """torchvision 0.28.0 (the release paired with torch 2.13), installed --no-deps into .venv/extra/torchvision
    by scripts/setup.sh. NOTE: PyPI's wheel is a CUDA build whose compiled ops (nms, roi_align, ...) cannot load
    beside the CPU torch; its models are plain Python. Its import registers fake kernels for nms/qnms, which must
    exist as schemas first, so they are defined here (without kernels: calling them raises). It lives outside
    site-packages so that transformers, which imports torchvision when it finds one, never meets it."""
    if "torchvision" not in sys.modules:
        if _TV_DIR not in sys.path:
            sys.path.insert(0, _TV_DIR)
        if not hasattr(torch.ops.torchvision, "nms"):
            lib = torch.library.Library("torchvision", "FRAGMENT")
            for name in ("nms", "qnms"):
                lib.define(f"{name}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            torchvision._lib = lib  # keep the definitions alive
    import torchvision as tv

    return tv


def _lm_batches(n, bs=2, seq=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (bs, seq), generator=g)
        out.append({"input_ids": ids, "labels": ids})
    return out


def _hf_loss(model, batch):
    return model(**batch).loss


# -- Hugging Face ---------------------------------------------------------------------------------------------
def gpt2():
    import transformers as T

    cfg = T.GPT2Config(
        vocab_size=VOCAB,
        n_positions=64,
        n_embd=32,
        n_layer=2,
        n_head=4,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    return T.GPT2LMHeadModel(cfg), _lm_batches, _hf_loss


def llama():
    import transformers as T

    cfg = T.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        bos_token_id=0,
        eos_token_id=0,
        pad_token_id=0,
    )
    return T.LlamaForCausalLM(cfg), _lm_batches, _hf_loss


def qwen2():
    import transformers as T

    cfg = T.Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    return T.Qwen2ForCausalLM(cfg), _lm_batches, _hf_loss


def mixtral():
    import transformers as T

    cfg = T.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    return T.MixtralForCausalLM(cfg), _lm_batches, _hf_loss


def bert():
    import transformers as T

    cfg = T.BertConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )

    def batches(n, seed=0):
        g = torch.Generator().manual_seed(seed)
        out = []
        for _ in range(n):
            ids = torch.randint(0, VOCAB, (2, 16), generator=g)
            labels = torch.full_like(ids, -100)
            labels[:, ::3] = ids[:, ::3]  # masked-LM targets on every third token, the rest ignored
            out.append({"input_ids": ids, "labels": labels})
        return out

    return T.BertForMaskedLM(cfg), batches, _hf_loss


def t5():
    import transformers as T

    cfg = T.T5Config(
        vocab_size=VOCAB,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=2,
        num_heads=4,
        decoder_start_token_id=0,
        dropout_rate=0.0,
    )

    def batches(n, seed=0):
        g = torch.Generator().manual_seed(seed)
        return [
            {
                "input_ids": torch.randint(0, VOCAB, (2, 12), generator=g),
                "labels": torch.randint(0, VOCAB, (2, 8), generator=g),
            }
            for _ in range(n)
        ]

    return T.T5ForConditionalGeneration(cfg), batches, _hf_loss


def vit():
    import transformers as T

    cfg = T.ViTConfig(
        image_size=32,
        patch_size=8,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        num_labels=10,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )

    def batches(n, seed=0):
        g = torch.Generator().manual_seed(seed)
        return [
            {"pixel_values": torch.randn(2, 3, 32, 32, generator=g), "labels": torch.randint(0, 10, (2,), generator=g)}
            for _ in range(n)
        ]

    return T.ViTForImageClassification(cfg), batches, _hf_loss


# -- torchvision ------------------------------------------------------------------------------------------------
def resnet():
    """torchvision's ResNet with one BasicBlock per stage (ResNet-10): convolutions, BatchNorm (running stats
    updated in place), max pooling, residual adds."""
    from_tv = torchvision().models.resnet
    model = from_tv.ResNet(from_tv.BasicBlock, [1, 1, 1, 1], num_classes=10)

    def batches(n, seed=0):
        g = torch.Generator().manual_seed(seed)
        return [
            {"x": torch.randn(4, 3, 64, 64, generator=g), "y": torch.randint(0, 10, (4,), generator=g)}
            for _ in range(n)
        ]

    return model, batches, lambda m, b: F.cross_entropy(m(b["x"]), b["y"])


# -- Meta's Llama structure with complex rotary embeddings (as in Meta's reference code and torchtitan) ----------
def _rope_freqs(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end, dtype=torch.float32)
    return torch.polar(torch.ones(end, dim // 2), torch.outer(t, freqs))  # complex64


def _apply_rope(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    return torch.view_as_real(xq_ * f).flatten(3).type_as(xq), torch.view_as_real(xk_ * f).flatten(3).type_as(xk)


class _RMSNorm(nn.Module):
    def __init__(self, d, eps=1e-6):
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class _Attention(nn.Module):
    def __init__(self, d, heads, kv_heads):
        super().__init__()
        self.h, self.kv, self.hd = heads, kv_heads, d // heads
        self.wq = nn.Linear(d, heads * self.hd, bias=False)
        self.wk = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wv = nn.Linear(d, kv_heads * self.hd, bias=False)
        self.wo = nn.Linear(heads * self.hd, d, bias=False)

    def forward(self, x, freqs_cis):
        b, s, _ = x.shape
        q = self.wq(x).view(b, s, self.h, self.hd)
        k = self.wk(x).view(b, s, self.kv, self.hd)
        v = self.wv(x).view(b, s, self.kv, self.hd)
        q, k = _apply_rope(q, k, freqs_cis)
        rep = self.h // self.kv
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(b, s, -1))


class _FeedForward(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.w1, self.w2, self.w3 = (
            nn.Linear(d, hidden, bias=False),
            nn.Linear(hidden, d, bias=False),
            nn.Linear(d, hidden, bias=False),
        )

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class _Block(nn.Module):
    def __init__(self, d, heads, kv_heads, hidden):
        super().__init__()
        self.attention, self.feed_forward = _Attention(d, heads, kv_heads), _FeedForward(d, hidden)
        self.attention_norm, self.ffn_norm = _RMSNorm(d), _RMSNorm(d)

    def forward(self, x, freqs_cis):
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class MetaLlama(nn.Module):
    def __init__(self, vocab=VOCAB, d=32, layers=2, heads=4, kv_heads=2, hidden=64, max_seq=64):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(_Block(d, heads, kv_heads, hidden) for _ in range(layers))
        self.norm = _RMSNorm(d)
        self.output = nn.Linear(d, vocab, bias=False)
        self.register_buffer("freqs_cis", _rope_freqs(d // heads, max_seq), persistent=False)

    def forward(self, tokens):
        h = self.tok_embeddings(tokens)
        freqs = self.freqs_cis[: tokens.shape[1]]
        for layer in self.layers:
            h = layer(h, freqs)
        return self.output(self.norm(h))


def meta_llama():
    def loss(m, b):
        logits = m(b["input_ids"][:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), b["input_ids"][:, 1:].reshape(-1))

    return MetaLlama(), _lm_batches, loss


MODELS = {
    "gpt2": gpt2,
    "llama": llama,
    "qwen2": qwen2,
    "mixtral": mixtral,
    "bert": bert,
    "t5": t5,
    "vit": vit,
    "resnet": resnet,
    "meta_llama": meta_llama,
}


# -- sizes that change from step to step (the bounded-dynamic-shapes issue) ----------------------------------------
class TopKMoE(nn.Module):
    """A hand-written top-k mixture-of-experts layer: a softmax router, the top k experts per token with
    renormalized weights, each expert's tokens found with `where` (a data-dependent count), gathered, run through
    the expert's MLP and added back with `index_add_`."""

    def __init__(self, d=32, hidden=64, experts=4, k=2):
        super().__init__()
        self.k = k
        self.router = nn.Linear(d, experts, bias=False)
        self.w_in = nn.ModuleList(nn.Linear(d, hidden) for _ in range(experts))
        self.w_out = nn.ModuleList(nn.Linear(hidden, d) for _ in range(experts))

    def forward(self, x):
        flat = x.reshape(-1, x.shape[-1])
        weights, chosen = self.router(flat).softmax(-1).topk(self.k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, (w_in, w_out) in enumerate(zip(self.w_in, self.w_out)):
            token, slot = torch.where(chosen == e)
            y = w_out(F.gelu(w_in(flat[token])))
            out.index_add_(0, token, y * weights[token, slot, None])
        return out.reshape(x.shape)


class MoELM(nn.Module):
    def __init__(self, d=32, layers=2):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, d)
        self.norms = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.moes = nn.ModuleList(TopKMoE(d) for _ in range(layers))
        self.head = nn.Linear(d, VOCAB)

    def forward(self, ids):
        h = self.emb(ids)
        for norm, moe in zip(self.norms, self.moes):
            h = h + moe(norm(h))
        return self.head(h)


def topk_moe():
    def loss(m, b):
        logits = m(b["input_ids"][:, :-1])
        return F.cross_entropy(logits.reshape(-1, VOCAB), b["input_ids"][:, 1:].reshape(-1))

    return MoELM(), _lm_batches, loss


def mixtral_eager_experts():
    """Mixtral with transformers' "eager" experts: the per-expert loop (one_hot, nonzero, where, index_add_)
    instead of `torch._grouped_mm`: every step's routing changes the counts every op after it sees."""
    model, batches, loss = mixtral()
    model.config._experts_implementation = "eager"
    return model, batches, loss


def mixtral_issue():
    """The bounded-dynamic-shapes issue's tiny Mixtral: 4 experts, top-2, hidden 64, 2 layers, batches of 4 x 32
    tokens, transformers' default experts."""
    import transformers as T

    cfg = T.MixtralConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    return T.MixtralForCausalLM(cfg), functools.partial(_lm_batches, bs=4, seq=32), _hf_loss


def mixtral_issue_eager_experts():
    """mixtral_issue with the per-expert loop (mixtral_eager_experts)."""
    model, batches, loss = mixtral_issue()
    model.config._experts_implementation = "eager"
    return model, batches, loss


def _varlen_batches(n, bs=2, lo=17, hi=64, seed=0):
    """Batches whose sequence length varies between lo and hi (a fixed draw per seed)."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n,), generator=g).tolist()
    return [{"input_ids": (ids := torch.randint(0, VOCAB, (bs, t), generator=g)), "labels": ids} for t in lengths]


def gpt2_varlen():
    model, _, loss = gpt2()
    return model, _varlen_batches, loss


def mixtral_varlen():
    model, _, loss = mixtral()
    return model, _varlen_batches, loss


# Not in MODELS (the zoo test's list): their sizes change every step.
VARYING = {
    "topk_moe": topk_moe,
    "mixtral_eager_experts": mixtral_eager_experts,
    "gpt2_varlen": gpt2_varlen,
    "mixtral_varlen": mixtral_varlen,
    "mixtral_issue": mixtral_issue,
    "mixtral_issue_eager_experts": mixtral_issue_eager_experts,
}


def _to(batch, device):
    return {k: v.to(device) for k, v in batch.items()}


def side_by_side(name, steps=5, seed=0, lr=1e-3, compiled=False):
    """Trains the same model on cpu and tpu with AdamW. Returns a dict: losses, step times, compiles and host syncs
    per step per device, parameter counts, tpu counters (fallbacks, compiles), compiles after step 2. compiled: the
    tpu model's loss runs under torch.compile(backend="tpu", dynamic=True) (CPU stays eager)."""
    import torchtpu

    torch.manual_seed(seed)
    model, make_batches, loss_fn = {**MODELS, **VARYING}[name]()
    model.train()
    batches = make_batches(steps)
    twin = copy.deepcopy(model)
    out = {"params": {"cpu": len(list(model.parameters()))}}
    twin.to("tpu")
    out["params"]["tpu"] = len(list(twin.parameters()))
    for dev, m in (("cpu", model), ("tpu", twin)):
        opt = torch.optim.AdamW(m.parameters(), lr=lr)
        step_loss = torch.compile(loss_fn, backend="tpu", dynamic=True) if compiled and dev == "tpu" else loss_fn
        torchtpu.metrics.reset()
        losses, times, compiles, syncs = [], [], [], []
        for i, b in enumerate(batches):
            c0 = torchtpu.metrics.counters()
            t0 = time.perf_counter()
            opt.zero_grad()
            loss = step_loss(m, _to(b, dev))
            loss.backward()
            opt.step()
            losses.append(loss.item())
            times.append(time.perf_counter() - t0)
            c1 = torchtpu.metrics.counters()
            compiles.append(c1.get("compiles", 0) - c0.get("compiles", 0))
            syncs.append(c1.get("host_syncs", 0) - c0.get("host_syncs", 0))
            if i == 1:
                compiles_before = c1.get("compiles", 0)
        out[dev] = {"losses": losses, "times": times, "compiles": compiles, "host_syncs": syncs}
        if dev == "tpu":
            c = torchtpu.metrics.counters()
            out["counters"] = c
            out["compiles_after_step2"] = c.get("compiles", 0) - compiles_before
    out["fallbacks"] = {k[len("fallback.") :]: v for k, v in out["counters"].items() if k.startswith("fallback.")}
    out["max_rel_diff"] = max(
        abs(a - b) / max(abs(a), 1e-12) for a, b in zip(out["cpu"]["losses"], out["tpu"]["losses"])
    )
    out["models"] = (model, twin)
    return out


def generate_side_by_side(name, new_tokens=16, seed=0):
    """Greedy generation with the KV cache on cpu and tpu; returns both token tensors."""
    torch.manual_seed(seed)
    model, _, _ = MODELS[name]()
    model.eval()
    twin = copy.deepcopy(model).to("tpu")
    prompt = torch.randint(0, VOCAB, (1, 8), generator=torch.Generator().manual_seed(seed + 1))
    kw = dict(max_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    with torch.no_grad():
        a = model.generate(prompt, **kw)
        b = twin.generate(prompt.to("tpu"), **kw)
    return a, b.cpu()
