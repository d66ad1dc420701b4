import functools
from pathlib import Path

import pytest
import torch

from nmt.config import ModelConfig
from nmt.model import Transformer
from nmt.tokenizer import EOS, PAD

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "data" / "toy"


def tiny_config(**overrides) -> ModelConfig:
    values = dict(d_model=32, d_ff=64, n_heads=4, n_encoder_layers=2, n_decoder_layers=2, dropout=0.1, src_vocab_size=40, tgt_vocab_size=40)
    values.update(overrides)
    return ModelConfig(**values)


@pytest.fixture
def model() -> Transformer:
    """A random tiny Transformer in eval mode (dropout off)."""
    torch.manual_seed(0)
    return Transformer(tiny_config()).eval()


def random_sources(lengths: list[int], vocab: int = 40, seed: int = 0) -> torch.Tensor:
    """Right-padded ``(batch, max_len + 1)`` sources of the given piece counts, each ending in EOS."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths) + 1), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, vocab, (n,), generator=g)
        src[i, n] = EOS
    return src


@functools.lru_cache(maxsize=None)
def toy_tokenizer(vocab_size: int = 40, lines: int = 300):
    """A joint SentencePiece tokenizer trained on the first ``lines`` English lines of the shipped
    toy corpus (few enough characters for 40 pieces), trained once per session for every test that asks for it."""
    from nmt.config import TokenizerConfig
    from nmt.tokenizer import train_tokenizer

    en = (TOY / "train.en").read_text(encoding="utf-8").splitlines()[:lines]
    return train_tokenizer(en, en, TokenizerConfig(vocab_size=vocab_size))
