"""The layers of the Transformer (Vaswani et al. 2017, "Attention Is All You Need", §3), in the
paper's order: positions, attention, feed-forward, the residual connection, the encoder layer
and the decoder layer. :mod:`nmt.core.model` builds the model of them; the decoder cache that
self-attention extends one step at a time is :mod:`nmt.core.cache`.

Notation for tensor shapes, used in every docstring and comment::

    batch     sentences in a batch          beam      hypotheses per sentence
    src_len   source tokens (incl. EOS)     tgt_len   target tokens so far
    d_model   model width                   n_heads   attention heads
    head_dim  d_model // n_heads            vocab     target vocabulary size

Masks are boolean and **True means "may attend"** (the convention of
``torch.nn.functional.scaled_dot_product_attention``). Every source row keeps its EOS, so
no query row is ever fully masked and attention never produces NaN.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.config import ModelConfig

from .cache import LayerCache


def sinusoidal_positions(length: int, d_model: int, device=None) -> Tensor:
    """Sinusoidal position encodings, ``(length, d_model)`` in float32 (Vaswani et al. 2017, §3.5).

    ``PE[pos, 2i] = sin(pos / 10000^(2i/d_model))`` and ``PE[pos, 2i+1] = cos(...)``:
    sine on even dimensions, cosine on odd ones, interleaved. Computed in float64 on the
    CPU (some devices, such as Apple's MPS, have no float64), then moved to ``device``.
    """
    position = torch.arange(length, dtype=torch.float64).unsqueeze(1)
    inv_freq = torch.pow(10000.0, -torch.arange(0, d_model, 2, dtype=torch.float64) / d_model)
    angles = position * inv_freq  # (length, d_model / 2)
    table = torch.empty(length, d_model, dtype=torch.float64)
    table[:, 0::2] = torch.sin(angles)
    table[:, 1::2] = torch.cos(angles)
    return table.float().to(device)


def split_heads(x: Tensor, n_heads: int) -> Tensor:
    """``(batch, len, d_model)`` → ``(batch, n_heads, len, head_dim)``."""
    batch, length, d_model = x.shape
    # (batch, n_heads, len, head_dim)
    return x.view(batch, length, n_heads, d_model // n_heads).transpose(1, 2)


def merge_heads(x: Tensor) -> Tensor:
    """``(batch, n_heads, len, head_dim)`` → ``(batch, len, d_model)``."""
    batch, n_heads, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, n_heads * head_dim)  # (batch, len, d_model)


class SelfAttention(nn.Module):
    """Multi-head self-attention with one fused Q/K/V projection (Vaswani et al. 2017, §3.2.2)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(
        self,
        x: Tensor,
        mask: Tensor | None = None,
        causal: bool = False,
        cache: LayerCache | None = None,
    ) -> Tensor:
        """Attend ``x`` ``(batch, len, d_model)`` to itself, after the cached positions if given.

        Args:
            mask: ``(batch, 1, 1, len)`` key mask, True = may attend; None for no padding.
            causal: each position attends only to itself and earlier ones.
            cache: this layer's part of a :class:`DecoderCache` (or a
                :class:`~nmt.decode.static.StaticCache`);
                ``x``'s keys and values are appended to it (by the cache) and ``x`` attends to every
                cached position (under the cache's own mask, when it gives one).

        Returns:
            ``(batch, len, d_model)``.
        """
        q, k, v = (split_heads(t, self.n_heads) for t in self.qkv(x).chunk(3, dim=-1))
        if cache is not None:
            # mask: None, or the positions written so far in a cache of fixed capacity
            k, v, mask = cache.append(k, v)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal)
        return self.out(merge_heads(y))


class CrossAttention(nn.Module):
    """Multi-head attention from decoder states to the encoder output (§3.2.3).

    Keys and values come from :meth:`memory_kv`, computed once per sentence. With
    ``beam > 1`` the queries of a sentence's beams are folded into the query-length axis,
    so all beams attend to one shared copy of the source side instead of ``beam`` copies.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads, self.dropout = n_heads, dropout
        self.q = nn.Linear(d_model, d_model)
        self.kv = nn.Linear(d_model, 2 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def memory_kv(self, memory: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of ``memory`` ``(batch, src_len, d_model)``, each ``(batch, n_heads,
        src_len, head_dim)``."""
        k, v = self.kv(memory).chunk(2, dim=-1)
        return split_heads(k, self.n_heads), split_heads(v, self.n_heads)

    def probabilities(self, x: Tensor, k: Tensor, src_mask: Tensor) -> Tensor:
        """The attention distribution of queries ``x`` ``(batch, tgt_len, d_model)`` over keys ``k``
        ``(batch, n_heads, src_len, head_dim)``: ``(batch, n_heads, tgt_len, src_len)`` in float32,
        each row summing to 1 over the real source tokens (what :meth:`forward` weights values
        by)."""
        q = split_heads(self.q(x), self.n_heads)  # (batch, n_heads, tgt_len, head_dim)
        # (batch, n_heads, tgt_len, src_len)
        scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.size(-1))
        return torch.softmax(scores.masked_fill(~src_mask, float("-inf")), dim=-1)

    def forward(self, x: Tensor, k: Tensor, v: Tensor, src_mask: Tensor, beam: int = 1) -> Tensor:
        """``x`` ``(batch*beam, tgt_len, d_model)`` attends to ``k``/``v`` ``(batch, n_heads,
        src_len, head_dim)`` under ``src_mask`` ``(batch, 1, 1, src_len)``; returns ``(batch*beam,
        tgt_len, d_model)``."""
        q = split_heads(self.q(x), self.n_heads)  # (batch*beam, n_heads, tgt_len, head_dim)
        n, h, t, hd = q.shape
        if beam > 1:  # a sentence's beams fold into its queries, to share its keys and values:
            # (batch, beam, n_heads, tgt_len, head_dim) -> (batch, n_heads, beam*tgt_len, head_dim)
            q = (
                q.view(n // beam, beam, h, t, hd)
                .transpose(1, 2)
                .reshape(n // beam, h, beam * t, hd)
            )
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=src_mask, dropout_p=p)
        if beam > 1:  # unfolded: (batch, n_heads, beam*tgt_len, head_dim) -> (batch*beam, ...)
            y = y.view(n // beam, h, beam, t, hd).transpose(1, 2).reshape(n, h, t, hd)
        return self.out(merge_heads(y))


# swish: x · sigmoid(x) (Ramachandran et al. 2017), Marian's default
ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}


class FeedForward(nn.Module):
    """``Linear(d_ff) → ReLU (GELU, swish) → Dropout → Linear(d_model)`` (§3.3)."""

    def __init__(self, d_model: int, d_ff: int, activation: str, activation_dropout: float):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.activation = ACTIVATIONS[activation]
        self.dropout = nn.Dropout(activation_dropout)

    def forward(self, x: Tensor) -> Tensor:
        """``(..., d_model)`` → ``(..., d_model)``."""
        return self.fc2(self.dropout(self.activation(self.fc1(x))))


class Residual(nn.Module):
    """One sublayer's residual connection and LayerNorm.

    Post-LN (the paper, §3.1/§5.4): ``LayerNorm(x + Dropout(sublayer(x)))``.
    Pre-LN (Xiong et al. 2020): ``x + Dropout(sublayer(LayerNorm(x)))``.
    """

    def __init__(self, d_model: int, dropout: float, pre_norm: bool):
        super().__init__()
        self.norm, self.dropout, self.pre_norm = (
            nn.LayerNorm(d_model),
            nn.Dropout(dropout),
            pre_norm,
        )

    def forward(self, x: Tensor, sublayer: Callable[..., Tensor], *args, **kwargs) -> Tensor:
        """``x`` ``(..., d_model)`` through ``sublayer(x, *args, **kwargs)`` (same shape in, same
        out) and the residual connection around it, normalised after the sum (Post-LN) or before
        the sublayer (Pre-LN). The sublayer's own arguments are passed on, not closed over: the
        decode step builds no function per layer and step."""
        if self.pre_norm:
            return x + self.dropout(sublayer(self.norm(x), *args, **kwargs))
        return self.norm(x + self.dropout(sublayer(x, *args, **kwargs)))


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward, each in a :class:`Residual` (§3.1)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        pre = cfg.norm_position == "pre"
        self.self_attn = SelfAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.activation_dropout)
        self.res_attn, self.res_ffn = (
            Residual(cfg.d_model, cfg.dropout, pre),
            Residual(cfg.d_model, cfg.dropout, pre),
        )

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """``x`` ``(batch, src_len, d_model)``, ``mask`` ``(batch, 1, 1, src_len)``."""
        x = self.res_attn(x, self.self_attn, mask)
        return self.res_ffn(x, self.ffn)


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder output, then feed-forward, each in a
    :class:`Residual` (§3.1)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        pre = cfg.norm_position == "pre"
        self.self_attn = SelfAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.cross_attn = CrossAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.activation_dropout)
        self.res_self, self.res_cross, self.res_ffn = (
            Residual(cfg.d_model, cfg.dropout, pre) for _ in range(3)
        )

    def forward(
        self,
        x: Tensor,
        cross_k: Tensor,
        cross_v: Tensor,
        src_mask: Tensor,
        cache: LayerCache | None = None,
        beam: int = 1,
    ) -> Tensor:
        """``x`` ``(batch*beam, tgt_len, d_model)`` → same shape. Without ``cache``, self-attention
        is causal over ``x``; with it, ``x`` holds the positions after the cached ones and attends
        to all of them (see :class:`SelfAttention`). ``cross_k``/``cross_v``: ``(batch, n_heads,
        src_len, head_dim)``."""
        x = self.res_self(x, self.self_attn, causal=cache is None, cache=cache)
        x = self.res_cross(x, self.cross_attn, cross_k, cross_v, src_mask, beam)
        return self.res_ffn(x, self.ffn)
