"""Subword regularisation: every epoch's training pairs cut anew into sampled pieces.

``tokenizer.subword_alpha`` > 0 trains on a segmentation SentencePiece samples instead of its
best one: BPE-dropout for a BPE model (Provilkov et al. 2020), unigram sampling for a unigram
model (Kudo 2018). The pairs are those the encoded cache keeps (:mod:`nmt.data.encoded`), in its
order, so batching, resuming and several directions work as without sampling; only the pieces
differ, and with them the lengths the batches are cut by. Validation and translation keep the
best segmentation. The trainer (:class:`nmt.training.train.Trainer`) cuts each epoch once, on rank
0, and keeps the current epoch's cut in its checkpoints.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np
import sentencepiece as spm

from .clean import KEPT, flatten
from .corpus import CHUNK_LINES, ParallelText
from .encoded import EncodedCorpus, cache_key, encoded_chunks, encoding_threads, prefixed
from .multilingual import directions, split_text, tag_ids
from .tokenizer import Tokenizer


def sample_corpus(
    text: ParallelText,
    tokenizer: Tokenizer,
    alpha: float,
    seed: Sequence[int],
    max_len: int | None = None,
    max_len_ratio: float | None = None,
    threads: int = 1,
    chunk_lines: int = CHUNK_LINES,
    src_prefix: tuple[int, ...] = (),
) -> EncodedCorpus:
    """The pairs :func:`nmt.data.encoded.encode_corpus` keeps from ``text``, in its order, each side
    cut by a sampled segmentation instead of the best one (``alpha``: see
    :meth:`~nmt.data.tokenizer.Tokenizer.encode_src`): one epoch's training corpus under
    ``tokenizer.subword_alpha`` (BPE-dropout, Provilkov et al. 2020).

    Which pairs are kept is decided on the best segmentation, as in the cache, so example
    ``i`` is the same pair in both and only its pieces differ (the key is the cache's, of the text
    as it is now: a run compares it with its cache's); a sampled side may then be
    longer than ``max_len`` (about 1.4 times as many pieces at ``alpha`` 0.1 with BPE). The
    sides of block ``k`` are drawn with SentencePiece's generator seeded from ``(*seed, k,
    side)``, so within one process the result is a function of ``seed``: not of ``threads``
    (which only decide the best segmentation) nor of what was encoded before. Another process
    draws differently from the same seed (SentencePiece 0.2.3 salts its generator's seed per
    process), so a run keeps each epoch's cut in its checkpoints. It is held in memory (4 bytes
    a piece and 8 a line), one in-memory block per block of text.

    Raises:
        DataError: as :meth:`~nmt.data.corpus.ParallelText.chunks` (unreadable or misaligned text).
    """
    src_blocks, tgt_blocks = [], []
    for k, (src, tgt, _, _, reason) in enumerate(
        encoded_chunks(text, tokenizer, max_len, max_len_ratio, threads, chunk_lines)
    ):
        keep = (reason == KEPT).tolist()
        if not any(keep):
            continue
        for side, (lines, encode, blocks) in enumerate(
            ((src, tokenizer.encode_src, src_blocks), (tgt, tokenizer.encode_tgt, tgt_blocks))
        ):
            spm.set_random_generator_seed(
                int(np.random.SeedSequence([*seed, k, side]).generate_state(1)[0])
            )
            blocks.append(flatten(encode(list(itertools.compress(lines, keep)), alpha=alpha)))
        src_blocks[-1] = prefixed(src_blocks[-1], src_prefix)
    return EncodedCorpus(
        src_blocks, tgt_blocks, key=cache_key(text, tokenizer, max_len, max_len_ratio, src_prefix)
    )


def sampled_training_corpus(cfg, tokenizer: Tokenizer, seed: tuple[int, ...]) -> EncodedCorpus:
    """Every direction's training pairs cut anew with ``tokenizer.subword_alpha``
    (:func:`sample_corpus`, seeded by ``seed`` and the direction's place), joined
    as :func:`nmt.training.opening.prepare` joins the cached ones: the same pairs in the same
    order."""
    d, threads = cfg.data, encoding_threads(cfg.data.workers, cfg.train.threads)
    return EncodedCorpus.joined(
        [
            sample_corpus(
                split_text(d, direction, "train"),
                tokenizer,
                cfg.tokenizer.subword_alpha,
                (*seed, part),
                d.max_len,
                d.max_len_ratio,
                threads,
                src_prefix=tag_ids(tokenizer, d, direction.tgt),
            )
            for part, direction in enumerate(directions(d))
        ]
    )
