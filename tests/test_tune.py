import re
from dataclasses import replace

import pytest
import yaml
from conftest import ROOT, random_sources
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmt.config import ConfigError, DecodeConfig, config_from_dict
from nmt.decode.search import translate_batch
from nmt.fields import looks_like_test_data
from nmt.tools.tune import Setting, grid, rerank, validation_lines


@pytest.mark.parametrize("beam", [2, 5])
@pytest.mark.parametrize("patience", [None, 1.0])
def test_one_search_reranked_equals_a_search_per_setting(model, beam, patience):
    """One search with every setting as a ranking returns every finished hypothesis (with a
    patience, the first that many, which no ranking changes); the best of them under each setting is
    what a search with that setting alone finds."""
    src = random_sources([2, 6, 11, 17, 30], seed=11)
    settings = grid([beam], ["gnmt", "length", "none"], [0.0, 0.6, 1.0, 2.0, -0.5], [patience])
    decode = DecodeConfig(beam_size=beam, max_len_a=1.0, max_len_b=8, patience=patience)
    pool = translate_batch(
        model,
        src,
        replace(decode, length_penalty=0.0),
        rankings=tuple((s.length_normalization, s.length_penalty) for s in settings),
    )
    compared = 0
    for setting in settings:
        direct = translate_batch(
            model,
            src,
            replace(
                decode,
                length_penalty=setting.length_penalty,
                length_normalization=setting.length_normalization,
            ),
        )
        assert [rerank(p, setting.length_normalization, setting.length_penalty) for p in pool] == [
            d[0].tokens for d in direct
        ], setting
        compared += 1
    assert compared == 9
    # The grid is not vacuous: some settings choose different translations.
    picks = {
        tuple(map(tuple, (rerank(p, n, a) for p in pool)))
        for n, a in [("none", 0.0), ("length", 2.0), ("length", -0.5)]
    }
    assert len(picks) > 1


def test_grid_lists_each_distinct_setting_once():
    assert grid([1, 5], ["gnmt", "length", "none"], [0.0, 1.0]) == [
        Setting(1, "none", 0.0),
        Setting(5, "none", 0.0),
        Setting(5, "gnmt", 1.0),
        Setting(5, "length", 1.0),
    ]
    # greedy search ends at its first EOS: one setting whatever the patience
    assert grid([1, 4], ["length"], [1.0], [None, 2.0]) == [
        Setting(1, "none", 0.0),
        Setting(4, "length", 1.0),
        Setting(4, "length", 1.0, 2.0),
    ]
    with pytest.raises(ConfigError, match="patiences must all be"):
        grid([4], ["length"], [1.0], [-1.0])


def test_rerank_counts_eos_in_the_length():
    from nmt.decode.search import Hypothesis

    short, long = Hypothesis([7], 0.0, -1.0), Hypothesis([7, 8, 9], 0.0, -1.9)
    # length, alpha 1: -1.0 / 2 = -0.5 against -1.9 / 4 = -0.475: the longer one wins.
    assert rerank([short, long], "length", 1.0) == [7, 8, 9]
    assert rerank([short, long], "none", 1.0) == [7]
    assert rerank([], "gnmt", 0.6) == []


@pytest.mark.parametrize(
    "name,is_test",
    [
        ("test.de", True),
        ("test_2016_flickr.en.gz", True),
        ("newstest2014.de", True),
        ("wmt.newstest2013.en", True),
        ("TEST.en", True),
        ("valid.de", False),
        ("val.en.gz", False),
        ("latest.en", False),
        ("contest.de", False),
    ],
)
def test_test_file_names(tmp_path, name, is_test):
    # the name counts, not the directory
    assert looks_like_test_data(tmp_path / "test" / name) == is_test


def test_shipped_configs_train_and_select_on_no_test_split():
    configs = sorted((ROOT / "configs").glob("*.yaml"))
    assert configs
    for path in configs:
        data = config_from_dict(yaml.safe_load(path.read_text(encoding="utf-8")), str(path)).data
        # Training reads the train split; best.pt, early stopping and validation BLEU use the valid
        # split.
        used = [
            data.train_split,
            data.valid_split,
            data.train_src,
            data.train_tgt,
            data.valid_src,
            data.valid_tgt,
        ]
        used += [f"{split}:{file}" for split, file in (data.hf_data_files or {}).items()]
        assert not [u for u in used if u and looks_like_test_data(u)], path
    # a sweep's overrides choose on val too
    for path in sorted((ROOT / "configs" / "sweeps").glob("*.yaml")):
        sets = [
            s
            for entry in yaml.safe_load(path.read_text(encoding="utf-8"))
            for s in entry.get("set", [])
        ]
        assert not [
            s
            for s in sets
            if s.split("=")[0].startswith("data.") and looks_like_test_data(s.split("=", 1)[1])
        ], path


def test_shipped_scripts_train_and_tune_on_no_test_file():
    for path in sorted((ROOT / "scripts").glob("*.sh")):
        # continued lines as one command
        text = path.read_text(encoding="utf-8").replace("\\\n", " ")
        for command in re.findall(r"nmt (?:train|tune-decode)\b[^\n]*", text):
            assert not [
                w for w in command.split() if looks_like_test_data(w.split("=")[-1].strip("\"'"))
            ], (path, command)


def test_tuning_refuses_test_sets_and_bad_grids_in_the_python_api_too(tmp_path):
    (tmp_path / "valid.en").write_text("a\nb\n")
    (tmp_path / "valid.de").write_text("x\n")
    with pytest.raises(ConfigError) as err:  # refused before it is read: the file does not exist
        validation_lines(tmp_path / "newstest2014.en", tmp_path / "valid.de")
    assert err.value.key == "src" and str(err.value).startswith(
        f"src {tmp_path / 'newstest2014.en'}: the name says test data"
    )
    assert err.value.render(
        {"src": "--src", "allow_test_names": "--allow-test-names"}.get
    ).endswith("or pass --allow-test-names if this file is a validation set named like a test set")
    with pytest.raises(
        ConfigError,
        match=r"^src .*valid.en and ref .*valid.de differ in length \(2 and 1 lines\); they must "
        r"match line for line$",
    ):
        validation_lines(tmp_path / "valid.en", tmp_path / "valid.de")
    assert validation_lines(tmp_path / "valid.en", tmp_path / "valid.de", max_sentences=1) == (
        ["a"],
        ["x"],
    )
    with pytest.raises(ConfigError, match="^max_sentences must be at least 1, got 0$"):
        validation_lines(tmp_path / "valid.en", tmp_path / "valid.de", max_sentences=0)
    with pytest.raises(ConfigError, match=r"^beam_sizes must all be in \[1, 1024\], got 0,5$"):
        grid([0, 5], ["gnmt"], [1.0])
    with pytest.raises(
        ConfigError, match="^normalizations: unknown average; choose from gnmt, length, none$"
    ):
        grid([1, 5], ["gnmt", "average"], [1.0])


@settings(
    max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.data(),
    scores=st.lists(
        st.tuples(st.sampled_from([20.0, 25.5]), st.sampled_from([50.0, 51.0])),
        min_size=2,
        max_size=8,
    ),
    sentences=st.integers(1, 300),
)
def test_a_tie_keeps_the_checkpoints_own_setting_or_the_smallest_beam_and_says_so(
    data, scores, sentences, caplog
):
    """tune-decode on one sentence tied on every setting and picked the first in grid order."""
    import logging

    from nmt.cli.commands.tune import FEW_SENTENCES, choose
    from nmt.config import DecodeConfig

    rows = [
        {
            "beam_size": b,
            "length_normalization": "length",
            "length_penalty": a,
            "patience": None,
            "bleu": bleu,
            "chrf": chrf,
        }
        for (bleu, chrf), (b, a) in zip(scores, [(b, a) for b in (5, 1, 4, 2) for a in (0.6, 1.0)])
    ]
    own = data.draw(st.sampled_from(rows))
    decode = DecodeConfig(
        beam_size=own["beam_size"],
        length_normalization="length",
        length_penalty=own["length_penalty"],
    )
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nmt.tune"):
        best = choose(rows, decode, sentences)
    top = max((r["bleu"], r["chrf"]) for r in rows)
    tied = [r for r in rows if (r["bleu"], r["chrf"]) == top]
    assert (best["bleu"], best["chrf"]) == top
    assert best is own if own in tied else best["beam_size"] == min(r["beam_size"] for r in tied)
    assert ("settings tie" in caplog.text) == (len(tied) > 1)
    if len(tied) > 1:  # the warning names what it kept
        assert f"--length-penalty {best['length_penalty']} --patience 0" in caplog.text
    assert ("cannot tell search settings apart" in caplog.text) == (sentences < FEW_SENTENCES)
