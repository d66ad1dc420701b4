r"""Eole's own Transformer encoder-decoder and label-smoothed loss behind nmt's training interface,
for the training-throughput benchmark (``scripts/bench_train.py``).

Eole (``pip install eole``, https://github.com/eole-nlp/eole) is the maintained successor of
OpenNMT-py. :func:`build` builds, with eole 0.6.4's own config classes and model builder
(``TransformerModelConfig`` → ``EncoderDecoderModel.for_training``), a Transformer of the sizes of
an ``nmt.config.ModelConfig``, and returns

* a module whose ``forward(src, tgt_in, project=True)`` runs ``EncoderDecoderModel.forward`` and
  eole's generator (the output layer) and returns logits ``(batch, tgt_len, vocab)`` whatever
  ``project`` says (it is there for nmt's ``Updater``);
* ``loss_fn(logits, target, smoothing, model=None)`` → ``nmt.core.loss.LossOutput`` sums, computed
  by ``eole.utils.loss.LossCompute`` as eole's trainer builds it (``LossCompute.from_config``):
  its criterion is ``torch.nn.CrossEntropyLoss(ignore_index=pad, reduction="sum",
  label_smoothing=ε)`` applied to the float32 logits (``LossCompute._compute_ce_loss``).

Install (beside the CPU torch 2.13.0, without pulling a CUDA torch or eole's serving, data and
tokenizer dependencies: spaCy, fastText, ctranslate2, datasets, fastapi, ...)::

    python3 -m venv --system-site-packages /tmp/eole_venv
    /tmp/eole_venv/bin/pip install --no-deps eole==0.6.4 pyonmttok==1.38.1

The model and loss code import only ``torch``, ``numpy``, ``safetensors``, ``pyyaml``,
``pydantic``, ``regex`` and ``pyonmttok`` (this machine's Python already has all but
``pyonmttok``); in an isolated venv: ``pip install --no-deps eole==0.6.4 && pip install
torch==2.13.0 numpy safetensors pyyaml pydantic regex pyonmttok``. ``import eole`` warns that its
C++/CUDA ops and flash_attn are missing; neither is used on a CPU.

How the model differs from nmt's (``nmt.core.model.Transformer``, Post-LN by default):

* **Pre-LN.** Eole's decoder layer has only the pre-norm form (``x + Dropout(Sublayer(LN(x)))``,
  with a final LayerNorm after each stack); its encoder alone can be Post-LN
  (``encoder_layer_style: postnorm``, for RoBERTa/XLM-R), so both stacks here are Pre-LN, as
  nmt's ``norm_position: pre``. LayerNorm eps 1e-5 as nmt's.
* Positions: sinusoidal, sine/cosine interleaved (``SinusoidalInterleaved``), embeddings scaled
  by ``sqrt(d_model)``, then dropout: the same as nmt's.
* Biases: on Q, K, V, the attention output and both FFN layers (``add_qkvbias``,
  ``add_ffnbias``; eole's default has none), none on the output layer (``generator_bias: false``)
  like nmt's. Q, K and V are three ``nn.Linear`` (nmt fuses them into one).
* Dropout: ``dropout`` on the embeddings and every residual branch as nmt, and eole's FFN also
  drops out its ReLU activation with the same ``dropout`` (nmt: ``activation_dropout``, 0 by
  default); ``attention_dropout`` from the ModelConfig.
* Attention: on a CPU eole computes attention by hand (matmul, masked_fill, softmax in float32,
  matmul) and keeps the probabilities; on a GPU it calls ``scaled_dot_product_attention``. nmt uses
  SDPA on both.
* Tying: one joint embedding matrix (``share_embeddings``) that is also the output layer
  (``share_decoder_embeddings``), as nmt's; ``vocab_size`` rows, pad id 0 (eole's
  ``<blank>``), UNK 1, BOS 2, EOS 3 as :mod:`nmt.core.pieces`.
* Initialisation: eole's ``xavier_uniform`` (every matrix, the embedding included and its PAD row
  not zeroed; biases zero). nmt: Xavier for linear layers, ``N(0, d_model^-0.5)`` embeddings with
  a zero PAD row.
* The decoder input: ``EncoderDecoderModel.forward`` takes the whole target and feeds
  ``tgt[:, :-1]``; the wrapper appends one PAD column to ``tgt_in`` so that eole's decoder reads
  exactly ``tgt_in``.

Given the same weights (Q/K/V concatenated into nmt's fused matrices), the module computes nmt's
``norm_position: pre`` Transformer's logits to float rounding (1e-6 on a tiny model), with the
same number of parameters.

How the loss differs from nmt's: PyTorch's label smoothing, which eole uses, spreads ε uniformly
over all ``V`` classes, the reference and PAD included: ``(1 − ε)·NLL + ε/V · Σ_c −log p_c``
(eole's help text says ε/(V−1), but the code is ``CrossEntropyLoss``); nmt spreads ε over the
``V − 2`` classes that are neither the reference nor PAD, and PAD gets none. Positions whose
target is PAD count nothing in both. ``LossOutput.nll`` is the smoothed loss, detached, as eole's
trainer reports it (its statistics hold the criterion's loss only) and as the benchmark's ``hf``
engine does: no second pass over the logits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PAD, UNK, BOS, EOS = 0, 1, 2, 3  # nmt.core.pieces


def build(model_cfg, vocab_size: int, device) -> tuple[torch.nn.Module, Callable]:
    """Eole's Transformer of ``model_cfg``'s sizes over a joint vocabulary of ``vocab_size``
    pieces (pad id 0) on ``device``, and its loss: ``(module, loss_fn)``; see the module doc.

    The module has ``cfg`` (``model_cfg``, which nmt's ``Updater`` reads ``d_model`` from) and
    ``eole`` (the ``EncoderDecoderModel``).

    Raises:
        ValueError: ``model_cfg`` asks for no shared embeddings (eole ties them here) or an
            activation other than ReLU.
    """
    import types

    import torch
    from eole.config.models import TransformerModelConfig
    from eole.config.training import TrainingConfig
    from eole.constants import DefaultTokens
    from eole.inputters.inputter import dict_to_vocabs
    from eole.models.model import EncoderDecoderModel
    from eole.utils.loss import LossCompute

    from nmt.core.loss import LossOutput

    if not model_cfg.share_embeddings:
        raise ValueError("the eole engine ties the source, target and output embeddings")
    if model_cfg.activation != "relu":
        raise ValueError(f"the eole engine builds a ReLU FFN, not {model_cfg.activation}")
    device = torch.device(device)

    # a joint vocabulary with nmt's special ids; the other pieces' names do not matter
    tokens = [DefaultTokens.PAD, DefaultTokens.UNK, DefaultTokens.BOS, DefaultTokens.EOS]
    tokens += [f"piece{i}" for i in range(len(tokens), vocab_size)]
    specials = {
        "pad_token": DefaultTokens.PAD,
        "unk_token": DefaultTokens.UNK,
        "bos_token": DefaultTokens.BOS,
        "eos_token": DefaultTokens.EOS,
    }
    vocabs = dict_to_vocabs({"src": tokens, "tgt": tokens, "specials": specials})
    assert vocabs["tgt"][DefaultTokens.PAD] == PAD and len(vocabs["tgt"]) == vocab_size

    d = model_cfg.d_model
    config = TransformerModelConfig(
        hidden_size=d,
        transformer_ff=model_cfg.d_ff,
        heads=model_cfg.n_heads,
        encoder={"layers": model_cfg.n_encoder_layers},
        decoder={"layers": model_cfg.n_decoder_layers},
        embeddings={"word_vec_size": d, "position_encoding_type": "SinusoidalInterleaved"},
        mlp_activation_fn="relu",
        layer_norm="standard",
        norm_eps=1e-5,
        add_qkvbias=True,
        # named too: the default that add_qkvbias implies reaches the decoder's attention only
        add_final_linear_bias=True,
        add_ffnbias=True,
        share_embeddings=True,
        share_decoder_embeddings=True,
        generator_bias=False,
    )
    running = TrainingConfig(
        dropout=[model_cfg.dropout],
        attention_dropout=[model_cfg.attention_dropout],
        param_init_method="xavier_uniform",
        param_init=0.0,
        compute_dtype="fp32",
        gpu_ranks=[device.index or 0] if device.type == "cuda" else [],
    )
    # device_id -1: eole's get_device() gives the CPU
    eole_model = EncoderDecoderModel.for_training(
        config, vocabs, running, device_id=(device.index or 0) if device.type == "cuda" else -1
    ).to(device)

    class EoleTransformer(torch.nn.Module):
        """nmt's ``(src, tgt_in) -> logits`` around eole's ``EncoderDecoderModel``."""

        def __init__(self):
            super().__init__()
            self.eole, self.cfg = eole_model, model_cfg

        def forward(self, src, tgt_in, project=True):  # always logits: eole's loss projects none
            # eole decodes tgt[:, :-1]: one PAD column after tgt_in, dropped again there
            tgt = torch.nn.functional.pad(tgt_in, (0, 1), value=PAD)
            out = self.eole(src, tgt, src.ne(PAD).sum(1))
            return self.eole.generator(out.dec_out)

    computes: dict[float, LossCompute] = {}

    def eole_loss_compute(smoothing: float) -> LossCompute:
        """What eole's trainer builds (``LossCompute.from_config``) for ε ``smoothing``, over
        logits: its generator is the identity, since the module already applied eole's."""
        if smoothing not in computes:
            setup = types.SimpleNamespace(
                model=config, training=running.model_copy(update={"label_smoothing": smoothing})
            )
            stand_in = types.SimpleNamespace(tgt_shift=1, generator=torch.nn.Identity())
            compute = LossCompute.from_config(setup, stand_in, vocabs)
            computes[smoothing] = compute.to(device)
        return computes[smoothing]

    def loss_fn(logits, target, smoothing, model=None):
        """Eole's summed label-smoothed cross entropy of ``logits`` ``(batch, tgt_len, vocab)``
        against ``target`` ``(batch, tgt_len)`` (PAD ignored) as a ``LossOutput``."""
        compute = eole_loss_compute(float(smoothing))
        flat_target = target.reshape(-1)
        loss, _ = compute._compute_ce_loss(logits, flat_target)
        return LossOutput(loss, loss.detach(), flat_target.ne(compute.padding_idx).sum())

    return EoleTransformer(), loss_fn
