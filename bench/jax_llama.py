"""The ceiling for generation: a Hugging Face Llama (``LlamaForCausalLM``, default rotary, grouped-query attention,
no biases) written in JAX, decoding greedily with a static KV cache: one ``jax.jit`` program for the prompt and one
per generated token (forward, argmax and cache update together, the cache donated). It takes the PyTorch model's
own weights, so its tokens equal Hugging Face's (bench/generate.py checks them)."""

from __future__ import annotations

import numpy as np


def params_of(model):
    """The Hugging Face Llama's weights as numpy arrays, by their state-dict names."""
    return {k: v.detach().cpu().float().numpy() for k, v in model.state_dict().items()}


def make_decoder(config, max_len):
    """(prefill(p, ids) -> (cache, token), step(p, cache, token, pos) -> (cache, token)), both jitted; ``cache`` is
    (keys, values) of shape (layers, batch, kv heads, max_len, head dim), ``pos`` the token's position (int32)."""
    import jax
    import jax.numpy as jnp

    layers = config.num_hidden_layers
    heads = config.num_attention_heads
    kv_heads = config.num_key_value_heads
    hd = config.hidden_size // heads
    eps = config.rms_norm_eps
    theta = config.rope_parameters["rope_theta"] if getattr(config, "rope_parameters", None) else config.rope_theta
    inv_freq = 1.0 / (theta ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
    head_name = "lm_head.weight"

    def rms(x, w):
        v = jnp.mean(x * x, axis=-1, keepdims=True)
        return w * (x * jax.lax.rsqrt(v + eps))

    def rope(x, pos):  # x: (B, H, T, hd), pos: (T,)
        f = pos[:, None].astype(jnp.float32) * inv_freq[None, :]
        emb = jnp.concatenate([f, f], axis=-1)
        cos, sin = jnp.cos(emb), jnp.sin(emb)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        rot = jnp.concatenate([-x2, x1], axis=-1)
        return x * cos + rot * sin

    def forward(p, ids, pos, keys, values):
        """ids (B, T) at positions pos (T,): logits of the last position and the cache with these T entries."""
        b, t = ids.shape
        x = p["model.embed_tokens.weight"][ids]
        kpos = jnp.arange(max_len)
        mask = kpos[None, :] <= pos[:, None]  # (T, max_len): causal over the cache
        for i in range(layers):
            pre = f"model.layers.{i}."
            h = rms(x, p[pre + "input_layernorm.weight"])
            q = (h @ p[pre + "self_attn.q_proj.weight"].T).reshape(b, t, heads, hd).transpose(0, 2, 1, 3)
            k = (h @ p[pre + "self_attn.k_proj.weight"].T).reshape(b, t, kv_heads, hd).transpose(0, 2, 1, 3)
            v = (h @ p[pre + "self_attn.v_proj.weight"].T).reshape(b, t, kv_heads, hd).transpose(0, 2, 1, 3)
            q, k = rope(q, pos), rope(k, pos)
            at = (np.int32(i), np.int32(0), np.int32(0), pos[0].astype(jnp.int32), np.int32(0))  # int32 under x64 too
            keys = jax.lax.dynamic_update_slice(keys, k[None].astype(keys.dtype), at)
            values = jax.lax.dynamic_update_slice(values, v[None].astype(values.dtype), at)
            kk = jnp.repeat(keys[i], heads // kv_heads, axis=1)
            vv = jnp.repeat(values[i], heads // kv_heads, axis=1)
            s = (q @ kk.transpose(0, 1, 3, 2)) / np.sqrt(hd)
            s = jnp.where(mask[None, None], s, -jnp.inf)
            a = jax.nn.softmax(s.astype(jnp.float32), axis=-1).astype(q.dtype) @ vv
            a = a.transpose(0, 2, 1, 3).reshape(b, t, heads * hd)
            x = x + a @ p[pre + "self_attn.o_proj.weight"].T
            h = rms(x, p[pre + "post_attention_layernorm.weight"])
            g = jax.nn.silu(h @ p[pre + "mlp.gate_proj.weight"].T) * (h @ p[pre + "mlp.up_proj.weight"].T)
            x = x + g @ p[pre + "mlp.down_proj.weight"].T
        x = rms(x[:, -1], p["model.norm.weight"])
        w = p[head_name] if head_name in p else p["model.embed_tokens.weight"]
        return x @ w.T, keys, values

    def prefill(p, ids):
        b, t = ids.shape
        shape = (layers, b, kv_heads, max_len, hd)
        keys = jnp.zeros(shape, jnp.float32)
        values = jnp.zeros(shape, jnp.float32)
        logits, keys, values = forward(p, ids, jnp.arange(t, dtype=jnp.int32), keys, values)
        return (keys, values), jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def step(p, cache, token, pos):
        logits, keys, values = forward(p, token[:, None], pos[None], *cache)
        return (keys, values), jnp.argmax(logits, axis=-1).astype(jnp.int32)

    return jax.jit(prefill), jax.jit(step, donate_argnums=(1,))


def generate(decoder, params, prompt, new_tokens, read_each=True):
    """Greedy tokens after ``prompt`` (numpy (B, T)): one program per token; ``read_each`` reads whether every
    sequence is done after each token, as Hugging Face's loop does (one host sync per token)."""
    import jax.numpy as jnp

    prefill, step = decoder
    t = prompt.shape[1]
    cache, tok = prefill(params, jnp.asarray(prompt, jnp.int32))
    out = [tok]
    for i in range(1, new_tokens):
        cache, tok = step(params, cache, tok, jnp.asarray(t + i - 1, jnp.int32))
        out.append(tok)
        if read_each:
            bool((tok < 0).all())  # never true: the read is the point
    return np.concatenate([prompt, np.stack([np.asarray(x) for x in out], axis=1)], axis=1)
