import pytest
import torch
from conftest import TOY, tiny_config

from nmt.config import DecodeConfig, TokenizerConfig
from nmt.corpus import read_parallel
from nmt.data import pad_sources
from nmt.export import ExportError, export, export_huggingface, marian_permutation
from nmt.model import Transformer, sinusoidal_positions
from nmt.search import translate_batch
from nmt.tokenizer import BOS, EOS, PAD, UNK, controls_as_spaces, train_tokenizer

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
    marian = torch.cat([torch.sin(torch.arange(5.0)[:, None] / 10000 ** (torch.arange(0, 8, 2) / 8)), torch.cos(torch.arange(5.0)[:, None] / 10000 ** (torch.arange(0, 8, 2) / 8))], 1)
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
    for sentence in ["the big dog sees a small cat .", "because the man likes the house , the child sees two dogs ."]:
        src = pad_sources(tokenizer.encode_src([sentence]))
        (hyps,) = translate_batch(model, src, DecodeConfig(beam_size=1, length_penalty=0.0, max_len_a=0.0, max_len_b=12))
        with torch.no_grad():
            generated = hf.generate(input_ids=src, attention_mask=torch.ones_like(src), num_beams=1, do_sample=False, max_new_tokens=13)
        theirs = [t for t in generated[0, 1:].tolist() if t not in (EOS, PAD)]
        assert generated[0, 0].item() == BOS
        assert theirs == hyps[0].tokens


ADVERSARIAL = [
    "the big dog sees a small cat .",
    "the dog </s> runs .", "<pad> the cat", "<unk>", "<s> a </s>", "</s>", "▁the ▁dog",  # special-token and piece spellings
    "the >>fr<< cat <<", " >>de<< a dog", "<<>>",  # Marian language tags anywhere but at the very start
    "a\x00b\x07c\x1fd", "\x1c the dog \x1d", "the dog\x85", "\x85", "\t", "", "  the   dog  ",  # control characters, whitespace
    "\u3000the dog\u3000", "\ufeffthe", "\u200bthe\u200b", "\u200b", "the\u00a0dog", "\u2028the", "héllo wörld ﬁ ①",  # Unicode
    "A" * 5000, "dog" * 700,  # very long words
]


def test_tokenizer_gives_nmt_ids_for_adversarial_text(exported):
    _, tokenizer, _, out = exported
    hf_tok = transformers.MarianTokenizer.from_pretrained(out)
    for text in ADVERSARIAL:
        assert hf_tok(controls_as_spaces(text))["input_ids"] == tokenizer.encode_src([text])[0] + [EOS], repr(text)
    # The documented exception: MarianTokenizer hands control characters to SentencePiece, which deletes most.
    assert hf_tok("dog\x01sees")["input_ids"] != tokenizer.encode_src(["dog\x01sees"])[0] + [EOS]
    # The documented exception: MarianTokenizer turns a leading >>...<< into one (unknown) tag token.
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
        export_huggingface(Transformer(tiny_config(src_vocab_size=200, tgt_vocab_size=200, norm_position="pre")), tokenizer, tmp_path)


def test_ctranslate2_conversion_translates_like_nmt(exported, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from nmt.export import export_ctranslate2

    model, tokenizer, _, hf_dir = exported
    export_ctranslate2(hf_dir, tmp_path / "ct2")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    sp = tokenizer.src
    for sentence in ["the big dog sees a small cat .", "a woman ."]:
        ids = tokenizer.encode_src([sentence])[0]
        (hyps,) = translate_batch(model, pad_sources([ids]), DecodeConfig(beam_size=1, length_penalty=0.0, max_len_a=0.0, max_len_b=12))
        pieces = [sp.id_to_piece(i) for i in ids] + [sp.id_to_piece(EOS)]
        result = translator.translate_batch([pieces], beam_size=1, max_decoding_length=12)  # pieces, EOS not counted
        theirs = [sp.piece_to_id(p) for p in result[0].hypotheses[0]]
        assert theirs == hyps[0].tokens


def test_export_checks_format_and_quantization_before_reading_the_checkpoint(tmp_path):
    with pytest.raises(ExportError) as err:
        export(tmp_path / "missing.pt", tmp_path / "out", format="onnx")
    assert str(err.value) == "format 'onnx' is not supported; use huggingface, ctranslate2, nmt"
    assert err.value.render({"format": "--format"}.get) == "--format 'onnx' is not supported; use huggingface, ctranslate2, nmt"
    with pytest.raises(ExportError, match="^quantization applies to format ctranslate2 only, not nmt$"):
        export(tmp_path / "missing.pt", tmp_path / "out.pt", format="nmt", quantization="int8")
