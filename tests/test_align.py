import pytest
import torch
from conftest import random_sources

from nmt.data.tokenizer import BOS, PAD
from nmt.decode.search import Hypothesis
from nmt.translation.align import add_alignments, alignment_layer, format_alignment, hard_alignment


class ScriptedAttention:
    """A model whose cross-attention is fixed: 3 decoder layers, 2 heads. In the penultimate
    layer, head 0 looks at source piece (2 - j) and head 1 spreads evenly, so the heads'
    average peaks at 2 - j; the other layers look elsewhere (piece 0), to show which layer
    counts."""

    def cross_attention(self, src, tgt_in):
        batch, src_len = src.shape
        tgt_len = tgt_in.size(1)
        weights = torch.zeros(3, batch, 2, tgt_len, src_len)
        weights[:, :, :, :, 0] = 1.0
        weights[1] = 0.0
        weights[1, :, 1] = 1.0 / src_len
        for j in range(tgt_len):
            weights[1, :, 0, j, max(2 - j, 0)] = 1.0
        return weights


def test_alignment_of_a_model_whose_attention_is_known():
    assert alignment_layer(3) == 1 and alignment_layer(6) == 4  # the penultimate (0-based)
    assert alignment_layer(2) == 1 and alignment_layer(1) == 0  # fewer than three: the last
    assert alignment_layer(3, chosen=3) == 2 and alignment_layer(6, chosen=1) == 0
    sources = [[7, 8, 9], [7, 8, 9, 10]]
    results = [
        [Hypothesis([4, 5, 6], -1.0, -1.0), Hypothesis([4], -2.0, -2.0)],
        [Hypothesis([4, 5, 6, 7], -1.0, -1.0)],
    ]
    aligned = add_alignments([ScriptedAttention()], sources, results, torch.device("cpu"))
    assert [[h.alignment for h in hyps] for hyps in aligned] == [
        [((2, 0), (1, 1), (0, 2)), ((2, 0),)],
        [((2, 0), (1, 1), (0, 2), (0, 3))],
    ]
    assert [h.tokens for h in aligned[0]] == [[4, 5, 6], [4]] and aligned[0][1].score == -2.0
    assert format_alignment(aligned[0][0].alignment) == "2-0 1-1 0-2"


def test_hard_alignment_ignores_source_eos_and_padding():
    # (tgt_len, src_len): piece, piece, EOS, PAD
    attention = torch.tensor([[0.1, 0.2, 0.6, 0.1], [0.5, 0.1, 0.1, 0.3]])
    assert hard_alignment(attention, n_src=2, n_tgt=2) == ((1, 0), (0, 1))
    assert hard_alignment(attention, n_src=0, n_tgt=2) == ()


def test_cross_attention_probabilities_are_what_the_layer_uses(model):
    src = random_sources([5, 9], seed=1)
    tgt_in = torch.tensor([[BOS, 6, 7, 8], [BOS, 9, PAD, PAD]])
    captured = []
    layer = model.decoder[1].cross_attn
    handle = layer.register_forward_hook(
        lambda module, args, output: captured.append((args, output))
    )
    with torch.inference_mode():
        weights = model.cross_attention(src, tgt_in)  # (n_layers, batch, n_heads, tgt_len, src_len)
    handle.remove()
    assert weights.shape == (2, 2, 4, 4, 10)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 2, 4, 4))
    assert float(weights[:, 0, :, :, 6:].abs().max()) == 0.0  # sentence 0 has 6 real tokens
    (x, k, v, src_mask, *_), output = captured[0]
    heads = weights[1] @ v  # (batch, n_heads, tgt_len, head_dim)
    merged = heads.transpose(1, 2).reshape(2, 4, -1)
    assert torch.allclose(layer.out(merged), output, atol=1e-5)


def test_plot_attention_search_honours_every_decode_setting(monkeypatch):
    """``nmt plot attention`` once passed six settings positionally and lost ``allow_unk`` and the
    normalisation; the search now receives the decode settings whole."""
    import torch.nn.functional as F
    from conftest import TOY, tiny_config

    from nmt.cli.commands.plot import sentence_attention
    from nmt.config import DecodeConfig
    from nmt.core.model import Transformer
    from nmt.data.tokenizer import UNK, Tokenizer, train_sentencepiece
    from nmt.translation.inference import Inference

    sp = train_sentencepiece(
        (TOY / "train.en").read_text(encoding="utf-8").splitlines()[:500], vocab_size=100
    )
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab_size=100, tgt_vocab_size=100)).eval()
    favour_unk = torch.zeros(100)
    favour_unk[UNK] = 100.0
    monkeypatch.setattr(
        model, "project", lambda h: F.linear(h, model.tgt_embed.weight) + favour_unk
    )
    decode = DecodeConfig(beam_size=2, max_len_a=0.0, max_len_b=3)
    inference = Inference([model], Tokenizer(sp, sp), torch.device("cpu"))
    _, allowed, _ = sentence_attention(
        inference, "the dog", DecodeConfig(**{**vars(decode), "allow_unk": True}), ()
    )
    _, banned, weights = sentence_attention(inference, "the dog", decode, ())
    assert allowed == ["<unk>"] * 3 + ["</s>"]
    assert "<unk>" not in banned and weights.shape[:2] == (2, len(banned))


def test_plot_labels_get_a_font_that_has_their_characters(tmp_path, caplog):
    """A Japanese model's labels were drawn as empty boxes with 12 font warnings when no CJK font
    was installed."""
    import warnings

    import numpy as np
    from matplotlib import font_manager

    from nmt.tools.plot import label_fonts, plot_attention

    dejavu = font_manager.findfont("DejaVu Sans")
    mono = font_manager.findfont("DejaVu Sans Mono")
    assert label_fonts(["▁a", "dog", "Straße"]) is None  # the default font has them
    with caplog.at_level("WARNING", logger="nmt.plot"):
        assert (
            label_fonts(
                ["▁猫", "が"], candidates=[("DejaVu Sans Mono", mono), ("DejaVu Sans", dejavu)]
            )
            is None
        )
    (warning,) = [r.getMessage() for r in caplog.records]
    assert (
        "no installed font has 2 of the labels' characters (が猫...)" in warning
        and "fonts-noto-cjk" in warning
    )
    serif = font_manager.findfont("DejaVu Serif")  # it has U+2900 (⤀), which DejaVu Sans lacks
    assert label_fonts(
        ["a⤀"],
        candidates=[
            ("Nothing", str(tmp_path / "missing.ttf")),
            ("DejaVu Sans Mono", mono),
            ("DejaVu Serif", serif),
        ],
    ) == [
        "DejaVu Sans",
        "DejaVu Serif",
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning per missing glyph
        out = plot_attention(
            np.full((2, 3, 3), 1 / 3),
            ["▁猫", "が", "</s>"],
            ["▁a", "▁cat", "</s>"],
            tmp_path / "a.png",
            marked_layer=0,
        )
    assert out.stat().st_size > 1000


def test_the_alignment_layer_is_a_setting_that_reaches_the_alignments():
    from nmt.config import ConfigError, config_from_dict

    sources = [[7, 8, 9]]
    results = [[Hypothesis([4, 5, 6], -1.0, -1.0)]]
    # the first layer looks at piece 0
    chosen = add_alignments([ScriptedAttention()], sources, results, torch.device("cpu"), layer=1)
    assert chosen[0][0].alignment == ((0, 0), (0, 1), (0, 2))
    assert add_alignments([ScriptedAttention()], sources, results, torch.device("cpu"), layer=2)[0][
        0
    ].alignment == ((2, 0), (1, 1), (0, 2))
    with pytest.raises(
        ConfigError, match="decode.alignment_layer 4 is beyond the model's 3 decoder layers"
    ):
        config_from_dict({"model": {"n_decoder_layers": 3}, "decode": {"alignment_layer": 4}})


def test_unknown_pieces_copy_the_source_text_their_step_attends_to_most():
    """The scripted attention peaks at source piece 2 - j for target piece j: an UNK at j copies
    the text of piece 2 - j; a hypothesis without UNK is left as it was."""
    from nmt.data.tokenizer import UNK
    from nmt.translation.align import copy_unknown

    sources = [[7, 8, 9]]
    surfaces = [["Zürich", "12345", "Ω"]]
    results = [[Hypothesis([UNK, 5, UNK], -1.0, -1.0), Hypothesis([4, 5], -2.0, -2.0)]]
    (hyps,) = copy_unknown([ScriptedAttention()], sources, surfaces, results, torch.device("cpu"))
    assert hyps[0].copied == ("Ω", "Zürich") and hyps[0].alignment is None
    assert hyps[1] == results[0][1]
    # an UNK that attends to a bare word boundary ('▁' before '龍', as SentencePiece cuts an
    # unknown word) copies the piece the boundary opens, not its empty text
    surfaces = [["the", "", "龍"]]
    results = [[Hypothesis([5, UNK, 6], -1.0, -1.0)]]  # its UNK, at 1, attends to piece 1
    (hyps,) = copy_unknown([ScriptedAttention()], sources, surfaces, results, torch.device("cpu"))
    assert hyps[0].copied == ("龍",)


def test_an_unknown_word_of_a_real_tokenizer_is_copied_whole(toy_tokenizer):
    """The toy vocabulary has no digits or Han characters: each such word is a bare '▁' and one
    unknown piece, and whichever of the two an UNK attends to, the word is what is copied."""
    from nmt.data.tokenizer import UNK
    from nmt.translation.align import _text_at

    for word in ("12345", "龍", "龍龍"):
        line = f"the {word} dog"
        surfaces, ids = toy_tokenizer.src_surfaces(line), toy_tokenizer.encode_src([line])[0]
        at = ids.index(UNK)
        assert surfaces[at] == word and surfaces[at - 1] == ""  # '▁', then the unknown piece
        assert _text_at(surfaces, at - 1) == _text_at(surfaces, at) == word


def test_a_translation_writes_the_copied_text_in_place_of_its_unknown_pieces(toy_tokenizer):
    """SentencePiece writes UNK as ' ⁇ ' with the spaces of the pieces around it; the copy takes
    its place, so a word-initial UNK stays a word and one inside a word stays inside it."""
    from nmt.data.tokenizer import UNK

    tok = toy_tokenizer
    the, dogs = (tok.encode_tgt([word])[0] for word in ("the", "dogs"))
    boundary = tok.tgt.piece_to_id("▁")
    ids = [
        [*the, boundary, UNK, *dogs],
        [*the, UNK, *dogs],
        [UNK, *dogs],
        [*the, UNK, boundary, UNK],
    ]
    copied = [("12",), ("x",), ("7",), ("a", "b")]
    assert tok.decode_tgt(ids, copied) == ["the 12 dogs", "thex dogs", "7 dogs", "thea b"]
    assert tok.decode_tgt(ids[:1]) == [tok.tgt.decode(ids[0])]  # nothing copied: as before
