import functools
import os
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from nmt.config import ModelConfig, TokenizerConfig
from nmt.core.model import Transformer
from nmt.data.corpus import read_parallel
from nmt.data.tokenizer import BOS, EOS, PAD, Tokenizer, train_tokenizer

ROOT = Path(__file__).resolve().parents[1]
TOY = ROOT / "data" / "toy"


def tiny_config(**overrides) -> ModelConfig:
    values = dict(
        d_model=32,
        d_ff=64,
        n_heads=4,
        n_encoder_layers=2,
        n_decoder_layers=2,
        dropout=0.1,
        src_vocab_size=40,
        tgt_vocab_size=40,
    )
    values.update(overrides)
    return ModelConfig(**values)


@pytest.fixture
def model() -> Transformer:
    """A random tiny Transformer in eval mode (dropout off)."""
    torch.manual_seed(0)
    return Transformer(tiny_config()).eval()


@pytest.fixture(scope="module")
def byte_tokenizer():
    """A SentencePiece model with byte fallback: every byte has a piece (``<0x0A>`` decodes to a
    line feed)."""
    from nmt.data.tokenizer import Tokenizer, train_sentencepiece

    sp = train_sentencepiece(
        ["a dog runs on the beach", "the cat sees a dog", "犬が走る", "猫が見る"] * 50,
        vocab_size=280,
        byte_fallback=True,
    )
    return Tokenizer(sp, sp)


def random_sources(lengths: list[int], vocab: int = 40, seed: int = 0) -> torch.Tensor:
    """Right-padded ``(batch, max_len + 1)`` sources of the given piece counts, each ending in
    EOS."""
    g = torch.Generator().manual_seed(seed)
    src = torch.full((len(lengths), max(lengths) + 1), PAD, dtype=torch.long)
    for i, n in enumerate(lengths):
        src[i, :n] = torch.randint(4, vocab, (n,), generator=g)
        src[i, n] = EOS
    return src


#: Test files that keep a worker busy for a minute or more, longest first. pytest-xdist hands out
#: whole files (--dist loadfile) in collection order when told --no-loadscope-reorder
#: (pyproject.toml); its default order, most tests first, started these few-test files last, so that
#: one worker ran test_readme.py's three minutes alone at the end while the other had finished.
LONGEST_FIRST = (
    "test_readme.py",
    "test_recipe.py",
    "test_distributed.py",
    "test_train.py",
    "test_gpu_check.py",
    "test_cli.py",
    "test_languages.py",
)


def pytest_collection_modifyitems(config, items):
    """The files of :data:`LONGEST_FIRST` first, in that order; the rest keep the collection's order
    (the sort is stable)."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


# one of pytest-xdist's workers: one torch thread each, so that they do not contend for the
# cores
if os.environ.get("PYTEST_XDIST_WORKER"):
    torch.set_num_threads(1)


@functools.lru_cache(maxsize=None)
def cached_tokenizer(vocab_size: int = 40, lines: int = 300, german: bool = False) -> Tokenizer:
    """A joint SentencePiece tokenizer of the first ``lines`` toy pairs' English (and, with
    ``german``, German) side, trained once per session for every test that asks for the same one.
    English alone has few enough characters for 40 pieces."""
    src, tgt = read_parallel(TOY / "train.en", TOY / "train.de")
    return train_tokenizer(
        src[:lines], (tgt if german else src)[:lines], TokenizerConfig(vocab_size=vocab_size)
    )


# Format characters (Unicode category Cf) a corpus may hold: direction marks and isolates, joiners,
# the soft hyphen, the byte-order mark. Each starts one toy line in three of format_tokenizer()'s
# training text.
FORMAT_CHARACTERS = [
    "\u202e",
    "\u202d",
    "\u200e",
    "\u200f",
    "\u2066",
    "\u2069",
    "\u00ad",
    "\ufeff",
    "\u061c",
    "\u200d",
    "\u2060",
    "\u200b",
]
# Lines with no text: any number of controls, format characters, surrogates and separators (spaces
# among them), those above weighted in, since SentencePiece keeps several as pieces of their own;
# and U+FFFD and U+2581, text to Unicode but spaces to SentencePiece (a line of them has no pieces).
NO_TEXT_LINES = st.lists(
    st.one_of(
        st.characters(categories=["Cc", "Cf", "Cs", "Zs", "Zl", "Zp"]),
        st.sampled_from([*FORMAT_CHARACTERS, " ", "\t", "\x01", "\ufffd", "\u2581"]),
    ),
    max_size=8,
).map("".join)


@functools.lru_cache(maxsize=None)
def format_tokenizer() -> Tokenizer:
    """A joint 300-piece BPE model of 2,000 toy pairs, a third of the English lines starting with
    one of :data:`FORMAT_CHARACTERS`: several become pieces of their own (``▁‮``, the word start and
    U+202E)."""
    src, tgt = read_parallel(TOY / "train.en", TOY / "train.de")
    marked = [
        FORMAT_CHARACTERS[i % len(FORMAT_CHARACTERS)] + line if i % 3 == 0 else line
        for i, line in enumerate(src[:2000])
    ]
    return train_tokenizer(marked, tgt[:2000], TokenizerConfig(vocab_size=300))


@pytest.fixture(scope="session")
def toy_tokenizer() -> Tokenizer:
    """A joint 300-piece BPE model of 3,000 toy pairs: lower-case English and German words and
    ``.``, no digits or other punctuation (those encode as UNK)."""
    return cached_tokenizer(300, 3000, german=True)


# Lines of any code points, surrogates included (an in-memory string or JSON's \uD800 can hold
# one), weighted towards what has broken tokenizers: controls, separators, combining marks, the
# word-boundary mark itself, characters outside the toy vocabulary, and words inside it.
_AWKWARD = [
    *map(chr, range(0x20)),
    "\x7f",
    *map(chr, range(0x80, 0xA0)),
    "\u2028",
    "\u2029",
    "\u200b",
    "\ufeff",
    "\u00a0",
    "\u3000",
    "\u0301",
    "\u0308",
    "\u20dd",
    "\u2581",
    "\ud800",
    "\udfff",
    "\ufffd",
    "😀",
    "日本",
    "!!!",
    "42",
    " ",
    "the ",
    "dog ",
    "Hund ",
]
AWKWARD_LINES = st.lists(
    st.one_of(st.characters(exclude_categories=()), st.sampled_from(_AWKWARD)), max_size=30
).map("".join)
# Property tests try 60 examples each; HYPOTHESIS_PROFILE=thorough tries 2,000.
settings.register_profile(
    "nmt",
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
settings.register_profile("thorough", settings.get_profile("nmt"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "nmt"))


# ------------------------------------------------------------------ decoding through
# nmt.translation.inference


def translate_lines(
    model,
    tokenizer,
    lines,
    decode,
    device="cpu",
    *,
    steering=None,
    first_index=0,
    progress=None,
    skipped=None,
    **decoding,
):
    """``Inference([model...]).translate(lines, Decoding(decode, **decoding))``: the one way into
    decoding, called as tests call it (``decoding``: ``sampling``, ``alignment``, ``src_prefix``,
    ``shortlist``)."""
    from nmt.translation.inference import Decoding, Inference

    models = list(model) if isinstance(model, (list, tuple)) else [model]
    inference = Inference(models, tokenizer, torch.device(device))
    return inference.translate(
        lines, Decoding(decode, **decoding), steering, first_index, progress, skipped
    )


def load_model(path, device="cpu"):
    """``(model, tokenizer, config)`` of a checkpoint, the model as trained (no inference dtype or
    packing) on ``device``."""
    from nmt.runs.checkpoint import load_checkpoint

    loaded = load_checkpoint(path)
    return loaded.model.to(device), loaded.tokenizer, loaded.config


class ScriptedScorer:
    """A scorer for the search whose next-token probabilities are fixed per prefix (the tokens
    after BOS) by ``table``; an unknown prefix ends. ``calls``: the steps it has scored."""

    def __init__(self, table: dict[tuple[int, ...], dict[int, float]], vocab: int = 7):
        self.table, self.vocab, self.calls = table, vocab, 0

    def step(self, prefix, state):
        self.calls += 1
        rows = []
        for row in prefix.tolist():
            assert row[0] == BOS
            probs = torch.zeros(self.vocab)
            for token, p in self.table.get(tuple(row[1:]), {EOS: 1.0}).items():
                probs[token] = p
            rows.append(probs.log())
        return torch.stack(rows), state

    def reorder(self, state, index):
        return state

    def keep_sentences(self, state, keep):
        return state
