"""Validation during training: loss, perplexity and BLEU/chrF of each direction's validation set.

The BLEU code is ``nmt evaluate``'s (:func:`nmt.scoring.evaluate.score`), so a validation score
equals ``nmt evaluate --checkpoint`` of the same checkpoint at ``train.valid_beam_size``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import torch

from nmt.config import Config
from nmt.core.batching import TokenBatchSampler, collate
from nmt.core.loss import EAGER
from nmt.core.model import Transformer
from nmt.data.encoded import EncodedCorpus
from nmt.data.multilingual import mean_validation
from nmt.data.tokenizer import Tokenizer
from nmt.runtime.compiled import training_loss
from nmt.scoring import evaluate
from nmt.translation.inference import Decoding, Inference


@dataclass
class ValidationSet:
    """One direction's validation text, cleaned, and its encoding (each source after ``src_prefix``,
    its target's tag)."""

    corpus: EncodedCorpus
    src_lines: list[str]
    ref_lines: list[str]
    direction: str = ""  # SRC-TGT in a run of several directions; "" in a run of one
    tgt_lang: str | None = None  # what the BLEU tokenizer follows (eval.tokenize auto)
    src_prefix: tuple[int, ...] = ()


@torch.no_grad()
def validate(
    model: Transformer,
    tokenizer: Tokenizer,
    valid: list[ValidationSet],
    cfg: Config,
    device: torch.device,
) -> dict:
    """Validation loss, perplexity and BLEU/chrF of beam-search translations, of each direction of
    ``valid``.

    Translations are scored by :func:`nmt.scoring.evaluate.score`, the code ``nmt evaluate`` uses,
    each direction with its target's BLEU tokenizer. Several directions give their mean, which
    ``best.pt`` and ``train.patience`` follow, and each one's
    (:func:`nmt.data.multilingual.mean_validation`).
    """
    results = {v.direction: validate_direction(model, tokenizer, v, cfg, device) for v in valid}
    return results[""] if list(results) == [""] else mean_validation(results)


def validate_direction(
    model: Transformer,
    tokenizer: Tokenizer,
    valid: ValidationSet,
    cfg: Config,
    device: torch.device,
) -> dict:
    """:func:`validate` of one direction."""
    model.eval()
    loss_sum = nll_sum = 0.0
    n_tokens = 0
    sampler = TokenBatchSampler(
        valid.corpus.src_lengths, valid.corpus.tgt_lengths, cfg.train.max_tokens, seed=0
    )
    # as training scores, chunked as it is (the loss's passes eager: no gradients here)
    loss, smoothing = training_loss(cfg.train, device, EAGER), cfg.train.label_smoothing
    for indices in sampler.epoch_batches(0):
        batch = collate(valid.corpus, indices).to(device)
        out = loss(model(batch.src, batch.tgt_in, project=False), batch.tgt_out, smoothing, model)
        loss_sum += float(out.loss)
        nll_sum += float(out.nll)
        n_tokens += int(out.n_tokens)
    decode = replace(cfg.decode, beam_size=cfg.train.valid_beam_size, n_best=1)
    inference = Inference([model], tokenizer, device)
    hyps = inference.best_strings(
        inference.translate(valid.src_lines, Decoding(decode, src_prefix=valid.src_prefix))
    )
    scores = evaluate.score(
        hyps, [valid.ref_lines], tokenize=evaluate.config_tokenizer(cfg, valid.tgt_lang)
    )
    nll = nll_sum / max(1, n_tokens)
    return {
        "valid_loss": loss_sum / max(1, n_tokens),
        "valid_nll": nll,
        "valid_ppl": math.exp(min(nll, 50.0)),
        "bleu": scores["bleu"],
        "chrf": scores["chrf"],
        "bleu_signature": scores["bleu_signature"],
        "example": hyps[0] if hyps else "",
    }
