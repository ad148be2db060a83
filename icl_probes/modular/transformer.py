"""One- and two-layer transformers for k-input modular addition (Ch. 4, Fig. 4.3; Fig. 4.4).

The input is the k tokens a_1..a_k (vocabulary Z_p) plus learned positional embeddings; each block is
multi-head attention followed by a ReLU MLP, both residual, without LayerNorm (as in the grokking
models of Nanda et al. 2023, so W^{KQ} acts on the raw token embeddings). Attention is bidirectional
and the logits are read from the last position. The paper gives 160 heads and hidden dimension 128;
the head dimension is our choice (d_head = 32, as in Nanda et al.).
"""

from __future__ import annotations

import math

import torch
from torch import nn


class Block(nn.Module):
    """Attention (n_heads heads of size d_head) then a ReLU MLP of width d_mlp; residual stream (B, k, d_model)."""

    def __init__(self, d_model: int, n_heads: int, d_head: int, d_mlp: int):
        super().__init__()
        self.n_heads, self.d_head = n_heads, d_head
        self.qkv = nn.Linear(d_model, 3 * n_heads * d_head, bias=False)
        self.out = nn.Linear(n_heads * d_head, d_model, bias=False)
        self.mlp = nn.Sequential(nn.Linear(d_model, d_mlp), nn.ReLU(), nn.Linear(d_mlp, d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = self.qkv(x).view(b, t, 3, self.n_heads, self.d_head).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)  # (B, H, k, d_head), no mask
        x = x + self.out(y.transpose(1, 2).reshape(b, t, self.n_heads * self.d_head))
        return x + self.mlp(x)

    def w_q(self) -> torch.Tensor:
        """Query weights per head, (n_heads, d_model, d_head)."""
        w = self.qkv.weight.detach()[: self.n_heads * self.d_head]  # rows: output features
        return w.view(self.n_heads, self.d_head, -1).transpose(1, 2)

    def w_k(self) -> torch.Tensor:
        """Key weights per head, (n_heads, d_model, d_head)."""
        n = self.n_heads * self.d_head
        return self.qkv.weight.detach()[n : 2 * n].view(self.n_heads, self.d_head, -1).transpose(1, 2)


class ModularTransformer(nn.Module):
    """n_layers blocks over k token positions; logits (B, p) from the last position.

    Parameters: tok (p, d_model), pos (k, d_model), blocks, unembed (d_model -> p).
    """

    def __init__(
        self,
        k: int,
        p: int,
        n_layers: int = 1,
        d_model: int = 128,
        n_heads: int = 160,
        d_head: int = 32,
        d_mlp: int = 512,
    ):
        super().__init__()
        for name, val in dict(n_layers=n_layers, d_model=d_model, n_heads=n_heads, d_head=d_head, d_mlp=d_mlp).items():
            if val < 1:
                raise ValueError(f"{name}={val}: must be >= 1")
        self.k, self.p = k, p
        self.tok = nn.Embedding(p, d_model)
        self.pos = nn.Parameter(torch.zeros(k, d_model))
        self.blocks = nn.ModuleList(Block(d_model, n_heads, d_head, d_mlp) for _ in range(n_layers))
        self.unembed = nn.Linear(d_model, p, bias=False)
        for w in (self.tok.weight, self.pos):
            nn.init.normal_(w, std=1 / math.sqrt(d_model))  # O(1) residual-stream norm per token

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        """a: long (B, k) in [0, p). Returns logits (B, p)."""
        x = self.tok(a) + self.pos
        for block in self.blocks:
            x = block(x)
        return self.unembed(x[:, -1])

    @torch.no_grad()
    def w_kq(self, layer: int = 0) -> torch.Tensor:
        """W^{KQ} per head over the token embeddings: (n_heads, p, p), entry [h, a, b] = <key(a), query(b)>_h.

        key(a) = E[a] W^K_h and query(b) = E[b] W^Q_h with E the token embedding (positions left out).
        """
        e = self.tok.weight.detach()
        block = self.blocks[layer]
        keys = torch.einsum("pd,hde->hpe", e, block.w_k())
        queries = torch.einsum("pd,hde->hpe", e, block.w_q())
        return (keys @ queries.transpose(1, 2)).cpu()
