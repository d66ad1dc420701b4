"""The Transformer encoder-decoder of Vaswani et al. 2017 ("Attention Is All You Need", §3), built
of the layers of :mod:`nmt.core.layers` (whose docstring gives the notation for shapes and masks):
embeddings and positions, the encoder and decoder stacks, the tied output projection; encoding
once, teacher-forced decoding, and one cached decoding step (:mod:`nmt.core.cache`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from nmt.config import ModelConfig

from .cache import DecoderCache, OutputColumns
from .layers import DecoderLayer, EncoderLayer, sinusoidal_positions
from .pieces import PAD


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
            raise ValueError(
                "ModelConfig needs src_vocab_size and tgt_vocab_size (set from the tokenizer)"
            )
        self.cfg = cfg
        d = cfg.d_model
        if cfg.share_embeddings and cfg.src_vocab_size != cfg.tgt_vocab_size:
            raise ValueError(
                f"share_embeddings needs one vocabulary, got {cfg.src_vocab_size} source and "
                f"{cfg.tgt_vocab_size} target pieces"
            )
        self.src_embed = nn.Embedding(cfg.src_vocab_size, d, padding_idx=PAD)
        self.tgt_embed = (
            self.src_embed
            if cfg.share_embeddings
            else nn.Embedding(cfg.tgt_vocab_size, d, padding_idx=PAD)
        )
        self.encoder = nn.ModuleList(EncoderLayer(cfg) for _ in range(cfg.n_encoder_layers))
        self.decoder = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.n_decoder_layers))
        pre = cfg.norm_position == "pre"
        # Pre-LN leaves the residual stream unnormalised: a final LayerNorm per stack.
        self.encoder_norm = nn.LayerNorm(d) if pre else nn.Identity()
        self.decoder_norm = nn.LayerNorm(d) if pre else nn.Identity()
        self.dropout = nn.Dropout(cfg.dropout)
        self.register_buffer("positions", sinusoidal_positions(256, d), persistent=False)
        # An inference-only copy of the tied output matrix: quantized for int8, packed for float32
        # on a CPU (nmt.runtime.device.to_dtype).
        self.output_projection: nn.Module | None = None
        self.output_bias = nn.Buffer(torch.zeros(cfg.tgt_vocab_size)) if cfg.output_bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform linear weights and zero biases; embeddings ``N(0, d_model^-0.5)`` with the
        PAD row zero."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
        # in order (a set's would vary run to run), once each
        for emb in dict.fromkeys((self.src_embed, self.tgt_embed)):
            nn.init.normal_(emb.weight, mean=0.0, std=self.cfg.d_model**-0.5)
            with torch.no_grad():
                emb.weight[PAD].zero_()

    def grow_positions(self, length: int) -> None:
        """Make the position table hold at least ``length`` positions (it doubles, at least)."""
        if length > self.positions.size(0):
            self.positions = sinusoidal_positions(
                max(length, 2 * self.positions.size(0)), self.cfg.d_model, self.positions.device
            )

    def _embed(self, tokens: Tensor, embedding: nn.Embedding, start: int | Tensor = 0) -> Tensor:
        """``tokens`` ``(batch, len)`` at positions ``start..start+len-1`` → ``(batch, len,
        d_model)``.

        ``start`` may be a ``(1,)`` tensor on the device, for one position (``len`` 1) read from
        there: a decode step whose shapes and host values repeat (:mod:`nmt.decode.static`); the
        table must already hold it (:meth:`grow_positions`)."""
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
        """Decoder states ``(..., d_model)`` → logits ``(..., vocab)`` through the tied embedding
        and the output bias (or, when inference set one, their quantized or packed copy
        ``output_projection``)."""
        if self.output_projection is not None:
            return self.output_projection(h)
        return F.linear(h, self.tgt_embed.weight, self.output_bias)

    def decode(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """Teacher-forced decoding of the whole prefix ``tgt_in`` ``(batch, tgt_len)``.

        Returns logits ``(batch, tgt_len, vocab)``; position ``t`` sees ``tgt_in[:, :t+1]`` only.
        """
        return self.project(self.decode_states(tgt_in, memory, src_mask))

    def decode_states(self, tgt_in: Tensor, memory: Tensor, src_mask: Tensor) -> Tensor:
        """The decoder's output states ``(batch, tgt_len, d_model)`` that :meth:`decode` projects to
        logits."""
        x = self._embed(tgt_in, self.tgt_embed)
        for layer in self.decoder:
            x = layer(x, *layer.cross_attn.memory_kv(memory), src_mask)
        return self.decoder_norm(x)

    def forward(self, src: Tensor, tgt_in: Tensor, project: bool = True) -> Tensor:
        """Logits ``(batch, tgt_len, vocab)`` for ``src`` ``(batch, src_len)`` and ``tgt_in``
        ``(batch, tgt_len)``; with ``project`` False the decoder states ``(batch, tgt_len,
        d_model)`` before the output projection (for :class:`nmt.core.loss.ProjectedLoss`, which
        projects them itself)."""
        memory, src_mask = self.encode(src)
        return (self.decode if project else self.decode_states)(tgt_in, memory, src_mask)

    def cross_attention(self, src: Tensor, tgt_in: Tensor) -> Tensor:
        """Every decoder layer's cross-attention probabilities while teacher-forcing ``tgt_in``
        ``(batch, tgt_len)`` on ``src`` ``(batch, src_len)``: ``(n_decoder_layers, batch, n_heads,
        tgt_len, src_len)`` in float32; row ``t`` is the step that predicts the token after
        ``tgt_in[:, t]``.

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

    def start_decoding(
        self,
        memory: Tensor,
        src_mask: Tensor,
        beam: int,
        capacity: int = 32,
        columns: Tensor | None = None,
    ) -> DecoderCache:
        """An empty cache for ``beam`` hypotheses per sentence with room for ``capacity`` target
        positions (it grows if needed), with every layer's cross-attention keys/values computed
        once from ``memory`` ``(batch, src_len, d_model)``; ``columns``: sorted target ids
        ``(n,)`` the batch may generate (a shortlist, see :meth:`output_columns`), None for all."""
        cfg = self.cfg
        rows, head_dim = memory.size(0) * beam, cfg.d_model // cfg.n_heads
        self_kv = memory.new_empty(cfg.n_decoder_layers, 2, rows, cfg.n_heads, capacity, head_dim)
        cross_kv = torch.stack(
            [torch.stack(layer.cross_attn.memory_kv(memory)) for layer in self.decoder]
        )
        return DecoderCache(
            self_kv,
            cross_kv,
            src_mask,
            beam,
            None if columns is None else self.output_columns(columns),
        )

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
        # (batch*beam, 1, d_model)
        x = self._embed(tokens.unsqueeze(1), self.tgt_embed, start=cache.length)
        for i, layer in enumerate(self.decoder):
            x = layer(
                x,
                cache.cross_kv[i, 0],
                cache.cross_kv[i, 1],
                cache.src_mask,
                cache=cache.layer(i),
                beam=cache.beam,
            )
        cache.advance_()
        h = self.decoder_norm(x[:, 0])
        return (self.log_probs(h) if cache.columns is None else cache.columns.log_probs(h)), cache

    def log_probs(self, h: Tensor) -> Tensor:
        """Next-token log-probabilities ``(..., vocab)`` in float32 from decoder states ``(...,
        d_model)``."""
        return F.log_softmax(self.project(h).float(), dim=-1)


_RANDOM_FILLS = {
    torch.Tensor.normal_,
    torch.Tensor.uniform_,
    torch.Tensor.bernoulli_,
    torch.Tensor.random_,
    torch.Tensor.exponential_,
}


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


#: Where a :class:`Transformer`'s state dict shows each size its config names: layers by the
#: largest index in the names, widths by a dimension of one tensor
#: (:func:`nmt.runs.checkpoint.size_mismatches` checks a checkpoint's config against them).
STATE_LAYERS = {"n_encoder_layers": r"encoder\.(\d+)\.", "n_decoder_layers": r"decoder\.(\d+)\."}
STATE_WIDTHS = {
    "d_model": ("tgt_embed.weight", 1),
    "d_ff": ("encoder.0.ffn.fc1.weight", 0),
    "src_vocab_size": ("src_embed.weight", 0),
    "tgt_vocab_size": ("tgt_embed.weight", 0),
}


def count_parameters(model: nn.Module) -> int:
    """Distinct trainable parameters (tied matrices counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
