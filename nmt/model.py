"""The Transformer encoder-decoder of Vaswani et al. 2017 ("Attention Is All You Need").

Read top to bottom: positions, attention, feed-forward, encoder layer, decoder layer,
the model; the decoder cache it extends one step at a time is in :mod:`nmt.cache`.

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

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from .cache import DecoderCache, LayerCache, OutputColumns
from .config import ModelConfig
from .dropout import Dropout
from .tokenizer import PAD


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
    return x.view(batch, length, n_heads, d_model // n_heads).transpose(1, 2)  # (batch, n_heads, len, head_dim)


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

    def forward(self, x: Tensor, mask: Tensor | None = None, causal: bool = False, cache: LayerCache | None = None) -> Tensor:
        """Attend ``x`` ``(batch, len, d_model)`` to itself, after the cached positions if given.

        Args:
            mask: ``(batch, 1, 1, len)`` key mask, True = may attend; None for no padding.
            causal: each position attends only to itself and earlier ones.
            cache: this layer's part of a :class:`DecoderCache` (or a :class:`~nmt.graphs.StaticCache`);
                ``x``'s keys and values are appended to it (by the cache) and ``x`` attends to every
                cached position (under the cache's own mask, when it gives one).

        Returns:
            ``(batch, len, d_model)``.
        """
        q, k, v = (split_heads(t, self.n_heads) for t in self.qkv(x).chunk(3, dim=-1))
        if cache is not None:
            k, v, mask = cache.append(k, v)  # mask: None, or the positions written so far in a cache of fixed capacity
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
        """Keys and values of ``memory`` ``(batch, src_len, d_model)``, each ``(batch, n_heads, src_len, head_dim)``."""
        k, v = self.kv(memory).chunk(2, dim=-1)
        return split_heads(k, self.n_heads), split_heads(v, self.n_heads)

    def probabilities(self, x: Tensor, k: Tensor, src_mask: Tensor) -> Tensor:
        """The attention distribution of queries ``x`` ``(batch, tgt_len, d_model)`` over keys ``k``
        ``(batch, n_heads, src_len, head_dim)``: ``(batch, n_heads, tgt_len, src_len)`` in float32,
        each row summing to 1 over the real source tokens (what :meth:`forward` weights values by)."""
        q = split_heads(self.q(x), self.n_heads)  # (batch, n_heads, tgt_len, head_dim)
        scores = (q @ k.transpose(-1, -2)).float() / math.sqrt(q.size(-1))  # (batch, n_heads, tgt_len, src_len)
        return torch.softmax(scores.masked_fill(~src_mask, float("-inf")), dim=-1)

    def forward(self, x: Tensor, k: Tensor, v: Tensor, src_mask: Tensor, beam: int = 1) -> Tensor:
        """``x`` ``(batch*beam, tgt_len, d_model)`` attends to ``k``/``v`` ``(batch, n_heads, src_len, head_dim)``
        under ``src_mask`` ``(batch, 1, 1, src_len)``; returns ``(batch*beam, tgt_len, d_model)``."""
        q = split_heads(self.q(x), self.n_heads)  # (batch*beam, n_heads, tgt_len, head_dim)
        n, h, t, hd = q.shape
        if beam > 1:
            q = q.view(n // beam, beam, h, t, hd).transpose(1, 2).reshape(n // beam, h, beam * t, hd)
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=src_mask, dropout_p=p)
        if beam > 1:
            y = y.view(n // beam, h, beam, t, hd).transpose(1, 2).reshape(n, h, t, hd)
        return self.out(merge_heads(y))


ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}  # swish: x · sigmoid(x) (Ramachandran et al. 2017), Marian's default


class FeedForward(nn.Module):
    """``Linear(d_ff) → ReLU (GELU, swish) → Dropout → Linear(d_model)`` (§3.3)."""

    def __init__(self, d_model: int, d_ff: int, activation: str, activation_dropout: float):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.activation = ACTIVATIONS[activation]
        self.dropout = Dropout(activation_dropout)

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
        self.norm, self.dropout, self.pre_norm = nn.LayerNorm(d_model), Dropout(dropout), pre_norm

    def before(self, x: Tensor) -> Tensor:
        """The sublayer's input: ``x`` itself (Post-LN) or normalised (Pre-LN)."""
        return self.norm(x) if self.pre_norm else x

    def after(self, x: Tensor, sublayer_out: Tensor) -> Tensor:
        """The residual sum of ``x`` and the dropped-out ``sublayer_out``, normalised after (Post-LN) or not (Pre-LN)."""
        y = x + self.dropout(sublayer_out)
        return y if self.pre_norm else self.norm(y)


class EncoderLayer(nn.Module):
    """Self-attention, then feed-forward, each in a :class:`Residual` (§3.1)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        pre = cfg.norm_position == "pre"
        self.self_attn = SelfAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.activation_dropout)
        self.res_attn, self.res_ffn = Residual(cfg.d_model, cfg.dropout, pre), Residual(cfg.d_model, cfg.dropout, pre)

    def forward(self, x: Tensor, mask: Tensor) -> Tensor:
        """``x`` ``(batch, src_len, d_model)``, ``mask`` ``(batch, 1, 1, src_len)``."""
        x = self.res_attn.after(x, self.self_attn(self.res_attn.before(x), mask))
        return self.res_ffn.after(x, self.ffn(self.res_ffn.before(x)))


class DecoderLayer(nn.Module):
    """Causal self-attention, cross-attention to the encoder output, then feed-forward, each in a :class:`Residual` (§3.1)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        pre = cfg.norm_position == "pre"
        self.self_attn = SelfAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.cross_attn = CrossAttention(cfg.d_model, cfg.n_heads, cfg.attention_dropout)
        self.ffn = FeedForward(cfg.d_model, cfg.d_ff, cfg.activation, cfg.activation_dropout)
        self.res_self, self.res_cross, self.res_ffn = (Residual(cfg.d_model, cfg.dropout, pre) for _ in range(3))

    def forward(self, x: Tensor, cross_k: Tensor, cross_v: Tensor, src_mask: Tensor, cache: LayerCache | None = None, beam: int = 1) -> Tensor:
        """``x`` ``(batch*beam, tgt_len, d_model)`` → same shape. Without ``cache``, self-attention is
        causal over ``x``; with it, ``x`` holds the positions after the cached ones and attends to
        all of them (see :class:`SelfAttention`). ``cross_k``/``cross_v``: ``(batch, n_heads, src_len, head_dim)``."""
        h = self.self_attn(self.res_self.before(x), causal=cache is None, cache=cache)
        x = self.res_self.after(x, h)
        x = self.res_cross.after(x, self.cross_attn(self.res_cross.before(x), cross_k, cross_v, src_mask, beam))
        return self.res_ffn.after(x, self.ffn(self.res_ffn.before(x)))


class Transformer(nn.Module):
    """Encoder-decoder Transformer (Vaswani et al. 2017, §3).

    Embeddings are scaled by ``sqrt(d_model)`` and summed with sinusoidal positions
    (§3.4-3.5), then dropped out. The output projection is tied to the target embedding;
    with ``share_embeddings`` (one joint vocabulary) the source embedding is the same
    matrix too (§3.4, after Press and Wolf 2017). With ``output_bias`` a fixed vector
    ``output_bias`` ``(vocab,)`` is added to the logits (a buffer, saved and loaded but never
    trained, as Marian's ``final_logits_bias`` is in ``transformers``).

    Raises:
        ValueError: ``src_vocab_size``/``tgt_vocab_size`` unset, or ``share_embeddings``
            with vocabularies of different sizes.
    """

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        if cfg.src_vocab_size <= 0 or cfg.tgt_vocab_size <= 0:
            raise ValueError("ModelConfig needs src_vocab_size and tgt_vocab_size (set from the tokenizer)")
        self.cfg = cfg
        d = cfg.d_model
        if cfg.share_embeddings and cfg.src_vocab_size != cfg.tgt_vocab_size:
            raise ValueError(f"share_embeddings needs one vocabulary, got {cfg.src_vocab_size} source and {cfg.tgt_vocab_size} target pieces")
        self.src_embed = nn.Embedding(cfg.src_vocab_size, d, padding_idx=PAD)
        self.tgt_embed = self.src_embed if cfg.share_embeddings else nn.Embedding(cfg.tgt_vocab_size, d, padding_idx=PAD)
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        pre = cfg.norm_position == "pre"
        # Pre-LN leaves the residual stream unnormalised: a final LayerNorm per stack.
        self.encoder_norm = nn.LayerNorm(d) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d) if pre else nn.Identity()
        self.dropout = Dropout(cfg.dropout)
        self.register_buffer("positions", sinusoidal_positions(256, d), persistent=False)
        # An inference-only copy of the tied output matrix: quantized for int8, packed for float32 on a CPU (nmt.translate.to_dtype).
        self.output_projection: nn.Module | None = None
        self.output_bias = nn.Buffer(torch.zeros(cfg.tgt_vocab_size)) if cfg.output_bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform linear weights and zero biases; embeddings ``N(0, d_model^-0.5)`` with the PAD row zero."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        for emb in dict.fromkeys((self.src_embed, self.tgt_embed)):  # in order (a set's would vary run to run), once each
            nn.init.normal_(emb.weight, mean=0.0, std=self.cfg.d_model**-0.5)
            with torch.no_grad():
                emb.weight[PAD].zero_()

    def grow_positions(self, length: int) -> None:
        """Make the position table hold at least ``length`` positions (it doubles, at least)."""
        if length > self.positions.size(0):
            self.positions = sinusoidal_positions(max(length, 2 * self.positions.size(0)), self.cfg.d_model, self.positions.device)

    def _embed(self, tokens: Tensor, embedding: nn.Embedding, start: int | Tensor = 0) -> Tensor:
        """``tokens`` ``(batch, len)`` at positions ``start..start+len-1`` → ``(batch, len, d_model)``.

        ``start`` may be a ``(1,)`` tensor on the device, for one position (``len`` 1) read from
        there: a decode step whose shapes and host values repeat (:mod:`nmt.graphs`); the table
        must already hold it (:meth:`grow_positions`)."""
        if isinstance(start, Tensor):
            position = self.positions.index_select(0, start)
        else:
            self.grow_positions(start + tokens.size(1))
            position = self.positions[start : start + tokens.size(1)]
        x = embedding(tokens) * math.sqrt(self.cfg.d_model) + position.to(embedding.weight.dtype)
        return self.dropout(x)

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """Encode ``src`` ``(batch, src_len)``.

        Returns:
            memory ``(batch, src_len, d_model)`` and src_mask ``(batch, 1, 1, src_len)``
            (True on real tokens).
        """
        src_mask = (src != PAD)[:, None, None, :]
        x = self._embed(src, self.src_embed)
        for layer in self.encoder:
            x = layer(x, src_mask)
        return self.encoder_norm(x), src_mask

    def project(self, h: Tensor) -> Tensor:
        """Decoder states ``(..., d_model)`` → logits ``(..., vocab)`` through the tied embedding and the output bias
        (or, when inference set one, their quantized or packed copy ``output_projection``)."""
        if self.output_projection is not None:
            return self.output_projection(h)
        return F.linear(h, self.tgt_embed.weight, self.output_bias)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher-forced decoding of the whole prefix ``tgt_in`` ``(batch, tgt_len)``.

        Returns logits ``(batch, tgt_len, vocab)``; position ``t`` sees ``tgt_in[:, :t+1]`` only.
        """
        return self.project(self.decode_states(tgt_in, memory, src_mask))

    def decode_states(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """The decoder's output states ``(batch, tgt_len, d_model)`` that :meth:`decode` projects to logits."""
        x = self._embed(tgt_in, self.tgt_embed)
        for layer in self.decoder:
            x = layer(x, *layer.cross_attn.memory_kv(memory), src_mask)
        return self.decoder_norm(x)

    def forward(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Logits ``(batch, tgt_len, vocab)`` for ``src`` ``(batch, src_len)`` and ``tgt_in`` ``(batch, tgt_len)``."""
        memory, src_mask = self.encode(src)
        return self.decode(tgt_in, memory, src_mask)

    def cross_attention(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Every decoder layer's cross-attention probabilities while teacher-forcing ``tgt_in``
        ``(batch, tgt_len)`` on ``src`` ``(batch, src_len)``: ``(n_decoder_layers, batch, n_heads,
        tgt_len, src_len)`` in float32; row ``t`` is the step that predicts the token after ``tgt_in[:, t]``.

        The decoder runs unchanged; a forward hook on each layer's cross-attention recomputes
        the distribution from that layer's own inputs, so nothing is threaded through the model.
        """
        weights = []

        def record(module, args, output):
            x, k, _, src_mask = args[:4]
            weights.append(module.probabilities(x, k, src_mask))

        handles = [layer.cross_attn.register_forward_hook(record) for layer in self.decoder]
        try:
            self(src, tgt_in)
        finally:
            for handle in handles:
                handle.remove()
        return torch.stack(weights)

    def start_decoding(self, memory: Tensor, src_mask: Tensor, beam: int, capacity: int = 32, columns: Tensor | None = None) -> DecoderCache:
        """An empty cache for ``beam`` hypotheses per sentence with room for ``capacity`` target
        positions (it grows if needed), with every layer's cross-attention keys/values computed
        once from ``memory`` ``(batch, src_len, d_model)``; ``columns``: sorted target ids
        ``(n,)`` the batch may generate (a shortlist, see :meth:`output_columns`), None for all."""
        cfg = self.cfg
        rows, head_dim = memory.size(0) * beam, cfg.d_model // cfg.n_heads
        self_kv = memory.new_empty(cfg.n_decoder_layers, 2, rows, cfg.n_heads, capacity, head_dim)
        cross_kv = torch.stack([torch.stack(layer.cross_attn.memory_kv(memory)) for layer in self.decoder])
        return DecoderCache(self_kv, cross_kv, src_mask, beam, None if columns is None else self.output_columns(columns))

    def output_columns(self, ids: Tensor) -> OutputColumns:
        """The rows of the tied output matrix (and output bias) for target ids ``ids`` ``(n,)``."""
        weight = self.tgt_embed.weight
        ids = ids.to(weight.device)
        bias = None if self.output_bias is None else self.output_bias.index_select(0, ids)
        return OutputColumns(ids, weight.index_select(0, ids), bias, self.cfg.tgt_vocab_size)

    def decode_step(self, tokens: Tensor, cache: DecoderCache) -> tuple[Tensor, DecoderCache]:
        """One decoding step for every hypothesis.

        Args:
            tokens: the latest token of each hypothesis, ``(batch*beam,)``.
            cache: the state after the previous steps (positions ``0..cache.length-1``);
                extended in place by this position.

        Returns:
            log-probabilities ``(batch*beam, vocab)`` in float32 for the next token (over the
            cache's ``columns`` only, when it has them), and the cache.
        """
        x = self._embed(tokens.unsqueeze(1), self.tgt_embed, start=cache.length)  # (batch*beam, 1, d_model)
        for i, layer in enumerate(self.decoder):
            x = layer(x, cache.cross_kv[i, 0], cache.cross_kv[i, 1], cache.src_mask, cache=cache.layer(i), beam=cache.beam)
        cache.advance_()
        h = self.decoder_norm(x[:, 0])
        return (self.log_probs(h) if cache.columns is None else cache.columns.log_probs(h)), cache

    def log_probs(self, h: Tensor) -> Tensor:
        """Next-token log-probabilities ``(..., vocab)`` in float32 from decoder states ``(..., d_model)``."""
        return F.log_softmax(self.project(h).float(), dim=-1)


_RANDOM_FILLS = {torch.Tensor.normal_, torch.Tensor.uniform_, torch.Tensor.bernoulli_, torch.Tensor.random_, torch.Tensor.exponential_}


class _SkipInit(TorchFunctionMode):
    """``torch.nn.init``'s functions and the in-place random fills they use return their tensor
    untouched (no values written, no random number drawn); everything else runs as usual."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__module__", None) == "torch.nn.init" or func in _RANDOM_FILLS:
            return args[0] if args else next(iter(kwargs.values()))
        return func(*args, **(kwargs or {}))


def uninitialised_model(cfg: ModelConfig) -> Transformer:
    """A :class:`Transformer` of ``cfg`` whose parameters are allocated but never initialised
    (they hold whatever the memory held): for names, shapes and dtypes. Untouched allocations
    cost neither time nor resident memory, even for a large model. Not on the meta device:
    PyTorch runs meta tensors' initialisers (and ``arange``) through Python reference
    implementations whose first call imports ``torch._dynamo``, 1.5-5 s at the start of every
    command that checks a checkpoint.
    """
    with _SkipInit():
        return Transformer(cfg)


def count_parameters(model: nn.Module) -> int:
    """Distinct trainable parameters (tied matrices counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
