"""Exact block-banded attention for sliding-window layers, registered as the ``"banded"`` kernel.

Sliding-window layers (Gemma 2/3, Mistral, Qwen2 with ``use_sliding_window``, ...) let each query see
only the last W keys. Under stock ``sdpa``, transformers builds an explicit (b, 1, n, n) boolean mask
for them, so SDPA cannot use its causal fast path and computes all n^2 scores. Here the mask
builder returns a :class:`BandedMask` instead (offsets, window, the 2-D padding mask and the model's
own index predicate, no n x n tensor), and the kernel splits the queries into blocks of W rows. Block
t attends only to the 2W keys of blocks t-1 and t, with a small (W x 2W) mask evaluated from the same
predicate. Every score the stock kernel keeps is computed, every score it masks is either masked or
never computed, so the result is the same attention up to float rounding; time and memory are
O(n W) instead of O(n^2).

Full-attention layers (no ``local_size``) and masks with custom or/and overlays (``use_vmap``) are
handed to SDPA exactly as before. Soft-capped logits (Gemma 2) are refused with a message that names
``eager`` as the exact fallback.

Use: ``gemfilter.load_model(name, attn="banded")`` or, for a model loaded elsewhere,
``gemfilter.set_attention(model, "banded")``.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from .compat import mask_helpers, register_attention, sdpa_attention_forward

NAME = "banded"


@dataclass(frozen=True)
class BandedMask:
    """What a sliding-window layer receives instead of an n x n mask (built once per forward, shared by
    every sliding layer).

    q_offset, kv_offset: absolute positions of the first query and the first key.
    q_length, kv_length: query and key counts the layers will see.
    window: the window W (``local_size``); no allowed key lies W or more positions back. It is also
        the query block size.
    allowed: boolean masks, either one small (b, q, kv) mask (``blocked`` False: kv <= 2W or q <= W) or
        (b, nb, W, 2W) masks, one per W-row query block against the 2W keys that start at absolute
        position q_offset - W + tW (``blocked`` True).
    """

    q_offset: int
    kv_offset: int
    q_length: int
    kv_length: int
    window: int
    blocked: bool
    allowed: torch.Tensor

    # With a static (compileable) cache, generate builds the masks before the forward and hands them in as
    # a prebuilt mask, which transformers' mask code probes with ``.ndim`` and ``.contiguous()``. Answering
    # as a prebuilt 4-D mask lets it reach :func:`banded_mask` unchanged, which passes it through.
    ndim: ClassVar[int] = 4

    def contiguous(self):
        return self

    def sizes(self) -> tuple:
        return self.q_offset, self.kv_offset, self.q_length, self.kv_length, self.window

    def without(self, rows: int, keys: torch.Tensor) -> "BandedMask":
        """This mask with its first ``rows`` queries kept from the keys ``keys`` (long (m,), indices among this
        call's keys): one forward that writes two parts, the first blind to some earlier keys
        (:class:`gemfilter.stable.Blind`)."""
        W, device = self.window, self.allowed.device
        if self.blocked:  # block t's queries and its 2W keys, at absolute positions as banded_mask laid them
            t = torch.arange(self.allowed.shape[1], device=device)[:, None, None]
            q_pos = self.q_offset + t * W + torch.arange(W, device=device)[None, :, None]
            kv_pos = self.q_offset - W + t * W + torch.arange(2 * W, device=device)[None, None, :]
        else:
            q_pos = torch.arange(self.q_offset, self.q_offset + self.q_length, device=device)[:, None]
            kv_pos = torch.arange(self.kv_offset, self.kv_offset + self.kv_length, device=device)[None, :]
        hidden = (q_pos < self.q_offset + rows) & torch.isin(kv_pos, self.kv_offset + keys.to(device))
        return dataclasses.replace(self, allowed=self.allowed & ~hidden)


def _allowed(mask_function, padding, batch, q_offset, q_length, kv_offset, kv_length, q_pos, kv_pos):
    """Evaluate transformers' index predicate on absolute positions q_pos (..., Q, 1), kv_pos (..., 1, K).

    Positions outside the real queries/keys (block padding) are clamped before the predicate runs, so an
    index-based predicate never reads out of range, and are then masked. Returns (batch, ..., Q, K) bool.
    """
    kv_hi = kv_offset + kv_length - 1
    kv_in = (kv_pos >= kv_offset) & (kv_pos <= kv_hi)
    qc, kc = q_pos.clamp(q_offset, q_offset + q_length - 1), kv_pos.clamp(kv_offset, kv_hi)
    b_idx = torch.arange(batch, device=q_pos.device).view((batch,) + (1,) * q_pos.dim())
    head = torch.zeros((), dtype=torch.long, device=q_pos.device)
    ok = torch.as_tensor(mask_function(b_idx, head, qc[None], kc[None]), device=q_pos.device) & kv_in[None]
    if padding is not None:
        ok = ok & padding[(b_idx, kc[None])]
    return ok.expand((batch,) + torch.broadcast_shapes(q_pos.shape, kv_pos.shape))


def _sees_ahead(mask_function, q_offset, q_length, kv_offset, kv_length, device) -> bool:
    """Whether the predicate lets the first query see the key right after it (a non-causal window).

    Only asked when that key exists among this call's keys and queries, so an index-based predicate
    never reads out of range."""
    q = int(q_offset)
    if q_length < 2 or not int(kv_offset) <= q + 1 < int(kv_offset) + int(kv_length):
        return False
    zero = torch.zeros((), dtype=torch.long, device=device)
    return bool(mask_function(zero, zero, zero + q, zero + q + 1))


def banded_mask(
    batch_size,
    q_length,
    kv_length,
    q_offset=0,
    kv_offset=0,
    mask_function=None,
    attention_mask=None,
    local_size=None,
    use_vmap=False,
    device="cpu",
    **kwargs,
):
    """``AttentionMaskInterface`` entry: a :class:`BandedMask` for sliding layers, SDPA's mask otherwise.

    The band is evaluated from the model's own predicate (causal, window, chunks, packed sequences),
    only on the W x 2W blocks around the diagonal: O(n W) booleans instead of n^2.
    """
    causal_mask_function, prepare_padding_mask, sdpa_mask = mask_helpers()
    mask_function = mask_function or causal_mask_function
    if isinstance(attention_mask, BandedMask):  # prebuilt by generate for a static cache (see BandedMask.ndim)
        asked = tuple(map(int, (q_offset, kv_offset, q_length, kv_length, local_size)))
        if asked != attention_mask.sizes():
            raise ValueError(
                f"banded: a prebuilt mask for (q_offset, kv_offset, q, kv, window) = "
                f"{attention_mask.sizes()} was handed to a layer that needs {asked}"
            )
        return attention_mask
    # Full attention, custom overlays that may reach outside the band, or a predicate that lets a query see
    # keys after it (config.is_causal=False: bidirectional windows): the band holds only past keys, so SDPA's mask.
    if local_size is None or use_vmap or _sees_ahead(mask_function, q_offset, q_length, kv_offset, kv_length, device):
        return sdpa_mask(
            batch_size=batch_size,
            q_length=q_length,
            kv_length=kv_length,
            q_offset=q_offset,
            kv_offset=kv_offset,
            mask_function=mask_function,
            attention_mask=attention_mask,
            local_size=local_size,
            use_vmap=use_vmap,
            device=device,
            **kwargs,
        )
    q_offset, kv_offset, q_length, kv_length, W = map(int, (q_offset, kv_offset, q_length, kv_length, local_size))
    padding = prepare_padding_mask(attention_mask, kv_length, kv_offset)
    if padding is not None and bool(padding.all()):
        padding = None  # no padding: skip the gather
    args = (mask_function, padding, batch_size, q_offset, q_length, kv_offset, kv_length)
    blocked = not (kv_length <= 2 * W or q_length <= W)
    if not blocked:  # one small block: the whole (q, kv) mask is at most about W x 2W
        q_pos = torch.arange(q_offset, q_offset + q_length, device=device)[:, None]
        kv_pos = torch.arange(kv_offset, kv_offset + kv_length, device=device)[None, :]
    else:
        t = torch.arange(math.ceil(q_length / W), device=device)[:, None, None]
        q_pos = q_offset + t * W + torch.arange(W, device=device)[None, :, None]  # (nb, W, 1)
        kv_pos = q_offset - W + t * W + torch.arange(2 * W, device=device)[None, None, :]  # (nb, 1, 2W)
    return BandedMask(q_offset, kv_offset, q_length, kv_length, W, blocked, _allowed(*args, q_pos, kv_pos))


def _attend(query, key, value, mask, scaling, dropout):
    """SDPA over grouped queries. query (N, h_kv, g*Q, d), key/value (N, h_kv, K, d), mask (N, 1, g*Q, K)."""
    return F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=dropout, scale=scaling)


def banded_attention(query, key, value, mask: BandedMask, scaling: float, dropout: float = 0.0) -> torch.Tensor:
    """Sliding-window attention in W-row query blocks, each against the 2W keys of its own and the previous block.

    query: (b, h, q, d); key, value: (b, h_kv, kv, d) with h a multiple of h_kv (GQA). Returns (b, h, q, d).
    """
    b, h, q_len, d = query.shape
    h_kv, kv_len = key.shape[1], key.shape[2]
    if (q_len, kv_len) != (mask.q_length, mask.kv_length):
        why = (
            (
                "; with sliding_window=1, transformers' sliding cache layer keeps every past key while the mask "
                "sizes allow only the current one (stock sdpa and eager silently attend to all of them), so banded "
                "refuses: use a window of at least 2, or no cache"
            )
            if mask.window == 1
            else ""
        )
        raise ValueError(
            f"banded attention: the mask was built for {mask.q_length} queries x {mask.kv_length} keys, "
            f"the layer has {q_len} x {kv_len}{why}"
        )
    g = h // h_kv
    B = mask.window
    # GQA without repeating K/V: the g query heads of a group are stacked along the query axis.
    if not mask.blocked:
        m = mask.allowed[:, None, None].expand(b, 1, g, q_len, kv_len).reshape(b, 1, g * q_len, kv_len)
        out = _attend(query.reshape(b, h_kv, g * q_len, d), key, value, m, scaling, dropout)
        return out.reshape(b, h, q_len, value.shape[-1])
    nb = mask.allowed.shape[1]
    # Shift the keys so that block t's keys are rows [tB, tB + 2B): key row u of block t sits at
    # absolute position (q_offset - B) + tB + u.
    pad_left = B - (mask.q_offset - mask.kv_offset)
    need = (nb + 1) * B

    def blocks(x):
        x = F.pad(x, (0, 0, pad_left, 0)) if pad_left >= 0 else x[:, :, -pad_left:]
        x = F.pad(x, (0, 0, 0, max(0, need - x.shape[2])))[:, :, :need]
        return x.unfold(2, 2 * B, B).transpose(-1, -2)  # (b, h_kv, nb, 2B, d)

    kb, vb = blocks(key), blocks(value)
    qb = F.pad(query, (0, 0, 0, nb * B - q_len)).reshape(b, h_kv, g, nb, B, d)
    qb = qb.permute(0, 3, 1, 2, 4, 5).reshape(b * nb, h_kv, g * B, d)
    kb = kb.permute(0, 2, 1, 3, 4).reshape(b * nb, h_kv, 2 * B, d)
    vb = vb.permute(0, 2, 1, 3, 4).reshape(b * nb, h_kv, 2 * B, vb.shape[-1])
    m = mask.allowed[:, :, None].expand(b, nb, g, B, 2 * B).reshape(b * nb, 1, g * B, 2 * B)
    out = _attend(qb, kb, vb, m, scaling, dropout)  # (b*nb, h_kv, g*B, dv)
    dv = out.shape[-1]
    out = out.reshape(b, nb, h_kv, g, B, dv).permute(0, 2, 3, 1, 4, 5).reshape(b, h, nb * B, dv)
    return out[:, :, :q_len]


def banded_attention_forward(
    module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None, **kwargs
):
    """``AttentionInterface`` entry, same contract as transformers' ``sdpa_attention_forward``.

    Returns (attn_output (b, q, h, d), None).
    """
    if kwargs.get("softcap") is not None:
        raise ValueError(
            f"the 'banded' attention kernel does not compute soft-capped attention (softcap={kwargs['softcap']}, "
            "Gemma 2's attn_logit_softcapping). Load the model with attn='eager', which applies the cap exactly."
        )
    if kwargs.get("output_attentions"):
        warnings.warn(
            "the 'banded' attention kernel returns no attention weights, so output_attentions=True gives "
            "none for its layers; load the model with attn='eager' to get them",
            UserWarning,
            stacklevel=2,
        )
    if not isinstance(attention_mask, BandedMask):  # full-attention layer or dense fallback: stock SDPA
        return sdpa_attention_forward()(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    out = banded_attention(query, key, value, attention_mask, scaling, dropout if module.training else 0.0)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register ``"banded"`` in both of transformers' interfaces (idempotent) and return the name."""
    register_attention(NAME, banded_attention_forward, banded_mask)
    return NAME
