"""nmt import: Hugging Face Marian (OPUS-MT) models as nmt checkpoints, exact to the last token.

The directories are built offline with random weights (tests/opus_dirs.py). What is compared, and
under which settings both searches are defined to agree:

* ids: ``MarianTokenizer(text)`` and ``MarianTokenizer(text_target=text)`` against nmt's encoding
  (plus the ``</s>`` MarianTokenizer appends), mapped back to Marian's ids, for ordinary and
  adversarial text;
* teacher-forced log-probabilities of every Marian piece, within 1e-4;
* greedy search: ``generate(num_beams=1, max_length=L)`` against nmt's beam 1 with ``max_len_a`` 0
  and ``max_len_b`` L - 2 (the import's own mapping), every sentence, those cut by the limit too
  (both force EOS there, and greedy picks the same token whatever the forced token's score);
* beam search: ``generate(num_beams=4, early_stopping=True, length_penalty=α)`` against nmt's beam
  4, ``length`` normalisation, α and ``patience`` 1, and ``early_stopping="never"`` against nmt's
  exact rule, on every sentence whose result ends before the limit (at the limit
  generate() forces EOS with log-probability 0, nmt with the model's own, so a result cut there may
  be ranked differently; until the last step the two searches hold the same hypotheses);
* the decoded text: ``batch_decode(..., skip_special_tokens=True)``.
"""

import json
import shutil
import sys
from dataclasses import replace

import pytest
import torch
from conftest import TOY, load_model, translate_lines
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opus_dirs import SOURCE, TARGET, make_opus_dir
from typer.testing import CliRunner

from nmt.cli.main import app
from nmt.config import DecodeConfig
from nmt.core.batching import pad_sources
from nmt.data.tokenizer import BOS, EOS, PAD, UNK
from nmt.interop.importing import import_checkpoint
from nmt.interop.marian import NEVER, MarianError, Rows, from_marian, to_marian
from nmt.runs.checkpoint import load_checkpoint
from nmt.translation.inference import best_strings

transformers = pytest.importorskip("transformers")
runner = CliRunner()

LINES = SOURCE[-12:] + [
    ">>fr<< the big dog sees a small cat .",
    "a woman .",
    "zebra quokka !",
    "the man , the man , the man",
]
ADVERSARIAL = [
    "",
    " ",
    "the dog </s> runs .",
    "a</s>b",
    "<pad> the cat",
    "<unk>",
    "<unk>dog",
    "</s>>>fr<< x",
    "<s> a",
    "▁the ▁dog",
    ">>fr<< the dog",
    ">>fr<<the dog",
    " >>fr<< the",
    ">>xx<< a dog",
    ">>x<< y <<",
    ">><<",
    "the >>fr<< cat",  # language codes
    "«the dog»  „x“ – 1,5 ’s",
    "héllo wörld ﬁ ①",
    "\u3000the dog\u3000",
    "the\u00a0dog",
    "a\tb",
    "A" * 300,
    "zzzz qqqq",  # normalisation, unknown pieces
]
SIZES = {  # name: (make_opus_dir arguments, slow)
    "32-wide 2+2 swish safetensors": (
        dict(d_model=32, layers=(2, 2), heads=4, ffn=64, seed=1),
        False,
    ),
    "48-wide 1+3 gelu pytorch_model.bin": (
        dict(
            d_model=48,
            layers=(1, 3),
            heads=2,
            ffn=96,
            activation="gelu",
            weights="bin",
            seed=4,
            train_steps=60,
        ),
        True,
    ),
    "16-wide 3+1 relu separate vocabularies": (
        dict(
            d_model=16,
            layers=(3, 1),
            heads=2,
            ffn=32,
            activation="relu",
            separate_vocabs=True,
            seed=3,
            train_steps=60,
        ),
        True,
    ),
}


@pytest.fixture(
    scope="module",
    params=[
        pytest.param(name, marks=[pytest.mark.slow] if slow else [])
        for name, (_, slow) in SIZES.items()
    ],
)
def opus(request, tmp_path_factory):
    """An OPUS-MT-like directory, transformers' model and tokenizer for it, and nmt's imported
    checkpoint loaded."""
    base = tmp_path_factory.mktemp("opus")
    directory = make_opus_dir(base / "opus-mt-en-de", **SIZES[request.param][0])
    hf = transformers.MarianMTModel.from_pretrained(directory).eval()
    tok = transformers.MarianTokenizer.from_pretrained(directory)
    import_checkpoint(directory, base / "imported.pt")
    model, tokenizer, cfg = load_model(base / "imported.pt", torch.device("cpu"))
    return directory, hf, tok, model, tokenizer, cfg


def test_layout_numbers_marian_pieces_in_nmts_layout():
    from nmt.data.tokenizer import TokenizerError
    from nmt.data.vocab import PAD_PIECE, Layout

    layout = Layout.of(
        {"</s>": 0, "<unk>": 1, "▁a": 2, "b": 3, "<pad>": 4}, "</s>", "<unk>", "<pad>"
    )
    # PAD added, <pad> (the start) as BOS
    assert layout.pieces == (PAD_PIECE, "<unk>", "<pad>", "</s>", "▁a", "b")
    assert layout.marian_ids == (-1, 1, 4, 0, 2, 3) and layout.to_marian() == [3, 1, 4, 5, 2]
    # nmt export's
    exported = Layout.of(
        {"<pad>": 0, "<unk>": 1, "<s>": 2, "</s>": 3, "▁a": 4},
        "</s>",
        "<unk>",
        "<pad>",
        start="<s>",
    )
    assert (
        exported.pieces == ("<pad>", "<unk>", "<s>", "</s>", "▁a")
        and exported.to_marian() == [0, 1, 2, 3, 4]
        and not exported.extra_pad
    )
    with pytest.raises(TokenizerError, match=r"its 3 ids are not 0 \.\.\. 2"):
        Layout.of({"</s>": 0, "<unk>": 1, "<pad>": 5}, "</s>", "<unk>", "<pad>")
    with pytest.raises(TokenizerError, match="no <pad> piece"):
        Layout.of({"</s>": 0, "<unk>": 1}, "</s>", "<unk>", "<pad>")


def marian_ids(ids, layout):
    return [layout.marian_ids[i] for i in ids]


def generated(output, pad):
    """generate()'s sequences without the start token, </s> and padding."""
    return [[t for t in row[1:] if t not in (0, pad)] for row in output.tolist()]


def test_ids_equal_marian_tokenizer_for_any_text(opus):
    _, _, tok, _, tokenizer, _ = opus
    for text in LINES + ADVERSARIAL:
        assert tok(text)["input_ids"] == marian_ids(
            tokenizer.encode_src([text])[0], tokenizer.src.layout
        ) + [0], repr(text)
        assert tok(text_target=text)["input_ids"] == marian_ids(
            tokenizer.encode_tgt([text])[0], tokenizer.tgt.layout
        ) + [0], repr(text)
    # batched as one by one
    assert tokenizer.encode_src(LINES) == [tokenizer.encode_src([line])[0] for line in LINES]
    # the text of each piece, one per id; what Marian's vocabulary lacks is the text of its UNKs
    for text in LINES + ADVERSARIAL:
        ids, surfaces = tokenizer.encode_src([text])[0], tokenizer.src_surfaces(text)
        assert len(surfaces) == len(ids), repr(text)
        unknown = [s for s, i in zip(surfaces, ids) if i == UNK and s]
        assert tokenizer.unknown_src(text) == list(dict.fromkeys(unknown)), repr(text)


def test_teacher_forced_log_probs_equal(opus):
    _, hf, tok, model, tokenizer, _ = opus
    sources, targets = LINES[:6], TARGET[-6:]
    enc = tok(sources, padding=True, return_tensors="pt")
    labels = tok(text_target=targets, padding=True, return_tensors="pt")["input_ids"]
    start = hf.config.decoder_start_token_id
    decoder_in = torch.cat([torch.full((len(targets), 1), start), labels[:, :-1]], 1)
    src = pad_sources(tokenizer.encode_src(sources))
    # pad_sources appends EOS: dropped
    tgt_in = pad_sources([[BOS, *ids] for ids in tokenizer.encode_tgt(targets)])[:, :-1]
    with torch.no_grad():
        theirs = torch.log_softmax(hf(**enc, decoder_input_ids=decoder_in).logits, -1)
        # Marian's columns, in Marian's order
        ours = torch.log_softmax(model(src, tgt_in), -1)[..., Rows.of(tokenizer).tgt]
    real = labels != hf.config.pad_token_id  # positions of real target tokens (</s> included)
    assert real.sum() > 30
    torch.testing.assert_close(ours[real], theirs[real], atol=1e-4, rtol=0)
    with torch.no_grad():  # nmt's PAD row: probability exactly 0, so the normaliser is Marian's
        assert torch.log_softmax(model(src, tgt_in), -1)[..., PAD].max() < NEVER / 2


def test_greedy_tokens_and_text_equal_generate(opus):
    _, hf, tok, model, tokenizer, cfg = opus
    enc = tok(LINES, padding=True, return_tensors="pt")
    with torch.no_grad():
        output = hf.generate(**enc, num_beams=1, do_sample=False, max_length=40)
    decode = replace(cfg.decode, beam_size=1, max_len_a=0.0, max_len_b=38)
    results = translate_lines(model, tokenizer, LINES, decode, torch.device("cpu"))
    assert [marian_ids(r[0].tokens, tokenizer.tgt.layout) for r in results] == generated(
        output, hf.config.pad_token_id
    )
    assert best_strings(tokenizer, results) == tok.batch_decode(output, skip_special_tokens=True)
    lengths = [len(r[0].tokens) for r in results]
    assert min(lengths) < 38  # some ended by EOS before the limit


@pytest.mark.parametrize("alpha", [1.0, 0.6])
@pytest.mark.parametrize("early_stopping,patience", [(True, 1.0), ("never", None)])
def test_beam_search_tokens_equal_generate(opus, alpha, early_stopping, patience):
    """generate()'s early_stopping true is nmt's patience 1; "never" is nmt's exact rule (both take
    the bound at the longest length allowed, which an absolute limit makes the same)."""
    _, hf, tok, model, tokenizer, cfg = opus
    enc = tok(LINES, padding=True, return_tensors="pt")
    with torch.no_grad():
        output = hf.generate(
            **enc,
            num_beams=4,
            do_sample=False,
            max_length=40,
            early_stopping=early_stopping,
            length_penalty=alpha,
        )
    decode = replace(
        cfg.decode,
        beam_size=4,
        length_penalty=alpha,
        length_normalization="length",
        max_len_a=0.0,
        max_len_b=38,
        patience=patience,
    )
    results = translate_lines(model, tokenizer, LINES, decode, torch.device("cpu"))
    # </s> before the forced one at the limit (searched on, "never" ends fewer before it)
    ended = [i for i, row in enumerate(output.tolist()) if 0 in row[1:39]]
    assert len(ended) >= (6 if early_stopping is True else 2)
    theirs = generated(output, hf.config.pad_token_id)
    assert [marian_ids(results[i][0].tokens, tokenizer.tgt.layout) for i in ended] == [
        theirs[i] for i in ended
    ]


def test_imported_decode_defaults_follow_generation_config(opus):
    directory, _, _, _, tokenizer, cfg = opus
    generation = json.loads((directory / "generation_config.json").read_text())
    # generate() bans only <pad>, not <unk>
    assert cfg.decode == DecodeConfig(
        beam_size=generation["num_beams"],
        length_penalty=1.0,
        length_normalization="length",
        max_len_a=0.0,
        max_len_b=generation["max_length"] - 2,
        allow_unk=True,
        # config.json's max_position_embeddings 128 less the EOS
        max_input_pieces=127,
    )
    assert cfg.model.activation in ("swish", "gelu", "relu") and cfg.model.output_bias
    assert (cfg.data.src_lang, cfg.data.tgt_lang) == ("en", "de")
    assert (
        tokenizer.src.id_to_piece(BOS) == "<pad>"
        and tokenizer.src.id_to_piece(EOS) == "</s>"
        and tokenizer.src.id_to_piece(UNK) == "<unk>"
    )


def test_export_after_import_gives_the_same_directory(opus, tmp_path):
    directory, hf, tok, model, tokenizer, cfg = opus
    result = runner.invoke(
        app, ["export", "--checkpoint", str(directory.parent / "imported.pt"), str(tmp_path / "hf")]
    )
    assert result.exit_code == 0, result.output
    again = transformers.MarianMTModel.from_pretrained(tmp_path / "hf")
    original, exported = hf.state_dict(), again.state_dict()
    assert set(original) == set(exported)
    assert [name for name in original if not torch.equal(original[name], exported[name])] == []
    for name in ("vocab.json", "source.spm", "target.spm", "target_vocab.json"):
        if (directory / name).exists():
            assert (tmp_path / "hf" / name).read_bytes() == (
                directory / name
            ).read_bytes() or json.loads((tmp_path / "hf" / name).read_text()) == json.loads(
                (directory / name).read_text()
            ), name
    tok_again = transformers.MarianTokenizer.from_pretrained(tmp_path / "hf")
    assert [tok_again(t)["input_ids"] for t in LINES + ADVERSARIAL] == [
        tok(t)["input_ids"] for t in LINES + ADVERSARIAL
    ]
    generation = json.loads((tmp_path / "hf" / "generation_config.json").read_text())
    assert {
        k: generation[k]
        for k in ("num_beams", "length_penalty", "early_stopping", "max_length", "bad_words_ids")
    } == {
        "num_beams": 4,
        "length_penalty": 1.0,
        # the directory's generate() default (false, a heuristic) was imported as nmt's exact
        # rule, which generate() calls "never" (its bound is nmt's under an absolute limit)
        "early_stopping": "never",
        "max_length": 40,
        "bad_words_ids": [[hf.config.pad_token_id]],
    }


def test_nmt_weights_round_trip_through_marian_names(opus):
    _, _, _, model, tokenizer, _ = opus
    state = model.state_dict()
    back = from_marian(
        to_marian(state, model.cfg, Rows.of(tokenizer)), model.cfg, Rows.of(tokenizer)
    )
    assert set(back) == set(state)
    assert all(torch.equal(back[k], state[k]) for k in state)


@pytest.fixture(scope="module")
def small_opus(tmp_path_factory):
    return make_opus_dir(
        tmp_path_factory.mktemp("small") / "opus",
        d_model=16,
        layers=(1, 1),
        heads=2,
        ffn=32,
        seed=1,
    )


def test_translate_defaults_equal_generate_defaults(small_opus, tmp_path):
    """`nmt import` then `nmt translate` with the checkpoint's own settings gives what generate()
    gives with the directory's (which here asks for early_stopping, the one setting where
    generate()'s default search differs from nmt's)."""
    directory = tmp_path / "opus"
    shutil.copytree(small_opus, directory)
    generation = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(
        json.dumps(
            {
                **generation,
                "early_stopping": True,
                "length_penalty": 0.8,
                "num_beams": 3,
                "max_length": 30,
            }
        )
    )
    result = runner.invoke(app, ["import", str(directory), "--out", str(tmp_path / "m.pt")])
    assert result.exit_code == 0, result.output
    lines = SOURCE[-8:]
    out = runner.invoke(
        app,
        ["translate", "--checkpoint", str(tmp_path / "m.pt")],
        input="".join(line + "\n" for line in lines),
    )
    assert out.exit_code == 0, out.output
    hf = transformers.MarianMTModel.from_pretrained(directory).eval()
    tok = transformers.MarianTokenizer.from_pretrained(directory)
    with torch.no_grad():
        # the directory's generation settings
        output = hf.generate(**tok(lines, padding=True, return_tensors="pt"))
    ended = [i for i, row in enumerate(output.tolist()) if 0 in row[1:29]]
    assert len(ended) >= 4
    theirs = tok.batch_decode(output, skip_special_tokens=True)
    assert [out.stdout.splitlines()[i] for i in ended] == [theirs[i] for i in ended]


def test_a_hub_cache_entry_imports_from_the_snapshot_its_main_ref_names(small_opus, tmp_path):
    entry = tmp_path / "models--Helsinki-NLP--opus-mt-en-de"
    shutil.copytree(small_opus, entry / "snapshots" / "0123abcd")
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text("0123abcd")
    result = runner.invoke(app, ["import", str(entry), "--out", str(tmp_path / "m.pt")])
    assert result.exit_code == 0, result.output
    vocab = json.loads((small_opus / "vocab.json").read_text())
    assert (
        result.output
        == f"wrote {tmp_path / 'm.pt'}: 16-wide 1+1-layer Marian model, {len(vocab)} pieces, "
        "en→de\n"
    )
    assert load_checkpoint(tmp_path / "m.pt").payload["imported_from"]["path"] == str(
        entry / "snapshots" / "0123abcd"
    )


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"normalize_before": True}, "normalize_before"),
        ({"normalize_embedding": True}, "normalize_embedding"),
        ({"static_position_embeddings": False}, "static_position_embeddings"),
        ({"scale_embedding": False}, "scale_embedding"),
        ({"activation_function": "gelu_new"}, "activation_function"),
        ({"decoder_vocab_size": 9}, "decoder_vocab_size"),
        ({"decoder_ffn_dim": 128}, "decoder_ffn_dim"),
        ({"decoder_start_token_id": 0}, "decoder_start_token_id"),
        ({"tie_word_embeddings": False}, "tie_word_embeddings"),
        ({"model_type": "bart"}, "model_type"),
    ],
)
def test_a_config_json_nmt_cannot_represent_is_refused_naming_the_key(
    small_opus, tmp_path, changes, key
):
    directory = tmp_path / "opus"
    shutil.copytree(small_opus, directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))
    result = runner.invoke(app, ["import", str(directory), "--out", str(tmp_path / "m.pt")])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and result.output.startswith(
        f"error: {directory / 'config.json'}: {key} "
    ), result.output
    assert not (tmp_path / "m.pt").exists()


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"encoder_layers": 10**9}, "n_encoder_layers 1000000000"),
        ({"decoder_layers": 10**7}, "n_decoder_layers 10000000"),
        (
            {"d_model": 2**20, "encoder_attention_heads": 1, "decoder_attention_heads": 1},
            "d_model 1048576",
        ),
        ({"encoder_ffn_dim": 2**30, "decoder_ffn_dim": 2**30}, "d_ff 1073741824"),
    ],
)
def test_a_config_json_larger_than_its_weights_is_refused_before_the_model_is_built(
    small_opus, tmp_path, changes, key
):
    """10^9 encoder layers in config.json once ran a Python loop over layer names until 23 GB were
    gone."""
    directory = tmp_path / "opus"
    shutil.copytree(small_opus, directory)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, **changes}))
    with pytest.raises(
        MarianError,
        match=rf"the weights do not fit the model config.json describes \(model\.{key} in "
        r"config.json vs \d+ in the tensors\)",
    ):
        import_checkpoint(directory, tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()


def test_weights_of_another_architecture_are_refused(small_opus, tmp_path):
    from safetensors.torch import load_file, save_file

    directory = tmp_path / "opus"
    shutil.copytree(small_opus, directory)
    state = load_file(directory / "model.safetensors")
    save_file(
        {**state, "model.encoder.layernorm_embedding.weight": torch.ones(16)},
        directory / "model.safetensors",
    )
    with pytest.raises(
        MarianError,
        match=r"unexpected: model\.encoder\.layernorm_embedding\.weight\) \(an embedding or final "
        r"LayerNorm",
    ):
        import_checkpoint(directory, tmp_path / "m.pt")
    (directory / "model.safetensors").unlink()
    with pytest.raises(MarianError, match="no weights"):
        import_checkpoint(directory, tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()


def test_a_vocab_json_of_another_model_is_refused(small_opus, tmp_path):
    """A vocab.json whose pieces are not the SentencePiece models' once imported, and every line
    then translated to nothing (each piece <unk>)."""
    directory = tmp_path / "opus"
    shutil.copytree(small_opus, directory)
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    special = {"</s>", "<unk>", "<pad>"}
    renamed = {(piece if piece in special else f"x{i}"): i for piece, i in vocab.items()}
    (directory / "vocab.json").write_text(json.dumps(renamed), encoding="utf-8")
    with pytest.raises(MarianError, match=r"pieces of source\.spm are not in vocab\.json"):
        import_checkpoint(directory, tmp_path / "m.pt")
    assert not (tmp_path / "m.pt").exists()


def test_a_vocab_json_of_string_ids_is_named_as_the_fault(small_opus, tmp_path):
    """Ids written as strings were once reported as config.json's decoder_start_token_id being no
    piece's id."""
    directory = tmp_path / "opus"
    shutil.copytree(small_opus, directory)
    vocab = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    (directory / "vocab.json").write_text(
        json.dumps({piece: str(i) for piece, i in vocab.items()}), encoding="utf-8"
    )
    with pytest.raises(
        MarianError,
        match=r"vocab\.json: not a mapping of pieces to integer ids \(the piece '.*' has the id "
        r"'0'\)",
    ):
        import_checkpoint(directory, tmp_path / "m.pt")


def test_generation_settings_nmt_does_not_apply_are_named(small_opus, tmp_path, caplog):
    directory = tmp_path / "opus"
    shutil.copytree(small_opus, directory)
    generation = json.loads((directory / "generation_config.json").read_text())
    (directory / "generation_config.json").write_text(
        json.dumps(
            {
                **generation,
                "renormalize_logits": True,
                "bad_words_ids": [[5, 6], generation["bad_words_ids"][0]],
            }
        )
    )
    payload = import_checkpoint(directory, tmp_path / "m.pt")
    notes = payload["imported_from"]["not_applied"]
    assert [n.split("=")[0].split(" ")[0] for n in notes] == [
        "early_stopping",
        "renormalize_logits",
        "bad_words_ids",
    ]
    assert "early_stopping=False" in caplog.text and "renormalize_logits=True" in caplog.text
    info = runner.invoke(app, ["info", str(tmp_path / "m.pt")])
    assert (
        f"imported from: {directory}" in info.output
        and "not applied from its generation settings: renormalize_logits" in info.output
    )


def test_without_a_length_limit_an_import_takes_nmts_rule_and_says_so(small_opus, tmp_path, caplog):
    """generate() stops at 20 tokens (18 pieces) when a directory sets no max_length; nmt's own
    rule applies instead, and the import says so in one line."""
    directory = tmp_path / "opus"
    shutil.copytree(small_opus, directory)
    for name in ("generation_config.json", "config.json"):
        settings = json.loads((directory / name).read_text())
        (directory / name).write_text(
            json.dumps({k: v for k, v in settings.items() if k != "max_length"})
        )
    payload = import_checkpoint(directory, tmp_path / "m.pt")
    decode = payload["config"]["decode"]
    assert (decode["max_len_a"], decode["max_len_b"]) == (1.5, 10)
    said = [r.getMessage() for r in caplog.records if "max_length" in r.getMessage()]
    assert said == [
        f"warning: {directory / 'generation_config.json'}: no max_length or max_new_tokens: "
        "translations are limited by nmt's rule, 1.5 x source pieces + 10 (generate() would stop "
        "at 18 pieces); --max-len-a and --max-len-b change it"
    ]


def test_a_line_past_an_imports_positions_is_refused_and_each_line_taken_fits_generate(
    small_opus, tmp_path, caplog
):
    """max_position_embeddings 128: a source line of 127 pieces and its EOS is translated, and
    generate() takes it too; one of 128 pieces is left empty with a warning naming it (generate()
    raises an IndexError there), where before it was translated past the model's positions."""
    assert (
        runner.invoke(app, ["import", str(small_opus), "--out", str(tmp_path / "m.pt")]).exit_code
        == 0
    )
    tok = transformers.MarianTokenizer.from_pretrained(small_opus)
    lines = {n: " ".join(["cat"] * n) for n in (126, 127, 128, 200)}
    assert {n: len(tok(line)["input_ids"]) for n, line in lines.items()} == {
        n: n + 1 for n in lines
    }  # n pieces and EOS
    out = runner.invoke(
        app,
        [
            "translate",
            "--checkpoint",
            str(tmp_path / "m.pt"),
            "--beam-size",
            "1",
            "--max-len-b",
            "3",
        ],
        input="".join(line + "\n" for line in lines.values()),
    )
    assert out.exit_code == 0, out.output
    written = out.stdout.splitlines()
    assert [bool(w) for w in written] == [True, True, False, False]
    assert "input line 3 has 128 pieces, over the limit of 127 (--max-input-pieces)" in caplog.text
    hf = transformers.MarianMTModel.from_pretrained(small_opus).eval()
    with torch.no_grad():
        for n in (126, 127):  # what nmt translated, generate() takes
            hf.generate(**tok([lines[n]], return_tensors="pt"), max_length=4, num_beams=1)
        with pytest.raises(IndexError):
            hf.generate(**tok([lines[128]], return_tensors="pt"), max_length=4, num_beams=1)


@pytest.mark.parametrize("sacremoses", ["absent", "installed"])
def test_ids_equal_with_and_without_sacremoses(small_opus, monkeypatch, sacremoses):
    """MarianTokenizer sets up Moses' punctuation normaliser when sacremoses is installed, but does
    not apply it: nmt does not either."""
    if sacremoses == "absent":
        monkeypatch.setitem(sys.modules, "sacremoses", None)
    else:
        pytest.importorskip("sacremoses")
    tok = transformers.MarianTokenizer.from_pretrained(small_opus)
    # the normaliser nmt must not apply differs with sacremoses
    assert (tok.punc_normalizer("«a»") == "«a»") == (sacremoses == "absent")
    from nmt.interop.importing import read_tokenizer

    tokenizer = read_tokenizer(small_opus)
    for text in ["«the dog»  „x“ – 1,5 ’s", "the dog ... sees a cat!", "« »", "‘a’ “b” — c"]:
        assert tok(text)["input_ids"] == marian_ids(
            tokenizer.encode_src([text])[0], tokenizer.src.layout
        ) + [0]


def test_an_imported_model_fine_tunes_and_every_command_accepts_it(small_opus, tmp_path):
    assert (
        runner.invoke(app, ["import", str(small_opus), "--out", str(tmp_path / "m.pt")]).exit_code
        == 0
    )
    run = tmp_path / "run"
    direct = runner.invoke(
        app,
        [
            "train",
            "--init-from",
            str(small_opus),
            "--run-dir",
            str(run),
            "--set",
            f"data.dir={TOY}",
        ],
    )
    assert direct.exit_code == 2 and direct.output.startswith(
        f"error: --init-from {small_opus} is a Hugging Face directory; import it first"
    )
    assert not run.exists()
    result = runner.invoke(
        app,
        [
            "train",
            "--init-from",
            str(tmp_path / "m.pt"),
            "--run-dir",
            str(run),
            "--set",
            f"data.dir={TOY}",
            "--set",
            "train.max_steps=3",
            "--set",
            "train.log_every=1",
            "--set",
            "train.validate_every=3",
            "--set",
            # a step_2.pt to average with last.pt (best.pt is last.pt: both of step 3)
            "train.save_every=2",
            "--set",
            "data.valid_max_sentences=4",
            "--set",
            "train.valid_beam_size=1",
            "--set",
            "train.max_tokens=400",
            "--set",
            "train.threads=1",
            "--set",
            "train.schedule=constant",
            "--set",
            "train.lr=1e-4",
            "--set",
            "train.warmup_steps=1",
            "--set",
            # regularisation may change when fine-tuning; Marian's segmenters sample too
            "tokenizer.subword_alpha=0.1",
        ],
    )
    assert result.exit_code == 0, result.output
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [1, 2, 3] and all(
        r["lr"] == 1e-4 for r in records if "loss" in r
    )
    last = load_checkpoint(run / "last.pt").payload
    assert last["model"]["output_bias"][PAD] == NEVER  # a buffer: never trained
    assert (
        last["subwords"]["epoch"] == last["progress"]["epoch"]
        and last["config"]["tokenizer"]["subword_alpha"] == 0.1
    )
    assert (
        last["init_from"]["path"] == str(tmp_path / "m.pt")
        and last["init_from"]["step"] is None
        and last["imported_from"]["path"] == str(small_opus)
    )
    info = runner.invoke(app, ["info", str(run / "last.pt")])
    assert (
        f"initialised from: {tmp_path / 'm.pt'} (not trained by nmt" in info.output
        and f"imported from: {small_opus}" in info.output
    )
    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_text("".join(line + "\n" for line in SOURCE[-4:]))
    ref.write_text("".join(line + "\n" for line in TARGET[-4:]))
    assert (
        runner.invoke(
            app,
            [
                "evaluate",
                "--checkpoint",
                str(run / "last.pt"),
                "--src",
                str(src),
                "--ref",
                str(ref),
                "--max-len-b",
                "8",
            ],
        ).exit_code
        == 0
    )
    tuned = runner.invoke(
        app,
        [
            "tune-decode",
            "--checkpoint",
            str(tmp_path / "m.pt"),
            "--src",
            str(src),
            "--ref",
            str(ref),
            "--beam-sizes",
            "1,2",
        ],
    )
    assert tuned.exit_code == 0, tuned.output
    averaged = runner.invoke(
        app,
        [
            "average",
            str(run / "step_2.pt"),
            str(run / "last.pt"),
            "--out",
            str(tmp_path / "avg.pt"),
        ],
    )
    assert averaged.exit_code == 0, averaged.output
    assert load_checkpoint(tmp_path / "avg.pt").payload["imported_from"]["path"] == str(small_opus)
    assert (
        runner.invoke(
            app,
            [
                "export",
                "--checkpoint",
                str(tmp_path / "avg.pt"),
                "--format",
                "nmt",
                str(tmp_path / "slim.pt"),
            ],
        ).exit_code
        == 0
    )
    assert "imported from:" in runner.invoke(app, ["info", str(tmp_path / "slim.pt")]).output
    resumed = runner.invoke(
        app, ["train", "--run-dir", str(run), "--resume", "--set", "train.max_steps=4"]
    )
    assert resumed.exit_code == 0, resumed.output
    assert load_checkpoint(run / "last.pt").payload["init_from"]["path"] == str(tmp_path / "m.pt")


def test_serve_translates_an_imported_model_as_translate_does(small_opus, tmp_path):
    from starlette.testclient import TestClient

    from nmt.serve.app import Limits, Translator, create_app

    import_checkpoint(small_opus, tmp_path / "m.pt")
    translator = Translator.load([tmp_path / "m.pt"], torch.device("cpu"), torch.float32)
    lines = [">>fr<< the big dog .", "a woman sees a cat ."]
    decode = replace(translator.cfg.decode, beam_size=2)
    expected = best_strings(
        translator.tokenizer,
        translate_lines(translator.model, translator.tokenizer, lines, decode, torch.device("cpu")),
    )
    with TestClient(create_app(translator, Limits(max_wait_ms=0.0))) as client:
        answer = client.post("/translate", json={"text": lines, "beam_size": 2, "alignment": True})
        info = client.get("/info")
    assert answer.status_code == 200 and info.status_code == 200, answer.text
    assert [t["text"] for t in answer.json()["translations"]] == expected
    assert info.json()["tokenizer"]["src_vocab_size"] == translator.tokenizer.src.get_piece_size()
    pieces = answer.json()["translations"][0]["attention"]["src_pieces"]
    assert pieces[0] == ">>fr<<" and pieces[-1] == "</s>"  # the language code is one piece


@pytest.mark.parametrize("joint", [True, False])
def test_an_nmt_export_imports_back_as_the_model_it_came_from(tmp_path, joint):
    """A directory nmt export wrote decodes from <s> (nmt's BOS), not <pad>: its ids are kept, no
    row is added; a vocabulary per side comes back as one per side."""
    from conftest import cached_tokenizer, tiny_config

    from nmt.config import Config, TokenizerConfig, config_to_dict
    from nmt.core.model import Transformer
    from nmt.data.corpus import read_parallel
    from nmt.data.tokenizer import train_tokenizer
    from nmt.runs.checkpoint import save_checkpoint, tokenizer_to_tensors

    if joint:
        tokenizer = cached_tokenizer(300, 3000, german=True)
    else:
        src, tgt = read_parallel(TOY / "train.en", TOY / "train.de")
        tokenizer = train_tokenizer(
            src[:3000], tgt[:3000], TokenizerConfig(vocab_size=300, joint=False)
        )
    torch.manual_seed(0)
    model = Transformer(
        tiny_config(src_vocab_size=300, tgt_vocab_size=300, share_embeddings=joint)
    ).eval()
    cfg = Config(model=model.cfg, decode=DecodeConfig(beam_size=3, max_len_a=0.0, max_len_b=8))
    save_checkpoint(
        {
            "model": model.state_dict(),
            "config": config_to_dict(cfg),
            "tokenizer": tokenizer_to_tensors(tokenizer.protos()),
        },
        tmp_path / "m.pt",
    )
    assert (
        runner.invoke(
            app, ["export", "--checkpoint", str(tmp_path / "m.pt"), str(tmp_path / "hf")]
        ).exit_code
        == 0
    )
    import_checkpoint(tmp_path / "hf", tmp_path / "back.pt")
    back, back_tokenizer, back_cfg = load_model(tmp_path / "back.pt", torch.device("cpu"))
    # the same ids
    assert back_tokenizer.src.layout.pieces == tuple(
        tokenizer.src.id_to_piece(i) for i in range(300)
    )
    assert (
        back_tokenizer.tgt.layout.pieces == tuple(tokenizer.tgt.id_to_piece(i) for i in range(300))
        and back_tokenizer.joint == joint
    )
    state = back.state_dict()
    assert (
        all(torch.equal(state[k], v) for k, v in model.state_dict().items())
        and not state["output_bias"].any()
    )
    # its generation_config.json
    assert (back_cfg.decode.beam_size, back_cfg.decode.max_len_b, back_cfg.decode.allow_unk) == (
        3,
        8,
        False,
    )
    lines = ["the dog sees a cat .", "a man , a woman and a child ."]
    ours = translate_lines(model, tokenizer, lines, cfg.decode, torch.device("cpu"))
    theirs = translate_lines(back, back_tokenizer, lines, back_cfg.decode, torch.device("cpu"))
    assert [h[0].tokens for h in ours] == [h[0].tokens for h in theirs]


def test_a_ctranslate2_export_of_an_import_bans_pad_as_nmt_does(tmp_path):
    """No PAD or BOS from nmt, so none from the CTranslate2 README's search either, also for an nmt
    export imported back (whose BOS is '<s>', not OPUS-MT's start piece '<pad>')."""
    pytest.importorskip("ctranslate2")
    import re

    from conftest import cached_tokenizer, tiny_config

    from nmt.config import Config, config_to_dict
    from nmt.core.model import Transformer
    from nmt.runs.checkpoint import save_checkpoint, tokenizer_to_tensors

    tokenizer = cached_tokenizer(300, 3000, german=True)
    model = Transformer(tiny_config(src_vocab_size=300, tgt_vocab_size=300)).eval()
    payload = {
        "model": model.state_dict(),
        "config": config_to_dict(Config(model=model.cfg)),
        "tokenizer": tokenizer_to_tensors(tokenizer.protos()),
    }
    save_checkpoint(payload, tmp_path / "m.pt")
    assert (
        runner.invoke(
            app, ["export", "--checkpoint", str(tmp_path / "m.pt"), str(tmp_path / "hf")]
        ).exit_code
        == 0
    )
    import_checkpoint(tmp_path / "hf", tmp_path / "back.pt")
    assert (
        runner.invoke(
            app,
            [
                "export",
                "--checkpoint",
                str(tmp_path / "back.pt"),
                "--format",
                "ctranslate2",
                str(tmp_path / "ct2"),
            ],
        ).exit_code
        == 0
    )
    code = re.search(r"```python\n(.*?)```", (tmp_path / "ct2" / "README.md").read_text(), re.S)[1]
    assert "suppress_sequences=[['<s>'], ['<pad>']]" in code
    printed = []
    # the README's lines run as written
    exec(code.replace("print(", "printed.append("), {"printed": printed})
    assert len(printed[0]) == 1 and isinstance(printed[0][0], str)


JSON_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=False),
    st.text(max_size=4),
    st.just([1]),
    st.just({"a": 1}),
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    file=st.sampled_from(["config.json", "generation_config.json", "tokenizer_config.json"]),
    data=st.data(),
)
def test_any_value_of_any_key_of_a_marian_json_file_imports_or_is_one_error(
    small_opus, tmp_path_factory, file, data
):
    """decoder_start_token_id [1] raised TypeError (unhashable list) where 19 other changes had
    one-line errors: every key of the three JSON files a Marian directory holds, given a value of
    any JSON type, imports or is refused as an nmt error, never another exception."""
    from nmt.errors import NmtError

    directory = tmp_path_factory.mktemp("mutated") / "opus"
    shutil.copytree(small_opus, directory)
    content = json.loads((directory / file).read_text())
    key = data.draw(st.sampled_from(sorted(content)))
    (directory / file).write_text(json.dumps({**content, key: data.draw(JSON_VALUES)}))
    try:
        import_checkpoint(directory, directory.parent / "m.pt")
    except NmtError as exc:
        assert "\n" not in str(exc)
