"""Per-query-head KV cache: the layout of the official SnapKV and H2O copies (GemFilter repo).

Shi et al. 2024 ran their baselines with ``repeat_kv`` moved *before* compression: K and V are
repeated from h_kv to h heads, each query head keeps its own token set, and the cache holds h heads
(4x the KV memory of Llama 3.1 8B, which has 8 KV heads for 32 query heads).

Two things must hold for such a cache to be read correctly:

1. New tokens arrive from the model's ``k_proj`` / ``v_proj`` with h_kv heads. :class:`PerQueryHeadLayer`
   repeats them to h heads (query head j reads KV head j // g, as ``repeat_kv`` does) before appending.
2. The attention kernel repeats K/V by ``module.num_key_value_groups`` (g). On keys that already have
   h heads that would be wrong (h * g heads, or a shape error). :func:`attend` hands the kernel a view
   of the module with ``num_key_value_groups = 1`` whenever K has as many heads as the query, so the
   kernel uses the cached heads one to one. The module itself is never changed.
"""

from __future__ import annotations

import functools

from ..compat import dynamic_layer_class


def repeat_heads(x, groups: int):
    """(b, h_kv, n, d) -> (b, h_kv * groups, n, d); head j is KV head j // groups (transformers' repeat_kv)."""
    return x if groups == 1 else x.repeat_interleave(groups, dim=1)


@functools.cache
def _layer_class():
    # transformers is imported on first use, not when gemfilter is imported.
    class PerQueryHeadLayer(dynamic_layer_class()):
        """A full-attention cache layer that holds one K/V set per query head: (b, h, kept + t, d).

        groups: query heads per KV head (g); incoming (b, h_kv, q, d) states are repeated g times.
        """

        def __init__(self, keys, values, groups: int):
            super().__init__()
            self.lazy_initialization(keys, values)
            self.keys, self.values, self.groups = keys, values, groups

        def update(self, key_states, value_states, *args, **kwargs):
            return super().update(
                repeat_heads(key_states, self.groups), repeat_heads(value_states, self.groups), *args, **kwargs
            )

    return PerQueryHeadLayer


def per_head_layer(layer, idx, groups: int):
    """A :class:`PerQueryHeadLayer` holding, for each query head, the rows ``idx`` of its repeated K/V.

    layer: the prefilled cache layer, keys/values (b, h_kv, n, d); idx: (b, h, kept) sorted positions.
    """
    gather = idx[..., None].expand(-1, -1, -1, layer.keys.shape[-1])
    keys = repeat_heads(layer.keys, groups).gather(2, gather)
    values = repeat_heads(layer.values, groups).gather(2, gather)
    return _layer_class()(keys, values, groups)


class OneGroup:
    """The attention module as the kernel must see it when K/V already hold one head per query head.

    Only ``num_key_value_groups`` differs (1); every other attribute is read from the module.
    """

    num_key_value_groups = 1

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        return getattr(self._module, name)


def attend(module, query, key, value, attention_mask, kernel, **kwargs):
    """Call the base ``kernel``; through :class:`OneGroup` when ``key`` has as many heads as ``query``
    but the module would still repeat it (a per-query-head cache layer under GQA).

    query (b, h, q, d); key, value (b, h_kv or h, L, d).
    """
    if key.shape[1] == query.shape[1] and getattr(module, "num_key_value_groups", 1) > 1:
        module = OneGroup(module)
    return kernel(module, query, key, value, attention_mask, **kwargs)
