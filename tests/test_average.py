import os
import shutil
from pathlib import Path

import pytest
import torch
from conftest import cached_tokenizer, tiny_config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmt.config import ConfigError, config_from_dict, config_to_dict
from nmt.core.model import Transformer
from nmt.files import OutputError
from nmt.runs.checkpoint import (
    CheckpointError,
    load_checkpoint,
    save_checkpoint,
    tokenizer_to_tensors,
)
from nmt.tools.average import average_checkpoints, newest_step_checkpoints


def write(path, seed, **entries):
    torch.manual_seed(seed)
    model = Transformer(tiny_config())
    state = model.state_dict()
    cfg = config_from_dict(
        {
            "model": {
                "d_model": 32,
                "d_ff": 64,
                "n_heads": 4,
                "n_encoder_layers": 2,
                "n_decoder_layers": 2,
                "src_vocab_size": 40,
                "tgt_vocab_size": 40,
            }
        }
    )
    save_checkpoint(
        {
            "model": state,
            "config": config_to_dict(cfg),
            "tokenizer": tokenizer_to_tensors(cached_tokenizer(40).protos()),
            **entries,
        },
        path,
    )
    return state


def test_average_of_three(tmp_path):
    states = [write(tmp_path / f"c{i}.pt", seed=i) for i in range(3)]
    before = [(tmp_path / f"c{i}.pt").read_bytes() for i in range(3)]
    average_checkpoints([tmp_path / f"c{i}.pt" for i in range(3)], tmp_path / "avg.pt")
    avg = load_checkpoint(tmp_path / "avg.pt").payload["model"]
    name = "decoder.0.ffn.fc1.weight"
    torch.testing.assert_close(avg[name], (states[0][name] + states[1][name] + states[2][name]) / 3)
    assert avg["src_embed.weight"].data_ptr() == avg["tgt_embed.weight"].data_ptr()  # still tied
    torch.testing.assert_close(
        avg["tgt_embed.weight"], sum(s["tgt_embed.weight"] for s in states) / 3
    )
    assert [(tmp_path / f"c{i}.pt").read_bytes() for i in range(3)] == before


def test_average_refuses_to_overwrite_an_input(tmp_path):
    write(tmp_path / "a.pt", 0)
    with pytest.raises(OutputError, match="is the same file as an input"):
        average_checkpoints([tmp_path / "a.pt"], tmp_path / "a.pt")
    with pytest.raises(CheckpointError, match="nothing to average"):
        average_checkpoints([], tmp_path / "b.pt")


def test_average_refuses_different_tokenizers_and_models_before_writing(tmp_path):
    write(tmp_path / "a.pt", 0)
    write(tmp_path / "b.pt", 1)
    other = load_checkpoint(tmp_path / "b.pt").payload
    save_checkpoint(
        {**other, "tokenizer": tokenizer_to_tensors(cached_tokenizer(40, lines=200).protos())},
        tmp_path / "tok.pt",
    )
    with pytest.raises(CheckpointError, match="have different tokenizers"):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "tok.pt"], tmp_path / "avg.pt")
    gelu = config_to_dict(
        config_from_dict({"model": {**other["config"]["model"], "activation": "gelu"}})
    )
    save_checkpoint({**other, "config": gelu}, tmp_path / "gelu.pt")
    with pytest.raises(
        CheckpointError, match="different models \\(model.activation 'relu' vs 'gelu'\\)"
    ):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "gelu.pt"], tmp_path / "avg.pt")
    (tmp_path / "notes.pt").write_text("not a checkpoint\n")
    with pytest.raises(CheckpointError, match="notes.pt is not an nmt checkpoint"):
        average_checkpoints(
            [tmp_path / "a.pt", tmp_path / "b.pt", tmp_path / "notes.pt"], tmp_path / "avg.pt"
        )
    wide = config_to_dict(config_from_dict({"model": {**other["config"]["model"], "d_ff": 128}}))
    save_checkpoint({**other, "config": wide}, tmp_path / "wide.pt")  # config and tensors disagree
    with pytest.raises(
        CheckpointError,
        match=r"do not fit the model its config describes \(model\.d_ff 128 in the config vs 64 in "
        r"the tensors",
    ):
        average_checkpoints([tmp_path / "wide.pt"], tmp_path / "avg.pt")
    # smaller: compared tensor by tensor
    narrow = config_to_dict(config_from_dict({"model": {**other["config"]["model"], "d_ff": 32}}))
    save_checkpoint({**other, "config": narrow}, tmp_path / "narrow.pt")
    with pytest.raises(CheckpointError, match=r"do not fit the model .*shape in file vs config"):
        average_checkpoints([tmp_path / "narrow.pt"], tmp_path / "avg.pt")
    assert not (tmp_path / "avg.pt").exists()


def test_average_command_checks_its_options(tmp_path):
    from typer.testing import CliRunner

    from nmt.cli.main import app

    write(tmp_path / "a.pt", 0)
    (tmp_path / "run").mkdir()
    for last in ("0", "-1"):
        result = CliRunner().invoke(
            app,
            [
                "average",
                "--run-dir",
                str(tmp_path / "run"),
                "--last",
                last,
                "--out",
                str(tmp_path / "avg.pt"),
            ],
        )
        assert result.exit_code == 2 and f"--last must be at least 1, got {last}" in result.output
    result = CliRunner().invoke(
        app, ["average", str(tmp_path / "a.pt"), "--out", str(tmp_path / "missing" / "avg.pt")]
    )
    assert result.exit_code == 2 and "missing does not exist; create it first" in result.output
    assert not (tmp_path / "missing").exists()
    # Writing the average over a run's own checkpoint would change what --resume and translate read.
    (tmp_path / "run" / "metrics.jsonl").write_text("")
    write(tmp_path / "run" / "step_4.pt", 1)
    write(tmp_path / "run" / "last.pt", 1)
    before = (tmp_path / "run" / "last.pt").read_bytes()
    for name in ("last.pt", "best.pt", "step_8.pt"):
        result = CliRunner().invoke(
            app,
            ["average", "--run-dir", str(tmp_path / "run"), "--out", str(tmp_path / "run" / name)],
        )
        assert (
            result.exit_code == 2
            and "would replace a training checkpoint" in result.output
            and "average.pt" in result.output
        )
    assert (tmp_path / "run" / "last.pt").read_bytes() == before and not (
        tmp_path / "run" / "best.pt"
    ).exists()
    result = CliRunner().invoke(
        app,
        [
            "average",
            "--run-dir",
            str(tmp_path / "run"),
            "--out",
            str(tmp_path / "run" / "average.pt"),
        ],
    )
    assert result.exit_code == 0 and (tmp_path / "run" / "average.pt").is_file()


def test_averaging_refuses_to_replace_a_runs_checkpoint_in_the_python_api_too(tmp_path):
    write(tmp_path / "a.pt", 0)
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("")
    write(run / "last.pt", 1)
    before = (run / "last.pt").read_bytes()
    with pytest.raises(OutputError) as err:
        average_checkpoints([tmp_path / "a.pt"], run / "last.pt")
    assert err.value.key == "out" and str(err.value).startswith(
        f"out {run / 'last.pt'} would replace a training checkpoint of the run in {run}"
    )
    assert (run / "last.pt").read_bytes() == before
    # not in a run directory: any name will do
    average_checkpoints([tmp_path / "a.pt"], tmp_path / "last.pt")
    averaged_from = load_checkpoint(tmp_path / "last.pt").payload["averaged_from"]
    assert averaged_from == [str(tmp_path / "a.pt")]
    # a relative input is recorded absolute: the record is read from elsewhere (nmt info)
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(tmp_path)
        average_checkpoints([Path("a.pt")], tmp_path / "rel.pt")
    recorded = load_checkpoint(tmp_path / "rel.pt").payload["averaged_from"]
    assert recorded == [str((tmp_path / "a.pt").resolve())]
    with pytest.raises(ConfigError, match="^last must be at least 1, got 0$"):
        newest_step_checkpoints(run, 0)
    with pytest.raises(ConfigError, match="^run_dir .*nowhere is not a directory$"):
        newest_step_checkpoints(tmp_path / "nowhere", 5)


def test_fewer_step_checkpoints_than_asked_are_warned_about(tmp_path, caplog):
    """--last 5 with 3 step files once averaged 3 silently."""
    from nmt.tools.average import newest_step_checkpoints

    run = tmp_path / "run"
    run.mkdir()
    for step in (2, 4, 6):
        write(run / f"step_{step}.pt", step)
    with caplog.at_level("WARNING", logger="nmt.average"):
        found = newest_step_checkpoints(run, 5)
    assert [p.name for p in found] == ["step_2.pt", "step_4.pt", "step_6.pt"]
    assert (
        f"--last 5 asked for 5 step checkpoints, but {run} has 3 (step_2.pt, step_4.pt, "
        "step_6.pt): averaging those" in caplog.text
    )


def test_checkpoints_of_two_runs_are_refused_unless_asked(tmp_path):
    """Two runs of one architecture were averaged without a word."""
    for seed, (name, run) in enumerate(
        (("a.pt", "runs/one"), ("b.pt", "runs/two"), ("c.pt", "runs/one"))
    ):
        # different weights: identical ones would be one checkpoint given twice
        write(tmp_path / name, seed)
        payload = load_checkpoint(tmp_path / name).payload
        save_checkpoint(
            {**payload, "run": {"id": run.replace("/", "-"), "dir": run}}, tmp_path / name
        )
    with pytest.raises(
        CheckpointError,
        match=r"come from different runs \(runs/one and runs/two\).*--allow-different-runs",
    ):
        average_checkpoints([tmp_path / "a.pt", tmp_path / "b.pt"], tmp_path / "avg.pt")
    assert not (tmp_path / "avg.pt").exists()
    assert (
        average_checkpoints([tmp_path / "a.pt", tmp_path / "c.pt"], tmp_path / "avg.pt")["run"][
            "dir"
        ]
        == "runs/one"
    )
    mixed = average_checkpoints(
        [tmp_path / "a.pt", tmp_path / "b.pt"], tmp_path / "mixed.pt", different_runs=True
    )
    assert "run" not in mixed and len(mixed["averaged_from"]) == 2


def test_a_checkpoint_given_twice_is_refused_also_through_a_link_or_its_run_directory(tmp_path):
    write(tmp_path / "a.pt", 0)
    write(tmp_path / "b.pt", 1)
    (tmp_path / "alias.pt").symlink_to(tmp_path / "a.pt")
    (tmp_path / "best.pt").hardlink_to(tmp_path / "b.pt")  # the directory stands for its best.pt
    for twice in (
        [tmp_path / "a.pt", tmp_path / "a.pt"],
        [tmp_path / "a.pt", tmp_path / "b.pt", tmp_path / "alias.pt"],
        [tmp_path / "best.pt", tmp_path],
        [tmp_path, tmp_path / "b.pt"],
    ):
        with pytest.raises(CheckpointError, match="is given twice"):
            average_checkpoints(twice, tmp_path / "avg.pt")
    assert not (tmp_path / "avg.pt").exists()


RUN = {"id": "0123abcd", "dir": "runs/one"}
TWICE = [
    "the same name",
    "a hard link",
    "a symbolic link",
    "its run directory",
    "a byte copy",
    "the same run and step",
    "the same weights",
    "another run's",
]


def _again(original, kind, place):
    """A path that gives checkpoint ``original`` again, as ``kind`` says."""
    if kind == "the same name":
        return original
    again = place / "again.pt"
    if kind == "a hard link":
        os.link(original, again)
    elif kind == "a symbolic link":
        again.symlink_to(original)
    elif kind == "a byte copy":  # best.pt as training writes it: a copy of the step's file
        shutil.copyfile(original, again)
    elif kind == "its run directory":  # which stands for its best.pt, here a copy
        again = place / "run"
        again.mkdir()
        shutil.copyfile(original, again / "best.pt")
    else:
        payload = dict(load_checkpoint(original).payload)
        if (
            kind == "the same run and step"
        ):  # e.g. converted to another dtype: other bits, the same moment of the same run
            payload["model"] = {
                k: t.to(torch.bfloat16).float() if t.is_floating_point() else t
                for k, t in payload["model"].items()
            }
        elif kind == "the same weights":  # re-saved without the step
            del payload["progress"]
        else:  # the same weights recorded as another run's (averaged with --allow-different-runs)
            payload["run"] = {"id": "4567cdef", "dir": "runs/two"}
        save_checkpoint(payload, again)
    return again


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(n=st.integers(1, 3), kind=st.sampled_from(TWICE), which=st.data(), after=st.booleans())
def test_a_checkpoint_given_twice_in_any_form_is_refused_naming_both(
    tmp_path_factory, n, kind, which, after
):
    """`nmt average best.pt step_200.pt step_100.pt`, best.pt a copy of step_200.pt, gave step 200
    two thirds of the weight."""
    place = tmp_path_factory.mktemp("average")
    states = [
        write(place / f"step_{100 * (i + 1)}.pt", seed=i, run=RUN, progress={"step": 100 * (i + 1)})
        for i in range(n)
    ]
    paths = [place / f"step_{100 * (i + 1)}.pt" for i in range(n)]
    average_checkpoints(paths, place / "avg.pt")  # each once: the mean
    name = "decoder.0.ffn.fc1.weight"
    torch.testing.assert_close(
        load_checkpoint(place / "avg.pt").payload["model"][name], sum(s[name] for s in states) / n
    )
    i = which.draw(st.integers(0, n - 1))
    again = _again(paths[i], kind, place)
    given_paths = (
        paths[: i + 1] + [again] + paths[i + 1 :] if after else paths[:i] + [again] + paths[i:]
    )
    first, second = (paths[i], again) if after else (again, paths[i])
    why = dict.fromkeys(["a hard link", "a symbolic link", "the same name"], "the same file")
    why |= dict.fromkeys(["the same weights", "another run's"], "identical weights")
    with pytest.raises(CheckpointError) as err:
        average_checkpoints(given_paths, place / "avg2.pt", different_runs=kind == "another run's")
    assert str(err.value) == (
        f"{second} is given twice (as {first} too: "
        f"{why.get(kind, f'the same run, runs/one, at step {100 * (i + 1)}')}); "
        "each checkpoint counts once in an average, so give each once"
    )
    assert not (place / "avg2.pt").exists()


def test_an_average_beside_one_of_its_inputs_is_not_one_checkpoint_twice(tmp_path):
    """An average records the run and step of its last input, but holds other weights: not a copy of
    it."""
    for step in (100, 200):
        write(tmp_path / f"step_{step}.pt", seed=step, run=RUN, progress={"step": step})
    average_checkpoints([tmp_path / "step_100.pt", tmp_path / "step_200.pt"], tmp_path / "avg.pt")
    assert load_checkpoint(tmp_path / "avg.pt").payload["progress"]["step"] == 200
    mixed = average_checkpoints(
        [tmp_path / "avg.pt", tmp_path / "step_200.pt"], tmp_path / "avg2.pt"
    )
    assert mixed["averaged_from"] == [str(tmp_path / "avg.pt"), str(tmp_path / "step_200.pt")]
