import copy

import pytest
import torch
import torch.nn.functional as F
from conftest import FORMAT_CHARACTERS, NO_TEXT_LINES, random_sources
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from nmt.config import ConfigError, DecodeConfig
from nmt.data.tokenizer import PAD
from nmt.decode.search import translate_batch
from nmt.runtime.device import (
    Int8Linear,
    PackedLinear,
    onednn_linear_works,
    resolve_dtype,
    to_dtype,
)


def test_int8_quantizes_every_linear_layer_and_keeps_scores_close(model):
    float_model = copy.deepcopy(model)
    int8 = to_dtype(model, resolve_dtype("int8", torch.device("cpu")))
    assert not any(type(m) is nn.Linear for m in int8.modules())
    quantized = [m for m in int8.modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
    # encoder layer: qkv, out, fc1, fc2; decoder layer: also q, kv, out of cross-attention; and the
    # tied output matrix's copy
    assert len(quantized) == 2 * 4 + 2 * 7 + 1 and int8.output_projection in quantized
    # the embeddings (and the tie) keep float32
    assert torch.equal(int8.tgt_embed.weight, float_model.tgt_embed.weight)
    assert all(m.weight().qscheme() == torch.per_channel_affine for m in quantized)
    assert all(type(m) is Int8Linear for m in quantized)
    x = torch.randn(3, 2, model.cfg.d_model)
    with torch.inference_mode():  # the short call computes what the parent's does, to the bit
        assert all(
            torch.equal(m(x), torch.ao.nn.quantized.dynamic.Linear.forward(m, x))
            for m in quantized
            if m.in_features == x.size(-1)
        )
    src = random_sources([6, 11], seed=4)
    with torch.inference_mode():
        expected = float_model.decode(torch.full((2, 1), 2), *float_model.encode(src)).log_softmax(
            -1
        )
        got = int8.decode(torch.full((2, 1), 2), *int8.encode(src)).log_softmax(-1)
    assert got.dtype == torch.float32
    # int8 weights and activations: close, not equal
    assert float((got - expected).abs().max()) < 0.05
    (hyps, _) = translate_batch(
        int8,
        src,
        DecodeConfig(beam_size=3, length_penalty=0.6, max_len_a=1.0, max_len_b=4, n_best=2),
    )
    assert len(hyps) == 2 and hyps[0].score >= hyps[1].score


def test_int8_names_its_limits():
    with pytest.raises(
        ConfigError, match="--dtype must be float32, bfloat16, float16, int8 or auto, got 'int4'"
    ):
        resolve_dtype("int4", torch.device("cpu"), "--dtype")
    with pytest.raises(ConfigError, match="--dtype int8 runs on the CPU only"):
        resolve_dtype("int8", torch.device("meta"), "--dtype")


def test_steering_segments_as_the_model_writes_and_heals_a_cut_word():
    from conftest import cached_tokenizer

    from nmt.data.tokenizer import EOS
    from nmt.decode.steering import FRAGMENT_DONE
    from nmt.translation.steering_text import steering

    tok = cached_tokenizer(200, lines=2000)
    pieces = tok.tgt_pieces
    cut = steering(tok, prefix="the do")
    # whole words are forced; the last, cut one is a fragment
    assert [pieces[i] for (i,) in cut.prefix] == ["\u2581the"]
    # what may spell "▁do": a piece that holds it (and maybe goes on), or begins it
    first = dict(cut.fragment[0])
    assert {pieces[i] for i, s in first.items() if s == FRAGMENT_DONE} == {
        p for p in pieces if p.startswith("\u2581do")
    }
    assert {pieces[i] for i, s in first.items() if s != FRAGMENT_DONE} == {
        p for p in pieces if "\u2581do".startswith(p) and p != "\u2581do"
    }
    assert len(first) > 1
    spaced = steering(tok, prefix="the dog ")
    assert [i for (i,) in spaced.prefix[:-1]] == tok.encode_tgt(["the dog"])[0]
    assert EOS in spaced.prefix[-1] and all(
        pieces[i].startswith("\u2581") for i in spaced.prefix[-1] if i != EOS
    )
    terms = steering(tok, constraints=["dog", "", " "], bans=["cat sees"])
    assert terms.constraints == (tuple(tok.encode_tgt(["dog"])[0]),) and terms.bans == (
        tuple(tok.encode_tgt(["cat sees"])[0]),
    )
    assert not steering(tok) and not steering(tok, prefix="  ")


def test_a_translation_starts_with_its_prefix_holds_its_terms_and_avoids_its_bans(model):
    from conftest import cached_tokenizer, tiny_config, translate_lines

    from nmt.core.model import Transformer
    from nmt.translation.steering_text import steering

    tok = cached_tokenizer(200, lines=2000)
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab_size=200, tgt_vocab_size=200)).eval()
    lines = ["the dog sees a cat .", "a man .", "the house is big ."]
    decode = DecodeConfig(beam_size=4, max_len_a=1.0, max_len_b=4, n_best=2)
    wishes = [
        steering(tok, prefix="the big ", constraints=["house"]),
        steering(tok),
        steering(tok, prefix="a wom", bans=["man"]),
    ]
    results = translate_lines(model, tok, lines, decode, torch.device("cpu"), steering=wishes)
    texts = [[t for t in tok.decode_tgt([h.tokens for h in hyps])] for hyps in results]
    assert all(t.startswith("the big ") and "house" in t for t in texts[0])
    (banned,) = wishes[2].bans
    # beyond the prefix, which the user wrote
    generated = [h.tokens[len(wishes[2].prefix) :] for h in results[2]]
    assert all(t.startswith("a wom") for t in texts[2])
    assert not any(g[j : j + len(banned)] == list(banned) for g in generated for j in range(len(g)))
    assert texts[1] == [
        tok.decode_tgt([h.tokens])[0]
        for h in translate_lines(model, tok, lines[1:2], decode, torch.device("cpu"))[0]
    ]


def test_a_line_of_only_unknown_characters_is_not_translated_into_an_invented_sentence(caplog):
    """A source of only UNK pieces (an emoji, another script) was translated anyway into one
    invented sentence, with no warning."""
    from collections import Counter

    from conftest import cached_tokenizer, tiny_config, translate_lines

    from nmt.core.model import Transformer

    tok = cached_tokenizer(200, lines=2000)
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab_size=200, tgt_vocab_size=200)).eval()
    lines = ["the dog .", "😀😀", "日本語", "", "the cat ."]
    skipped = Counter()
    with caplog.at_level("WARNING", logger="nmt.translate"):
        results = translate_lines(
            model,
            tok,
            lines,
            DecodeConfig(beam_size=2, max_len_b=3),
            torch.device("cpu"),
            skipped=skipped,
        )
    assert [bool(r) for r in results] == [True, False, False, False, True] and skipped == Counter(
        unknown=2
    )
    assert [r.getMessage()[:22] for r in caplog.records] == [
        "warning: input line 2 ",
        "warning: input line 3 ",
    ]
    assert "only text the model's vocabulary lacks" in caplog.text


@pytest.fixture(scope="module")
def format_model():
    from conftest import format_tokenizer, tiny_config

    from nmt.core.model import Transformer

    torch.manual_seed(0)
    return Transformer(
        tiny_config(src_vocab_size=300, tgt_vocab_size=300)
    ).eval(), format_tokenizer()


def test_format_characters_the_tokenizer_kept_are_pieces_a_model_would_read(format_model):
    _, tok = format_model
    kept = [c for c in FORMAT_CHARACTERS if tok.encode_src([c])[0]]
    # U+200E, U+200F, U+FEFF, U+061C and U+200B are removed
    assert kept == ["\u202e", "\u202d", "\u2066", "\u2069", "\u00ad", "\u200d", "\u2060"]
    # one piece: a word to the model
    assert [tok.src.id_to_piece(i) for i in tok.encode_src(["\u202e"])[0]] == ["▁\u202e"]


SENTENCES = st.sampled_from(["the dog .", "a cat sees the man ."]).map(lambda line: (line, True))


@given(
    marked=st.lists(
        st.one_of(NO_TEXT_LINES.map(lambda line: (line, False)), SENTENCES), min_size=1, max_size=8
    )
)
def test_a_line_with_no_text_is_not_translated_into_an_invented_sentence(
    format_model, caplog, marked
):
    """A line of only U+202E, which the training text held at the start of some lines, was
    translated into an invented sentence: it was one piece of its own, neither blank nor unknown. A
    line of no character but format, control and space characters now gives an empty output line,
    with a warning if it is not blank, whatever the tokenizer made of it."""
    from collections import Counter

    from conftest import translate_lines

    model, tok = format_model
    lines, texts = [line for line, _ in marked], [text for _, text in marked]
    skipped = Counter()
    caplog.clear()
    with caplog.at_level("WARNING", logger="nmt.translate"):
        results = translate_lines(
            model,
            tok,
            lines,
            DecodeConfig(beam_size=2, max_len_b=3),
            torch.device("cpu"),
            skipped=skipped,
        )
    assert [bool(r) for r in results] == texts
    warned = [i + 1 for i, line in enumerate(lines) if not texts[i] and line.strip()]
    assert skipped == Counter(no_text=len(warned)) if warned else skipped == Counter()
    messages = [r.getMessage() for r in caplog.records]
    assert [int(m.split()[3]) for m in messages] == warned and all(
        "has no text to translate (only format, control or space characters, or ones the "
        "tokenizer reads as spaces, such as U+" in m
        for m in messages
    )


@pytest.mark.skipif(not onednn_linear_works(), reason="this torch build has no oneDNN linear")
@pytest.mark.parametrize("min_rows", [1, 10**9])
def test_float32_on_the_cpu_packs_every_linear_layer_and_decodes_as_the_dense_model(
    model, monkeypatch, min_rows
):
    """Every linear layer and the tied output matrix are packed (through oneDNN from ``min_rows``
    rows on, MKL's ``F.linear`` below: both paths are run), the state_dict keeps its names and
    values, and the search keeps the exactness of the production path: cached = recompute =
    tiled, a sentence alone = in a padded batch, and the same hypotheses as the unpacked model."""
    monkeypatch.setattr("nmt.runtime.device.PACKED_MIN_ROWS", min_rows)
    dense = copy.deepcopy(model)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    packed = to_dtype(model, torch.float32)
    assert isinstance(packed.output_projection, PackedLinear) and dense.output_projection is None
    assert not any(type(m) is nn.Linear for m in packed.modules())
    assert sum(isinstance(m, PackedLinear) for m in packed.modules()) == 2 * 4 + 2 * 7 + 1
    after = packed.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    h = torch.randn(5, 1, model.cfg.d_model)
    with torch.inference_mode():
        assert torch.allclose(packed.project(h), F.linear(h, dense.tgt_embed.weight), atol=1e-5)
        layer, reference = packed.decoder[0].ffn.fc1, dense.decoder[0].ffn.fc1
        for rows in (1, 3, 40):
            x = torch.randn(rows, 2, model.cfg.d_model)
            assert torch.allclose(layer(x), reference(x), atol=1e-5)
    src = random_sources([1, 2, 7, 19, 33], seed=5)
    decode = DecodeConfig(beam_size=4, length_penalty=0.6, max_len_a=0.5, max_len_b=6, n_best=2)
    runs = {
        name: translate_batch(packed, src, decode, step=name)
        for name in ("dynamic", "tiled", "recompute")
    }
    runs["dense"] = translate_batch(dense, src, decode)
    for name in ("tiled", "recompute", "dense"):
        for ref, got in zip(runs[name], runs["dynamic"]):
            assert [h.tokens for h in got] == [h.tokens for h in ref], name
            assert [h.score for h in got] == pytest.approx([h.score for h in ref], abs=1e-5), name
    for i in range(src.size(0)):
        n = int((src[i] != PAD).sum())
        alone = translate_batch(packed, src[i : i + 1, :n], decode)[0]
        assert [h.tokens for h in alone] == [h.tokens for h in runs["dynamic"][i]]
    with torch.enable_grad():  # autograd falls back to the dense matrices
        x = torch.randn(2, model.cfg.d_model, requires_grad=True)
        packed.project(x).sum().backward()
        assert torch.allclose(x.grad, dense.tgt_embed.weight.sum(0).expand(2, -1), atol=1e-5)
        y = torch.randn(40, model.cfg.d_model)
        # the layer's weight requires grad: the dense path records it
        packed.decoder[0].ffn.fc1(y).sum().backward()
        assert torch.allclose(
            packed.decoder[0].ffn.fc1.weight.grad, y.sum(0).expand(model.cfg.d_ff, -1), atol=1e-4
        )


def test_int8_per_matrix_weights_when_asked(model):
    """``per_channel=False``: one scale per weight matrix (what ``scripts/bench_decode.py
    --int8-weights per-tensor`` measures)."""
    int8 = to_dtype(model, torch.qint8, per_channel=False)
    quantized = [m for m in int8.modules() if isinstance(m, torch.ao.nn.quantized.dynamic.Linear)]
    assert len(quantized) == 2 * 4 + 2 * 7 + 1 and all(
        m.weight().qscheme() == torch.per_tensor_affine for m in quantized
    )


def _cut_words(tok):
    """Words the target vocabulary holds as one piece whose beginnings it cuts into two or more
    (``▁Lehr`` as ``▁L ehr``)."""
    found = []
    for piece in tok.tgt_pieces:
        word = piece[1:]
        if piece.startswith("\u2581") and len(word) > 2 and word.isalpha():
            cuts = [k for k in range(1, len(word)) if len(tok.encode_tgt([word[:k]])[0]) > 1]
            if cuts:
                found.append((word, cuts))
    return found


@settings(max_examples=20, deadline=None)
@given(data=st.data())
def test_a_prefix_ending_inside_a_word_lets_the_model_finish_it_however_the_fragment_was_cut(
    data,
):
    """`zwei Lehr` (cut `▁L ehr`) gave `zwei Lehr sagen…`: the pieces the fragment was cut into were
    forced, so the model could not write `▁Lehrer`, the one piece its vocabulary has for the
    word."""
    from conftest import cached_tokenizer, tiny_config

    from nmt.config import DecodeConfig
    from nmt.core.model import Transformer
    from nmt.translation.inference import Decoding, Inference
    from nmt.translation.steering_text import steering

    tok = cached_tokenizer(300, 3000, german=True)
    word, cuts = data.draw(st.sampled_from(_cut_words(tok)))
    cut = data.draw(st.sampled_from(cuts))
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab_size=300, tgt_vocab_size=300)).eval()
    whole = tok.tgt_pieces.index("\u2581" + word)
    favour = torch.zeros(300)
    favour[whole] = 50.0  # the model would write the word in one piece, if it may
    model.project = lambda h: F.linear(h, model.tgt_embed.weight) + favour
    inference = Inference([model], tok, torch.device("cpu"))
    decode = DecodeConfig(beam_size=3, max_len_a=0.0, max_len_b=4)
    ((best, *_),) = inference.translate(
        ["the dog ."], Decoding(decode), [steering(tok, prefix="der " + word[:cut])]
    )
    assert best.tokens[:2] == [tok.encode_tgt(["der"])[0][0], whole], (
        word,
        cut,
        [tok.tgt_pieces[i] for i in best.tokens],
    )


def test_text_the_vocabulary_lacks_is_said_and_copied_where_an_unknown_piece_is_written(
    toy_tokenizer, monkeypatch, caplog
):
    """The toy vocabulary has no digits: a line with some is said, naming them; with replace_unk
    a model that writes UNK (here its scores pushed towards it) gets the attended source text
    written there, never ' ⁇ '."""
    import torch.nn.functional as F
    from conftest import tiny_config, translate_lines

    from nmt.core.model import Transformer
    from nmt.data.tokenizer import UNK
    from nmt.translation.inference import best_strings

    tok, vocab = toy_tokenizer, toy_tokenizer.tgt.get_piece_size()
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab_size=vocab, tgt_vocab_size=vocab)).eval()
    bias = torch.zeros(vocab)
    bias[UNK] = 6.0
    monkeypatch.setattr(model, "project", lambda h: F.linear(h, model.tgt_embed.weight) + bias)
    lines = ["the 3 dogs see 12345 cats .", "the dog sees a cat ."]
    decode = DecodeConfig(beam_size=2, max_len_a=0.0, max_len_b=4)
    with caplog.at_level("WARNING", logger="nmt.translate"):
        plain = translate_lines(model, tok, lines, decode)
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith(
        "warning: input line 1 has text the model's vocabulary lacks ('3', '12345')"
    )
    assert all(UNK not in h.tokens for hyps in plain for h in hyps)  # UNK is banned by default
    copied = translate_lines(model, tok, lines, decode, replace_unk=True)
    best = [hyps[0] for hyps in copied]
    assert all(h.tokens.count(UNK) == len(h.copied) > 0 for h in best)
    surfaces = set(tok.src_surfaces(lines[0])) | set(tok.src_surfaces(lines[1]))
    assert all(set(h.copied) <= surfaces for h in best)
    texts = best_strings(tok, copied)
    assert "⁇" not in "".join(texts) and any(c in texts[0] for c in best[0].copied if c)


def test_per_line_warnings_name_ten_lines_of_a_kind_then_count_the_rest(toy_tokenizer, caplog):
    """300 lines with digits the vocabulary lacks wrote 300 warnings; now the first ten of each
    kind are named (the tenth says the rest are counted) and, when the input ends, one line
    counts the rest. The hint to --replace-unk is left out where it is given."""
    from conftest import tiny_config

    from nmt.core.model import Transformer
    from nmt.errors import Capped
    from nmt.translation.inference import Decoding, Inference

    vocab = toy_tokenizer.tgt.get_piece_size()
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab_size=vocab, tgt_vocab_size=vocab)).eval()
    inference = Inference([model], toy_tokenizer, torch.device("cpu"))
    lines = [f"the {n} dogs ." for n in range(25)] + ["龍"] * 3  # 25 with digits; 3 unknown only
    decoding = Decoding(DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=2), replace_unk=True)
    with caplog.at_level("WARNING", logger="nmt.translate"):
        results = [
            r for _, chunk in inference.stream([lines[:7], lines[7:]], decoding) for r in chunk
        ]
    said = caplog.messages
    assert len(results) == 28 and [bool(r) for r in results] == [True] * 25 + [False] * 3
    digits = [m for m in said if "vocabulary lacks ('" in m and "has text" in m]
    assert [m.split()[3] for m in digits] == [str(n) for n in range(1, Capped.NAMED + 1)]
    assert digits[-1].endswith("; further lines like this are counted, not named")
    assert not any("--replace-unk" in m for m in digits)  # given already
    unknown_only = [m for m in said if "has only text the model's vocabulary lacks ('龍')" in m]
    assert len(unknown_only) == 3
    assert said[-1] == (
        f"warning: {25 - Capped.NAMED} more input line(s) not named above: text the model's "
        "vocabulary lacks"
    )
    assert len(said) == Capped.NAMED + 3 + 1
