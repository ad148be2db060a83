"""Independent reference for GemFilter's selection, computed from a model's hidden states.

It does not call the library: it re-derives layer r's post-RoPE q and k by hand (input norm, q/k
projections, q/k norms where present, RoPE), repeats the keys to the query heads, takes
sum_h q_last . k_j, avg-pools with an explicit window sum, and takes the sorted top-k.
"""

import inspect

import torch


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def _rope(x, cos, sin):
    rd = cos.shape[-1]  # partial rotary (Phi3) rotates only the first rd dims
    rot, rest = x[..., :rd], x[..., rd:]
    return torch.cat([rot * cos + _rotate_half(rot) * sin, rest], dim=-1)


def qk_at_layer(model, input_ids, layer, attention_mask=None):
    """(q, k) of ``layer`` after RoPE: q (b, h, n, d), k (b, h_kv, n, d)."""
    mask = torch.ones_like(input_ids) if attention_mask is None else attention_mask
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=input_ids, attention_mask=mask, position_ids=pos, output_hidden_states=True)
        hidden = out.hidden_states[layer]  # input of decoder layer `layer`
        block = model.model.layers[layer]
        attn = block.self_attn
        x = block.input_layernorm(hidden)
        cfg = model.config
        d = getattr(attn, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        h, h_kv = cfg.num_attention_heads, cfg.num_key_value_heads
        if hasattr(attn, "qkv_proj"):
            qkv = attn.qkv_proj(x)
            q, k = qkv[..., : h * d], qkv[..., h * d : (h + h_kv) * d]
        else:
            q, k = attn.q_proj(x), attn.k_proj(x)
        b, n, _ = x.shape
        q = q.view(b, n, h, d)
        k = k.view(b, n, h_kv, d)
        if hasattr(attn, "q_norm"):
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        rotary = model.model.rotary_emb
        if "layer_type" in inspect.signature(rotary.forward).parameters:
            cos, sin = rotary(hidden, pos, cfg.layer_types[layer])
        else:
            cos, sin = rotary(hidden, pos)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return _rope(q, cos, sin), _rope(k, cos, sin)


def reference_indices(model, input_ids, layer, topk, kernel=5):
    """Sorted top-k indices for a single unpadded row (b = 1)."""
    q, k = qk_at_layer(model, input_ids, layer)
    g = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(g, dim=1)  # GQA: repeat keys to the query heads
    n = k.shape[2]
    raw = [sum(float(q[0, hh, -1] @ k[0, hh, j]) for hh in range(q.shape[1])) for j in range(n)]
    half = kernel // 2
    pooled = [sum(raw[i] for i in range(j - half, j + half + 1) if 0 <= i < n) / kernel for j in range(n)]
    order = sorted(range(n), key=lambda j: -pooled[j])[: min(topk, n)]
    return sorted(order), pooled
