import pytest
import torch
import torch.nn.functional as F
from conftest import TOY, random_sources
from hypothesis import given
from hypothesis import strategies as st

from nmt.config import DecodeConfig
from nmt.data.corpus import ParallelText
from nmt.data.tokenizer import BOS, EOS, UNK
from nmt.decode.search import translate_batch
from nmt.decode.steering import Steering
from nmt.translation.shortlist import Shortlist, ShortlistError, build, cooccurrence, rank

DECODE = DecodeConfig(beam_size=4, length_penalty=0.6, max_len_a=0.5, max_len_b=6, n_best=2)


def test_log_probs_are_the_log_softmax_over_the_columns_and_minus_infinity_elsewhere(model):
    ids = torch.tensor([EOS, 5, 9, 30])
    h = torch.randn(3, model.cfg.d_model)
    got = model.output_columns(ids).log_probs(h)
    logits = F.linear(h, model.tgt_embed.weight)
    assert torch.allclose(got[:, ids], logits[:, ids].log_softmax(-1), atol=1e-6)
    # normalised over the shortlist, as Marian's is
    assert torch.allclose(got[:, ids].exp().sum(-1), torch.ones(3))
    others = torch.ones(model.cfg.tgt_vocab_size, dtype=torch.bool)
    others[ids] = False
    assert torch.isneginf(got[:, others]).all()


def test_a_shortlist_of_the_whole_vocabulary_is_the_exact_search(model):
    src = random_sources([1, 4, 9, 17], seed=2)
    everything = torch.arange(model.cfg.tgt_vocab_size)
    exact = translate_batch(model, src, DECODE)
    for scorer in ("dynamic", "tiled", "recompute"):
        got = translate_batch(model, src, DECODE, step=scorer, columns=everything)
        for e, g in zip(exact, got):
            assert [h.tokens for h in g] == [h.tokens for h in e], scorer
            assert [h.score for h in g] == pytest.approx([h.score for h in e], abs=1e-5), scorer


@given(
    st.sets(st.integers(4, 39), min_size=1, max_size=12),
    st.lists(st.integers(1, 12), min_size=1, max_size=4),
    st.integers(1, 4),
    st.integers(0, 100),
)
def test_every_piece_generated_is_in_the_shortlist_and_the_cache_is_still_exact(
    model, allowed, lengths, beam, seed
):
    """Whatever the shortlist and the batch: nothing outside the columns is generated, and the
    cached search over them equals the recomputing and tiled references over the same columns."""
    columns = torch.tensor(sorted({EOS, *allowed}))
    src = random_sources(lengths, seed=seed)
    decode = DecodeConfig(beam_size=beam, length_penalty=0.6, max_len_a=0.5, max_len_b=5, n_best=1)
    runs = {
        name: translate_batch(model, src, decode, step=name, columns=columns)
        for name in ("dynamic", "tiled", "recompute")
    }
    for hyps in runs["dynamic"]:
        assert set(hyps[0].tokens) <= set(columns.tolist())
    for name in ("tiled", "recompute"):
        assert [h[0].tokens for h in runs[name]] == [h[0].tokens for h in runs["dynamic"]], name


def test_columns_hold_the_specials_the_sources_lists_and_what_steering_needs():
    shortlist = Shortlist(always=(7,), by_source={5: (10, 11), 6: (12,), 8: (13,)})
    steering = [
        Steering(prefix=((20,), (21, 22), (7, 30, 31))),
        Steering(constraints=((23, 24),), bans=((25,), (26, 27))),
    ]
    got = shortlist.columns([[5, 9], [5, 6]], steering)
    # 8 is no source: 13 stays out; a ban adds nothing; the step (21, 22) has no listed choice, so
    # both come in; the step (7, 30, 31) has 7 listed already, so it stays the choice.
    assert got.tolist() == sorted({BOS, EOS, UNK, 7, 10, 11, 12, 20, 21, 22, 23, 24})


def test_a_constraint_outside_the_shortlist_is_still_met(model):
    src = random_sources([6], seed=1)
    shortlist = Shortlist(always=tuple(range(4, 12)), by_source={})
    steer = [Steering(constraints=((33, 34),))]
    (hyps,) = translate_batch(
        model, src, DECODE, steering=steer, columns=shortlist.columns(src.tolist(), steer)
    )
    tokens = hyps[0].tokens
    assert hyps[0].unmet == 0 and any(tokens[i : i + 2] == [33, 34] for i in range(len(tokens) - 1))


def test_a_word_the_prefix_ends_inside_is_spelt_whatever_the_shortlist_lists(model):
    """A prefix cut inside a word leaves a fragment the output must spell in some way: its pieces
    join the columns, or no hypothesis could be written and the line came back empty."""
    src = random_sources([6], seed=1)
    shortlist = Shortlist(always=tuple(range(4, 12)), by_source={})
    # the fragment: 30 then 31 (done), or 32 alone (done)
    steer = [Steering(prefix=((5,),), fragment=(((30, 1), (32, -1)), ((31, -1),)))]
    columns = shortlist.columns(src.tolist(), steer)
    assert {30, 31, 32} <= set(columns.tolist())
    (hyps,) = translate_batch(model, src, DECODE, steering=steer, columns=columns)
    tokens = hyps[0].tokens
    assert tokens[0] == 5 and (tokens[1:3] == [30, 31] or tokens[1] == 32)


def test_cooccurrence_counts_sentence_pairs_and_dice_ranks_by_hand():
    # a piece twice in a sentence counts once
    pairs = [([1, 2, 2], [5, 6]), ([1], [5]), ([2, 3], [6, 7])]
    # two blocks: the merge is exercised
    keys, counts, src_counts, tgt_counts, n = cooccurrence(pairs, tgt_vocab=8, block=2)
    assert dict(zip((keys // 8 * 10 + keys % 8).tolist(), counts.tolist())) == {
        15: 2,
        16: 1,
        25: 1,
        26: 2,
        27: 1,
        36: 1,
        37: 1,
    }
    assert (
        src_counts.tolist() == [0, 2, 2, 1]
        and tgt_counts.tolist() == [0, 0, 0, 0, 0, 2, 2, 1]
        and n == 3
    )
    # Dice 2·c(s,t)/(c(s)+c(t)): (1,5) 1, (1,6) 0.5; (2,6) 1, (2,7) 2/3, (2,5) 0.5; (3,7) 1, (3,6)
    # 2/3.
    assert rank(keys, counts, src_counts, tgt_counts, 8, per_source=2) == {
        1: (5, 6),
        2: (6, 7),
        3: (7, 6),
    }
    # A longer list stops at what co-occurs with its own source, never running into the next
    # source's.
    assert rank(keys, counts, src_counts, tgt_counts, 8, per_source=10) == {
        1: (5, 6),
        2: (6, 7, 5),
        3: (7, 6),
    }


@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 6), max_size=5), st.lists(st.integers(0, 6), max_size=5)),
        max_size=12,
    ),
    st.integers(1, 10),
    st.integers(1, 4),
)
def test_each_list_holds_only_distinct_pieces_seen_with_its_source(pairs, per_source, block):
    keys, counts, src_counts, tgt_counts, n = cooccurrence(pairs, tgt_vocab=7, block=block)
    seen = {(s, t) for src, tgt in pairs for s in src for t in tgt}
    assert n == len(pairs) and dict(zip(keys.tolist(), counts.tolist())) == {
        s * 7 + t: sum(1 for src, tgt in pairs if s in src and t in tgt) for s, t in seen
    }
    for s, targets in rank(keys, counts, src_counts, tgt_counts, 7, per_source).items():
        assert (
            len(targets)
            == len(set(targets))
            == min(per_source, len({t for src, tgt in pairs if s in src for t in tgt}))
        )
        assert all((s, t) in seen for t in targets)


def test_build_on_the_toy_corpus_lists_the_translation_of_a_word(toy_tokenizer):
    shortlist = build(
        toy_tokenizer,
        ParallelText.files(TOY / "train.en", TOY / "train.de").pairs(),
        per_source=5,
        frequent=10,
    )
    piece = toy_tokenizer.src.piece_to_id
    tgt = toy_tokenizer.tgt_pieces
    assert len(shortlist.always) == 10 and tgt[shortlist.always[0]] not in ("<pad>", "<s>")
    assert (
        tgt[shortlist.by_source[piece("▁dog")][0]] == "▁Hund"
        and tgt[shortlist.by_source[piece("▁cat")][0]] == "▁Katze"
    )


def test_the_file_round_trips_in_ctranslate2_vocabulary_map_format(toy_tokenizer, tmp_path):
    shortlist = build(
        toy_tokenizer,
        ParallelText.files(TOY / "train.en", TOY / "train.de").pairs(),
        per_source=3,
        frequent=4,
    )
    path = tmp_path / "shortlist.txt"
    shortlist.write(path, toy_tokenizer)
    lines = path.read_text(encoding="utf-8").splitlines()
    # the empty source: always allowed
    assert lines[0].startswith("\t") and len(lines[0].split("\t")[1].split(" ")) == 4
    assert all(len(line.split("\t")) == 2 and " " not in line.split("\t")[0] for line in lines)
    assert Shortlist.read(path, toy_tokenizer) == shortlist


def test_sampling_ends_where_the_shortlist_leaves_no_piece(model):
    """Before its minimum length a sample may not end, and this shortlist allows nothing else:
    it ends there anyway (with score -inf) rather than draw a piece from outside the shortlist."""
    from nmt.decode.search import Sampling

    src = random_sources([5, 3], seed=7)
    decode = DecodeConfig(n_best=2, min_len=4, max_len_a=0.5, max_len_b=6)
    got = translate_batch(
        model, src, decode, sampling=Sampling(seed=3), columns=torch.tensor([BOS, EOS, UNK])
    )
    assert [h.tokens for hyps in got for h in hyps] == [[]] * 4 and all(
        h.log_prob == float("-inf") for hyps in got for h in hyps
    )


@pytest.mark.parametrize(
    "text,message",
    [
        ("▁dog ▁Hund\n", "line 1: no tab"),
        ("\t▁der\n▁the ▁dog\t▁Hund\n", "line 2: the source '▁the ▁dog' is an n-gram"),
        (
            "▁dog\t▁Hund ▁Katze ▁zzzz\n",
            "line 1: target piece '▁zzzz' is not in the model's vocabulary",
        ),
        ("\n\n▁zzzz\t▁Hund\n", "line 3: source piece '▁zzzz' is not in the model's vocabulary"),
        # lines end at \n only; the message shows U+2028 escaped
        ("▁dog\t▁Hund\u2028x\n▁zzzz\t▁Hund\n", "line 1: target piece '▁Hund.{6}x' is not"),
        (" \t▁Hund\n", "line 1: the source ' ' is only spaces"),
        ("", "the shortlist allows no target piece"),
        ("\n\n\t\n▁dog\t\n", "the shortlist allows no target piece"),
    ],
)
def test_a_bad_file_is_named_with_its_line(toy_tokenizer, tmp_path, text, message):
    path = tmp_path / "bad.txt"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ShortlistError, match=f"{path}[,:] {message}"):
        Shortlist.read(path, toy_tokenizer)


def test_a_byte_order_mark_and_crlf_line_ends_are_read_as_text_editors_write_them(
    toy_tokenizer, tmp_path
):
    path = tmp_path / "bom.txt"
    path.write_bytes("\ufeff\t▁der\r\n▁dog\t▁Hund\r\n".encode())
    piece = toy_tokenizer.tgt.piece_to_id
    assert Shortlist.read(path, toy_tokenizer) == Shortlist(
        (piece("▁der"),), {toy_tokenizer.src.piece_to_id("▁dog"): (piece("▁Hund"),)}
    )


def test_an_empty_corpus_builds_nothing(toy_tokenizer):
    with pytest.raises(
        ShortlistError, match="no sentence pair with pieces on both sides among 2 pairs"
    ):
        build(toy_tokenizer, [("", "der Hund"), ("the dog", "")])


def test_an_unreadable_file_is_one_error(toy_tokenizer, tmp_path):
    (tmp_path / "latin1.txt").write_bytes("▁dog\t▁Hund\n".encode() + b"\xff\n")
    for path in (tmp_path / "missing.txt", tmp_path, tmp_path / "latin1.txt"):
        with pytest.raises(ShortlistError, match="cannot read the shortlist"):
            Shortlist.read(path, toy_tokenizer)
