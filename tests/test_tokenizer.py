import subprocess
import sys
import unicodedata
from collections import Counter

from conftest import AWKWARD_LINES, ROOT, TOY
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nmt.data.tokenizer import controls_as_spaces, reservoir_sample


def test_reservoir_keeps_a_short_stream_whole_and_in_order():
    assert reservoir_sample(iter(["a", "b", "c"]), 3, seed=7) == ["a", "b", "c"]
    assert reservoir_sample(iter(["a", "b"]), 5, seed=7) == ["a", "b"]


def test_reservoir_sample_is_uniform_and_fixed_by_the_seed():
    n, k, draws = 10, 3, 4000
    counts = Counter()
    for seed in range(draws):
        sample = reservoir_sample(iter(range(n)), k, seed)
        assert len(sample) == k == len(set(sample)) and set(sample) <= set(range(n))
        counts.update(sample)
    # Each item is kept with probability k/n = 0.3; over 4,000 draws the standard error is 0.0072.
    assert all(abs(counts[i] / draws - 0.3) < 0.03 for i in range(n)), counts
    big = reservoir_sample(iter(range(100_000)), 1_000, seed=3)
    assert (
        big
        == reservoir_sample(iter(range(100_000)), 1_000, seed=3)
        != reservoir_sample(iter(range(100_000)), 1_000, seed=4)
    )
    assert abs(sum(big) / len(big) - 50_000) < 3_000  # mean of a uniform sample; standard error 913


TRAIN = """
import hashlib, sys
from nmt.config import TokenizerConfig
from nmt.data.corpus import read_parallel
from nmt.data.tokenizer import train_tokenizer
src, tgt = read_parallel(sys.argv[1] + "/train.en", sys.argv[1] + "/train.de")
for joint in (True, False):
    cfg = TokenizerConfig(vocab_size=300, joint=joint, input_sentence_size=5000)
    tok = train_tokenizer(src, tgt, cfg, seed=int(sys.argv[2]))
    print(*(hashlib.sha1(p).hexdigest() for p in tok.protos().values()))
"""


def _train_in_a_new_process(seed: int) -> str:
    return subprocess.run(
        [sys.executable, "-c", TRAIN, str(TOY), str(seed)],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=300,
    ).stdout


def test_sampled_tokenizer_is_the_same_in_every_process_for_one_seed():
    # 24,000 toy sentences, 5,000 sampled: SentencePiece's own sampling gave another model per
    # process.
    first = _train_in_a_new_process(1)
    assert len(first.split()) == 3
    assert _train_in_a_new_process(1) == first
    assert _train_in_a_new_process(2) != first


def test_control_characters_part_words_as_spaces_do(toy_tokenizer):
    r"""SentencePiece's nmt_nfkc deletes most controls (``dog\x01sees`` became ``dogsees``) and
    keeps NUL and NEL as unknown characters; every one (C0, DEL, C1) reads as a space now, on
    both sides, as TAB and the line and paragraph separators U+2028 and U+2029 already did."""
    spaced = toy_tokenizer.encode_src(["dog sees"])[0]
    assert toy_tokenizer.src.encode("dog\x01sees") != spaced  # what SentencePiece alone does
    for c in [*map(chr, range(0x20)), *map(chr, range(0x7F, 0xA0)), "\u2028", "\u2029"]:
        assert toy_tokenizer.encode_src([f"dog{c}sees"])[0] == spaced, repr(c)
        assert toy_tokenizer.encode_tgt([f"Hund{c}sieht"]) == toy_tokenizer.encode_tgt(
            ["Hund sieht"]
        ), repr(c)
    assert toy_tokenizer.decode_tgt(toy_tokenizer.encode_tgt(["Hund\x00sieht\x1bden\x9fMann"])) == [
        "Hund sieht den Mann"
    ]
    assert (
        controls_as_spaces("a\tb\x00c\u0085d\x7fe") == "a\tb c d e"
        and controls_as_spaces("the dog .") == "the dog ."
    )
    # a lone surrogate: U+FFFD, not a crash
    assert toy_tokenizer.encode_src(["a\ud800b"]) == toy_tokenizer.encode_src(["a\ufffdb"])


def test_a_tokenizer_learns_no_piece_of_a_control_character():
    """It trains on the text encode_src gives it: a control is a space there too."""
    from nmt.data.tokenizer import train_sentencepiece

    sp = train_sentencepiece(
        [f"the dog{c}sees a cat{c}." for c in ("\x85", "\x00", "\x01", "\x9c")] * 50, vocab_size=40
    )
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    assert "▁sees" in pieces and not [
        p for p in pieces if any(unicodedata.category(c) == "Cc" for c in p)
    ]


@given(lines=st.lists(AWKWARD_LINES, max_size=6))
@example(lines=["\ud800"])  # a lone surrogate made SentencePiece raise
@example(lines=["dog\x01sees", "\x00", "\x85"])
def test_any_text_encodes_and_no_control_reaches_sentencepiece(toy_tokenizer, lines):
    for ids in toy_tokenizer.encode_src(lines) + toy_tokenizer.encode_tgt(lines):
        assert all(0 <= i < toy_tokenizer.src.get_piece_size() for i in ids)
    for line in map(controls_as_spaces, lines):
        assert not [c for c in line if unicodedata.category(c) in ("Cc", "Cs") and c != "\t"]


@given(
    left=AWKWARD_LINES,
    right=AWKWARD_LINES,
    control=st.sampled_from(
        [*map(chr, range(0x09)), *map(chr, range(0x0A, 0x20)), *map(chr, range(0x7F, 0xA0))]
    ),
)
def test_a_control_character_encodes_as_a_space(toy_tokenizer, left, right, control):
    assert toy_tokenizer.encode_src([left + control + right]) == toy_tokenizer.encode_src(
        [left + " " + right]
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["the", "dog", "3", "12345", "Ω", "😀", " ", "  ", "sees", "ä"])))
def test_the_unknown_text_of_a_line_is_what_encodes_as_unk(toy_tokenizer, words):
    """Every piece's text comes back, one per piece of encode_src, and the unknown ones are the
    texts of its UNK pieces."""
    from nmt.data.tokenizer import UNK

    line = "".join(words)
    ids = toy_tokenizer.encode_src([line])[0]
    surfaces = toy_tokenizer.src_surfaces(line)
    assert len(surfaces) == len(ids)
    unknown = [s for s, i in zip(surfaces, ids) if i == UNK and s]
    assert toy_tokenizer.unknown_src(line) == list(dict.fromkeys(unknown))
    assert all(u not in ("the", "dog", "sees") for u in unknown)
