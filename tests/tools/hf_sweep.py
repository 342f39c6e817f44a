"""The Hugging Face zoo, swept: every architecture in transformers' causal-LM, masked-LM, seq2seq and
image-classification auto-mappings, built from its own default config shrunk to a tiny one (nested text/vision
configs too; random init, no downloads), trained 3 AdamW steps on cpu, in eager mode on tpu (strict unless
TORCHTPU_MODE says otherwise) and under
torch.compile(backend="tpu"), from the same init on the same batches.

    .venv/bin/python tests/tools/hf_sweep.py [--jobs 2] [--only llama,bert] [--redo] [--out docs/zoo.jsonl] [--write]

Each architecture runs in a process of its own (bounded in time; a crash is a row, not the end of the sweep),
sharing one disk cache. Per row: the loss's largest relative difference to cpu over the steps (eager, compiled),
the CPU fallbacks by op, Dynamo's graph breaks on tpu beside Dynamo's on cpu (backend "eager", same model and
steps), and the compiled graphs that ran op by op. A row that ran but drifted is checked against cpu in float64
(_float64_check). `--write` puts the table of --out's rows (last wins) into docs/zoo.md.
tests/models/test_hf_sweep.py runs a fixed subset (SUBSET)."""

from __future__ import annotations

import argparse
import collections
import copy
import json
import os
import subprocess
import sys
import time

import torch

TASKS = {
    "causal-lm": "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES",
    "masked-lm": "MODEL_FOR_MASKED_LM_MAPPING_NAMES",
    "seq2seq": "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES",
    "image-classification": "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES",
}
STEPS = 3
_DOCS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "docs")
DOC_ROWS = os.path.join(_DOCS, "zoo.jsonl")  # the rows of the last full sweep, and of rows rerun since (last wins)
MATCH = 1e-3  # largest relative loss difference to cpu over the steps that counts as a match
VOCAB = 512
SEQ = 16
BATCH = 2
IMAGE = 64
LAYERS = 2
HIDDEN = 64
HEADS = 4
# The subset tests/models/test_hf_sweep.py runs in CI: one per family of attention / structure the sweep covers.
SUBSET = [
    ("causal-lm", "gemma3_text"),
    ("causal-lm", "deepseek_v3"),
    ("causal-lm", "qwen3_next"),
    ("masked-lm", "roberta"),
    ("seq2seq", "bart"),
    ("image-classification", "swin"),
]


def entries():
    """(task, model_type, class name) for every entry of the four mappings."""
    from transformers.models.auto import modeling_auto

    out = []
    for task, name in TASKS.items():
        for model_type, cls in getattr(modeling_auto, name).items():
            out.append((task, model_type, cls if isinstance(cls, str) else cls[0]))
    return out


# -- tiny configs ----------------------------------------------------------------------------------------------
_INT = [  # (size, names): several sizes are equal, so not a dict
    (HIDDEN, "hidden_size d_model n_embd embedding_size model_dim word_embed_proj_dim hidden_size_global"),
    (
        LAYERS,
        "num_hidden_layers n_layer num_layers n_layers encoder_layers decoder_layers num_decoder_layers "
        "num_encoder_layers",
    ),
    (HEADS, "num_attention_heads n_head n_heads num_heads encoder_attention_heads decoder_attention_heads"),
    (
        HIDDEN // HEADS,
        "head_dim d_kv qk_head_dim v_head_dim linear_key_head_dim linear_value_head_dim index_head_dim "
        "mamba_d_head dim_head attention_head_size",
    ),
    (2 * HIDDEN, "intermediate_size ffn_dim encoder_ffn_dim decoder_ffn_dim d_ff n_inner ffn_hidden_size"),
    (
        HIDDEN // 2,
        "moe_intermediate_size shared_expert_intermediate_size shared_intermediate_size kv_lora_rank "
        "q_lora_rank shared_experts_intermediate_size",
    ),
    (VOCAB, "vocab_size"),
    (128, "max_position_embeddings n_positions max_source_positions max_target_positions"),
    (4, "num_experts num_local_experts n_routed_experts moe_num_experts"),
    (2, "num_experts_per_tok moe_topk num_experts_per_token linear_num_key_heads index_n_heads mamba_n_heads"),
    (
        1,
        "num_expert_group n_group topk_group first_k_dense_replace n_shared_experts num_shared_experts "
        "moe_num_shared_experts mamba_n_groups n_groups",
    ),
    (
        8,
        "qk_rope_head_dim qk_nope_head_dim sliding_window mamba_d_state state_size time_step_rank mamba_dt_rank "
        "index_topk rotary_dim",
    ),
    (IMAGE, "image_size"),
    (HIDDEN, "emb_dim dim embedding_dim lru_width d_latents"),
    (2 * HIDDEN, "hidden_dim"),
    (64, "entity_vocab_size pronunciation_vocab_size shape_vocab_size"),
    (HIDDEN // 2, "entity_emb_size"),
    (VOCAB, "vocab_size_per_layer_input"),
    (16, "hidden_size_per_layer_input num_latents"),
    (8, "attention_window_size"),
    (LAYERS, "num_blocks zero_expert_num moe_k"),
    (HIDDEN // 2, "expert_ffn_hidden_size"),
    (4, "num_filters"),
]
SIZE = {k: v for v, names in _INT for k in names.split()}
SIZE["linear_num_value_heads"] = 4
SIZE["num_kv_shared_layers"] = 0  # Gemma 3n's last layers reuse earlier layers' KV: 2 layers have none to spare
SIZE["patch_size"] = 8
SIZE["mamba_n_heads"] = 8  # x mamba_d_head 16 = mamba_expand 2 x hidden 64
_LAYER_COUNTS = {k for k, v in SIZE.items() if v == LAYERS and "layer" in k}


def _is_dropout(key):
    return any(s in key for s in ("dropout", "pdrop", "drop_rate", "layerdrop", "drop_path", "jitter_noise"))


def _shrink(d: dict, stages: bool = True) -> dict:
    """Overrides for one config's dict (to_dict()), sub-configs shrunk into full dicts. stages=False keeps a vision
    model's per-stage lists, patch, window and image sizes as they are (some tie them together in ways the rules
    below break: the sweep then tries that)."""
    out = {}
    n_layers = {k: d[k] for k in _LAYER_COUNTS if isinstance(d.get(k), int)}
    # per-layer lists keep one layer of each kind, in order (hybrid models: sliding/full, linear/full, mamba/attn)
    layer_lists = {k: v for k, v in d.items() if isinstance(v, list) and v and len(v) in n_layers.values()}
    keep = set()
    for k, v in layer_lists.items():
        if k.endswith("layer_types") or k in ("layers_block_type",):
            first = {}
            for i, t in enumerate(v):
                first.setdefault(t, i)
            keep |= set(first.values())
    keep = sorted(keep) or None
    if keep is not None:
        keep = keep + [i for i in range(LAYERS) if i not in keep][: max(0, LAYERS - len(keep))]
        keep = sorted(keep)
        for k, v in layer_lists.items():
            out[k] = [v[i] for i in keep]
    hierarchical = isinstance(d.get("depths"), list)
    for k, v in d.items():
        if isinstance(v, dict) and "model_type" in v:
            sub = _shrink(v, stages)
            if sub:  # a sub-config passed back whole is rebuilt from its dict, which not all survive (DBRX's)
                out[k] = {**v, **sub}
        elif isinstance(v, bool) or k in out:
            continue
        elif not stages and (isinstance(v, list) or k in ("image_size", "patch_size", "window_size")):
            continue
        elif isinstance(v, float) and v and _is_dropout(k):
            out[k] = 0.0
        elif isinstance(v, list) and _is_dropout(k) and any(isinstance(x, float) and x for x in v):
            out[k] = [0.0] * len(v)  # per stage (CvT's drop_path_rate)
        elif k in _LAYER_COUNTS and isinstance(v, int):
            out[k] = len(keep) if keep is not None else min(v, LAYERS)
        elif hierarchical and k in ("depths", "depth") and isinstance(v, list):
            out[k] = [1] * len(v)
        elif hierarchical and k in ("num_heads", "num_attention_heads") and isinstance(v, list):
            out[k] = [min(2**i, 8) for i in range(len(v))]
        elif k in ("hidden_sizes", "embed_dims", "hidden_dims") and isinstance(v, list):
            out[k] = [16 * 2 ** min(i, 2) for i in range(len(v))]
        elif hierarchical and k == "embed_dim" and isinstance(v, int):
            out[k] = 16
        elif hierarchical and k == "hidden_size" and isinstance(v, int):
            continue  # derived from embed_dim and the stages
        elif hierarchical and k in ("patch_size", "patch_sizes"):
            continue  # the stages downsample after it
        elif hierarchical and k == "window_size" and isinstance(v, int):
            out[k] = 2  # the last stage's resolution (64 / 4 / 2**3): windows that fit every stage
        elif k == "per_layer_config" and isinstance(v, dict):
            n = out.get("num_hidden_layers", LAYERS)
            out[k] = {i: c for i, c in v.items() if int(i) < n}
        elif k == "head_dim" and v is None and isinstance(d.get("num_attention_heads"), int):
            out[k] = HIDDEN // HEADS
        elif k in SIZE and isinstance(v, int) and v > SIZE[k]:
            out[k] = SIZE[k]
        elif k in ("image_size",) and isinstance(v, (list, tuple)):
            out[k] = [IMAGE, IMAGE]
    if isinstance(d.get("num_key_value_heads"), int) and isinstance(d.get("num_attention_heads"), int):
        if d["num_key_value_heads"] < d["num_attention_heads"]:
            out["num_key_value_heads"] = HEADS // 2
        else:
            out["num_key_value_heads"] = out.get("num_attention_heads", d["num_attention_heads"])
    if d.get("num_key_value_heads", 0) is None and isinstance(d.get("num_attention_heads"), int):
        out["num_key_value_heads"] = HEADS
    if isinstance(d.get("qk_rope_head_dim"), int):  # multi-head latent attention: rope over qk_rope_head_dim
        out["qk_head_dim"] = out["qk_rope_head_dim"] + out.get("qk_nope_head_dim", d.get("qk_nope_head_dim", 0))
        if d.get("head_dim") == d["qk_rope_head_dim"]:
            out["head_dim"] = out["qk_rope_head_dim"]
        elif d.get("head_dim") == d["qk_rope_head_dim"] + d.get("qk_nope_head_dim", -1):
            out["head_dim"] = out["qk_head_dim"]
    vocab = out.get("vocab_size", d.get("vocab_size"))
    if not isinstance(vocab, int) and any(isinstance(v, dict) and "vocab_size" in v for v in d.values()):
        vocab = VOCAB  # a multimodal config: the ids of its image/audio tokens index the text model's vocabulary
    if isinstance(vocab, int):
        taken = iter(range(vocab - 1, 0, -1))
        for k, v in d.items():
            if k.endswith(("_token_id", "_token_index", "_token_ids")) and k not in ("vocab_size",):
                if isinstance(v, int) and v >= vocab:
                    out[k] = next(taken)
                elif isinstance(v, list) and any(isinstance(x, int) and x >= vocab for x in v):
                    out[k] = [next(taken) if x >= vocab else x for x in v]
    return out


def tiny_config(model_type: str, class_name: str | None = None, stages: bool = True):
    """The model class's own config class (a causal LM over a multimodal model type takes the text config), with
    its defaults shrunk."""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    cls = CONFIG_MAPPING[model_type]
    own = getattr(getattr(transformers, class_name, None), "config_class", None) if class_name else None
    if isinstance(own, type) and issubclass(own, transformers.PreTrainedConfig) and own is not cls:
        cls = own
    d = cls().to_dict()
    over = _shrink(d, stages)
    over.update(OVERRIDES.get(model_type, {}))
    return cls(**over)


# Per-architecture corrections where the generic rules give a config its own checks refuse (say why).
OVERRIDES: dict[str, dict] = {
    # attention every other layer, experts every other layer (the defaults put both past layer 2)
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2, "expert_layer_offset": 1},
    "recurrent_gemma": {"num_hidden_layers": 3},  # block_types cycles recurrent, recurrent, attention
    "gpt_neo": {"attention_types": [[["global", "local"], 1]]},  # must cover num_layers
    "mamba2": {"num_heads": 8, "head_dim": 16},  # num_heads x head_dim = expand x hidden
    "deepseek_v2": {"num_experts_per_tok": 2},  # None by default
    # B0 (the default is B7 at its widths and depths: 63M parameters); the head's width follows the last stage's;
    # no stochastic depth (drop_connect_rate: random, so cpu and tpu would drop different blocks)
    "efficientnet": {"width_coefficient": 1.0, "depth_coefficient": 1.0, "hidden_dim": 1280, "drop_connect_rate": 0.0},
    "bamba": {"attn_layer_indices": [1]},  # no attention layer by default: HF's cache then cannot count tokens
    "granitemoehybrid": {"layer_types": ["linear_attention", "attention"]},  # likewise
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},  # None by default
    "esm": {"vocab_size": VOCAB, "pad_token_id": 1, "mask_token_id": 2},  # None by default (from the tokenizer)
    "perceiver": {"max_position_embeddings": SEQ},  # its masked-LM decoder queries every position
    "xlstm": {"chunk_size": SEQ},
    "reformer": {
        "axial_pos_embds_dim": [HIDDEN // 2, HIDDEN // 2],  # sum to hidden
        "axial_pos_shape": [4, SEQ // 4],  # product: the sequence length
        "local_attn_chunk_length": SEQ // 2,
        "lsh_attn_chunk_length": SEQ // 2,
        "num_buckets": 2,
    },
    "bit": {"num_groups": 4},  # GroupNorm groups must divide the (shrunk) channels
    "dots1": {"n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1},  # no experts by default
}


# Why a row is not a match, where the error alone does not say (checked by hand; the table prints it before the error).
NOTES: dict[str, str] = {
    "dbrx": "transformers' own default config does not build (DbrxAttentionConfig has no rope_theta)",
    "cohere_compass_text": "transformers' own default config does not build (rope_parameters has no per-layer-type "
    "entries)",
    "gemma3n": "needs timm (not installed: it pulls another torch)",
    "timm_wrapper": "needs timm (not installed: it pulls another torch)",
    "dinat": "needs natten (not installed)",
    "musicgen": "its decoder takes one row per codebook (batch x num_codebooks ids)",
    "musicgen_melody": "its decoder takes one row per codebook (batch x num_codebooks ids)",
    "voxtral_realtime": "needs audio features",
    "siglip2": "takes patchified pixels with a patch mask and spatial shapes",
    "imagegpt": "classifies sequences of color-cluster ids, not pixels",
    "shieldgemma2": "needs a prompt and images together",
    "pp_lcnet": "returns no loss for labels",
    "git": "its loss skips the image tokens the sweep does not give",
    "kimi_linear": "its first eager step compiles ~1,370 programs: a per-position loop over chunk slices of every "
    "length (CPU takes 135 s for the 3 steps); not done in 1,500 s either, with the sweep's disk cache warm",
}


# -- models and batches ----------------------------------------------------------------------------------------
def _special_ids(cfg) -> set:
    ids = set()
    for c in [cfg] + [getattr(cfg, k) for k in ("text_config", "decoder", "encoder") if hasattr(cfg, k)]:
        for k, v in vars(c).items():
            if k.endswith(("_token_id", "_token_index", "_token_ids")):
                ids.update(v if isinstance(v, list) else [v])
    return {i for i in ids if isinstance(i, int)}


def _text_vocab(cfg):
    for c in (cfg, getattr(cfg, "text_config", None), getattr(cfg, "decoder", None)):
        v = getattr(c, "vocab_size", None)
        if isinstance(v, int):
            return v
    return VOCAB


def batches(task, cfg, n=STEPS, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    if task == "image-classification":
        size = getattr(cfg, "image_size", IMAGE)
        size = size if isinstance(size, (list, tuple)) else (size, size)
        ch = getattr(cfg, "num_channels", 3)
        for _ in range(n):
            x = torch.randn(BATCH, ch, *size, generator=g)
            out.append({"pixel_values": x, "labels": torch.randint(0, cfg.num_labels, (BATCH,), generator=g)})
        return out
    vocab = min(_text_vocab(cfg), VOCAB)
    allowed = torch.tensor(sorted(set(range(vocab)) - _special_ids(cfg)))

    def ids(length):
        return allowed[torch.randint(0, len(allowed), (BATCH, length), generator=g)]

    for _ in range(n):
        x = ids(SEQ)
        if task == "seq2seq":
            out.append({"input_ids": x, "labels": ids(SEQ)})
        else:
            out.append({"input_ids": x, "labels": x})
    return out


def build(task, model_type, class_name, seed=0, stages=True):
    import transformers

    cfg = tiny_config(model_type, class_name, stages)
    if task == "causal-lm" and hasattr(cfg, "is_decoder"):
        cfg.is_decoder = True  # BERT-like bodies as causal LMs (their LM-head classes ask for it)
    torch.manual_seed(seed)
    cls = getattr(transformers, class_name)
    model = cls(cfg)
    model.train()
    if task == "seq2seq" and getattr(model.config, "decoder_start_token_id", None) is None:
        model.config.decoder_start_token_id = 0  # labels -> decoder inputs (t5's configs leave it to generation)
        if getattr(model.config, "pad_token_id", None) is None:
            model.config.pad_token_id = 0
    if hasattr(model, "set_default_language"):  # X-MOD: one adapter per language
        model.set_default_language(cfg.languages[0])
    return model, batches(task, model.config, seed=seed)


def _break_ties(model, seed=0) -> int:
    """Weights initialized to one value (zero router gates: AFMoE, ...) give every expert the same score, and top-k's
    order among equal values is unspecified (cpu's differs from cuda's and from XLA's): such weights get small random
    values, so the comparison is between the models' arithmetic, not between tie-breaking rules. Returns how many."""
    g = torch.Generator().manual_seed(seed)
    n = 0
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2 and p.numel() > 1 and bool((p == p.reshape(-1)[0]).all()):
                p.copy_(torch.randn(p.shape, generator=g, dtype=p.dtype) * 0.02)
                n += 1
    return n


def _loss(model, batch):
    out = model(**batch)
    loss = getattr(out, "loss", None) if not isinstance(out, tuple) else out[0]
    if loss is None:
        raise RuntimeError(f"{type(model).__name__} returned no loss for labels")
    return loss


def _train(model, bs, device, compile_backend=None, dtype=None):
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    step = torch.compile(_loss, backend=compile_backend) if compile_backend else _loss
    losses = []
    for b in bs:
        opt.zero_grad()
        b = {k: v.to(device, dtype or v.dtype) if v.is_floating_point() else v.to(device) for k, v in b.items()}
        loss = step(model, b)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _rel(a, b):
    return max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b))


def _error(e):
    s = f"{type(e).__name__}: {e}".strip().splitlines()
    return s[0][:300] if s else type(e).__name__


def _graph_breaks():
    from torch._dynamo.utils import counters

    return sum(counters["graph_break"].values())


def run(task, model_type, class_name, modes=("eager", "compiled")) -> dict:
    """One architecture: cpu eager, Dynamo on cpu (backend "eager"), eager on tpu (in the current mode: strict by
    default), compiled on tpu."""
    import torch._dynamo

    import torchtpu

    r = {"task": task, "model_type": model_type, "class": class_name, "eager_mode": torchtpu.get_mode()}
    t0 = time.perf_counter()
    for stages in (True, False):  # every size shrunk; then a vision model's stages kept
        try:
            model, bs = build(task, model_type, class_name, stages=stages)
        except Exception as e:
            r["status"] = "no tiny config"
            r["error"] = _error(e)
            continue
        r["params"] = sum(p.numel() for p in model.parameters())
        r["constant_weights_randomized"] = _break_ties(model)
        pristine = copy.deepcopy(model)  # before training: a trained model may hold non-leaf tensors (caches)
        try:
            r["cpu"] = _train(model, bs, "cpu")
        except Exception as e:
            r["status"] = "fails on cpu"
            r["error"] = _error(e)
            continue
        r.pop("status", None)
        r.pop("error", None)
        r["config"] = "shrunk" if stages else "stages kept"
        break
    if "status" in r:
        return r

    def fresh(device):
        return copy.deepcopy(pristine).to(device)

    if "compiled" in modes:
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        try:
            r["cpu_dynamo"] = _train(fresh("cpu"), bs, "cpu", "eager")
            r["cpu_breaks"] = _graph_breaks()
        except Exception as e:
            r["cpu_dynamo_error"] = _error(e)
    for mode in modes:
        torchtpu.metrics.reset()
        torch._dynamo.reset()
        torch._dynamo.utils.counters.clear()
        try:
            m = fresh("tpu")
            r[mode] = _train(m, bs, "tpu", "tpu" if mode == "compiled" else None)
            r[mode + "_rel"] = _rel(r["cpu"], r[mode])
            if sum(p.numel() for p in m.parameters()) != r["params"]:
                r[mode + "_error"] = "parameter count differs on tpu (tied weights untied?)"
        except Exception as e:
            r[mode + "_error"] = _error(e)
        c = torchtpu.metrics.counters()
        r[mode + "_fallbacks"] = {k[len("fallback.") :]: v for k, v in c.items() if k.startswith("fallback.")}
        if mode == "compiled":
            r["tpu_breaks"] = _graph_breaks()
            r["eager_graphs"] = c.get("compile.eager_graphs", 0)
    ok = all(r.get(m + "_rel", 1) <= MATCH and not r.get(m + "_error") for m in modes)
    if not ok and all(m + "_rel" in r and not r.get(m + "_error") for m in modes):
        ok = _float64_check(r, pristine, bs, modes)
    r["status"] = ("match" if r.get("cpu32_rel64") is None else "match (float64)") if ok else "differs"
    r["seconds"] = round(time.perf_counter() - t0, 1)
    return r


def _float64_check(r, pristine, bs, modes) -> bool:
    """Some models amplify float32 rounding step over step (BatchNorm over 2 images, where late stages normalize a
    handful of values: LeViT's step-1 loss is 0.52 on cpu in float32 and 0.69 in float64, under AdamW and SGD
    alike), so cpu's own float32 losses are no reference for a second float32 implementation. Such a row is run
    again in float64 on cpu and on tpu, where rounding is too small to grow: it matches when cpu float32 is itself
    more than MATCH from cpu float64 (the model is one of those), tpu's first float32 loss (before any update) is
    within MATCH of cpu's, and tpu in float64, in each mode, is within MATCH of cpu in float64."""
    import torch._dynamo

    def train64(device, backend=None):
        return _train(copy.deepcopy(pristine).double().to(device), bs, device, backend, dtype=torch.float64)

    try:
        r["cpu64"] = train64("cpu")
        for m in modes:
            torch._dynamo.reset()
            r[m + "64"] = train64("tpu", "tpu" if m == "compiled" else None)
    except Exception as e:
        r["float64_error"] = _error(e)
        return False
    r["cpu32_rel64"] = _rel(r["cpu64"], r["cpu"])
    for m in modes:
        r[m + "64_rel"] = _rel(r["cpu64"], r[m + "64"])
    first = all(_rel(r["cpu"][:1], r[m][:1]) <= MATCH for m in modes)
    return first and r["cpu32_rel64"] > MATCH and all(r[m + "64_rel"] <= MATCH for m in modes)


# -- the sweep -------------------------------------------------------------------------------------------------
LEVEL0 = "--xla_backend_optimization_level=0"
FAST_COMPILE = LEVEL0 + " --xla_cpu_use_fusion_emitters=false"  # the suite's flags (tests/conftest.py)
# rows run at XLA's default optimization level: their float64 check (_float64_check) runs convolutions as XLA:CPU's
# plain loops, which level 0 leaves unoptimized
OPTIMIZED = {"textnet": "float64 eager on tpu took 816 s at level 0 (the row: 253 s at the default level)"}


def one_command(entry) -> list[str]:
    """The command that runs one row in its own process and prints it as JSON (its last line)."""
    return [sys.executable, os.path.abspath(__file__), "--one", ":".join(entry)]


def row_of(entry, p: subprocess.CompletedProcess, seconds: float) -> dict:
    """The row a --one process printed, or a "crashed" row naming its exit and last stderr line."""
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    task, model_type, cls = entry
    tail = (p.stderr.strip().splitlines() or ["?"])[-1][:300]
    return {
        "task": task,
        "model_type": model_type,
        "class": cls,
        "status": "crashed",
        "error": f"exit {p.returncode} after {seconds:.0f} s: {tail}",
    }


def _one_process(entry, timeout, env):
    task, model_type, cls = entry
    t0 = time.perf_counter()
    if model_type in OPTIMIZED and LEVEL0 in env.get("XLA_FLAGS", "").split():
        env = dict(env, XLA_FLAGS=" ".join(f for f in env["XLA_FLAGS"].split() if f != LEVEL0))
    try:
        p = subprocess.run(one_command(entry), capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {"task": task, "model_type": model_type, "class": cls, "status": "timeout", "error": f"> {timeout} s"}
    return row_of(entry, p, time.perf_counter() - t0)


def sweep(todo, jobs, timeout, out_path):
    from concurrent.futures import ThreadPoolExecutor

    env = dict(os.environ)
    env.setdefault("TORCHTPU_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "torchtpu-hf-sweep"))
    # parity, not speed: compiled for speed of compiling, as the suite is (tests/conftest.py)
    env.setdefault("XLA_FLAGS", FAST_COMPILE)
    done = 0
    with ThreadPoolExecutor(jobs) as pool, open(out_path, "a") as f:
        for r in pool.map(lambda e: _one_process(e, timeout, env), todo):
            done += 1
            f.write(json.dumps(r) + "\n")
            f.flush()
            print(f"[{done}/{len(todo)}] {r['task']} {r['model_type']}: {r['status']} {r.get('error', '')}", flush=True)


def _fmt_rel(r, mode):
    if r.get(mode + "_error"):
        return "error"
    v = r.get(mode + "_rel")
    return "-" if v is None else f"{v:.0e}"


def table(rows) -> str:
    counts = collections.Counter(r["status"] for r in rows)
    lines = [
        f"{len(rows)} architectures ({len(set(r['model_type'] for r in rows))} model types): "
        + ", ".join(f"{n} {s}" for s, n in counts.most_common())
        + f". Match: loss within {MATCH:g} relative of cpu's at each of {STEPS} AdamW steps, in eager mode and "
        "compiled. Match (float64): cpu's own float32 training is more than that from the same training in float64; "
        "tpu's first float32 loss matches cpu's and tpu in float64 matches cpu in float64, eager and compiled.",
        "",
        "| task | model type | class | params | status | eager vs cpu | compiled vs cpu | CPU fallbacks "
        "| graph breaks tpu / cpu | graphs op by op | note |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in sorted(rows, key=lambda r: (r["task"], r["model_type"])):
        fb = collections.Counter(r.get("eager_fallbacks", {})) + collections.Counter(r.get("compiled_fallbacks", {}))
        fbs = ", ".join(f"{k} {v}" for k, v in fb.items()) or "0"
        breaks = f"{r['tpu_breaks']} / {r.get('cpu_breaks', '?')}" if "tpu_breaks" in r else "-"
        note = r.get("error") or r.get("eager_error") or r.get("compiled_error") or ""
        if r["model_type"] in NOTES and r["status"] != "match":
            note = f"{NOTES[r['model_type']]}: {note}" if note else NOTES[r["model_type"]]
        if r.get("cpu32_rel64") is not None:
            note = (
                f"cpu float32 is {r['cpu32_rel64']:.0e} from cpu float64; in float64 tpu eager is "
                f"{r.get('eager64_rel', 1):.0e}, compiled {r.get('compiled64_rel', 1):.0e} from it; {note}".rstrip("; ")
            )
        note = note.replace("|", "/")[:220]
        lines.append(
            f"| {r['task']} | {r['model_type']} | {r['class']} | {r.get('params', '-')} | {r['status']} "
            f"| {_fmt_rel(r, 'eager')} | {_fmt_rel(r, 'compiled')} | {fbs} | {breaks} "
            f"| {r.get('eager_graphs', '-')} | {note} |"
        )
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--one", help="task:model_type:class, in this process; prints the row as JSON")
    ap.add_argument("--only", default="", help="comma-separated model types")
    ap.add_argument("--task", default="", help="comma-separated tasks")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument(
        "--out",
        default=DOC_ROWS,
        help="rows are appended; rows already there are skipped (docs/zoo.jsonl holds the rows docs/zoo.md shows)",
    )
    ap.add_argument("--redo", action="store_true", help="run the --only / --task rows even where --out has them")
    ap.add_argument("--write", action="store_true", help="write the table from --out into docs/zoo.md")
    args = ap.parse_args()
    if args.one:
        import faulthandler
        import signal

        faulthandler.register(signal.SIGUSR1, all_threads=True)  # a parent that finds it hung asks for its stacks
        task, model_type, cls = args.one.split(":")
        print(json.dumps(run(task, model_type, cls)), flush=True)
        return
    if not args.write:
        seen = set()
        if os.path.exists(args.out) and not args.redo:
            seen = {(r["task"], r["model_type"]) for r in map(json.loads, open(args.out))}
        only = set(filter(None, args.only.split(",")))
        tasks = set(filter(None, args.task.split(",")))
        todo = [
            e
            for e in entries()
            if (not only or e[1] in only) and (not tasks or e[0] in tasks) and (e[0], e[1]) not in seen
        ]
        sweep(todo, args.jobs, args.timeout, args.out)
    rows = {}
    for r in map(json.loads, open(args.out)):
        rows[(r["task"], r["model_type"])] = r  # the last run of an entry wins
    text = table(list(rows.values()))
    print(text)
    if args.write:
        _write_doc(text)


def _write_doc(text):
    path = os.path.join(_DOCS, "zoo.md")
    head = open(path).read().split("<!-- sweep:begin -->")[0] if os.path.exists(path) else ""
    with open(path, "w") as f:
        f.write(head + "<!-- sweep:begin -->\n" + text + "<!-- sweep:end -->\n")


if __name__ == "__main__":
    main()
