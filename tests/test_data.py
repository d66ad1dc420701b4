import gzip
import io
import json
import os
import unicodedata
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from conftest import AWKWARD_LINES, NO_TEXT_LINES, ROOT, TOY, format_tokenizer
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import nmt.data.encoded as encoded_module
from nmt.config import DataConfig
from nmt.core.batching import TokenBatchSampler, collate, token_batches
from nmt.data.clean import CleanReport, clean_pairs, encode_rows, has_text, report_of, strip_pairs
from nmt.data.corpus import (
    DataError,
    ParallelText,
    check_inputs,
    count_lines,
    load_split,
    read_lines,
    read_parallel,
    stream_buffers,
)
from nmt.data.encoded import EncodedCorpus, encode_corpus
from nmt.data.subwords import sample_corpus
from nmt.data.tokenizer import BOS, EOS, PAD


def test_read_lines_handles_crlf_bom_gzip_and_unicode_separators(tmp_path):
    plain = tmp_path / "a.txt"
    plain.write_bytes("\ufeffone\r\ntwo\u2028still two\r\n\r\nfour".encode())
    assert read_lines(plain) == ["one", "two\u2028still two", "", "four"]
    packed = tmp_path / "a.txt.gz"
    with gzip.open(packed, "wb") as f:
        f.write("eins\nzwei\n".encode())
    assert read_lines(packed) == ["eins", "zwei"]


def test_invalid_utf8_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"fine\nalso fine\ncaf\xe9\n")
    with pytest.raises(DataError, match=r"bad\.en:3: invalid UTF-8.*iconv"):
        read_lines(bad)


def test_mismatched_line_counts_name_both_files(tmp_path):
    (tmp_path / "x.en").write_text("a\nb\nc\n")
    (tmp_path / "x.de").write_text("a\nb\n")
    with pytest.raises(DataError, match=r"x\.en has 3 lines but .*x\.de has 2"):
        read_parallel(tmp_path / "x.en", tmp_path / "x.de")


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataError, match="file not found"):
        read_lines(tmp_path / "nope.en")
    with pytest.raises(DataError, match=r"neither train\.fr nor train\.fr\.gz"):
        load_split(DataConfig(dir=str(tmp_path), src_lang="fr"), "train")


def test_strip_drops_pairs_with_an_empty_side_and_keeps_alignment():
    src, tgt, report = strip_pairs(["  a ", "", "c", "   ", "e"], ["A", "B", "  ", "D", " E\t"])
    assert (src, tgt) == (["a", "e"], ["A", "E"])
    assert (report.total, report.empty, report.kept) == (5, 3, 2)


def test_token_batches_respect_budget_including_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 60, size=500)
    sampler = TokenBatchSampler(lengths, rng.integers(1, 60, size=500), max_tokens=300, seed=3)
    for epoch in range(3):
        batches = sampler.epoch_batches(epoch)
        seen = Counter(int(i) for b in batches for i in b)
        assert sorted(seen) == list(range(500)) and set(seen.values()) == {1}
        for b in batches:
            assert len(b) * sampler.lengths[b].max() <= 300
    assert [list(b) for b in sampler.epoch_batches(1)] != [
        list(b) for b in sampler.epoch_batches(2)
    ]
    assert [list(b) for b in sampler.epoch_batches(1)] == [
        list(b)
        for b in TokenBatchSampler(lengths, sampler.tgt_lengths, 300, seed=3).epoch_batches(1)
    ]


def test_over_budget_example_gets_its_own_batch():
    lengths = np.array([5, 500, 6, 4])
    batches = token_batches(lengths, 20, np.argsort(lengths))
    assert [sorted(b.tolist()) for b in batches] == [[0, 2, 3], [1]]


def test_bucketing_keeps_padding_small():
    rng = np.random.default_rng(1)
    src = rng.integers(2, 40, size=2000)
    sampler = TokenBatchSampler(src, src + rng.integers(0, 3, size=2000), max_tokens=1000, seed=0)
    assert sampler.padding_fraction() < 0.08


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 30), st.integers(1, 30)), min_size=1, max_size=40),
    st.integers(20, 200),
    st.sampled_from([1, 2, 8, 64]),
)
def test_the_padding_share_is_that_of_the_batches_collate_builds(pairs, max_tokens, multiple):
    src_lengths = np.array([s for s, _ in pairs])
    tgt_lengths = np.array([t for _, t in pairs])

    class Corpus:
        def src(self, i):
            return [5] * int(src_lengths[i])

        def tgt(self, i):
            return [6] * int(tgt_lengths[i])

    sampler = TokenBatchSampler(src_lengths, tgt_lengths, max_tokens, seed=3)
    pad = positions = 0
    for b in sampler.epoch_batches(0):
        batch = collate(Corpus(), b, multiple=multiple)
        for side in (batch.src, batch.tgt_out):
            pad, positions = pad + int((side == PAD).sum()), positions + side.numel()
    assert sampler.padding_fraction(0, multiple) == pytest.approx(pad / positions, abs=1e-12)


def test_ranks_get_distinct_batches_and_equal_counts():
    lengths = np.arange(1, 101)
    parts = [
        TokenBatchSampler(lengths, lengths, 120, seed=0, rank=r, world_size=3).epoch_batches(0)
        for r in range(3)
    ]
    assert len({len(p) for p in parts}) == 1
    ids = [int(i) for p in parts for b in p for i in b]
    assert len(ids) == len(set(ids))


def test_collate_adds_eos_bos_and_padding():
    corpus = EncodedCorpus.from_lists([[5, 6], [7]], [[8], [9, 10, 11]])
    batch = collate(corpus, np.array([0, 1]))
    assert batch.src.tolist() == [[5, 6, EOS], [7, EOS, PAD]]
    assert batch.tgt_in.tolist() == [[BOS, 8, PAD, PAD], [BOS, 9, 10, 11]]
    assert batch.tgt_out.tolist() == [[8, EOS, PAD, PAD], [9, 10, 11, EOS]]
    assert batch.n_tgt_tokens == 6


def test_encoding_is_cached_and_filters_are_counted(tmp_path, toy_tokenizer, monkeypatch):
    src = ["the dog sees a cat .", "a b", "the big red house is old ."]
    tgt = ["der Hund sieht eine Katze .", "x " * 40, "das große rote Haus ist alt ."]
    corpus, report = encode_corpus(
        ParallelText.lists(src, tgt), toy_tokenizer, tmp_path, max_len=100, max_len_ratio=3.0
    )
    assert len(corpus) == 2 and report.bad_ratio == 1
    assert toy_tokenizer.tgt.decode(corpus.tgt(1).tolist()) == "das große rote Haus ist alt ."

    def fail(*args):
        raise AssertionError("tokenized again despite the cache")

    monkeypatch.setattr(type(toy_tokenizer), "encode_src", fail)
    again, report_again = encode_corpus(
        ParallelText.lists(src, tgt), toy_tokenizer, tmp_path, max_len=100, max_len_ratio=3.0
    )
    assert _examples(again) == _examples(corpus) and report_again == report
    (arrow,) = (tmp_path / again.key).glob("*.arrow")  # the ids only: the text's Arrow copy is gone
    # read through a memory map, not copied
    assert str(arrow) in Path("/proc/self/maps").read_text()


def test_hugging_face_datasets_from_local_json(tmp_path):
    rows = [{"translation": {"en": f"sentence {i}", "de": f"Satz {i}"}} for i in range(5)]
    for split in ("train", "validation"):
        (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = DataConfig(
        hf_dataset="json",
        hf_data_files={
            "train": str(tmp_path / "train.jsonl"),
            "validation": str(tmp_path / "validation.jsonl"),
        },
        valid_split="validation",
    )
    src, tgt = load_split(cfg, "valid").read()
    assert src[3] == "sentence 3" and tgt[3] == "Satz 3" and len(src) == 5


MULTI30K = Path(os.environ.get("MULTI30K", ROOT.parent / "shared" / "data" / "multi30k"))


@pytest.mark.skipif(
    not (MULTI30K / "val.en.gz").is_file(), reason="Multi30k not found; set MULTI30K"
)
def test_real_multi30k_reads_aligned():
    src, tgt = load_split(DataConfig(dir=str(MULTI30K), valid_split="val"), "valid").read()
    assert len(src) == len(tgt) == 1014
    assert all(s.strip() for s in src) and all(t.strip() for t in tgt)
    assert src[0] == "A group of men are loading cotton onto a truck"
    assert tgt[0] == "Eine Gruppe von Männern lädt Baumwolle auf einen Lastwagen"


def test_damaged_gzip_is_a_clear_error(tmp_path):
    good = gzip.compress(("a fairly long line of text that compresses well\n" * 200).encode())
    damaged = bytearray(good)
    damaged[len(damaged) // 2] ^= 0xFF
    path = tmp_path / "x.en.gz"
    path.write_bytes(bytes(damaged))
    with pytest.raises(DataError, match=r"x\.en\.gz: cannot read"):
        read_lines(path)
    with pytest.raises(DataError, match="is a directory"):
        read_lines(tmp_path)


def _examples(corpus):
    """Every example's (source ids, target ids), as lists."""
    return [(corpus.src(i).tolist(), corpus.tgt(i).tolist()) for i in range(len(corpus))]


def test_threads_and_blocks_give_the_same_cache_as_one_pass(tmp_path, toy_tokenizer):
    """Streaming in blocks with 2 SentencePiece threads == encoding the lists at once."""
    src, tgt = read_parallel(TOY / "valid.en", TOY / "valid.de")
    src[7], tgt[11] = "   ", "x " * 25  # one empty side, one over the length ratio
    (tmp_path / "t.en").write_text("\n".join(src) + "\n")
    with gzip.open(tmp_path / "t.de.gz", "wt") as f:
        f.write("\n".join(tgt) + "\n")
    one, report = encode_corpus(
        ParallelText.lists(src, tgt), toy_tokenizer, None, max_len=50, max_len_ratio=3.0
    )
    many, report_many = encode_corpus(
        ParallelText.files(tmp_path / "t.en", tmp_path / "t.de.gz"),
        toy_tokenizer,
        tmp_path / "cache",
        max_len=50,
        max_len_ratio=3.0,
        threads=2,
        chunk_lines=64,
    )
    assert (report.total, report.empty, report.bad_ratio, report.kept) == (
        500,
        1,
        1,
        498,
    ) and report_many == report
    assert _examples(one) == _examples(many) and many.src(0).dtype == np.int32
    assert np.array_equal(one.src_lengths, many.src_lengths) and np.array_equal(
        one.tgt_lengths, many.tgt_lengths
    )
    assert len(many.src_blocks) == 8  # one record batch a block of 64 pairs, in one file
    assert toy_tokenizer.src.decode(many.src(0).tolist()) == src[0]
    # no temporary left
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [
        next((tmp_path / "cache").iterdir()).name
    ]


def test_a_bad_line_found_while_encoding_leaves_no_cache(tmp_path, toy_tokenizer):
    (tmp_path / "a.en").write_bytes(b"one\ntwo\nthree\n" * 50 + b"caf\xe9\n")
    (tmp_path / "a.de").write_bytes(b"eins\nzwei\ndrei\n" * 50 + b"Cafe\n")
    with pytest.raises(DataError, match=r"a\.en:151: invalid UTF-8"):
        encode_corpus(
            ParallelText.files(tmp_path / "a.en", tmp_path / "a.de"),
            toy_tokenizer,
            tmp_path / "cache",
            threads=2,
            chunk_lines=40,
        )
    assert list((tmp_path / "cache").iterdir()) == []
    (tmp_path / "b.en").write_bytes(b"one\n" * 151)
    (tmp_path / "b.de").write_bytes(b"eins\n" * 150)
    with pytest.raises(DataError, match=r"b\.en has 151 lines but .*b\.de has 150"):
        encode_corpus(
            ParallelText.files(tmp_path / "b.en", tmp_path / "b.de"),
            toy_tokenizer,
            tmp_path / "cache",
            chunk_lines=40,
        )
    assert list((tmp_path / "cache").iterdir()) == []


def test_damaged_cache_is_encoded_again_and_stale_temporaries_go(tmp_path, toy_tokenizer):
    src, tgt = read_parallel(TOY / "valid.en", TOY / "valid.de")
    text = ParallelText.lists(src, tgt)
    first, report = encode_corpus(text, toy_tokenizer, tmp_path)
    (entry,) = list(tmp_path.iterdir())
    expected = _examples(first)
    del first
    (arrow,) = entry.glob("*.arrow")
    with open(arrow, "r+b") as f:  # cut the file short, as an interrupted copy would
        f.truncate(arrow.stat().st_size // 2)
    # left by a killed run here (no such process)
    stale = tmp_path / f"{entry.name}.tmp-{encoded_module._HOST}-999999999-x"
    stale.mkdir()
    # in progress on another host sharing the directory
    elsewhere = tmp_path / f"{entry.name}.tmp-another-machine-999999999-x"
    elsewhere.mkdir()
    again, report_again = encode_corpus(text, toy_tokenizer, tmp_path)
    assert _examples(again) == expected
    assert report_again == report and sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [entry.name, elsewhere.name]
    )


def test_cache_keys_cannot_collide(tmp_path, toy_tokenizer, monkeypatch):
    def key(src, tgt):
        return encode_corpus(ParallelText.lists(src, tgt), toy_tokenizer, tmp_path)[0].key

    # Hugging Face rows may hold newlines: joining lines with one made these three corpora one key.
    keys = [
        key(["a\nb"], ["c\nd"]),
        key(["a", "b"], ["c", "d"]),
        key(["a", "b\nc"], ["d", "x"]),
        key(["a\nb", "c"], ["d", "x"]),
    ]
    assert len(set(keys)) == 4
    # new cleaning or encoding rules
    monkeypatch.setattr(encoded_module, "CACHE_FORMAT", encoded_module.CACHE_FORMAT + 1)
    assert key(["a", "b"], ["c", "d"]) != keys[1]


def test_gzip_is_recognised_by_content_and_other_files_are_named(tmp_path):
    (tmp_path / "packed.txt").write_bytes(gzip.compress("eins\nzwei\n".encode()))
    assert read_lines(tmp_path / "packed.txt") == ["eins", "zwei"]
    (tmp_path / "wide.txt").write_bytes("hallo\n".encode("utf-16"))
    with pytest.raises(DataError, match=r"wide\.txt: UTF-16 text.*iconv -f utf-16"):
        read_lines(tmp_path / "wide.txt")
    os.mkfifo(tmp_path / "pipe")
    with pytest.raises(
        DataError,
        match=r"pipe: not a regular file \(a pipe\?\); nmt train reads its text more than once",
    ):
        # read once, a pipe would do
        load_split(
            DataConfig(train_src=str(tmp_path / "pipe"), train_tgt=str(tmp_path / "packed.txt")),
            "train",
        )
    with pytest.raises(DataError, match=r"is a directory"):
        load_split(
            DataConfig(train_src=str(tmp_path), train_tgt=str(tmp_path / "packed.txt")), "train"
        )


def test_thread_count_never_exceeds_the_cpus():
    from nmt.data.encoded import encoding_threads

    cpus = len(os.sched_getaffinity(0))
    assert (
        encoding_threads(100_000) == cpus
        and encoding_threads(1) == 1
        and 1 <= encoding_threads(0) <= min(16, cpus)
    )
    # data.workers 0 follows train.threads where that is set; data.workers wins where both are
    assert encoding_threads(0, 1) == 1 and encoding_threads(1, 100_000) == 1
    assert encoding_threads(0, 100_000) == cpus and encoding_threads(0, 0) == min(16, cpus)


def test_stream_buffers_hand_over_what_a_pipe_has_so_far():
    read_fd, write_fd = os.pipe()
    with open(read_fd, "rb", buffering=0) as reader:
        chunks = stream_buffers(reader, size=3)
        os.write(write_fd, "\ufeffone\r\n".encode())
        # nothing more waiting: handed over at once, BOM and CR removed
        assert next(chunks) == ["one"]
        os.write(write_fd, b"two\nthree\nfour\nfive\nsi")
        assert next(chunks) == ["two", "three", "four"]  # full buffer
        assert next(chunks) == ["five"]  # "si" is not a line yet
        os.write(write_fd, b"x\n\nseven")
        assert next(chunks) == ["six", ""]
        os.close(write_fd)
        # a last line without newline
        assert next(chunks) == ["seven"] and next(chunks, None) is None


def test_stream_buffers_of_a_file_or_memory_fill_up_and_report_bad_lines(tmp_path):
    import io

    text = b"".join(b"line %d\n" % i for i in range(7))
    assert [len(b) for b in stream_buffers(io.BytesIO(text), size=3)] == [3, 3, 1]
    path = tmp_path / "in.txt"
    path.write_bytes(text)
    with open(path, "rb") as f:
        assert [len(b) for b in stream_buffers(f, size=5)] == [5, 2]
    chunks = stream_buffers(io.BytesIO(b"a\nb\nc\xff\n"), size=2)
    assert next(chunks) == ["a", "b"]
    with pytest.raises(DataError, match="<stdin>:3: invalid UTF-8"):
        next(chunks)


def test_count_lines_agrees_with_iter_lines(tmp_path):
    # é's two bytes straddle the first 1 MiB block
    cases = {
        "none": b"",
        "one_newline": b"\n",
        "no_final_newline": b"a\nb",
        "final_newline": b"a\nb\n",
        "crlf_bom": b"\xef\xbb\xbfa\r\nb\r\n",
        "block_boundary": b"x" * ((1 << 20) - 1) + "é\nz".encode(),
    }
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        with gzip.open(tmp_path / f"{name}.gz", "wb") as f:
            f.write(data)
        assert (
            count_lines(tmp_path / name)
            == count_lines(tmp_path / f"{name}.gz")
            == len(read_lines(tmp_path / name))
        ), name
    assert [
        count_lines(tmp_path / n)
        for n in ("none", "one_newline", "no_final_newline", "final_newline", "block_boundary")
    ] == [0, 1, 2, 2, 2]
    (tmp_path / "bad").write_bytes(b"ok\nok\n" * 3 + b"caf\xe9\n")
    with pytest.raises(DataError, match=r"bad:7: invalid UTF-8"):
        count_lines(tmp_path / "bad")
    # a multi-byte character cut at the end of the file
    (tmp_path / "cut").write_bytes("ok\né".encode()[:-1])
    with pytest.raises(DataError, match=r"cut:2: invalid UTF-8"):
        count_lines(tmp_path / "cut")


def test_check_inputs_finds_every_input_fault(tmp_path):
    def files(name, src, tgt):
        (tmp_path / f"{name}.en").write_bytes(src)
        (tmp_path / f"{name}.de").write_bytes(tgt)
        return ParallelText.files(tmp_path / f"{name}.en", tmp_path / f"{name}.de")

    train = files("train", b"a\nb\n", b"A\nB\n")
    check_inputs(train, files("valid", b"x\n", b"X\n"))
    with pytest.raises(DataError, match=r"valid50.en has 50 lines but .*valid50.de has 49"):
        check_inputs(train, files("valid50", b"x\n" * 50, b"X\n" * 49))
    with pytest.raises(DataError, match=r"latin.de:2: invalid UTF-8"):
        check_inputs(train, files("latin", b"x\ny\n", b"X\nY\xe9\n"))
    with pytest.raises(DataError, match=r"badtrain.en:1: invalid UTF-8"):
        check_inputs(files("badtrain", b"\xff\n", b"A\n"), files("valid", b"x\n", b"X\n"))
    with pytest.raises(
        DataError,
        match=r"the validation set \(.*blank.en and .*blank.de\) has no pair with text on both "
        r"sides",
    ):
        check_inputs(train, files("blank", b"x\n \n", b"\nY\n"))
    with pytest.raises(
        DataError, match=r"dataset 'd' split 'valid': 2 source lines but 1 target lines"
    ):
        ParallelText.lists(["a", "b"], ["A"], name="dataset 'd' split 'valid'")


def test_lines_with_no_pieces_are_dropped_and_counted(toy_tokenizer):
    zw = "\u200b"  # not blank to str.strip, but SentencePiece normalises it away: no pieces
    src = ["the dog .", zw, "  ", "a cat .", f"{zw} {zw}", "the man ."]
    tgt = ["der Hund .", "die Katze .", "x", zw, "y", "der Mann ."]
    kept = clean_pairs(toy_tokenizer, src, tgt)
    assert kept.src == ["the dog .", "the man ."] and kept.tgt == ["der Hund .", "der Mann ."]
    assert kept.report == CleanReport(total=6, empty=4) and all(kept.src_ids) and all(kept.tgt_ids)
    src_ids, _, reason = encode_rows(toy_tokenizer, src, tgt, max_len=100, max_len_ratio=3.0)
    assert reason.tolist() == [0, 1, 1, 1, 1, 0] and [src_ids[0], src_ids[5]] == kept.src_ids
    corpus, report = encode_corpus(
        ParallelText.lists(src, tgt), toy_tokenizer, None, max_len=100, max_len_ratio=3.0
    )
    assert report == kept.report and _examples(corpus) == list(zip(kept.src_ids, kept.tgt_ids))


PAIRS_OF_TEXT = [
    ("the dog .", "der Hund ."),
    ("a cat sees the man .", "eine Katze sieht den Mann ."),
]


@given(
    pairs=st.lists(
        st.one_of(
            st.sampled_from(PAIRS_OF_TEXT),
            st.tuples(NO_TEXT_LINES, st.just("der Hund .")),
            st.tuples(st.just("the dog ."), NO_TEXT_LINES),
        ),
        min_size=1,
        max_size=10,
    ),
    chunk_lines=st.integers(1, 4),
)
def test_a_side_with_no_text_is_dropped_and_counted_as_empty_whatever_the_tokenizer_made_of_it(
    tmp_path_factory, pairs, chunk_lines
):
    """A side of only U+202E, a piece of its own for a tokenizer whose training text held it, was
    kept: the model learnt to answer it with an invented sentence. A side with no character but
        format, control and space characters is now
    empty, in the cleaning that comes before the tokenizer (strip_pairs), after it (clean_pairs),
    and in the cache."""
    src, tgt = [s for s, _ in pairs], [t for _, t in pairs]
    kept_pairs = [(s, t) for s, t in pairs if (s, t) in PAIRS_OF_TEXT]
    tok = format_tokenizer()
    kept = clean_pairs(tok, src, tgt)
    assert list(zip(kept.src, kept.tgt)) == kept_pairs and kept.report == CleanReport(
        total=len(pairs), empty=len(pairs) - len(kept_pairs)
    )
    assert strip_pairs(src, tgt) == (kept.src, kept.tgt, kept.report)
    corpus, report = encode_corpus(
        ParallelText.lists(src, tgt),
        tok,
        tmp_path_factory.mktemp("cache"),
        max_len=100,
        max_len_ratio=9.0,
        chunk_lines=chunk_lines,
    )
    assert report == kept.report and _examples(corpus) == list(zip(kept.src_ids, kept.tgt_ids))


def test_has_text_sees_one_character_of_text_among_any_others():
    assert not any(
        has_text(line)
        for line in ["", " \t", "\u202e", "\u200b\u2066 \x01\u2029", "\ud800", "\u3000"]
        # U+FFFD and U+2581 are symbols to Unicode, spaces to SentencePiece: no pieces
        + ["\ufffd", "\u2581 \ufffd\u200b"]
    )
    # a private-use or unassigned one counts
    assert all(
        has_text(line) for line in ["a", "\u202eabc", "😀", "\u0301", "\ue000", "\ufffda", "!"]
    )


def test_the_characters_sentencepiece_reads_as_spaces_give_no_pieces(toy_tokenizer):
    from nmt.data.clean import SENTENCEPIECE_SPACES

    lines = [*SENTENCEPIECE_SPACES, "".join(SENTENCEPIECE_SPACES) + " \u2581"]
    assert toy_tokenizer.encode_src(lines) == [[]] * len(lines)
    assert toy_tokenizer.encode_tgt(lines) == [[]] * len(lines)


def _covered(tokenizer) -> set[str]:
    """The characters some piece of ``tokenizer`` spells."""
    return {ch for piece in tokenizer.tgt_pieces for ch in piece}


TOY_LINES = read_lines(TOY / "train.de")[:200]


@given(data=st.data(), n=st.integers(1, 200))
def test_a_corpus_with_characters_outside_the_tokenizer_is_measured_and_warned_about(
    toy_tokenizer, caplog, data, n
):
    """Fine-tuning an English-German checkpoint on French left 7.5% of the target pieces unknown, in
    98.5% of lines, and nothing said so. Characters outside the toy tokenizer (upper case, other
        scripts, symbols), each inserted as a
    word into some of n toy lines: the shares and the missing characters are counted exactly, and a
    side is warned about when 1% of its lines or more hold one."""
    from collections import Counter

    from nmt.data.clean import shown, unknowns
    from nmt.training.opening import MATERIAL_UNKNOWN_LINES, warn_if_uncovered

    known = _covered(toy_tokenizer)
    outside = st.characters(categories=["Lu", "Ll", "Lo", "Nd", "Po", "Sm", "Sc", "So"]).filter(
        # U+FFFD: a space to SentencePiece
        lambda ch: (
            ch not in known and unicodedata.normalize("NFKC", ch) == ch and ch not in "\u2581\ufffd"
        )
    )
    inserted = data.draw(st.lists(st.lists(outside, max_size=3), min_size=n, max_size=n))
    # NFD spellings of letters it covers (u and U+0308 for ü) are no missing character: NFKC makes
    # them the letter, which the tokenizer spells.
    nfd = st.sampled_from([unicodedata.normalize("NFD", ch) for ch in "äöüÄ"])
    decomposed = data.draw(st.lists(st.lists(nfd, max_size=2), min_size=n, max_size=n))
    lines = [
        " ".join([*line.split()[:2], *chars, *line.split()[2:], *more])
        for line, chars, more in zip(TOY_LINES, inserted, decomposed)
    ]
    found = unknowns(toy_tokenizer.encode_tgt, lines)
    holding = sum(map(bool, inserted))
    assert (
        found.lines == n
        and found.holding == holding / n
        and found.missing == Counter(ch for chars in inserted for ch in chars)
    )
    # one UNK a character
    assert found.pieces * sum(map(len, toy_tokenizer.encode_tgt(lines))) == pytest.approx(
        sum(map(len, inserted))
    )
    caplog.clear()
    with caplog.at_level("WARNING", logger="nmt.train"):
        warn_if_uncovered(
            ParallelText.lists(TOY_LINES[:n], lines, name="fr"),
            toy_tokenizer,
            "from --init-from ende.pt",
            "start without --init-from",
            1,
        )
    if holding / n < MATERIAL_UNKNOWN_LINES:
        assert caplog.records == []
        return
    (record,) = caplog.records
    top = ", ".join(f"{shown(ch)} {count:,}" for ch, count in found.missing.most_common(5))
    assert record.getMessage() == (
        "warning: the tokenizer from --init-from ende.pt was not trained on this text: "
        f"{100 * found.pieces:.1f}% of the target side's pieces (fr) "
        f"are unknown, in {100 * holding / n:.1f}% of its lines ({n} lines sampled); most frequent "
        f"missing characters: {top}; "
        "the model can never write them: train a tokenizer on this text (start without "
        "--init-from), or accept it"
    )


def test_a_missing_character_is_shown_by_its_code_points_where_it_would_not_print_as_itself():
    from nmt.data.clean import characters, shown

    assert characters("u\u0308 e\u0301x \ufb01") == ["ü", " ", "é", "x", " ", "f", "i"]
    assert characters("\u0301a") == ["\u0301", "a"]  # a mark with nothing before it stands alone
    assert shown("é") == "é (U+00E9)" and shown("\u0915\u094d") == "\u0915\u094d (U+0915 U+094D)"
    # a right-to-left override or isolate would turn the rest of the message around
    assert shown("\u202e") == "U+202E" and shown("\u2066") == "U+2066"


_ENCODE_SCRIPT = """
import signal, sys
from pathlib import Path
# a background job starts with Ctrl-C ignored
signal.signal(signal.SIGINT, signal.default_int_handler)
from nmt.data.encoded import encode_corpus
from nmt.data.corpus import ParallelText
from nmt.data.tokenizer import Tokenizer
d = Path(sys.argv[1])
try:
    text = ParallelText.files(d / "big.en", d / "big.de")
    encode_corpus(text, Tokenizer.load_dir(d), d / "cache", threads=2, chunk_lines=500)
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(130)
print("finished", flush=True)
"""


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


def _encoding_underway(cache: Path) -> bool:
    """Whether a temporary ``ids.arrow`` under ``cache`` holds a record batch already (more than its
    schema)."""
    try:
        return any(f.stat().st_size > 4096 for f in cache.glob("*.tmp-*/ids.arrow"))
    except FileNotFoundError:  # renamed or removed meanwhile
        return False


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("how", ["SIGKILL", "Ctrl-C"])
def test_stopping_an_encoding_ends_it_at_once_and_leaves_no_cache(tmp_path, toy_tokenizer, how):
    """Killed (SIGKILL, as the kernel's OOM killer does) or interrupted (SIGINT to the process
    group, as a terminal sends it) while it encodes with 2 threads. The encoding runs in that
    one process: it has no worker process that could die alone and leave the run waiting, or
    outlive it. The process ends within seconds, an interrupt is reported as one, and no cache
    directory is left complete."""
    import signal
    import subprocess
    import sys
    import time

    src, tgt = read_parallel(TOY / "train.en", TOY / "train.de")
    (tmp_path / "big.en").write_text("\n".join(src * 8) + "\n")
    (tmp_path / "big.de").write_text("\n".join(tgt * 8) + "\n")
    toy_tokenizer.save(tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-c", _ENCODE_SCRIPT, str(tmp_path)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not _encoding_underway(tmp_path / "cache"):
            assert proc.poll() is None and time.monotonic() < deadline, "the encoding never started"
            time.sleep(0.02)
        # threads, not processes: nothing else for a signal or the OOM killer to hit
        assert _children(proc.pid) == []
        stopped = time.monotonic()
        if how == "SIGKILL":
            os.kill(proc.pid, signal.SIGKILL)
        else:
            os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=30)  # a hang fails here instead of blocking the suite
        assert time.monotonic() - stopped < 10
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    if how == "Ctrl-C":
        assert (proc.returncode, out.strip()) == (130, "interrupted")
        assert list((tmp_path / "cache").iterdir()) == []  # the temporary directory went too
    else:
        assert proc.returncode == -signal.SIGKILL
        # only a temporary, swept by the next run
        assert not [p for p in (tmp_path / "cache").iterdir() if ".tmp-" not in p.name]
        corpus, _ = encode_corpus(
            ParallelText.lists(["a ."], ["b ."]), toy_tokenizer, tmp_path / "cache"
        )
        # the next run on this machine swept it
        assert [p.name for p in (tmp_path / "cache").iterdir()] == [corpus.key]


def test_empty_corpus_and_a_cache_entry_that_is_not_a_directory(tmp_path, toy_tokenizer):
    for cache in (tmp_path / "cache", None):
        for threads in (1, 2):
            corpus, report = encode_corpus(
                ParallelText.lists([], []), toy_tokenizer, cache, threads=threads
            )
            assert (len(corpus), report, corpus.src_lengths.shape) == (0, CleanReport(), (0,))
    text = ParallelText.lists(["the dog ."], ["der Hund ."])
    key = encode_corpus(text, toy_tokenizer, tmp_path / "k")[0].key
    # a file, a dangling link
    for make in (lambda p: p.write_text("x"), lambda p: os.symlink(tmp_path / "nowhere", p)):
        import shutil

        shutil.rmtree(tmp_path / "k" / key)
        make(tmp_path / "k" / key)
        corpus, _ = encode_corpus(text, toy_tokenizer, tmp_path / "k")
        assert (
            toy_tokenizer.tgt.decode(corpus.tgt(0).tolist()) == "der Hund ."
            and (tmp_path / "k" / key / "report.json").is_file()
        )


def test_uncached_encodings_killed_midway_are_swept(tmp_path, toy_tokenizer, monkeypatch):
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # a killed run's copy (no such process)
    dead = tmp_path / f"nmt-encode.tmp-{encoded_module._HOST}-999999999-x"
    dead.mkdir()
    alive = tmp_path / f"nmt-encode.tmp-{encoded_module._HOST}-{os.getpid()}-y"
    alive.mkdir()
    other = tmp_path / "someone-else.tmp-x-999999999-z"  # not nmt's: never touched
    other.mkdir()
    encode_corpus(ParallelText.lists(["a ."], ["b ."]), toy_tokenizer, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, other.name])


def test_a_script_without_a_main_guard_encodes_like_any_other(tmp_path, toy_tokenizer):
    """Encoding starts no process, so nothing imports the calling script again (as
    multiprocessing's spawn does): a script without an ``if __name__ == "__main__":`` guard
    works."""
    import subprocess
    import sys

    src, tgt = read_parallel(TOY / "valid.en", TOY / "valid.de")
    (tmp_path / "t.en").write_text("\n".join(src) + "\n")
    (tmp_path / "t.de").write_text("\n".join(tgt) + "\n")
    toy_tokenizer.save(tmp_path)
    script = tmp_path / "noguard.py"
    script.write_text(
        "from pathlib import Path\nfrom nmt.data.encoded import encode_corpus\n"
        "from nmt.data.corpus import ParallelText\nfrom nmt.data.tokenizer import Tokenizer\n"
        f"d = Path({str(tmp_path)!r})\n"
        "print(encode_corpus(ParallelText.files(d / 't.en', d / 't.de'), Tokenizer.load_dir(d), "
        "None, threads=2, chunk_lines=100)[1].total)\n"
    )
    proc = subprocess.run(
        [sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert (proc.returncode, proc.stdout.strip()) == (0, "500"), proc.stderr


def test_a_full_disk_while_encoding_is_one_error_and_leaves_nothing(
    tmp_path, toy_tokenizer, monkeypatch
):
    import errno
    import tempfile

    text = ParallelText.lists(["the dog ."], ["der Hund ."])

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    # the disk fills while the ids are written
    monkeypatch.setattr(encoded_module, "_write_ids", full)
    with pytest.raises(
        DataError,
        match=r"cannot write the encoded corpus under .*cache \(no space left on the device\); "
        r"free some space or set data.cache_dir elsewhere$",
    ):
        encode_corpus(text, toy_tokenizer, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []  # neither a cache nor a temporary
    # a read-only place wants another directory, not space
    monkeypatch.setattr(encoded_module, "_write_ids", read_only)
    with pytest.raises(
        DataError,
        match=r"\(read-only file system\); set data.cache_dir to a directory nmt can write$",
    ):
        encode_corpus(text, toy_tokenizer, tmp_path / "cache")
    monkeypatch.setattr(tempfile, "mkdtemp", full)  # no room even for the temporary directory
    with pytest.raises(
        DataError,
        match=r"no space left on the device\); free some space or set data.cache_dir elsewhere",
    ):
        encode_corpus(text, toy_tokenizer, tmp_path / "cache")


def test_pairs_the_model_cannot_see_are_dropped_and_counted(tmp_path, toy_tokenizer):
    """A side of no piece but UNK and the bare word boundary (an emoji, punctuation or digits
    outside the vocabulary, another script) teaches the model to invent: dropped and counted,
    on either side; a line with one known piece besides is kept."""
    from nmt.data.tokenizer import UNK, unknown_only

    src = ["the dog .", "😀", "!!!", "42", "日本語", "the 😀 dog .", "a cat .", "\x00\x85"]
    tgt = ["der Hund .", "Hund", "Katze", "Haus", "Mann", "der Hund .", "😀 !!!", "x"]
    src_ids, tgt_ids, reason = encode_rows(toy_tokenizer, src, tgt, max_len=100, max_len_ratio=3.0)
    assert [toy_tokenizer.src.id_to_piece(i) for i in src_ids[1]] == [
        "▁",
        "<unk>",
    ] and UNK in src_ids[5]
    assert [unknown_only(ids, toy_tokenizer.src) for ids in src_ids] == [
        False,
        True,
        True,
        True,
        True,
        False,
        False,
        False,
    ]
    assert unknown_only(tgt_ids[6], toy_tokenizer.tgt) and not unknown_only([], toy_tokenizer.tgt)
    # NUL and NEL are spaces now: that source is empty
    assert reason.tolist() == [0, 4, 4, 4, 4, 0, 4, 1]
    kept = clean_pairs(toy_tokenizer, src, tgt)
    assert kept.src == ["the dog .", "the 😀 dog ."] and kept.report == CleanReport(
        total=8, empty=1, unknown=5
    )
    assert "5 with a side of unknown pieces only" in str(kept.report) and kept.report.kept == 2
    corpus, report = encode_corpus(
        ParallelText.lists(src, tgt), toy_tokenizer, tmp_path, max_len=100, max_len_ratio=3.0
    )
    assert report == kept.report and _examples(corpus) == list(zip(kept.src_ids, kept.tgt_ids))


def _flip(path: Path, data: bytes, new: bytes) -> None:
    """Overwrite the first occurrence of ``data`` in the file with ``new`` (same length)."""
    content = path.read_bytes()
    at = content.index(data)
    path.write_bytes(content[:at] + new + content[at + len(new) :])


def test_a_damaged_cache_is_found_by_its_checksum_and_encoded_again(
    tmp_path, toy_tokenizer, caplog
):
    """A changed id (in range or not) or offset in ids.arrow would train on altered pairs or crash
    at some later step: the CRC-32 written with the cache finds it, in one line of warning."""
    src, tgt = read_parallel(TOY / "valid.en", TOY / "valid.de")
    text = ParallelText.lists(src, tgt)
    first, _ = encode_corpus(text, toy_tokenizer, tmp_path)
    expected, arrow = _examples(first), tmp_path / first.key / "ids.arrow"
    ids = first.src(0)
    offsets = np.cumsum([0, *(len(first.src(i)) for i in range(3))]).astype(np.int32)
    del first
    damages = {
        "an id in range": (ids.tobytes(), np.array([ids[1], *ids[1:]], dtype=np.int32).tobytes()),
        "an id out of range": (
            ids.tobytes(),
            np.array([99_999, *ids[1:]], dtype=np.int32).tobytes(),
        ),
        "an offset": (
            offsets.tobytes(),
            np.array([0, offsets[1] + 1, *offsets[2:]], dtype=np.int32).tobytes(),
        ),
    }
    for what, (data, new) in damages.items():
        _flip(arrow, data, new)
        caplog.clear()
        again, _ = encode_corpus(text, toy_tokenizer, tmp_path)
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert (
            len(warnings) == 1 and "is damaged (ids.arrow does not match the CRC-32" in warnings[0]
        ), what
        assert _examples(again) == expected, what
        del again
    caplog.clear()
    encode_corpus(text, toy_tokenizer, tmp_path)
    assert not caplog.records  # the cache written again is whole


@given(lines=st.lists(st.lists(st.sampled_from([0, 1, 2, 3, 5, 9, 255]), max_size=5), max_size=8))
def test_unknown_only_of_one_line_agrees_with_the_cleaning_rule(toy_tokenizer, lines):
    from nmt.data.clean import flatten, unknown_only_lines
    from nmt.data.tokenizer import WORD_BOUNDARY, unknown_only

    boundary = toy_tokenizer.src.piece_to_id(WORD_BOUNDARY)
    assert unknown_only_lines(flatten(lines), boundary).tolist() == [
        unknown_only(ids, toy_tokenizer.src) for ids in lines
    ]


@given(
    pairs=st.lists(st.tuples(AWKWARD_LINES, AWKWARD_LINES), max_size=12),
    chunk_lines=st.integers(1, 5),
)
@example(pairs=[("the dog .", "\x00")], chunk_lines=1)
def test_the_cache_gives_back_exactly_what_was_encoded(toy_tokenizer, pairs, chunk_lines):
    """What encode_rows keeps, in order, is what a fresh cache returns and what it returns
    when opened again; the counts too."""
    import tempfile

    src, tgt = [s for s, _ in pairs], [t for _, t in pairs]
    src_ids, tgt_ids, reason = encode_rows(toy_tokenizer, src, tgt, max_len=20, max_len_ratio=3.0)
    kept = [(s, t) for s, t, r in zip(src_ids, tgt_ids, reason) if r == 0]
    with tempfile.TemporaryDirectory() as cache:
        text = ParallelText.lists(src, tgt)
        written, report = encode_corpus(
            text, toy_tokenizer, Path(cache), 20, 3.0, chunk_lines=chunk_lines
        )
        read, report_read = encode_corpus(text, toy_tokenizer, Path(cache), 20, 3.0, threads=2)
        assert _examples(written) == _examples(read) == kept and report == report_read == report_of(
            reason
        )
        assert written.src_lengths.tolist() == [
            len(s) + 1 for s, _ in kept
        ] and read.tgt_lengths.tolist() == [len(t) + 1 for _, t in kept]
        del written, read


@given(
    pairs=st.lists(st.tuples(AWKWARD_LINES, AWKWARD_LINES), max_size=12),
    chunk_lines=st.integers(1, 5),
    alpha=st.sampled_from([0.0, 0.1, 0.5, 0.9]),
    seed=st.integers(0, 2**32 - 1),
)
@example(pairs=[("the dog runs .", "der hund läuft .")] * 4, chunk_lines=3, alpha=0.5, seed=0)
def test_a_sampled_epoch_keeps_the_caches_pairs_and_spells_the_same_text(
    toy_tokenizer, pairs, chunk_lines, alpha, seed
):
    """tokenizer.subword_alpha cuts the pairs the cache keeps, in its order, into pieces that
    spell the same text (the prefix first); the cut is a function of the seed alone (not of the
    threads), and with alpha 0 it is the cache's exactly."""
    src, tgt = [s for s, _ in pairs], [t for _, t in pairs]
    text, prefix = ParallelText.lists(src, tgt), (7,)
    best, _ = encode_corpus(
        text, toy_tokenizer, None, 20, 3.0, chunk_lines=chunk_lines, src_prefix=prefix
    )
    sampled = sample_corpus(
        text,
        toy_tokenizer,
        alpha,
        (seed, 3),
        20,
        3.0,
        threads=1,
        chunk_lines=chunk_lines,
        src_prefix=prefix,
    )
    again = sample_corpus(
        text,
        toy_tokenizer,
        alpha,
        (seed, 3),
        20,
        3.0,
        threads=2,
        chunk_lines=chunk_lines,
        src_prefix=prefix,
    )
    assert _examples(sampled) == _examples(again) and len(sampled) == len(best)
    decode = toy_tokenizer.src.decode
    for (s, t), (best_s, best_t) in zip(_examples(sampled), _examples(best)):
        assert s[0] == 7 and (decode(s[1:]), decode(t)) == (decode(best_s[1:]), decode(best_t))
    if alpha == 0.0:
        assert _examples(sampled) == _examples(best)


def test_subword_sampling_cuts_words_differently_by_seed_and_more_finely_with_alpha(toy_tokenizer):
    """BPE-dropout (Provilkov et al. 2020): a higher alpha drops more merges, so more pieces;
    another seed, another cut; alpha near 1 leaves single characters."""
    src, tgt = read_parallel(TOY / "valid.en", TOY / "valid.de")
    text = ParallelText.lists(src[:200], tgt[:200])
    pieces = {}
    for alpha in (0.0, 0.1, 0.5):
        corpus = sample_corpus(text, toy_tokenizer, alpha, (1,))
        pieces[alpha] = int(corpus.src_lengths.sum() + corpus.tgt_lengths.sum())
    assert pieces[0.0] < pieces[0.1] < pieces[0.5]
    one, other = (sample_corpus(text, toy_tokenizer, 0.1, (seed,)) for seed in (1, 2))
    assert _examples(one) != _examples(other)
    word = ParallelText.lists(["dog"], ["hund"])
    chars = sample_corpus(word, toy_tokenizer, 0.999, (1,))
    assert [toy_tokenizer.src.id_to_piece(i) for i in chars.src(0).tolist()] == [
        "\u2581",
        "d",
        "o",
        "g",
    ]


@given(
    lengths=st.lists(st.integers(0, 4), max_size=6),
    shift=st.integers(-2, 2),
    cut=st.integers(0, 3),
    parts=st.lists(st.integers(0, 6), min_size=1, max_size=3),
)
def test_a_stored_cut_is_whole_or_refused(lengths, shift, cut, parts):
    """EncodedCorpus.from_arrays (a checkpoint's epoch cut) gives a corpus whose every example
    reads inside its ids, or raises ValueError: never one that fails later, mid-epoch."""
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    ids = np.arange(int(offsets[-1]) + shift if offsets[-1] + shift >= 0 else 0, dtype=np.int32)
    arrays = {
        "src_ids": ids,
        "src_offsets": offsets,
        "tgt_ids": ids[cut:],
        "tgt_offsets": offsets,
        "parts": np.asarray(parts),
    }
    whole = len(ids) == len(ids[cut:]) == offsets[-1] and sum(parts) == len(lengths)
    try:
        corpus = EncodedCorpus.from_arrays(arrays)
    except ValueError:
        assert not whole
        return
    assert whole
    assert [corpus.src(i).tolist() for i in range(len(corpus))] == [
        ids[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])
    ]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lines=st.lists(
        st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp")), max_size=20),
        min_size=1,
        max_size=6,
    )
)
def test_bzip2_and_xz_inputs_read_as_gzip_does_and_other_compressions_are_named(
    tmp_path_factory, lines
):
    """Input compressed with bzip2, xz or zstd was diagnosed as Latin-1 text ("invalid UTF-8 ...
    iconv -f latin1")."""
    import bz2
    import lzma

    tmp = tmp_path_factory.mktemp("packed")
    text = "".join(line + "\n" for line in lines).encode("utf-8")
    for name, pack in (
        ("t.gz", gzip.compress),
        ("t.bz2", bz2.compress),
        ("t.xz", lzma.compress),
        ("t.xz-named-txt.txt", lzma.compress),
    ):
        (tmp / name).write_bytes(pack(text))
        # by content, whatever the name
        assert read_lines(tmp / name) == lines and count_lines(tmp / name) == len(lines)
    for kind, data in (
        ("zstd", b"\x28\xb5\x2f\xfd" + bytes(20)),
        ("zip", b"PK\x03\x04" + bytes(20)),
        ("7z", b"7z\xbc\xaf\x27\x1c" + bytes(20)),
    ):
        (tmp / f"t.{kind}").write_bytes(data)
        with pytest.raises(
            DataError,
            match=rf"t\.{kind}: {kind}-compressed data, which nmt does not read; decompress it "
            r"first",
        ):
            read_lines(tmp / f"t.{kind}")
    with pytest.raises(
        DataError,
        match=r"<stdin>: xz-compressed data; decompress it on the way in \(xz -dc FILE \| \.\.\.\)",
    ):
        list(stream_buffers(io.BytesIO(lzma.compress(text)), 4))


def test_a_split_both_plain_and_gzipped_is_read_plain_with_a_warning(tmp_path, caplog):
    """train.en beside train.en.gz used the plain file without a word."""
    from nmt.data.corpus import find_split_file

    (tmp_path / "train.en").write_text("plain\n")
    (tmp_path / "train.en.gz").write_bytes(gzip.compress(b"packed\n"))
    with caplog.at_level("WARNING", logger="nmt.data"):
        assert find_split_file(tmp_path, "train", "en") == tmp_path / "train.en"
    assert f"{tmp_path} holds both train.en and train.en.gz; reading train.en" in caplog.text


def _blocks(lines: list[list[int]], cuts: list[int], start: int) -> list:
    """``lines`` as encoded blocks split before each line index in ``cuts``, each block's
    offsets starting at ``start`` (a block taken from the middle of a larger array)."""
    bounds = sorted({0, len(lines), *(c for c in cuts if 0 < c < len(lines))})
    blocks = []
    for a, b in zip(bounds, bounds[1:]):
        chunk = lines[a:b]
        offsets = start + np.concatenate([[0], np.cumsum([len(x) for x in chunk])])
        ids = np.full(int(offsets[-1]) + 3, 7, dtype=np.int32)  # stray ids around the block
        ids[start : offsets[-1]] = [i for x in chunk for i in x]
        blocks.append((ids, offsets.astype(np.int64)))
    return blocks


_LINES = st.lists(st.lists(st.integers(0, 40), max_size=5), min_size=1, max_size=30)


@settings(max_examples=150, deadline=None)
@given(_LINES, st.lists(st.integers(0, 30), max_size=4), st.integers(0, 5))
@example([[1, 2], [2, 1], [1, 2], [], [0], [0, 0]], [], 0)
def test_line_hashes_are_equal_exactly_for_equal_lines_whatever_the_blocks(lines, cuts, start):
    from nmt.data.overlap import duplicate_pairs, line_hashes, pair_hashes

    hashes = line_hashes(_blocks(lines, cuts, start))
    assert hashes.dtype == np.uint64 and len(hashes) == len(lines)
    assert np.array_equal(hashes, line_hashes(_blocks(lines, [], 0)))
    for i, a in enumerate(lines):
        for j, b in enumerate(lines):
            assert (hashes[i] == hashes[j]) == (a == b), (a, b)
    # pairs: equal exactly when both sides are; duplicates as a set counts them
    tgt = lines[::-1]
    pairs = pair_hashes(hashes, line_hashes(_blocks(tgt, cuts, 0)))
    keys = [(tuple(s), tuple(t)) for s, t in zip(lines, tgt)]
    assert duplicate_pairs(pairs) == len(keys) - len(set(keys))
    # a pair is not its swap, nor its source with another target
    swapped = pair_hashes(line_hashes(_blocks(tgt, [], 0)), hashes)
    for k, (s, t) in enumerate(keys):
        assert (pairs[k] == swapped[k]) == (s == t)


def test_overlap_counts_validation_pairs_and_sources_found_in_training():
    from nmt.data.overlap import Overlap, line_hashes, pair_hashes

    def hashes(src, tgt):
        s = line_hashes(_blocks(src, [], 0))
        return s, pair_hashes(s, line_hashes(_blocks(tgt, [], 0)))

    train = hashes([[1], [2], [3]], [[4], [5], [6]])
    # pair (1,4) is a training pair; (2,9) shares only its source; (8,8) is new
    overlap = Overlap.of(train, hashes([[1], [2], [8]], [[4], [9], [8]]))
    assert (overlap.pairs, overlap.sources, overlap.total) == (1, 2, 3)
    assert str(overlap) == "in the training pairs: 1 pairs, 2 sources"


def test_a_validation_set_inside_the_training_data_is_warned_and_duplicates_logged(
    tmp_path, caplog
):
    from nmt.config import load_config
    from nmt.training.opening import prepare

    train_en = (TOY / "train.en").read_text(encoding="utf-8").splitlines()
    train_de = (TOY / "train.de").read_text(encoding="utf-8").splitlines()
    data = tmp_path / "data"
    data.mkdir()
    # three exact copies of pair 0 added to training; validation: 5 training pairs, 5 not
    (data / "train.en").write_text("\n".join(train_en + [train_en[0]] * 3) + "\n", "utf-8")
    (data / "train.de").write_text("\n".join(train_de + [train_de[0]] * 3) + "\n", "utf-8")
    valid_en = (TOY / "valid.en").read_text(encoding="utf-8").splitlines()[:5]
    valid_de = (TOY / "valid.de").read_text(encoding="utf-8").splitlines()[:5]
    (data / "valid.en").write_text("\n".join(train_en[10:15] + valid_en) + "\n", "utf-8")
    (data / "valid.de").write_text("\n".join(train_de[10:15] + valid_de) + "\n", "utf-8")
    known = set(zip(train_en, train_de))
    duplicates = len(train_en) + 3 - len(known)
    inside = sum(p in known for p in zip(train_en[10:15] + valid_en, train_de[10:15] + valid_de))
    cfg = load_config(
        None,
        [f"data.dir={data}", "tokenizer.vocab_size=120", "data.workers=1", "data.max_len=1000"],
    )
    with caplog.at_level("INFO"):
        prepare(cfg, tmp_path, None, write=True)
    messages = [r.getMessage() for r in caplog.records]
    assert any(f"; {duplicates} pairs repeat an earlier one;" in m for m in messages), messages
    assert any(f"; in the training pairs: {inside} pairs, " in m for m in messages), messages
    warned = [m for m in messages if "are training pairs too" in m]
    assert len(warned) == 1 and warned[0].startswith(f"warning: {inside} of the 10 validation")
