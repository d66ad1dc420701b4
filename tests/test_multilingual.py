"""One model for several directions: config, tags, the direction mix, validation per direction,
--tgt-lang."""

import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import TOY, load_model, translate_lines
from typer.testing import CliRunner

from nmt.cli.main import app
from nmt.config import ConfigError, TokenizerConfig, config_from_dict, config_to_dict, load_config
from nmt.core.batching import TokenBatchSampler, token_batches
from nmt.data.corpus import ParallelText, read_lines
from nmt.data.encoded import EncodedCorpus, cache_key, encode_corpus
from nmt.data.multilingual import (
    Direction,
    DirectionMix,
    directions,
    language_shares,
    tags,
    target,
    train_multilingual_tokenizer,
)
from nmt.runs.checkpoint import load_checkpoint
from nmt.training.train import train
from nmt.translation.inference import best_strings

runner = CliRunner()


def invoke(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


def one_line_error(result) -> str:
    """The one line a failed command printed on stderr (exit code 2)."""
    assert result.exit_code == 2, result.output
    (line,) = [line for line in result.stderr.splitlines() if line.strip()]
    return line


def two_target_corpus(
    directory: Path, n: int = 300, n_valid: int = 20, n_up: int | None = None
) -> Path:
    """The toy corpus's first ``n`` English sentences with their German (``de``) and in capitals
    (``up``, a language whose every output is recognisable), as ``{split}.{lang}`` files; with
    ``n_up``, en→up has only that many training pairs, in its own files ``train.en-up.{en,up}``."""
    directory.mkdir(parents=True, exist_ok=True)
    for split, count in (("train", n), ("valid", n_valid)):
        en = read_lines(TOY / f"{split}.en")[:count]
        sides = {
            "en": en,
            "de": read_lines(TOY / f"{split}.de")[:count],
            "up": [line.upper() for line in en],
        }
        for lang, lines in sides.items():
            (directory / f"{split}.{lang}").write_text(
                "".join(line + "\n" for line in lines), encoding="utf-8"
            )
    if n_up is not None:
        (directory / "train.up").unlink()
        english = read_lines(TOY / "train.en")[:n_up]
        for lang, lines in (("en", english), ("up", [line.upper() for line in english])):
            (directory / f"train.en-up.{lang}").write_text(
                "".join(line + "\n" for line in lines), encoding="utf-8"
            )
    return directory


def run_config(
    data: Path, run_dir: Path, max_steps: int, languages: dict | None = None, **train_settings
):
    """A tiny model's run of ``data`` in ``languages`` (default: the directions en-de and en-up)."""
    return config_from_dict(
        {
            "model": {
                "d_model": 64,
                "d_ff": 128,
                "n_heads": 4,
                "n_encoder_layers": 1,
                "n_decoder_layers": 1,
                "dropout": 0.0,
            },
            "data": {"dir": str(data), **(languages or {"directions": ["en-de", "en-up"]})},
            "tokenizer": {"vocab_size": 150},
            "train": {
                "run_dir": str(run_dir),
                "max_steps": max_steps,
                "max_tokens": 800,
                "warmup_steps": 20,
                "lr_scale": 0.7,
                "log_every": 10,
                "validate_every": 1000,
                "valid_beam_size": 1,
                "threads": 1,
                "progress_bar": False,
                "tensorboard": False,
                **train_settings,
            },
            "decode": {"beam_size": 1, "max_len_a": 1.2, "max_len_b": 5},
        }
    )


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A two-direction model (en→de, en→up) trained for 100 steps: enough to write capitals for
    >>up<< and German for >>de<<."""
    root = tmp_path_factory.mktemp("multi")
    data = two_target_corpus(root / "data")
    result = train(run_config(data, root / "run", 100))
    return data, root / "run", result


# ---------------------------------------------------------------------------- config


def test_directions_replace_the_language_pair_and_read_back():
    cfg = load_config(None, ["data.directions=en-de,en-fr,de-en"])
    assert [str(d) for d in directions(cfg.data)] == ["en-de", "en-fr", "de-en"] and tags(
        cfg.data
    ) == (">>de<<", ">>fr<<", ">>en<<")
    stored = config_to_dict(cfg)
    assert (
        stored["data"]["directions"] == ["en-de", "en-fr", "de-en"]
        and "src_lang" not in stored["data"]
    )
    assert config_from_dict(stored) == cfg
    assert load_config(None, ["data.directions=[en-de, en-fr]"]).data.directions == (
        "en-de",
        "en-fr",
    )
    one = load_config(None, [])
    assert directions(one.data) == (Direction("en", "de"),) and tags(one.data) == ()
    # one target language: no tag needed
    assert tags(load_config(None, ["data.directions=[de-en, fr-en]"]).data) == ()


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["data.directions=[en-de, en-en]"],
            r"data.directions\[1\] en-en translates en into itself",
        ),
        (["data.directions=[en-de, en-de]"], r"data.directions\[1\] en-de is written twice"),
        (["data.directions=[en-zh-TW]"], r"data.directions\[0\] must be SRC-TGT"),
        (
            ["data.directions=[en-de, en-fr]", "data.tgt_lang=fr"],
            "data.directions replaces data.tgt_lang",
        ),
        (
            [
                "data.directions=[en-de, en-fr]",
                "tokenizer.joint=false",
                "model.share_embeddings=false",
            ],
            "share one vocabulary: set tokenizer.joint=true",
        ),
        (
            ["data.directions=[en-de, en-fr]", "data.train_src=a", "data.train_tgt=b"],
            "data.train_src names the files of one direction",
        ),
        (["data.directions=[]"], "data.directions is empty"),
        # an empty item was dropped silently
        (["data.directions=en-de,,en-fr"], r"data.directions\[1\] must be SRC-TGT.*got ''"),
    ],
)
def test_direction_settings_that_cannot_work_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_a_direction_without_files_names_the_direction_the_splits_there_and_its_own_file_names(
    tmp_path,
):
    from nmt.data.corpus import DataError
    from nmt.data.multilingual import split_text

    for name in ("train.en", "train.de", "val.en", "val.de"):
        (tmp_path / name).write_text("a\n", encoding="utf-8")
    data = load_config(None, ["data.directions=[en-de, en-es]", f"data.dir={tmp_path}"]).data
    with pytest.raises(DataError) as err:
        split_text(data, Direction("en", "de"), "valid")
    assert "data.directions en-de" in str(
        err.value
    ) and "the splits train, val: choose with data.train_split and data.valid_split" in str(
        err.value
    )
    with pytest.raises(
        DataError,
        match=r"data.directions en-es: .*neither train.es nor train.es.gz exists; or give "
        r"train.en-es.en and train.en-es.es",
    ):
        split_text(data, Direction("en", "es"), "train")


# ------------------------------------------------------------------------------ tags


def test_a_tag_is_one_piece_never_written_and_starts_every_training_source(tmp_path):
    data = two_target_corpus(tmp_path / "data", n=200)
    texts = [
        (Direction("en", lang), ParallelText.files(data / "train.en", data / f"train.{lang}"))
        for lang in ("de", "up")
    ]
    tokenizer = train_multilingual_tokenizer(
        texts, TokenizerConfig(vocab_size=150), 1, (">>de<<", ">>up<<")
    )
    sp = tokenizer.src
    ids = [sp.piece_to_id(t) for t in (">>de<<", ">>up<<")]
    assert ids == [4, 5]  # user-defined pieces come right after the four special ones
    for text in (">>up<<", ">>up<< the dog .", "the >>up<< dog", ">>up<<the"):
        # never split, wherever it is written
        assert ">>up<<" in sp.encode(text, out_type=str), text
    assert set(ids) <= set(tokenizer.output_rules.unwritable)
    corpus, _ = encode_corpus(texts[1][1], tokenizer, tmp_path / "cache", src_prefix=(ids[1],))
    assert all(
        corpus.src(i)[0] == ids[1] and ids[1] not in corpus.src(i)[1:] for i in range(len(corpus))
    )
    assert all(not set(ids) & set(corpus.tgt(i).tolist()) for i in range(len(corpus)))
    untagged, _ = encode_corpus(texts[1][1], tokenizer, tmp_path / "cache")
    assert [corpus.src(i)[1:].tolist() for i in range(5)] == [
        untagged.src(i).tolist() for i in range(5)
    ]
    assert (
        cache_key(texts[1][1], tokenizer, None, None, (ids[1],))
        != cache_key(texts[1][1], tokenizer, None, None)
        == untagged.key
    )


def test_the_tokenizer_sample_gives_a_small_language_its_share():
    assert language_shares({"en": 1000, "de": 1000}, 2000, 1.5) == {"en": 1000, "de": 1000}
    assert language_shares({"en": 900, "ha": 100}, 1000, 1.0) == {"en": 900, "ha": 100}
    # (900/100)^(1/5) = 1.55: ha's 100 sentences given 392 places, repeated
    shares = language_shares({"en": 900, "ha": 100}, 1000, 5.0)
    assert shares == {"en": 608, "ha": 392}


# --------------------------------------------------------------------------- batches


def test_a_batch_mixes_directions_in_the_configured_proportions():
    rng = np.random.default_rng(0)
    sizes = (3000, 1000)
    src, tgt = rng.integers(2, 40, size=sum(sizes)), rng.integers(2, 40, size=sum(sizes))
    for temperature, expected in ((1.0, (3000, 1000)), (2.0, (2536, 1464)), (1e6, (2000, 2000))):
        mix = DirectionMix(sizes, temperature)
        # 4,000 · n^(1/T) / Σ n^(1/T): 3000^0.5 : 1000^0.5 = 0.634 : 0.366 at T = 2
        assert mix.draws == expected
        sampler = TokenBatchSampler(src, tgt, 300, seed=3, mix=mix)
        for epoch in (0, 1):
            batches = sampler.epoch_batches(epoch)
            # examples of each direction, counted
            counts = Counter(int(i >= sizes[0]) for b in batches for i in b)
            assert (counts[0], counts[1]) == expected
            # the same token budget
            assert all(len(b) * int(sampler.lengths[b].max()) <= 300 for b in batches)
            mixed = [b for b in batches if len(b) > 4]
            # batches hold both directions, in proportion
            share = np.mean([np.mean(b >= sizes[0]) for b in mixed])
            assert share == pytest.approx(expected[1] / sum(expected), abs=0.03)
    examples = TokenBatchSampler(src, tgt, 300, seed=3, mix=DirectionMix(sizes, 2.0)).epoch_examples
    small = [Counter(examples(epoch)[examples(epoch) >= 3000].tolist()) for epoch in (0, 1)]
    # 1,464 draws of 1,000: each once, 464 twice, others each epoch
    assert all(set(c.values()) == {1, 2} for c in small) and small[0] != small[1]
    big = examples(0)[examples(0) < 3000]
    # no repeats where the direction is drawn below its size
    assert len(set(big.tolist())) == len(big) == 2536


def test_one_direction_batches_are_those_of_the_sampler_without_directions():
    rng = np.random.default_rng(1)
    src, tgt = rng.integers(2, 60, size=500), rng.integers(2, 60, size=500)
    sampler = TokenBatchSampler(src, tgt, 300, seed=3)
    for epoch in range(3):  # the sampler's algorithm as it was before directions existed
        old = np.random.default_rng([3, epoch])
        tie = old.permutation(500)
        batches = token_batches(np.maximum(src, tgt), 300, tie[np.lexsort((tgt[tie], src[tie]))])
        batches = [batches[i] for i in old.permutation(len(batches))]
        assert [b.tolist() for b in sampler.epoch_batches(epoch)] == [b.tolist() for b in batches]
    corpus = EncodedCorpus.from_lists([[5]], [[6]])
    assert corpus.parts == (1,) and EncodedCorpus.joined([corpus]) is corpus


@pytest.mark.slow
def test_one_direction_written_as_directions_trains_exactly_as_the_language_pair(tmp_path):
    data = two_target_corpus(tmp_path / "data", n=60, n_valid=4)
    a = train(run_config(data, tmp_path / "pair", 4, {"src_lang": "en", "tgt_lang": "de"}))
    b = train(run_config(data, tmp_path / "listed", 4, {"directions": ["en-de"]}))
    assert a["valid_loss"] == b["valid_loss"] and a["bleu"] == b["bleu"] and "bleu/en-de" not in b
    ca, cb = (
        load_checkpoint(tmp_path / "pair" / "last.pt").payload,
        load_checkpoint(tmp_path / "listed" / "last.pt").payload,
    )
    assert ca["data_key"] == cb["data_key"] and ca["progress"]["batching"] == cb["progress"][
        "batching"
    ] == [800, 1, 1]
    assert all(torch.equal(t, cb["model"][k]) for k, t in ca["model"].items())


def test_a_resumed_run_of_two_directions_equals_an_uninterrupted_one(tmp_path):
    # 36 en-de pairs an epoch (of 40), 19 en-up (of 15; 4 twice)
    data = two_target_corpus(tmp_path / "data", n=40, n_valid=4, n_up=15)
    mixed = {"max_tokens": 300, "log_every": 1}
    whole = train(run_config(data, tmp_path / "whole", 12, **mixed))
    train(run_config(data, tmp_path / "split", 6, **mixed))
    resumed = train(
        run_config(data, tmp_path / "split", 6, **mixed),
        resume=True,
        overrides=["train.max_steps=12"],
    )
    assert resumed["step"] == whole["step"] == 12
    a, b = (
        load_checkpoint(tmp_path / "whole" / "last.pt").payload,
        load_checkpoint(tmp_path / "split" / "last.pt").payload,
    )
    # crossed an epoch; the temperature cut its batches
    assert a["progress"]["epoch"] >= 1 and a["progress"]["batching"] == [300, 1, 1, 1.5]
    assert all(torch.equal(t, b["model"][k]) for k, t in a["model"].items())
    losses = [
        {
            r["step"]: r["loss"]
            for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
            if "loss" in r
        }
        for run in (tmp_path / "whole", tmp_path / "split")
    ]
    assert losses[0] == losses[1] and len(losses[0]) == 12
    with pytest.raises(
        ConfigError, match=r"cannot change the model or tokenizer of a run \(data.directions\)"
    ):
        train(
            run_config(data, tmp_path / "split", 6, **mixed),
            resume=True,
            overrides=["data.directions=[en-de]"],
        )


# ------------------------------------------------------------------------ validation


def test_validation_per_direction_equals_nmt_evaluate_of_that_direction(trained):
    data, run, result = trained
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    validation = [r for r in records if "bleu" in r][-1]
    # best.pt follows the mean
    assert validation["bleu"] == pytest.approx(
        (validation["bleu/en-de"] + validation["bleu/en-up"]) / 2
    )
    assert (
        result["bleu/en-up"] == validation["bleu/en-up"]
        and result["best_bleu"] == validation["bleu"]
    )
    for lang in ("de", "up"):
        scored = invoke(
            "evaluate",
            "--checkpoint",
            run / "best.pt",
            "--src",
            data / "valid.en",
            "--ref",
            data / f"valid.{lang}",
            "--tgt-lang",
            lang,
            "--beam-size",
            1,
            "--json",
            "--threads",
            1,
        )
        assert scored.exit_code == 0, scored.output
        assert json.loads(scored.stdout)["bleu"] == validation[f"bleu/en-{lang}"]
        assert json.loads(scored.stdout)["chrf"] == validation[f"chrf/en-{lang}"]


def test_plot_and_info_show_every_direction(trained, tmp_path):
    _, run, _ = trained
    assert (
        invoke("plot", run, "--out", tmp_path / "m.png").exit_code == 0
        and (tmp_path / "m.png").stat().st_size > 0
    )
    info = json.loads(invoke("info", run, "--json").stdout)
    assert (info["directions"], info["tgt_langs"], info["tags"]) == (
        ["en-de", "en-up"],
        ["de", "up"],
        [">>de<<", ">>up<<"],
    )
    assert (
        "directions: en-de, en-up (into de, up: choose with --tgt-lang"
        in invoke("info", run).stdout
    )


# ----------------------------------------------------------------------- translation


def test_a_two_direction_model_translates_into_the_requested_language(trained, tmp_path):
    data, run, _ = trained
    source = data / "valid.en"
    outputs = {}
    for lang in ("de", "up"):
        result = invoke(
            "translate", "--checkpoint", run, "--tgt-lang", lang, "-i", source, "--threads", 1, "-q"
        )
        assert result.exit_code == 0, result.output
        outputs[lang] = result.stdout.splitlines()
    capitals = {
        lang: sum(line == line.upper() and any(c.isalpha() for c in line) for line in lines)
        for lang, lines in outputs.items()
    }
    # >>up<< writes capitals, >>de<< German (lower case words, capitalised nouns)
    assert capitals == {"de": 0, "up": 20}
    # German, not English: its words are German training words far more often than English ones. Not
    # a share pinned near what one processor gives: after 100 steps the model writes half-formed
    # words, and how many depends on the summation order (on an AMD EPYC 80 of 160 were German
    # training words and none English; on an Intel Xeon more than half).
    german, english = (
        set(" ".join(read_lines(data / f"train.{lang}")).split()) for lang in ("de", "en")
    )
    words, english_only = (
        [word for line in outputs["de"] for word in line.split()],
        english - german,
    )
    assert sum(w in german for w in words) >= len(words) / 3 and sum(
        w in german for w in words
    ) > 4 * sum(w in english_only for w in words)
    zero_shot = invoke(
        "translate",
        "--checkpoint",
        run,
        "--tgt-lang",
        "up",
        "--threads",
        1,
        "-q",
        input="der Hund sieht eine Katze .\n",
    )
    # a source language never trained from: zero-shot, asked all the same
    assert zero_shot.exit_code == 0 and len(zero_shot.stdout.splitlines()) == 1


def test_the_target_language_is_required_and_checked(trained, tmp_path):
    _, run, _ = trained
    missing = invoke("translate", "--checkpoint", run, input="the dog .\n")
    assert (
        missing.exit_code == 2
        and one_line_error(missing)
        == "error: this model translates into de, up (directions en-de, en-up): choose one with "
        "--tgt-lang"
    )
    unknown = invoke("translate", "--checkpoint", run, "--tgt-lang", "fr", input="the dog .\n")
    assert one_line_error(unknown) == "error: --tgt-lang fr: this model translates into de, up"
    for command in (
        ["evaluate", "--src", TOY / "valid.en", "--ref", TOY / "valid.de"],
        ["tune-decode", "--src", TOY / "valid.en", "--ref", TOY / "valid.de"],
    ):
        result = invoke(*command, "--checkpoint", run)
        assert result.exit_code == 2 and "choose one with --tgt-lang" in result.output, (
            result.output
        )
    model, tokenizer, cfg = load_model(run / "best.pt", "cpu")
    one = config_from_dict(
        {**config_to_dict(cfg), "data": {"dir": "x", "src_lang": "en", "tgt_lang": "de"}}
    )
    assert (
        target(one, tokenizer, None).src_prefix == ()
        and target(one, tokenizer, "de").src_prefix == ()
    )
    with pytest.raises(ConfigError, match="^tgt_lang fr: this model translates into de only"):
        target(one, tokenizer, "fr")
    # The tag's spelling, another case or a region get the code meant; an empty value says it is
    # empty.
    for given in (">>up<<", "UP", "up-US", " up"):
        with pytest.raises(
            ConfigError,
            match=f"^tgt_lang {re.escape(given.strip()) if given.strip() == given else '.*'}.*did "
            "you mean up\\?",
        ):
            target(cfg, tokenizer, given)
    with pytest.raises(
        ConfigError, match=r"^tgt_lang '': this model translates into de, up; give a language code"
    ):
        target(cfg, tokenizer, "")


def test_alignments_index_the_sentence_not_the_tag(trained):
    _, run, _ = trained
    model, tokenizer, cfg = load_model(run / "best.pt", "cpu")
    goal = target(cfg, tokenizer, "up")
    lines = ["the dog sees a cat .", "a woman ."]
    results = translate_lines(
        model,
        tokenizer,
        lines,
        cfg.decode,
        torch.device("cpu"),
        src_prefix=goal.src_prefix,
        alignment=True,
    )
    for hyps, line in zip(results, lines):
        assert hyps[0].alignment and all(
            0 <= i < len(tokenizer.encode_src([line])[0]) for i, _ in hyps[0].alignment
        )


def test_serve_takes_tgt_lang_and_the_page_offers_the_languages(trained):
    from starlette.testclient import TestClient

    from nmt.serve.app import Limits, Translator, create_app

    _, run, _ = trained
    translator = Translator.load([run / "best.pt"], torch.device("cpu"), torch.float32)
    lines = ["the dog sees a cat .", "a woman ."]
    with TestClient(create_app(translator, Limits(max_wait_ms=0.0))) as client:
        info = client.get("/info").json()
        assert (info["directions"], info["tgt_langs"], info["src_lang"]) == (
            ["en-de", "en-up"],
            ["de", "up"],
            None,
        )
        for lang in ("de", "up"):
            answer = client.post(
                "/translate",
                json={"text": lines, "tgt_lang": lang, "beam_size": 1, "alignment": True},
            ).json()["translations"]
            goal = target(translator.cfg, translator.tokenizer, lang)
            expected = best_strings(
                translator.tokenizer,
                translate_lines(
                    translator.model,
                    translator.tokenizer,
                    lines,
                    replace_beam(translator.cfg.decode),
                    torch.device("cpu"),
                    src_prefix=goal.src_prefix,
                ),
            )
            assert [t["text"] for t in answer] == expected
            # the heatmap shows what the model read
            assert answer[0]["attention"]["src_pieces"][0] == f">>{lang}<<"
        refused = client.post("/translate", json={"text": "a dog ."})
        assert refused.status_code == 422 and "choose one with tgt_lang" in refused.json()["error"]
        assert client.post("/translate", json={"text": "a dog .", "tgt_lang": 3}).status_code == 422
        page = client.get("/").text
        assert 'id="tgt_lang"' in page and "body.tgt_lang" in page


def replace_beam(decode):
    from dataclasses import replace

    return replace(decode, beam_size=1, n_best=1, max_tokens=4096)


@pytest.mark.slow
def test_export_keeps_the_tags_as_marian_does(trained, tmp_path):
    transformers = pytest.importorskip("transformers")
    from nmt.core.batching import pad_sources
    from nmt.decode.search import translate_batch

    _, run, _ = trained
    assert (
        invoke("export", "--checkpoint", run, "--format", "huggingface", tmp_path / "hf").exit_code
        == 0
    )
    model, tokenizer, cfg = load_model(run / "best.pt", "cpu")
    hf_tok = transformers.MarianTokenizer.from_pretrained(tmp_path / "hf")
    hf = transformers.MarianMTModel.from_pretrained(tmp_path / "hf").eval()
    for lang in ("de", "up"):
        ids = [
            *target(cfg, tokenizer, lang).src_prefix,
            *tokenizer.encode_src(["the dog sees a cat ."])[0],
        ]
        # as OPUS-MT's multi-target models take it
        assert hf_tok(f">>{lang}<< the dog sees a cat .")["input_ids"] == ids + [3]
        (hyps,) = translate_batch(
            model, pad_sources([ids]), replace_beam(cfg.decode), rules=tokenizer.output_rules
        )
        # one piece more than nmt wrote (its length limit may have ended it before EOS; generate
        # forces EOS last)
        with torch.no_grad():
            generated = hf.generate(
                input_ids=pad_sources([ids]),
                num_beams=1,
                do_sample=False,
                max_new_tokens=len(hyps[0].tokens) + 1,
            )
        assert generated[0, 1:].tolist()[: len(hyps[0].tokens)] == hyps[0].tokens


def test_init_from_a_multilingual_checkpoint_keeps_or_replaces_its_languages_whole(
    trained, tmp_path
):
    """``--init-from`` a checkpoint of several directions once failed with ``KeyError: 'src_lang'``
    (its config holds ``directions``, not the pair) whatever the new config said."""
    from nmt.errors import NmtError

    data, run, _ = trained
    kept = train(run_config(data, tmp_path / "kept", 2), init_from=run / "last.pt")
    assert kept["step"] == 2 and "bleu/en-up" in kept
    saved = load_checkpoint(tmp_path / "kept" / "last.pt").payload["config"]
    assert saved["data"]["directions"] == [
        "en-de",
        "en-up",
    ]
    # written: the languages come from the new config, whole
    pair = ["data.src_lang=en", "data.tgt_lang=de"]
    train(
        run_config(data, tmp_path / "pair", 2, {"src_lang": "en", "tgt_lang": "de"}),
        init_from=run / "last.pt",
        overrides=pair,
    )
    saved = load_checkpoint(tmp_path / "pair" / "last.pt").payload["config"]["data"]
    assert (saved["src_lang"], saved["tgt_lang"]) == ("en", "de") and saved.get(
        "directions"
    ) is None
    # the same text, with "fr" files: a target the tokenizer has no tag for
    more = tmp_path / "data"
    more.mkdir()
    for f in data.iterdir():
        (more / f.name).write_bytes(f.read_bytes())
        if f.suffix == ".up":
            (more / f.with_suffix(".fr").name).write_bytes(f.read_bytes())
    with pytest.raises(NmtError, match=">>fr<<"):
        train(
            run_config(more, tmp_path / "new", 2, {"directions": ["en-de", "en-fr"]}),
            init_from=run / "last.pt",
            overrides=["data.directions=en-de,en-fr"],
        )


def test_an_exported_multilingual_model_imports_back_with_its_directions(trained, tmp_path, caplog):
    """A multilingual export, imported back, was once a model of "und→und" that refused --tgt-lang
    and warned that a ban it applies was not applied; its directions come back from the tags in
    vocab.json."""
    pytest.importorskip("transformers")
    from nmt.interop.importing import import_checkpoint

    data, run, _ = trained
    assert (
        invoke("export", "--checkpoint", run, "--format", "huggingface", tmp_path / "hf").exit_code
        == 0
    )
    with caplog.at_level("WARNING"):
        payload = import_checkpoint(tmp_path / "hf", tmp_path / "back.pt")
    assert (
        payload["config"]["data"]["directions"] == ["en-de", "en-up"]
        and "not applied" not in caplog.text
    )
    lines = read_lines(data / "valid.en")[:5]
    for lang in ("de", "up"):
        # generate()'s limit is absolute
        same = ["--tgt-lang", lang, "--beam-size", "1", "--max-len-a", "0", "--max-len-b", "12"]
        ours = invoke(
            "translate", "--checkpoint", run / "best.pt", *same, input="\n".join(lines) + "\n"
        )
        back = invoke(
            "translate", "--checkpoint", tmp_path / "back.pt", *same, input="\n".join(lines) + "\n"
        )
        assert ours.exit_code == back.exit_code == 0 and back.stdout == ours.stdout
    assert "--tgt-lang" in one_line_error(
        invoke("translate", "--checkpoint", tmp_path / "back.pt", input="a dog .\n")
    )


def test_import_refuses_to_write_over_a_file_it_reads(trained, tmp_path):
    pytest.importorskip("transformers")
    _, run, _ = trained
    assert (
        invoke("export", "--checkpoint", run, "--format", "huggingface", tmp_path / "hf").exit_code
        == 0
    )
    before = (tmp_path / "hf" / "config.json").read_bytes()
    line = one_line_error(
        invoke("import", tmp_path / "hf", "--out", tmp_path / "hf" / "config.json")
    )
    assert (
        "is the same file as DIR" in line
        and (tmp_path / "hf" / "config.json").read_bytes() == before
    )
    # another name for one of its files
    (tmp_path / "link.pt").symlink_to(tmp_path / "hf" / "model.safetensors")
    weights = (tmp_path / "hf" / "model.safetensors").read_bytes()
    assert "is the same file as DIR" in one_line_error(
        invoke("import", tmp_path / "hf", "--out", tmp_path / "link.pt")
    )
    assert (tmp_path / "hf" / "model.safetensors").read_bytes() == weights
