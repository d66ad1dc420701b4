import os
from pathlib import Path

import pytest
import torch
from conftest import AWKWARD_LINES, TOY, tiny_config
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.config import DecodeConfig, TokenizerConfig
from nmt.core.batching import pad_sources
from nmt.core.layers import sinusoidal_positions
from nmt.core.model import Transformer
from nmt.data.corpus import read_parallel
from nmt.data.tokenizer import BOS, EOS, PAD, UNK, Tokenizer, controls_as_spaces, train_tokenizer
from nmt.decode.search import translate_batch
from nmt.interop.export import (
    EXPORT_FILES,
    ExportError,
    export,
    export_huggingface,
    generation_settings,
)
from nmt.interop.marian import permutation as marian_permutation

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    src, tgt = read_parallel(TOY / "train.en", TOY / "train.de")
    tokenizer = train_tokenizer(src[:2000], tgt[:2000], TokenizerConfig(vocab_size=200))
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab_size=200, tgt_vocab_size=200)).eval()
    out = tmp_path_factory.mktemp("hf")
    export_huggingface(model, tokenizer, out)
    hf = transformers.MarianMTModel.from_pretrained(out).eval()
    return model, tokenizer, hf, out


def test_permutation_maps_interleaved_to_half_split_positions():
    ours = sinusoidal_positions(5, 8)
    marian = torch.cat(
        [
            torch.sin(torch.arange(5.0)[:, None] / 10000 ** (torch.arange(0, 8, 2) / 8)),
            torch.cos(torch.arange(5.0)[:, None] / 10000 ** (torch.arange(0, 8, 2) / 8)),
        ],
        1,
    )
    torch.testing.assert_close(ours[:, marian_permutation(8)], marian, atol=1e-6, rtol=0)


def test_teacher_forced_logits_match(exported):
    model, tokenizer, hf, _ = exported
    src = pad_sources(tokenizer.encode_src(["the big dog sees a small cat .", "a woman ."]))
    tgt = torch.tensor([[BOS, 10, 11, 12, 13], [BOS, 20, 21, 22, 23]])
    with torch.no_grad():
        ours = model(src, tgt)
        theirs = hf(input_ids=src, attention_mask=(src != PAD).long(), decoder_input_ids=tgt).logits
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)


def test_greedy_output_identical(exported):
    model, tokenizer, hf, _ = exported
    for sentence in [
        "the big dog sees a small cat .",
        "because the man likes the house , the child sees two dogs .",
    ]:
        src = pad_sources(tokenizer.encode_src([sentence]))
        (hyps,) = translate_batch(
            model, src, DecodeConfig(beam_size=1, length_penalty=0.0, max_len_a=0.0, max_len_b=12)
        )
        with torch.no_grad():
            generated = hf.generate(
                input_ids=src,
                attention_mask=torch.ones_like(src),
                num_beams=1,
                do_sample=False,
                max_new_tokens=13,
            )
        theirs = [t for t in generated[0, 1:].tolist() if t not in (EOS, PAD)]
        assert generated[0, 0].item() == BOS
        assert theirs == hyps[0].tokens


ADVERSARIAL = [
    "the big dog sees a small cat .",
    "the dog </s> runs .",
    "<pad> the cat",
    "<unk>",
    "<s> a </s>",
    "</s>",
    "▁the ▁dog",  # special-token and piece spellings
    "the >>fr<< cat <<",
    " >>de<< a dog",
    "<<>>",  # Marian language tags anywhere but at the very start
    "a\x00b\x07c\x1fd",
    "\x1c the dog \x1d",
    "the dog\x85",
    "\x85",
    "\t",
    "",
    "  the   dog  ",  # control characters, whitespace
    "\u3000the dog\u3000",
    "\ufeffthe",
    "\u200bthe\u200b",
    "\u200b",
    "the\u00a0dog",
    "\u2028the",
    "héllo wörld ﬁ ①",  # Unicode
    "A" * 5000,
    "dog" * 700,  # very long words
]


def test_tokenizer_gives_nmt_ids_for_adversarial_text(exported):
    _, tokenizer, _, out = exported
    hf_tok = transformers.MarianTokenizer.from_pretrained(out)
    for text in ADVERSARIAL:
        assert hf_tok(controls_as_spaces(text))["input_ids"] == tokenizer.encode_src([text])[0] + [
            EOS
        ], repr(text)
    # The documented exception: MarianTokenizer hands control characters to SentencePiece, which
    # deletes most.
    assert hf_tok("dog\x01sees")["input_ids"] != tokenizer.encode_src(["dog\x01sees"])[0] + [EOS]
    # The documented exception: MarianTokenizer turns a leading >>...<< into one (unknown) tag
    # token.
    for tag, rest in ((">>de<<", " the dog ."), (">>x<<", ""), (">><<", "")):
        assert hf_tok(tag + rest)["input_ids"] == [UNK] + tokenizer.encode_src([rest])[0] + [EOS]
        assert tokenizer.encode_src([tag + rest])[0] != tokenizer.encode_src([rest])[0]


def test_export_warns_about_language_tags(exported, tmp_path, caplog):
    model, tokenizer, _, _ = exported
    export_huggingface(model, tokenizer, tmp_path)
    assert "MarianTokenizer removes a leading '>>...<<'" in caplog.text


def test_pre_ln_refused(exported, tmp_path):
    _, tokenizer, _, _ = exported
    with pytest.raises(ExportError, match="Post-LN"):
        export_huggingface(
            Transformer(tiny_config(src_vocab_size=200, tgt_vocab_size=200, norm_position="pre")),
            tokenizer,
            tmp_path,
        )


def test_ctranslate2_conversion_translates_like_nmt(exported, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from nmt.interop.export import export_ctranslate2

    model, tokenizer, _, hf_dir = exported
    export_ctranslate2(hf_dir, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    sp = tokenizer.src
    for sentence in ["the big dog sees a small cat .", "a woman ."]:
        ids = tokenizer.encode_src([sentence])[0]
        (hyps,) = translate_batch(
            model,
            pad_sources([ids]),
            DecodeConfig(beam_size=1, length_penalty=0.0, max_len_a=0.0, max_len_b=12),
        )
        pieces = [sp.id_to_piece(i) for i in ids] + [sp.id_to_piece(EOS)]
        # pieces, EOS not counted
        result = translator.translate_batch([pieces], beam_size=1, max_decoding_length=12)
        theirs = [sp.piece_to_id(p) for p in result[0].hypotheses[0]]
        assert theirs == hyps[0].tokens


def test_export_checks_format_and_quantization_before_reading_the_checkpoint(tmp_path):
    with pytest.raises(ExportError) as err:
        export(tmp_path / "missing.pt", tmp_path / "out", format="onnx")
    assert str(err.value) == "format 'onnx' is not supported; use huggingface, ctranslate2, nmt"
    assert (
        err.value.render({"format": "--format"}.get)
        == "--format 'onnx' is not supported; use huggingface, ctranslate2, nmt"
    )
    with pytest.raises(
        ExportError, match="^quantization applies to format ctranslate2 only, not nmt$"
    ):
        export(tmp_path / "missing.pt", tmp_path / "out.pt", format="nmt", quantization="int8")


@pytest.fixture
def checkpoint(exported, tmp_path):
    """The exported fixture's model as an nmt checkpoint whose decode settings generate() can
    express (an absolute length limit)."""
    from nmt.config import Config, config_to_dict, with_vocab
    from nmt.runs.checkpoint import save_checkpoint, tokenizer_to_tensors

    model, tokenizer, _, _ = exported
    cfg = with_vocab(
        Config(
            model=model.cfg,
            decode=DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=12, allow_unk=False),
        ),
        200,
        200,
    )
    path = tmp_path / "model.pt"
    save_checkpoint(
        {
            "model": model.state_dict(),
            "config": config_to_dict(cfg),
            "tokenizer": tokenizer_to_tensors(tokenizer.protos()),
        },
        path,
    )
    return path


def test_generation_config_searches_as_nmt_translate_does_by_default(
    exported, checkpoint, tmp_path
):
    import json

    model, tokenizer, _, _ = exported
    export(checkpoint, tmp_path / "hf")
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert generation["max_length"] == 14 and sorted(generation["suppress_tokens"]) == [
        PAD,
        UNK,
        BOS,
    ]
    hf = transformers.MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    sentences = [
        "the big dog sees a small cat .",
        "a woman .",
        "because the man likes the house , the child sees two dogs .",
    ]
    for sentence in sentences:
        src = pad_sources(tokenizer.encode_src([sentence]))
        (hyps,) = translate_batch(
            model,
            src,
            DecodeConfig(beam_size=1, max_len_a=0.0, max_len_b=12),
            rules=tokenizer.output_rules,
        )
        with torch.no_grad():
            # its own generation settings only
            generated = hf.generate(input_ids=src, attention_mask=torch.ones_like(src))
        assert [t for t in generated[0, 1:].tolist() if t not in (EOS, PAD)] == hyps[0].tokens
    # A beam: generate() ranks by log P / |Y|^α. Its exact stop ("never") takes the bound at
    # max_length, which only an absolute limit makes nmt's; under a relative one it ends a sentence
    # once num_beams hypotheses have (nmt's patience 1), and says so.
    values, notes = generation_settings(
        DecodeConfig(beam_size=5, length_penalty=2.0), tokenizer, 1024
    )
    assert {
        k: values[k] for k in ("num_beams", "length_penalty", "early_stopping", "max_length")
    } == {
        "num_beams": 5,
        "length_penalty": 2.0,
        "early_stopping": True,
        "max_length": 1024,
    }
    assert notes == [
        "generate() stops a sentence once num_beams hypotheses have finished (nmt's "
        "decode.patience 1), where nmt searches until no running hypothesis can change the "
        "result: generate()'s exact stop (early_stopping 'never') would search every sentence to "
        "max_length 1024",
        "generate() has no output limit relative to the source (nmt: 1.5 x source pieces + 10): "
        "generation_config.json sets max_length 1024, "
        "the model's position limit",
    ]
    for decode, early in (
        (DecodeConfig(beam_size=5, length_penalty=2.0, max_len_a=0.0), "never"),
        (DecodeConfig(beam_size=5, length_penalty=0.0), "never"),
        (DecodeConfig(beam_size=5, length_penalty=-1.0), "never"),
        (DecodeConfig(beam_size=5, length_normalization="none"), "never"),
        (DecodeConfig(beam_size=5, length_penalty=0.0, patience=1.0), True),
    ):
        assert generation_settings(decode, tokenizer, 1024)[0]["early_stopping"] == early, decode


def test_a_killed_export_leaves_nothing_that_loads(checkpoint, tmp_path, monkeypatch):
    import subprocess
    import sys

    out = tmp_path / "hf"
    kill = (
        "import os, signal, transformers\n"
        "transformers.MarianTokenizer.save_pretrained = lambda *a, **k: os.kill(os.getpid(), "
        "signal.SIGKILL)  # after the weights, before the tokenizer\n"
        f"from nmt.interop.export import export\nexport({str(checkpoint)!r}, {str(out)!r})\n"
    )
    proc = subprocess.run([sys.executable, "-c", kill], capture_output=True, text=True, timeout=300)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert not out.exists()
    (left,) = [p for p in tmp_path.iterdir() if p.name.startswith(".hf.tmp")]
    # the partial directory, hidden beside
    assert (left / "config.json").is_file() and not (left / "tokenizer_config.json").exists()
    with pytest.raises(OSError):
        transformers.MarianMTModel.from_pretrained(out)
    export(checkpoint, out)  # the next export removes what the killed one left
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf", "model.pt"]
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    # Ctrl-C (or any failure) while an export replaces an earlier one
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(transformers.MarianTokenizer, "save_pretrained", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export(checkpoint, out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before and sorted(
        p.name for p in tmp_path.iterdir()
    ) == ["hf", "model.pt"]


def test_an_unwritable_or_full_place_is_one_line_and_leaves_nothing(
    checkpoint, tmp_path, monkeypatch
):
    import errno

    from typer.testing import CliRunner

    from nmt.cli.main import app

    runner = CliRunner()
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    result = runner.invoke(
        app, ["export", "--checkpoint", str(checkpoint), str(tmp_path / "other")]
    )
    assert (
        result.exit_code == 2
        and result.output
        == f"error: OUT {tmp_path / 'other'} holds notes.txt, which no export writes; give a new "
        "or empty directory (an earlier export there is replaced)\n"
    )
    result = runner.invoke(
        app, ["export", "--checkpoint", str(checkpoint), str(tmp_path / "missing" / "hf")]
    )
    assert (
        result.exit_code == 2
        and "does not exist; create it first" in result.output
        and result.output.count("\n") == 1
    )

    real_mkdir = os.mkdir

    def read_only(path, *args, **kwargs):
        if ".hf." in str(path):
            raise OSError(errno.EROFS, "Read-only file system")
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", read_only)
    result = runner.invoke(app, ["export", "--checkpoint", str(checkpoint), str(tmp_path / "hf")])
    assert (
        result.exit_code == 2
        and result.output == f"error: cannot write OUT {tmp_path / 'hf'}: read-only file system\n"
    )
    monkeypatch.setattr(os, "mkdir", real_mkdir)

    def full(self, directory, *args, **kwargs):
        (Path(directory) / "model.safetensors").write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(transformers.MarianMTModel, "save_pretrained", full)
    for fmt in ("huggingface", "ctranslate2"):
        result = runner.invoke(
            app, ["export", "--checkpoint", str(checkpoint), "--format", fmt, str(tmp_path / "hf")]
        )
        assert (
            result.exit_code == 2
            and result.output
            == f"error: cannot write {tmp_path / 'hf'}: no space left on the device\n"
        ), result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.pt", "other"]


def test_the_hugging_face_export_takes_every_line_nmt_translates(checkpoint, tmp_path):
    """decode.max_input_pieces 1024 pieces and EOS: the export's position table holds 1025, so that
    generate() takes the longest line nmt translates (a table of 1024 raised an IndexError)."""
    export(checkpoint, tmp_path / "hf", format="huggingface")
    hf = transformers.MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    assert hf.config.max_position_embeddings == 1025
    ids = torch.full((1, 1025), 5)
    ids[0, -1] = EOS
    with torch.no_grad():
        assert hf.get_encoder()(input_ids=ids).last_hidden_state.shape == (1, 1025, 32)
        with pytest.raises(IndexError):
            hf.get_encoder()(input_ids=torch.cat([ids, ids[:, :1]], 1))


def test_ctranslate2_export_carries_its_tokenizer_and_usage(checkpoint, tmp_path, caplog):
    pytest.importorskip("ctranslate2")
    import re

    out = tmp_path / "ct2"
    export(checkpoint, out, format="ctranslate2")
    assert {"model.bin", "spm.model", "README.md"} <= {p.name for p in out.iterdir()}
    # notes for the Marian directory it converts from: not said
    assert "generate()" not in caplog.text and "MarianTokenizer" not in caplog.text
    # anything said names the output, not a temporary directory
    assert "tmp" not in caplog.text.replace(str(tmp_path), "")
    code = re.search(r"```python\n(.*?)```", (out / "README.md").read_text(), re.S)[1]
    printed = []
    # the README's lines run as written
    exec(code.replace("print(", "printed.append("), {"printed": printed})
    assert len(printed[0]) == 1 and isinstance(printed[0][0], str)


@pytest.fixture(scope="module")
def separate(tmp_path_factory):
    """A model of a vocabulary per side (tokenizer.joint: false): 200 English pieces in, 150 German
    pieces out."""
    src, tgt = read_parallel(TOY / "train.en", TOY / "train.de")
    english = train_tokenizer(
        src[:2000], tgt[:2000], TokenizerConfig(vocab_size=200, joint=False)
    ).src
    german = train_tokenizer(
        src[:2000], tgt[:2000], TokenizerConfig(vocab_size=150, joint=False)
    ).tgt
    tokenizer = Tokenizer(english, german)
    torch.manual_seed(1)
    model = Transformer(
        tiny_config(src_vocab_size=200, tgt_vocab_size=150, share_embeddings=False)
    ).eval()
    out = tmp_path_factory.mktemp("hf_separate")
    export_huggingface(model, tokenizer, out)
    return model, tokenizer, out


def test_separate_vocabularies_export_as_marians_target_vocab(separate):
    """Source ids from vocab.json, target ids and text from target_vocab.json; the same logits and
    greedy output."""
    model, tokenizer, out = separate
    assert {"source.spm", "target.spm", "vocab.json", "target_vocab.json"} <= {
        p.name for p in out.iterdir()
    }
    hf = transformers.MarianMTModel.from_pretrained(out).eval()
    hf_tok = transformers.MarianTokenizer.from_pretrained(out)
    for text in ADVERSARIAL[:6] + ["héllo wörld ﬁ ①", "ein hund läuft ."]:
        assert hf_tok(text)["input_ids"] == tokenizer.encode_src([text])[0] + [EOS], repr(text)
        assert hf_tok(text_target=text)["input_ids"] == tokenizer.encode_tgt([text])[0] + [EOS], (
            repr(text)
        )
    src = pad_sources(tokenizer.encode_src(["the big dog sees a small cat .", "a woman ."]))
    tgt = torch.tensor([[BOS, 10, 11, 12, 13], [BOS, 20, 21, 22, 23]])
    with torch.no_grad():
        theirs = hf(input_ids=src, attention_mask=(src != PAD).long(), decoder_input_ids=tgt).logits
        torch.testing.assert_close(theirs, model(src, tgt), atol=1e-4, rtol=0)
    (hyps,) = translate_batch(
        model, src[:1], DecodeConfig(beam_size=1, length_penalty=0.0, max_len_a=0.0, max_len_b=12)
    )
    with torch.no_grad():
        generated = hf.generate(
            input_ids=src[:1],
            attention_mask=(src[:1] != PAD).long(),
            num_beams=1,
            do_sample=False,
            max_new_tokens=13,
        )
    assert [t for t in generated[0, 1:].tolist() if t not in (EOS, PAD)] == hyps[0].tokens
    assert hf_tok.decode(hyps[0].tokens) == tokenizer.decode_tgt([hyps[0].tokens])[0]


@given(
    text=AWKWARD_LINES.filter(
        lambda t: not t.lstrip().startswith(">>") and not any("\ud800" <= c <= "\udfff" for c in t)
    )
)
def test_separate_vocabularies_tokenize_any_text_as_nmt_does(separate, text):
    """Each side's ids from its own vocabulary file, for any line (control characters read as
    spaces, as documented; a leading >>...<< and lone surrogates, which MarianTokenizer cannot take,
    left out)."""
    _, tokenizer, out = separate
    hf_tok = _marian_tokenizer(out)
    assert hf_tok(controls_as_spaces(text))["input_ids"] == tokenizer.encode_src([text])[0] + [EOS]
    assert hf_tok(text_target=controls_as_spaces(text))["input_ids"] == tokenizer.encode_tgt(
        [text]
    )[0] + [EOS]


def _marian_tokenizer(directory, _loaded={}):  # noqa: B006 - one load per directory across Hypothesis examples
    if directory not in _loaded:
        _loaded[directory] = transformers.MarianTokenizer.from_pretrained(directory)
    return _loaded[directory]


def test_separate_vocabularies_convert_to_ctranslate2_with_the_target_vocabulary(
    separate, tmp_path
):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from nmt.interop.export import export_ctranslate2

    model, tokenizer, hf_dir = separate
    export_ctranslate2(hf_dir, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    for sentence in ["the big dog sees a small cat .", "a woman ."]:
        ids = tokenizer.encode_src([sentence])[0]
        (hyps,) = translate_batch(
            model,
            pad_sources([ids]),
            DecodeConfig(beam_size=1, length_penalty=0.0, max_len_a=0.0, max_len_b=12),
        )
        pieces = [tokenizer.src.id_to_piece(i) for i in ids] + ["</s>"]
        result = translator.translate_batch([pieces], beam_size=1, max_decoding_length=12)
        # German pieces, from the target vocabulary
        assert result[0].hypotheses[0] == [tokenizer.tgt.id_to_piece(i) for i in hyps[0].tokens]


def test_sides_that_spell_a_special_piece_differently_are_refused(separate, tmp_path):
    """Marian's tokenizer has one EOS spelling for both sides: a target EOS of its own would become
    a new, out-of-range id."""
    import io

    import sentencepiece as spm

    model, tokenizer, _ = separate
    _, tgt = read_parallel(TOY / "train.en", TOY / "train.de")
    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(tgt[:2000]),
        model_writer=proto,
        vocab_size=150,
        pad_id=PAD,
        unk_id=UNK,
        bos_id=BOS,
        eos_id=EOS,
        eos_piece="<eos>",
    )
    odd = Tokenizer(tokenizer.src, spm.SentencePieceProcessor(model_proto=proto.getvalue()))
    with pytest.raises(ExportError, match="spells EOS '</s>' and the target's '<eos>'"):
        export_huggingface(model, odd, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()


def test_a_han_target_of_its_own_vocabulary_exports_with_byte_pieces(tmp_path):
    """A non-Latin target with byte fallback (Japanese-like: 600 Han characters, more than its
    pieces): the target ids, byte pieces included, come from target_vocab.json; CTranslate2 writes
    nmt's greedy pieces."""
    ctranslate2 = pytest.importorskip("ctranslate2")
    from nmt.interop.export import export_ctranslate2

    english = [f"word{i} number{7 * i} item{13 * i} thing{i % 13} and more" for i in range(400)]
    han = ["".join(chr(0x4E00 + (7 * i + j) % 600) for j in range(7)) for i in range(400)]
    tokenizer = train_tokenizer(
        english, han, TokenizerConfig(vocab_size=900, character_coverage="auto", joint=False)
    )
    size = tokenizer.tgt.get_piece_size()
    model = Transformer(
        tiny_config(
            src_vocab_size=tokenizer.src.get_piece_size(),
            tgt_vocab_size=size,
            share_embeddings=False,
        )
    ).eval()
    export_huggingface(model, tokenizer, tmp_path / "hf")
    hf_tok = transformers.MarianTokenizer.from_pretrained(tmp_path / "hf")
    # U+9FFF and あ: unseen, spelled in bytes
    for text in (han[0], han[1] + " " + han[2], "\u4e00\u9fff\u3042"):
        ids = tokenizer.encode_tgt([text])[0]
        assert hf_tok(text_target=text)["input_ids"] == ids + [EOS]
    assert any(tokenizer.tgt.is_byte(i) for i in tokenizer.encode_tgt(["\u9fff"])[0])
    export_ctranslate2(tmp_path / "hf", tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    ids = tokenizer.encode_src(["word3 number21 and more"])[0]
    (hyps,) = translate_batch(
        model,
        pad_sources([ids]),
        DecodeConfig(beam_size=1, length_penalty=0.0, max_len_a=0.0, max_len_b=12),
    )
    result = translator.translate_batch(
        [[tokenizer.src.id_to_piece(i) for i in ids] + ["</s>"]],
        beam_size=1,
        max_decoding_length=12,
    )
    assert result[0].hypotheses[0] == [tokenizer.tgt.id_to_piece(i) for i in hyps[0].tokens]


@settings(max_examples=60, deadline=None)
@given(
    format=st.sampled_from(sorted(EXPORT_FILES)),
    kept=st.data(),
    foreign=st.one_of(
        st.none(),
        st.tuples(
            st.sampled_from(["file", "directory", "link"]),
            st.text(st.characters(min_codepoint=48, max_codepoint=122), min_size=1, max_size=12),
        ),
    ),
)
def test_only_an_earlier_export_is_replaced(tmp_path_factory, format, kept, foreign):
    """A directory is replaced only when all it holds are the files one export format writes: any
    other file, a subdirectory or a link (even under an export's file name) makes it the user's,
    refused and left as it was."""
    from nmt.files import OutputError
    from nmt.interop.export import _check_directory

    out = tmp_path_factory.mktemp("export") / "out"
    out.mkdir()
    for name in kept.draw(st.sets(st.sampled_from(sorted(EXPORT_FILES[format])), min_size=1)):
        (out / name).write_text("earlier")
    if foreign is not None:
        kind, name = foreign
        if kind == "file" and any(name in files for files in EXPORT_FILES.values()):
            name = f"{name}.mine"
        target = out / name
        if target.exists():
            target.unlink()
        if kind == "file":
            target.write_text("mine")
        elif kind == "directory":
            target.mkdir()
        else:
            target.symlink_to(out.parent)
    before = sorted(p.name for p in out.iterdir())
    if foreign is None:
        _check_directory(out)
    else:
        with pytest.raises(
            OutputError, match=" which no export writes; give a new or empty directory"
        ):
            _check_directory(out)
    assert sorted(p.name for p in out.iterdir()) == before
