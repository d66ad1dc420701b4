"""Targets other than German: Chinese and Japanese end to end, tokenizer choices by script,
and the command-line flags that go with them."""

import gzip
import importlib.util
import json
import os
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from hypothesis import given
from hypothesis import strategies as st
from sentencepiece import sentencepiece_model_pb2
from test_cli import invoke
from test_evaluate import CODES

from nmt.config import ConfigError, TokenizerConfig, load_config
from nmt.data.tokenizer import UNK, auto_character_coverage, train_tokenizer
from nmt.decode.restrictions import Restrictions

TOY_ZH = ROOT / "data" / "toy_zh"
ENJA = Path(
    os.environ.get("SMALL_PARALLEL_ENJA", ROOT.parent / "shared" / "data" / "small_parallel_enja")
)
TINY = [
    "--set",
    "model.preset=tiny",
    "--set",
    "train.threads=1",
    "--set",
    "train.progress_bar=false",
    "--set",
    "train.tensorboard=false",
    "--set",
    "data.workers=1",
]


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def test_toy_zh_corpus_regenerates_byte_for_byte(tmp_path):
    spec = importlib.util.spec_from_file_location(
        "make_toy_zh_corpus", ROOT / "scripts" / "make_toy_zh_corpus.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--out", str(tmp_path)])
    for split in ("train", "valid", "test"):
        for lang in ("en", "zh"):
            assert (tmp_path / f"{split}.{lang}").read_bytes() == (
                TOY_ZH / f"{split}.{lang}"
            ).read_bytes()
    assert len(lines(TOY_ZH / "train.zh")) == 2000 and lines(TOY_ZH / "valid.zh")[0].endswith("。")


@pytest.fixture(scope="module")
def zh_run(tmp_path_factory):
    """A tiny English→Chinese model, validated (greedy, tok:zh) at steps 50, 100 and 150."""
    run = tmp_path_factory.mktemp("zh") / "run"
    result = invoke(
        "train",
        "--run-dir",
        run,
        "--set",
        f"data.dir={TOY_ZH}",
        "--set",
        "data.src_lang=en",
        "--set",
        "data.tgt_lang=zh",
        *TINY,
        "--set",
        "tokenizer.vocab_size=150",
        "--set",
        "train.max_steps=150",
        "--set",
        "train.warmup_steps=50",
        "--set",
        "train.validate_every=50",
        "--set",
        "train.save_every=50",
        "--set",
        "train.log_every=50",
        "--set",
        "train.max_tokens=1500",
        "--set",
        "train.valid_beam_size=1",
    )
    assert result.exit_code == 0, result.output
    return run


@pytest.mark.slow
def test_chinese_validation_bleu_is_nmt_evaluate_bleu_and_picks_best(zh_run):
    validations = [json.loads(line) for line in lines(zh_run / "metrics.jsonl") if '"bleu"' in line]
    assert [v["step"] for v in validations] == [50, 100, 150]
    assert all("|tok:zh|" in v["bleu_signature"] for v in validations)
    for v in validations:
        # No --tokenize or --tgt-lang: the checkpoint's data.tgt_lang (zh) chooses `zh`, as
        # validation did.
        result = invoke(
            "evaluate",
            "--checkpoint",
            zh_run / f"step_{v['step']}.pt",
            "--src",
            TOY_ZH / "valid.en",
            "--ref",
            TOY_ZH / "valid.zh",
            "--beam-size",
            "1",
            "--json",
        )
        assert result.exit_code == 0, result.output
        scored = json.loads(result.stdout)
        assert (
            scored["tokenize"] == "zh"
            and scored["bleu"] == v["bleu"]
            and scored["chrf"] == v["chrf"]
        )
    best = max(validations, key=lambda v: v["bleu"])
    # Scored with 13a, every imperfect Chinese line is one wrong "word": best.pt would stay at step
    # 50.
    assert best["step"] > 50 and best["bleu"] > validations[0]["bleu"] > 0
    assert torch.load(zh_run / "best.pt", weights_only=True)["progress"]["step"] == best["step"]


@pytest.mark.slow
def test_evaluate_flags_choose_the_tokenizer(zh_run, tmp_path):
    hyp = tmp_path / "hyp.zh"
    invoke(
        "evaluate",
        "--checkpoint",
        zh_run,
        "--src",
        TOY_ZH / "test.en",
        "--ref",
        TOY_ZH / "test.zh",
        "--output",
        hyp,
        "--beam-size",
        "2",
    )
    ref = TOY_ZH / "test.zh"
    by_flag = {
        t: json.loads(
            invoke("evaluate", "--hyp", hyp, "--ref", ref, "--tokenize", t, "--json").stdout
        )
        for t in ("13a", "zh", "char")
    }
    assert (
        json.loads(
            invoke("evaluate", "--hyp", hyp, "--ref", ref, "--tgt-lang", "zh", "--json").stdout
        )["bleu"]
        == by_flag["zh"]["bleu"]
    )
    # no language given: sacreBLEU's default, with a warning
    default = invoke("evaluate", "--hyp", hyp, "--ref", ref, "--json")
    assert json.loads(default.stdout)["tokenize"] == "13a"
    assert (
        "warning: the references look like zh text, which sacreBLEU scores with tokenizer zh, not "
        "13a: pass --tgt-lang zh" in default.stderr
    )
    assert by_flag["zh"]["bleu"] > by_flag["13a"]["bleu"]
    # An explicit flag overrides the checkpoint's language.
    forced = json.loads(
        invoke(
            "evaluate",
            "--checkpoint",
            zh_run,
            "--src",
            TOY_ZH / "test.en",
            "--ref",
            ref,
            "--beam-size",
            "2",
            "--tokenize",
            "char",
            "--json",
        ).stdout
    )
    assert forced["bleu"] == by_flag["char"]["bleu"] and "|tok:char|" in forced["bleu_signature"]
    text = invoke("evaluate", "--hyp", hyp, "--ref", ref, "--tgt-lang", "zh")
    assert text.exit_code == 0 and text.stdout.startswith(f"BLEU = {by_flag['zh']['bleu']:.2f} ")
    assert (
        f"  signature: {by_flag['zh']['bleu_signature']}" in text.stdout.splitlines()
        and "|tok:zh|" in by_flag["zh"]["bleu_signature"]
    )
    bad = invoke("evaluate", "--hyp", hyp, "--ref", ref, "--tokenize", "mecab")
    assert bad.exit_code == 2 and "unknown BLEU tokenizer 'mecab'" in bad.output


@pytest.mark.slow
def test_tune_decode_scores_as_validation_did(zh_run):
    """tune-decode on a Chinese run uses the checkpoint's tokenizer (zh): its greedy row is the
    last validation's BLEU, where 13a would score nearly every line as one wrong word."""
    last = [json.loads(line) for line in lines(zh_run / "metrics.jsonl") if '"bleu"' in line][-1]
    args = [
        "tune-decode",
        "--checkpoint",
        zh_run / "last.pt",
        "--src",
        TOY_ZH / "valid.en",
        "--ref",
        TOY_ZH / "valid.zh",
        "--beam-sizes",
        "1",
        "--json",
    ]
    rows = json.loads(invoke(*args).stdout)["rows"]
    assert "|tok:zh|" in rows[0]["bleu_signature"] and rows[0]["bleu"] == last["bleu"]
    forced = json.loads(invoke(*args, "--tokenize", "13a").stdout)["rows"]
    assert "|tok:13a|" in forced[0]["bleu_signature"] and forced[0]["bleu"] < rows[0]["bleu"]


@pytest.mark.slow
def test_translate_allow_unk_reaches_the_search(zh_run, monkeypatch):
    seen = []
    made = Restrictions.__init__

    def recording(self, decode, *args, **kwargs):
        seen.append(decode.allow_unk)
        made(self, decode, *args, **kwargs)

    monkeypatch.setattr(Restrictions, "__init__", recording)
    for flags, expected in (((), False), (("--allow-unk",), True), (("--no-allow-unk",), False)):
        result = invoke(
            "translate",
            "--checkpoint",
            zh_run,
            "--beam-size",
            "2",
            *flags,
            input="He drinks tea .\n",
        )
        assert result.exit_code == 0, result.output
        assert seen.pop() is expected and not seen


def test_missing_mecab_stops_evaluate_and_train_before_any_work(tmp_path, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "MeCab", None)
    ref = tmp_path / "ref.ja"
    ref.write_text("猫です。\n", encoding="utf-8")
    result = invoke("evaluate", "--hyp", ref, "--ref", ref, "--tgt-lang", "ja")
    assert result.exit_code == 2
    assert (
        result.output.strip()
        == "error: BLEU tokenizer ja-mecab needs MeCab and its dictionary (MeCab is not "
        'installed): pip install "nmt[ja]"'
    )
    result = invoke(
        "train",
        "--run-dir",
        tmp_path / "run",
        "--set",
        f"data.dir={TOY_ZH}",
        "--set",
        "data.tgt_lang=ja",
    )
    assert (
        result.exit_code == 2
        and 'pip install "nmt[ja]"' in result.output
        and not (tmp_path / "run").exists()
    )


@pytest.fixture(scope="module")
def validation_model():
    """A tiny untrained model, the toy tokenizer and three sources: validation only needs something
    to score."""
    from conftest import cached_tokenizer, tiny_config

    from nmt.core.model import Transformer

    tokenizer = cached_tokenizer(300, 3000, german=True)
    torch.manual_seed(0)
    return (
        Transformer(tiny_config(src_vocab_size=300, tgt_vocab_size=300)).eval(),
        tokenizer,
        ["the dog .", "a man .", "the house ."],
    )


@given(case=CODES, per_direction=st.booleans())
def test_validation_scores_every_spelling_of_its_language_code_as_that_language(
    validation_model, case, per_direction
):
    """A run with ``data.tgt_lang: zho_Hans`` validated Chinese with 13a: best.pt and early stopping
    followed BLEU near 0. The code is read where validation reads it, as ``data.tgt_lang`` or as a
    direction's target."""
    from test_evaluate import JA_REF, KO_REF, ZH_REF

    from nmt.config import Config, DataConfig, DecodeConfig, TrainConfig
    from nmt.data.encoded import EncodedCorpus
    from nmt.training.validation import ValidationSet, validate

    tokenize, code = case
    model, tokenizer, sources = validation_model
    refs = {"ja-mecab": JA_REF, "ko-mecab": KO_REF}.get(tokenize, ZH_REF)
    corpus = EncodedCorpus.from_lists(tokenizer.encode_src(sources), tokenizer.encode_tgt(refs))
    valid = ValidationSet(
        corpus, sources, refs, "en-x" if per_direction else "", code if per_direction else None
    )
    data = DataConfig(src_lang="en", tgt_lang="de" if per_direction else code)
    cfg = Config(
        model=model.cfg,
        data=data,
        decode=DecodeConfig(max_len_b=3),
        train=TrainConfig(valid_beam_size=1),
    )
    result = validate(model, tokenizer, [valid], cfg, torch.device("cpu"))
    signature = result["bleu_signature/en-x" if per_direction else "bleu_signature"]
    assert f"|tok:{tokenize}" in signature, (code, signature)


def test_a_run_is_warned_when_its_language_code_leaves_chinese_validation_to_13a(tmp_path, caplog):
    from nmt.training.opening import prepare

    data = tmp_path / "data"
    data.mkdir()
    for split in ("train", "valid"):
        (data / f"{split}.en").write_text(
            (TOY_ZH / f"{split}.en").read_text(encoding="utf-8"), encoding="utf-8"
        )
        for code in ("xyz", "zho_Hans"):
            (data / f"{split}.{code}").write_text(
                (TOY_ZH / f"{split}.zh").read_text(encoding="utf-8"), encoding="utf-8"
            )
    for code, warned in (("xyz", True), ("zho_Hans", False)):
        caplog.clear()
        cfg = load_config(
            None,
            [
                f"data.dir={data}",
                "data.src_lang=en",
                f"data.tgt_lang={code}",
                "tokenizer.vocab_size=150",
                "data.workers=1",
            ],
        )
        (tmp_path / code).mkdir()
        with caplog.at_level("INFO"):
            prepared = prepare(cfg, tmp_path / code, None, write=True)
        warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
        assert prepared.valid[0].tgt_lang == code
        assert warnings == (
            [
                f"warning: the validation references ({data}/valid.en and {data}/valid.{code}) "
                f"look like zh text, but their language code {code} "
                "chooses BLEU tokenizer 13a, which scores it near 0 and best.pt and train.patience "
                "would follow that: "
                "set eval.tokenize=zh, or name the language as nmt knows it (zh)"
            ]
            if warned
            else []
        )


def test_auto_character_coverage_by_script():
    # 61 distinct characters: a small sample is not a large character set
    ja = lines(TOY_ZH / "train.zh")
    assert auto_character_coverage({"source": lines(TOY_ZH / "train.en"), "target": ja})[0] == 1.0
    # 560 distinct Han characters
    many = ["".join(chr(0x4E00 + 7 * i + j) for j in range(7)) for i in range(80)]
    coverage, reason = auto_character_coverage({"source": ["a b c"], "target": many})
    assert coverage == 0.9995 and reason.startswith(
        "the target text has 560 distinct characters in its first 80 sentences, more than 500"
    )
    # 497 characters
    assert auto_character_coverage({"source": many[:71], "target": ["x"]})[0] == 1.0


def test_auto_coverage_is_logged_and_reaches_sentencepiece(caplog):
    han = ["".join(chr(0x4E00 + (7 * i + j) % 600) for j in range(7)) for i in range(400)]
    with caplog.at_level("INFO", logger="nmt.tokenizer"):
        joint = train_tokenizer(
            ["a b c"] * 400, han, TokenizerConfig(vocab_size=900, character_coverage="auto")
        )
        english = [f"word{i} number{7 * i} item{13 * i} thing{i % 13} and more" for i in range(400)]
        separate = train_tokenizer(
            english, han, TokenizerConfig(vocab_size=900, character_coverage="auto", joint=False)
        )
    assert (
        "tokenizer.character_coverage auto: 0.9995 (the target text has 600 distinct characters in "
        "its first 400 sentences" in caplog.text
    )
    assert (
        "tokenizer.character_coverage auto: 1.0 (the source text has 25 distinct characters"
        in caplog.text
    )
    assert "tokenizer.byte_fallback auto: true (character coverage 0.9995" in caplog.text
    for sp, coverage in ((joint.tgt, 0.9995), (separate.src, 1.0), (separate.tgt, 0.9995)):
        proto = sentencepiece_model_pb2.ModelProto()
        proto.ParseFromString(sp.serialized_model_proto())
        assert proto.trainer_spec.character_coverage == pytest.approx(coverage)
        assert proto.trainer_spec.byte_fallback == (coverage < 1.0)


def test_byte_fallback_spells_unseen_characters_instead_of_unk():
    text = ["他每天喝茶。", "我们在公园散步。", "这本书很有意思。"] * 50
    # byte_fallback auto: off
    plain = train_tokenizer(text, text, TokenizerConfig(vocab_size=60, character_coverage=1.0))
    fallback = train_tokenizer(
        text, text, TokenizerConfig(vocab_size=300, character_coverage=1.0, byte_fallback=True)
    )
    unseen = "王小明喜欢茶。"  # 王小明喜欢 never occur in the training text
    assert (
        plain.encode_tgt([unseen])[0].count(UNK) >= 1
        and plain.decode_tgt(plain.encode_tgt([unseen]))[0] != unseen
    )
    ids = fallback.encode_tgt([unseen])[0]
    assert UNK not in ids and fallback.decode_tgt([ids])[0] == unseen
    assert fallback.tgt.id_to_piece(ids[1]) == "<0xE7>"  # 王 is E7 8E 8B in UTF-8


@pytest.mark.slow
@pytest.mark.skipif(
    not (ENJA / "train.ja.gz").is_file(),
    reason=f"small_parallel_enja not found at {ENJA}; set SMALL_PARALLEL_ENJA to run the "
    "English→Japanese test",
)
def test_english_japanese_run_on_a_slice(tmp_path):
    data = tmp_path / "enja"
    data.mkdir()
    for split, n in (("train", 3000), ("dev", 40)):
        for lang in ("en", "ja"):
            with gzip.open(ENJA / f"{split}.{lang}.gz", "rt", encoding="utf-8") as f:
                (data / f"{split}.{lang}").write_text(
                    "".join(next(f) for _ in range(n)), encoding="utf-8"
                )
    run = tmp_path / "run"
    result = invoke(
        "train",
        "--config",
        ROOT / "configs" / "small_enja.yaml",
        "--run-dir",
        run,
        "--set",
        f"data.dir={data}",
        *TINY,
        "--set",
        "tokenizer.vocab_size=2000",
        "--set",
        "train.max_steps=30",
        "--set",
        "train.validate_every=30",
        "--set",
        "train.log_every=10",
        "--set",
        "train.max_tokens=1500",
        "--set",
        "train.valid_beam_size=1",
    )
    assert result.exit_code == 0, result.output
    record = [json.loads(line) for line in lines(run / "metrics.jsonl") if '"bleu"' in line][-1]
    assert record["step"] == 30 and "|tok:ja-mecab-" in record["bleu_signature"]
    src = data / "dev.en"
    result = invoke(
        "evaluate",
        "--checkpoint",
        run,
        "--src",
        src,
        "--ref",
        data / "dev.ja",
        "--beam-size",
        "1",
        "--json",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["bleu"] == record["bleu"]
    out = invoke("translate", "--checkpoint", run, "--beam-size", "2", "-i", src)
    assert out.exit_code == 0 and len(out.stdout.splitlines()) == 40 and "⁇" not in out.stdout


def test_config_keys_for_scripts():
    cfg = load_config(None, [])
    assert (
        cfg.tokenizer.character_coverage,
        cfg.tokenizer.byte_fallback,
        cfg.decode.allow_unk,
        cfg.eval.tokenize,
    ) == ("auto", "auto", False, "auto")
    cfg = load_config(
        None,
        [
            "tokenizer.character_coverage=0.9995",
            "tokenizer.byte_fallback=false",
            "decode.allow_unk=true",
            "eval.tokenize=char",
        ],
    )
    assert (
        cfg.tokenizer.character_coverage,
        cfg.tokenizer.byte_fallback,
        cfg.decode.allow_unk,
        cfg.eval.tokenize,
    ) == (0.9995, False, True, "char")
    assert load_config(None, ["tokenizer.character_coverage=1"]).tokenizer.character_coverage == 1.0
    for override, message in (
        (
            "tokenizer.character_coverage=most",
            "tokenizer.character_coverage must be auto or a number in (0, 1], got 'most'",
        ),
        (
            "tokenizer.character_coverage=1.5",
            "tokenizer.character_coverage must be auto or a number in (0, 1], got 1.5",
        ),
        (
            "tokenizer.byte_fallback=sometimes",
            "tokenizer.byte_fallback must be auto, true or false, got 'sometimes'",
        ),
        ("eval.tokenize=mecab", "eval.tokenize must be auto, none, zh, 13a"),
    ):
        with pytest.raises(ConfigError) as info:
            load_config(None, [override])
        assert str(info.value).startswith(message)
