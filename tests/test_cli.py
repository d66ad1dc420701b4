import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from conftest import ROOT, TOY
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from nmt.cli.main import app

runner = CliRunner()


def invoke(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A few steps on the shipped corpus with the shipped config, shrunk for speed."""
    run = tmp_path_factory.mktemp("cli") / "run"
    result = invoke(
        "train",
        "--config",
        ROOT / "configs" / "toy.yaml",
        "--run-dir",
        run,
        "--set",
        f"data.dir={TOY}",
        "--set",
        "train.max_steps=4",
        "--set",
        "train.log_every=2",
        "--set",
        "model.d_model=32",
        "--set",
        "model.d_ff=64",
        "--set",
        "tokenizer.vocab_size=200",
        "--set",
        "data.valid_max_sentences=10",
        "--set",
        "train.valid_beam_size=1",
        "--set",
        "train.threads=1",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["step"] == 4
    return run


def test_run_directory_contents(trained_run):
    names = {p.name for p in trained_run.iterdir()}
    assert {
        "best.pt",
        "last.pt",
        "config.yaml",
        "spm.model",
        "metrics.jsonl",
        "run.json",
        "cache",
        "tensorboard",
    } <= names
    records = [
        json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in records if "loss" in r] == [2, 4] and [
        r["step"] for r in records if "bleu" in r
    ] == [4]


def test_translate_keeps_one_line_per_input_line(trained_run, tmp_path):
    src = tmp_path / "in.en"
    src.write_text(
        "the dog sees a cat .\n\n   \nthe big man likes the small house .\n", encoding="utf-8"
    )
    out = tmp_path / "out.de"
    result = invoke(
        "translate",
        "--checkpoint",
        trained_run / "best.pt",
        "-i",
        src,
        "-o",
        out,
        "--beam-size",
        "3",
        "--max-len-b",
        "5",
    )
    assert result.exit_code == 0, result.output
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 5 and lines[-1] == ""  # 4 lines, each newline-terminated
    assert lines[1] == "" and lines[2] == ""
    piped = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "--beam-size",
        "3",
        "--max-len-b",
        "5",
        input=src.read_text(),
    )
    assert piped.exit_code == 0
    assert piped.stdout == out.read_text(encoding="utf-8")


def test_translate_n_best_format(trained_run):
    result = invoke(
        "translate",
        "--checkpoint",
        trained_run / "last.pt",
        "--beam-size",
        "3",
        "--n-best",
        "2",
        "--max-len-b",
        "4",
        input="a dog .\nthe cat .\n",
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split(" ||| ")[0] for line in lines] == ["0", "0", "1", "1"]
    blank = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "--beam-size",
        "2",
        "--n-best",
        "2",
        "--max-len-b",
        "3",
        input="a dog .\n\nthe cat .\n",
    )
    assert [line.split(" ||| ")[0] for line in blank.stdout.splitlines()] == [
        "0",
        "0",
        "1",
        "2",
        "2",
    ]
    scores = [float(line.split(" ||| ")[2]) for line in lines[:2]]
    assert scores[0] >= scores[1]


def test_evaluate_hyp_and_checkpoint(trained_run, tmp_path):
    ref = tmp_path / "ref.de"
    ref.write_text("der Hund sieht eine Katze .\ndie Frau mag das Haus .\n", encoding="utf-8")
    result = invoke("evaluate", "--hyp", ref, "--ref", ref, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["bleu"] == pytest.approx(100.0)
    # one file twice, however spelt (a link to it too), would count as two references
    (tmp_path / "link.de").symlink_to(ref)
    for other in (tmp_path / "." / "ref.de", tmp_path / "link.de"):
        assert _one_line_error(invoke("evaluate", "--hyp", ref, "--ref", ref, "--ref", other)) == (
            f"error: --ref {ref} and --ref {other} are one file ({ref.resolve()}): it would count "
            "as several references; give it once"
        )
    src = tmp_path / "src.en"
    src.write_text("the dog sees a cat .\nthe woman likes the house .\n", encoding="utf-8")
    hyp = tmp_path / "hyp.de"
    result = invoke(
        "evaluate",
        "--checkpoint",
        trained_run,
        "--src",
        src,
        "--ref",
        ref,
        "--json",
        "--output",
        hyp,
        "--beam-size",
        "2",
    )
    assert result.exit_code == 0, result.output
    scored = json.loads(result.stdout)
    rescored = json.loads(invoke("evaluate", "--hyp", hyp, "--ref", ref, "--json").stdout)
    assert scored["bleu"] == rescored["bleu"] and scored["sentences"] == 2


def test_evaluate_reads_one_input_from_standard_input_as_from_a_file(trained_run, tmp_path):
    """``-`` is standard input for --hyp, --ref or --src (as in sacreBLEU and the shell's filters),
    once."""
    ref, hyp, src = tmp_path / "ref.de", tmp_path / "hyp.de", tmp_path / "src.en"
    ref.write_text("der Hund sieht eine Katze .\ndie Frau mag das Haus .\n", encoding="utf-8")
    hyp.write_text("der Hund sieht die Katze .\neine Frau mag das Haus\n", encoding="utf-8")
    src.write_text("the dog sees a cat .\nthe woman likes the house .\n", encoding="utf-8")
    from_file = json.loads(invoke("evaluate", "--hyp", hyp, "--ref", ref, "--json").stdout)
    assert from_file["bleu"] < 100
    assert (
        json.loads(
            invoke("evaluate", "--hyp", "-", "--ref", ref, "--json", input=hyp.read_bytes()).stdout
        )
        == from_file
    )
    swapped = json.loads(
        invoke("evaluate", "--hyp", hyp, "--ref", "-", "--json", input=ref.read_bytes()).stdout
    )
    assert swapped == from_file
    translated = (
        "evaluate",
        "--checkpoint",
        trained_run,
        "--ref",
        ref,
        "--json",
        "--beam-size",
        "2",
        "--src",
    )
    assert (
        json.loads(invoke(*translated, "-", input=src.read_bytes()).stdout)["bleu"]
        == json.loads(invoke(*translated, src).stdout)["bleu"]
    )
    # and translate's -i -, as its default
    assert (
        invoke(
            "translate", "--checkpoint", trained_run, "-i", "-", "-q", input=src.read_bytes()
        ).stdout
        == invoke("translate", "--checkpoint", trained_run, "-i", src, "-q").stdout
    )
    # -o - is standard output, not a file named -
    assert (
        invoke("translate", "--checkpoint", trained_run, "-i", src, "-o", "-", "-q").stdout
        == invoke("translate", "--checkpoint", trained_run, "-i", src, "-q").stdout
    )
    refused = invoke(*translated, src, "-o", "-")
    assert (
        refused.exit_code == 2 and "--output -: standard output takes the scores" in refused.output
    )
    twice = invoke("evaluate", "--hyp", "-", "--ref", "-", input=hyp.read_bytes())
    assert (
        twice.exit_code == 2
        and "2 inputs (--hyp, --ref) name standard input (-), which can be read once"
        in twice.output
    )


def test_bad_inputs_give_clear_errors_not_tracebacks(trained_run, tmp_path):
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"ok\n\xff\xfe broken\n")
    result = invoke("translate", "--checkpoint", trained_run, "-i", bad)
    assert result.exit_code == 2 and "bad.en:2: invalid UTF-8" in result.output
    short = tmp_path / "short.de"
    short.write_text("one line\n")
    two = tmp_path / "two.de"
    two.write_text("a\nb\n")
    result = invoke("evaluate", "--hyp", two, "--ref", short)
    assert (
        result.exit_code == 2 and "short.de has 1 lines but there are 2 hypotheses" in result.output
    )
    from nmt.translation.inference import (
        Inference,
        # a source and references of different lengths are refused before anything is translated or
        # written
    )

    def untouchable(*args, **kwargs):
        raise AssertionError("translated before the line counts were compared")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(Inference, "translate", untouchable)
        result = invoke(
            "evaluate",
            "--checkpoint",
            trained_run,
            "--src",
            two,
            "--ref",
            short,
            "-o",
            tmp_path / "hyp.de",
        )
    assert (
        result.exit_code == 2
        and "short.de has 1 lines but there are 2 source lines" in result.output
        and not (tmp_path / "hyp.de").exists()
    )
    result = invoke(
        "translate", "--checkpoint", trained_run, input="fine\nsecond\ncaf\xe9\n".encode("latin-1")
    )
    assert result.exit_code == 2 and "<stdin>:3: invalid UTF-8" in result.output
    result = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "-o",
        tmp_path / "no" / "such" / "dir.de",
        input="x\n",
    )
    assert result.exit_code == 2 and "does not exist; create it first" in result.output
    result = invoke("translate", "--checkpoint", trained_run, "--beam-size", "0", input="x\n")
    assert (
        result.exit_code == 2
        and "--beam-size must be" in result.output
        and "decode." not in result.output
    ), result.output
    result = invoke("translate", "--checkpoint", tmp_path / "missing.pt", input="x\n")
    assert result.exit_code == 2 and "missing.pt not found" in result.output
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    result = invoke("translate", "--checkpoint", garbage, input="x\n")
    assert (
        result.exit_code == 2
        and "garbage.pt is not an nmt checkpoint: it is a text file" in result.output
    )


def test_train_rejects_misaligned_corpus(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "train.en").write_text("a\nb\nc\n")
    (data / "train.de").write_text("a\nb\n")
    (data / "valid.en").write_text("a\n")
    (data / "valid.de").write_text("a\n")
    result = invoke("train", "--run-dir", tmp_path / "new" / "r", "--set", f"data.dir={data}")
    assert result.exit_code == 2
    assert "train.en has 3 lines but" in result.output and "train.de has 2" in result.output
    # a refused run leaves no directory behind, nor those it made above it (an empty ./$HOME did)
    assert not (tmp_path / "new").exists()
    result = invoke(
        "train", "--run-dir", tmp_path / "r2", "--set", f"data.dir={tmp_path / 'nowhere'}"
    )
    assert (
        result.exit_code == 2
        and f"data.dir {tmp_path / 'nowhere'}: no such directory" in result.output
        and not (tmp_path / "r2").exists()
    )
    result = invoke("train", "--run-dir", tmp_path / "r2", "--set", f"data.dir={data / 'valid.en'}")
    assert (
        result.exit_code == 2
        and f"data.dir {data / 'valid.en'}: not a directory" in result.output
        and not (tmp_path / "r2").exists()
    )
    result = invoke("train", "--run-dir", tmp_path / "r", "--set", "train.max_stepz=3")
    assert (
        result.exit_code == 2
        and result.output == "error: unknown key train.max_stepz; did you mean train.max_steps?\n"
    )


def test_module_entry_point_help():
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "nmt", "translate", "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
    )
    assert result.returncode == 0
    assert "--beam-size" in result.stdout and "padding included" in result.stdout


def test_export_command(trained_run, tmp_path):
    pytest.importorskip("transformers")
    result = invoke("export", tmp_path / "hf", "--checkpoint", trained_run)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "hf" / "config.json").is_file() and (
        tmp_path / "hf" / "source.spm"
    ).is_file()
    result = invoke("export", tmp_path / "x", "--checkpoint", trained_run, "--format", "onnx")
    assert result.exit_code == 2 and "not supported" in result.output


def test_plot_writes_a_png(trained_run, tmp_path):
    result = invoke("plot", trained_run, "--out", tmp_path / "m.png")
    assert result.exit_code == 0, result.output
    data = (tmp_path / "m.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    result = invoke("plot", tmp_path)
    assert result.exit_code == 2 and "metrics.jsonl: not found" in result.output


def _earlier_step(run, tmp_path):
    """A checkpoint of ``run`` at step 2, other weights than its last.pt's (step 4), as its
    step_2.pt would be."""
    from nmt.runs.checkpoint import load_checkpoint, save_checkpoint

    earlier = dict(load_checkpoint(run / "last.pt").payload)
    earlier["model"] = {
        k: t * 0.5 if t.is_floating_point() else t for k, t in earlier["model"].items()
    }
    save_checkpoint(
        {**earlier, "progress": {**earlier["progress"], "step": 2}}, tmp_path / "step_2.pt"
    )
    return tmp_path / "step_2.pt"


def test_average_command(trained_run, tmp_path):
    line = _one_line_error(
        invoke(
            "average",
            trained_run / "last.pt",
            trained_run / "best.pt",
            "--out",
            tmp_path / "avg.pt",
        )
    )
    # both written at the last step: one checkpoint
    assert line == (
        f"error: {trained_run / 'best.pt'} is given twice (as {trained_run / 'last.pt'} too: the "
        f"same run, {trained_run}, at step 4); "
        "each checkpoint counts once in an average, so give each once"
    )
    result = invoke(
        "average",
        _earlier_step(trained_run, tmp_path),
        trained_run / "last.pt",
        "--out",
        tmp_path / "avg.pt",
    )
    assert result.exit_code == 0, result.output
    result = invoke(
        "translate",
        "--checkpoint",
        tmp_path / "avg.pt",
        "--beam-size",
        "2",
        "--max-len-b",
        "3",
        input="a dog .\n",
    )
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 1


def test_translate_in_bfloat16(trained_run):
    text = "the dog sees a cat .\n\nthe big man likes the small house .\n"
    fp32 = invoke(
        "translate", "--checkpoint", trained_run, "--beam-size", "2", "--max-len-b", "4", input=text
    )
    bf16 = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "--beam-size",
        "2",
        "--max-len-b",
        "4",
        "--dtype",
        "bfloat16",
        input=text,
    )
    assert bf16.exit_code == 0, bf16.output
    assert (
        len(bf16.stdout.split("\n")) == len(fp32.stdout.split("\n")) == 4
        and bf16.stdout.split("\n")[1] == ""
    )
    bad = invoke("translate", "--checkpoint", trained_run, "--dtype", "int3", input=text)
    assert bad.exit_code == 2 and "--dtype must be" in bad.output


def test_the_cli_module_loads_without_torch():
    """`nmt --help`, `evaluate --hyp` and usage errors answer without importing torch (seconds, 200
    MB)."""
    import subprocess
    import sys

    code = "import sys, nmt.cli.main, nmt.data.corpus; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_help_shows_flags_as_flags():
    """A flag takes no value, so help must not print a type after it (`--resume <bool>` invites
    `--resume true`)."""
    for command in ["train", "translate", "evaluate", "average", "plot", "export"]:
        result = invoke(command, "--help")
        assert result.exit_code == 0, result.output
        assert "<bool>" not in result.output and "BOOLEAN" not in result.output
    lines = invoke("train", "--help").output.splitlines()
    assert any(line.split() == ["--resume", "Continue", *line.split()[2:]] for line in lines)
    # options that take values keep their type; a repeatable option shows what one value is
    assert "--beam-size <int>" in invoke("translate", "--help").output
    for command in ["translate", "evaluate", "serve", "tune-decode"]:
        shown = invoke(command, "--help").output
        assert "--checkpoint <path>" in shown and "<list[" not in shown, shown
    # arguments are named alike in every usage line: upper case, one pair of brackets at most
    for words in (["average"], ["export"], ["import"], ["info"], ["plot", "metrics"]):
        usage = invoke(*words, "--help").output.splitlines()[0]
        arguments = usage.split("[OPTIONS]")[1].strip()
        assert arguments == arguments.upper() and "[[" not in arguments, usage


def _one_line_error(result) -> str:
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    return lines[0]


def test_errors_name_the_flags_given(trained_run, tmp_path):
    import torch

    line = _one_line_error(
        invoke(
            "translate",
            "--checkpoint",
            trained_run,
            "--n-best",
            "3",
            "--beam-size",
            "2",
            input="a dog .\n",
        )
    )
    assert line == "error: --n-best must be <= --beam-size (got 3 > 2)"
    line = _one_line_error(
        invoke("translate", "--checkpoint", trained_run, "--max-tokens", "0", input="a dog .\n")
    )
    assert line == "error: --max-tokens must be >= 1, got 0"
    line = _one_line_error(
        invoke(
            "translate", "--checkpoint", trained_run, "--max-input-pieces", "0", input="a dog .\n"
        )
    )
    assert line == "error: --max-input-pieces must be >= 1, got 0"
    # The beam size comes from the checkpoint: the message names the flag that changes it.
    line = _one_line_error(
        invoke("translate", "--checkpoint", trained_run, "--n-best", "7", input="a dog .\n")
    )
    assert line == "error: --n-best must be <= --beam-size (got 7 > 5)"
    line = _one_line_error(
        invoke("translate", "--checkpoint", trained_run, "--min-len", "-1", input="a dog .\n")
    )
    assert line == "error: --min-len must be >= 0, got -1"
    assert _one_line_error(
        invoke("translate", "--checkpoint", trained_run, "--threads", "-1", input="x\n")
    ).startswith("error: --threads must be in [0, 1024]")
    if not torch.cuda.is_available():
        assert "--device 'cuda' asked for" in _one_line_error(
            invoke("translate", "--checkpoint", trained_run, "--device", "cuda", input="x\n")
        )
    assert "--device: unknown device 'tpu'" in _one_line_error(
        invoke("translate", "--checkpoint", trained_run, "--device", "tpu", input="x\n")
    )
    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("x\n")
    assert "--run-dir" in _one_line_error(
        invoke("train", "--run-dir", not_a_dir, "--set", f"data.dir={TOY}")
    )


def test_flags_are_named_from_error_data_so_paths_are_never_rewritten(tmp_path):
    run_dir = tmp_path / "run_dir"
    run_dir.mkdir()
    (run_dir / "train.run_dir").write_text("a file\n")
    line = _one_line_error(
        invoke("train", "--run-dir", run_dir / "train.run_dir", "--set", f"data.dir={TOY}")
    )
    assert line == f"error: --run-dir {run_dir / 'train.run_dir'} is a file; choose a directory"
    line = _one_line_error(
        invoke(
            "train",
            "--set",
            f"train.run_dir={run_dir / 'train.run_dir'}",
            "--set",
            f"data.dir={TOY}",
        )
    )
    # set as a key, named as one
    assert line == f"error: train.run_dir {run_dir / 'train.run_dir'} is a file; choose a directory"
    config = tmp_path / "c.yaml"
    config.write_text(f"train:\n  run_dir: {run_dir}\n  warmup_steps: 50\ntrain:\n  max_steps: 3\n")
    line = _one_line_error(invoke("train", "--config", config, "--run-dir", run_dir))
    assert line == f"error: {config}:4: duplicate section train (first at line 1); write each once"


def test_usage_errors_are_one_line_with_a_suggestion():
    line = _one_line_error(invoke("translate", "--checkpoint", "x", "--beam-sise", "2"))
    assert line.startswith(
        "error: no such option: --beam-sise; did you mean --beam-size"
    ) and line.endswith("translate --help)")
    assert _one_line_error(invoke("evaluate", "--ref", "r", "--nbest", "2")).startswith(
        "error: no such option: --nbest"
    )
    assert "missing option '--out'" in _one_line_error(invoke("average", "a.pt"))
    # an option that begins a longer one is that one, not the closest by letters (--ban)
    assert _one_line_error(invoke("translate", "--checkpoint", "x", "--beam", "2")).startswith(
        "error: no such option: --beam; did you mean --beam-size?"
    )
    # a config key as an option, to a command that takes --set: the --set that sets it
    for option, keys in (
        ("--threads", ["train.threads"]),  # exactly
        ("--thread", ["train.threads"]),  # nearly
        ("--warmup", ["train.warmup_steps"]),  # the key it begins
        ("--max-tokens", ["train.max_tokens", "decode.max_tokens"]),  # every section's
    ):
        line = _one_line_error(invoke("train", option, "2"))
        said = " or ".join(f"--set {key}=VALUE" for key in keys)
        assert (
            line == f"error: no such option: {option}; did you mean {said}? (see root train --help)"
        )
    assert _one_line_error(invoke("train", "--bogus", "2")) == (
        "error: no such option: --bogus (see root train --help)"
    )
    # `nmt plot` alone prints its help, as before
    assert invoke("plot").exit_code == 2 and "Commands:" in invoke("plot").output


def test_info_takes_the_checkpoint_as_argument_or_as_flag(trained_run, tmp_path):
    by_argument = invoke("info", trained_run, "--json")
    assert (
        by_argument.exit_code == 0
        and invoke("info", "--checkpoint", trained_run, "--json").stdout == by_argument.stdout
    )
    assert (
        _one_line_error(invoke("info"))
        == "error: give one checkpoint: nmt info CHECKPOINT, or nmt info --checkpoint CHECKPOINT"
    )
    assert "give one checkpoint" in _one_line_error(
        invoke("info", trained_run, "--checkpoint", trained_run)
    )
    empty = tmp_path / "run"
    empty.mkdir()
    (empty / "last.pt").write_bytes((trained_run / "last.pt").read_bytes())
    line = _one_line_error(invoke("info", empty))  # the advice it gives works as written
    assert f"pass --checkpoint {empty / 'last.pt'}" in line
    assert invoke("info", "--checkpoint", empty / "last.pt").exit_code == 0
    # a directory with no checkpoint at all is named as such, not as a missing best.pt
    (empty / "last.pt").unlink()
    expected = (
        "is a directory with no nmt checkpoint (no best.pt or last.pt); give a run "
        "directory of nmt train or a .pt file"
    )
    assert _one_line_error(invoke("info", empty)) == f"error: {empty} {expected}"


def test_min_len_keeps_translations_from_ending_early(trained_run):
    """--print-alignment writes one pair per output piece, so it counts the pieces the search
    produced."""
    args = (
        "translate",
        "--checkpoint",
        trained_run,
        "--beam-size",
        "2",
        "--max-len-a",
        "0",
        "--max-len-b",
        "12",
        "--print-alignment",
    )
    pieces = lambda result: [
        len(line.split(" ||| ")[1].split()) for line in result.stdout.splitlines()
    ]
    free = invoke(*args, input="a dog .\nthe cat .\n")
    held = invoke(*args, "--min-len", "12", input="a dog .\nthe cat .\n")
    assert held.exit_code == 0, held.output
    # EOS only at the length limit, 12 pieces
    assert pieces(held) == [12, 12] and all(n <= 12 for n in pieces(free))
    assert pieces(invoke(*args, "--min-len", "5", input="a dog .\n"))[0] >= 5


@pytest.mark.parametrize("device", ["mps", "cuda", "cuda:3"])
def test_train_checks_the_device_before_any_work(tmp_path, device):
    import torch

    if (device == "mps" and torch.backends.mps.is_available()) or (
        device.startswith("cuda") and torch.cuda.device_count() > 3
    ):
        pytest.skip(f"this machine has {device}")
    if device == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    run = tmp_path / "run"
    line = _one_line_error(
        invoke(
            "train", "--run-dir", run, "--set", f"data.dir={TOY}", "--set", f"train.device={device}"
        )
    )
    assert f"train.device '{device}' asked for" in line
    assert not run.exists()  # refused before the tokenizer was trained or anything written


def test_evaluate_refuses_conflicting_options(trained_run, tmp_path):
    ref = tmp_path / "ref.de"
    ref.write_text("der Hund .\n", encoding="utf-8")
    src = tmp_path / "src.en"
    src.write_text("the dog .\n", encoding="utf-8")
    out = tmp_path / "out.de"
    line = _one_line_error(
        invoke("evaluate", "--hyp", ref, "--ref", ref, "--checkpoint", trained_run, "--src", src)
    )
    assert "--hyp" in line and "--checkpoint and --src" in line
    assert "--hyp (translations to score) and --src" in _one_line_error(
        invoke("evaluate", "--hyp", ref, "--ref", ref, "--src", src)
    )
    line = _one_line_error(invoke("evaluate", "--src", src, "--ref", ref))
    assert "--src needs --checkpoint" in line
    line = _one_line_error(invoke("evaluate", "--checkpoint", trained_run, "--ref", ref))
    assert "--checkpoint needs --src" in line
    line = _one_line_error(invoke("evaluate", "--hyp", ref, "--ref", ref, "-o", out))
    assert "--output" in line and not out.exists()
    line = _one_line_error(
        invoke("evaluate", "--hyp", ref, "--ref", ref, "--beam-size", "3", "--dtype", "bfloat16")
    )
    assert "--beam-size, --dtype:" in line
    # the default, typed: still ignored
    line = _one_line_error(
        invoke("evaluate", "--hyp", ref, "--ref", ref, "--min-len", "3", "--device", "auto")
    )
    assert (
        line
        == "error: --min-len, --device: these set how --checkpoint translates; with --hyp nothing "
        "is translated"
    )


def test_evaluate_prints_each_score_once_with_its_detail(tmp_path):
    ref = tmp_path / "ref.de"
    ref.write_text("der Hund sieht eine Katze .\ndie Frau mag das Haus .\n", encoding="utf-8")
    hyp = tmp_path / "hyp.de"
    hyp.write_text("der Hund sieht eine Katze .\ndie Frau mag den Garten .\n", encoding="utf-8")
    result = invoke("evaluate", "--hyp", hyp, "--ref", ref)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    bleu = [line for line in lines if "BLEU" in line]
    chrf = [line for line in lines if "chrF" in line]
    scores = json.loads(invoke("evaluate", "--hyp", hyp, "--ref", ref, "--json").stdout)
    assert (
        len(bleu) == 1
        and bleu[0].startswith(f"BLEU = {scores['bleu']:.2f} ")
        and "BP = " in bleu[0]
        and "ref_len = 12" in bleu[0]
    )
    assert chrf == [f"chrF = {scores['chrf']:.2f}"]
    assert (
        lines.count(f"  signature: {scores['bleu_signature']}") == 1
        and lines.count(f"  signature: {scores['chrf_signature']}") == 1
    )


def test_plot_output_is_checked_like_every_output(trained_run, tmp_path):
    line = _one_line_error(invoke("plot", trained_run, "-o", tmp_path))
    assert "is a directory" in line and not (tmp_path.parent / f"{tmp_path.name}.png").exists()
    line = _one_line_error(invoke("plot", trained_run, "-o", tmp_path / "missing" / "m.png"))
    assert "does not exist; create it first" in line
    line = _one_line_error(invoke("plot", trained_run, "-o", tmp_path / "m.txt"))
    assert "cannot write .txt images" in line and not (tmp_path / "m.txt").exists()
    # no suffix: a PNG at exactly that name
    result = invoke("plot", trained_run, "-o", tmp_path / "plain")
    assert result.exit_code == 0 and result.stdout.strip() == f"wrote {tmp_path / 'plain'}"
    assert (tmp_path / "plain").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (
        invoke("plot", trained_run, "-o", tmp_path / "m.svg").exit_code == 0
        and b"<svg" in (tmp_path / "m.svg").read_bytes()
    )


def test_plot_attention_checks_its_image_format_before_translating(
    trained_run, tmp_path, monkeypatch
):
    """`plot attention -o a.xyz` translated the sentence first and then failed in matplotlib with a
    traceback."""
    import nmt.cli.commands.plot

    monkeypatch.setattr(
        nmt.cli.commands.plot,
        "sentence_attention",
        lambda *a, **k: pytest.fail("translated before the format was checked"),
    )
    line = _one_line_error(
        invoke(
            "plot", "attention", "--checkpoint", trained_run, "the dog", "-o", tmp_path / "a.xyz"
        )
    )
    assert (
        line == f"error: {tmp_path / 'a.xyz'}: cannot write .xyz images; use .png, .pdf or .svg"
        and not (tmp_path / "a.xyz").exists()
    )


def test_version_comes_from_package_metadata():
    from importlib.metadata import version

    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout.startswith(f"nmt {version('nmt')} (torch {version('torch')}, Python ")


def test_info_describes_a_checkpoint(trained_run, tmp_path):
    from conftest import load_model

    from nmt.core.model import Transformer, count_parameters

    result = invoke("info", trained_run / "best.pt", "--json")
    assert result.exit_code == 0, result.output
    info = json.loads(result.stdout)
    model, _, cfg = load_model(trained_run / "best.pt", "cpu")
    validations = [
        json.loads(line)
        for line in (trained_run / "metrics.jsonl").read_text().splitlines()
        if "bleu" in line
    ]
    assert (
        info["step"] == 4
        and info["epoch"] == 0
        and info["best_bleu"] == max(r["bleu"] for r in validations)
    )
    assert info["parameters"] == count_parameters(model) == count_parameters(Transformer(cfg.model))
    assert (
        info["size_bytes"] == (trained_run / "best.pt").stat().st_size
        and info["optimizer_state"] is True
    )
    assert info["tokenizer"] == {
        "type": "bpe",
        "vocabulary": "sentencepiece",
        "joint": True,
        "src_vocab_size": 200,
        "tgt_vocab_size": 200,
    }
    assert info["config"]["model"]["d_model"] == 32 and info["dtype"] == "float32"
    text = invoke("info", trained_run).stdout
    assert (
        f"parameters: {info['parameters']:,} (float32; d_model 32" in text
        and "step: 4 (epoch 0)" in text
    )
    assert "optimizer state: yes" in text and "\n  model:\n    preset: tiny\n" in text
    assert "not found" in _one_line_error(invoke("info", tmp_path / "none.pt"))
    # An average's step and best BLEU are its last input's, and say so.
    assert (
        invoke(
            "average",
            _earlier_step(trained_run, tmp_path),
            trained_run / "last.pt",
            "--out",
            tmp_path / "avg.pt",
        ).exit_code
        == 0
    )
    averaged = invoke("info", tmp_path / "avg.pt").stdout
    assert (
        "step: 4 (epoch 0) (of the last checkpoint averaged, not of the average)" in averaged
        and "averaged from: " in averaged
    )
    # and so does --json, beside them
    described = json.loads(invoke("info", tmp_path / "avg.pt", "--json").stdout)
    assert described["step"] == 4 and described["progress_of"] == "last averaged"
    assert "progress_of" not in info


def test_export_slim_checkpoint_translates_the_same(trained_run, tmp_path):
    import torch

    slim = tmp_path / "slim.pt"
    result = invoke("export", slim, "--checkpoint", trained_run, "--format", "nmt")
    assert result.exit_code == 0, result.output
    payload = torch.load(slim, weights_only=True)
    assert set(payload) == {"model", "config", "tokenizer", "progress", "run", "nmt_version"}
    full = torch.load(trained_run / "best.pt", weights_only=True)
    assert all(torch.equal(payload["model"][k], full["model"][k]) for k in full["model"])
    assert slim.stat().st_size < (trained_run / "best.pt").stat().st_size
    text = "the dog sees a cat .\n\nthe big man likes the small house .\n"
    args = ("--beam-size", "2", "--max-len-b", "4")
    assert (
        invoke("translate", "--checkpoint", slim, *args, input=text).stdout
        == invoke("translate", "--checkpoint", trained_run, *args, input=text).stdout
    )
    info = json.loads(invoke("info", slim, "--json").stdout)
    assert info["optimizer_state"] is False and info["step"] == 4
    assert "is the checkpoint being exported" in _one_line_error(
        invoke("export", slim, "--checkpoint", slim, "--format", "nmt")
    )
    assert "--format ctranslate2 only" in _one_line_error(
        invoke(
            "export",
            tmp_path / "x.pt",
            "--checkpoint",
            slim,
            "--format",
            "nmt",
            "--quantization",
            "int8",
        )
    )


def test_export_ctranslate2_command_translates_like_nmt(trained_run, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    pytest.importorskip("transformers")
    from conftest import load_model

    from nmt.config import DecodeConfig
    from nmt.core.batching import pad_sources
    from nmt.data.tokenizer import EOS
    from nmt.decode.search import translate_batch

    result = invoke(
        "export", tmp_path / "ct2", "--checkpoint", trained_run, "--format", "ctranslate2"
    )
    assert result.exit_code == 0, result.output
    model, tokenizer, _ = load_model(trained_run, "cpu")
    translator = ctranslate2.Translator(str(tmp_path / "ct2"), device="cpu", intra_threads=1)
    sp = tokenizer.src
    ids = tokenizer.encode_src(["the big dog sees a small cat ."])[0]
    (hyps,) = translate_batch(
        model,
        pad_sources([ids]),
        DecodeConfig(beam_size=1, length_penalty=0.0, max_len_a=0.0, max_len_b=8),
    )
    output = translator.translate_batch(
        [[sp.id_to_piece(i) for i in ids] + [sp.id_to_piece(EOS)]],
        beam_size=1,
        max_decoding_length=8,
    )
    assert [sp.piece_to_id(p) for p in output[0].hypotheses[0]] == hyps[0].tokens


def test_n_best_score_is_length_normalised_log_probability(trained_run):
    """The score column is log P(Y|X) in nats, EOS included, divided by ((5 + |Y|) / 6)^α, |Y| with
    EOS (as --help says)."""
    import torch
    from conftest import load_model, translate_lines

    from nmt.core.batching import pad_sources
    from nmt.data.tokenizer import BOS, EOS

    alpha = 0.6
    result = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "--beam-size",
        "3",
        "--n-best",
        "3",
        "--length-penalty",
        alpha,
        "--max-len-b",
        "4",
        input="a dog .\n",
    )
    assert result.exit_code == 0, result.output
    model, tokenizer, cfg = load_model(trained_run, "cpu")
    # The hypotheses' pieces (an untrained model's text need not re-encode to the same pieces).
    (hyps,) = translate_lines(
        model,
        tokenizer,
        ["a dog ."],
        replace(cfg.decode, beam_size=3, n_best=3, length_penalty=alpha, max_len_b=4),
        torch.device("cpu"),
    )
    src = pad_sources(tokenizer.encode_src(["a dog ."]))
    lines = result.stdout.splitlines()
    assert len(lines) == len(hyps) == 3
    for line, hyp in zip(lines, hyps):
        _, text, score = line.split(" ||| ")
        assert text == tokenizer.decode_tgt([hyp.tokens])[0]
        tgt = torch.tensor([[BOS, *hyp.tokens, EOS]])
        with torch.no_grad():
            log_p = (
                model(src, tgt[:, :-1]).log_softmax(-1)[0].gather(-1, tgt[0, 1:, None]).sum().item()
            )
        assert float(score) == pytest.approx(
            log_p / ((5 + len(hyp.tokens) + 1) / 6) ** alpha, abs=2e-4
        )


def test_quiet_train_prints_only_its_result_line(tmp_path):
    args = [
        "--config",
        ROOT / "configs" / "toy.yaml",
        "--run-dir",
        tmp_path / "run",
        "--set",
        f"data.dir={TOY}",
        "--set",
        "train.max_steps=2",
        "--set",
        "model.d_model=32",
        "--set",
        "model.d_ff=64",
        "--set",
        "tokenizer.vocab_size=200",
        "--set",
        "data.valid_max_sentences=4",
        "--set",
        "train.valid_beam_size=1",
        "--set",
        "train.threads=1",
        "--set",
        "train.log_every=1",
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run(
        [sys.executable, "-m", "nmt", "train", "--quiet", *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and json.loads(result.stdout)["step"] == 2


def test_native_bf16_read_from_cpu_flags():
    from nmt.runtime.device import native_bf16

    avx2 = "processor\t: 0\nflags\t\t: fpu vme sse sse2 avx avx2 fma\n"
    assert native_bf16(avx2) is False
    assert native_bf16(avx2.replace("avx2", "avx2 avx512f avx512_bf16")) is True
    assert native_bf16(avx2.replace("avx2", "avx2 amx_tile amx_bf16")) is True
    assert native_bf16("processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n") is True  # Arm
    assert native_bf16("") is False


def test_dtype_auto_and_the_bf16_warning(trained_run, monkeypatch, caplog):
    import torch

    from nmt.runtime import device as runtime
    from nmt.runtime.device import resolve_dtype

    cpu = torch.device("cpu")
    monkeypatch.setattr(runtime, "native_bf16", lambda: True)
    assert resolve_dtype("auto", cpu) == torch.bfloat16
    monkeypatch.setattr(runtime, "native_bf16", lambda: False)
    assert resolve_dtype("auto", cpu) == torch.float32
    with caplog.at_level("WARNING", logger="nmt.runtime"):
        result = invoke(
            "translate",
            "--checkpoint",
            trained_run,
            "--beam-size",
            "1",
            "--dtype",
            "bfloat16",
            input="a dog .\n",
        )
    assert result.exit_code == 0 and "several times slower than float32" in caplog.text
    caplog.clear()
    # unknown CPU: no warning, auto keeps float32
    monkeypatch.setattr(runtime, "native_bf16", lambda: None)
    with caplog.at_level("WARNING", logger="nmt.runtime"):
        assert (
            resolve_dtype("bfloat16", cpu) == torch.bfloat16
            and resolve_dtype("auto", cpu) == torch.float32
        )
    assert caplog.text == ""
    auto = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "--beam-size",
        "1",
        "--max-len-b",
        "4",
        "--dtype",
        "auto",
        input="a dog .\n",
    )
    fp32 = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "--beam-size",
        "1",
        "--max-len-b",
        "4",
        input="a dog .\n",
    )
    assert auto.exit_code == 0 and auto.stdout == fp32.stdout
    assert "float32, bfloat16, float16, int8 or auto" in _one_line_error(
        invoke("translate", "--checkpoint", trained_run, "--dtype", "fp8", input="x\n")
    )


def test_translate_streams_a_pipe_line_by_line(trained_run):
    """The first translation comes back while the pipe is still open, before the second line is
    written."""
    import select

    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "nmt",
        "translate",
        "--checkpoint",
        str(trained_run),
        "--beam-size",
        "2",
        "--max-len-b",
        "4",
        "--buffer-size",
        "100",
    ]
    proc = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=ROOT,
    )
    try:
        proc.stdin.write(b"the dog sees a cat .\n")
        proc.stdin.flush()
        assert select.select([proc.stdout], [], [], 300)[0], (
            "no translation of the first line while the pipe stayed open"
        )
        first = proc.stdout.readline()
        proc.stdin.write(b"the big man likes the small house .\n")
        proc.stdin.close()
        rest = proc.stdout.read()
        assert proc.wait(timeout=300) == 0, proc.stderr.read()
    finally:
        proc.kill()
    whole = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "--beam-size",
        "2",
        "--max-len-b",
        "4",
        input="the dog sees a cat .\nthe big man likes the small house .\n",
    )
    assert (first + rest).decode() == whole.stdout and len(whole.stdout.splitlines()) == 2


def test_translate_buffers_keep_order_and_global_n_best_indices(trained_run, tmp_path):
    text = "a dog .\n\nthe cat .\nthe big man likes the small house .\nthe woman .\n"
    args = (
        "translate",
        "--checkpoint",
        trained_run,
        "--beam-size",
        "2",
        "--n-best",
        "2",
        "--max-len-b",
        "3",
    )
    whole = invoke(*args, input=text)
    small = invoke(*args, "--buffer-size", "2", input=text)
    assert small.exit_code == 0, small.output

    def entries(output):  # scores agree to rounding: batches differ in padding
        rows = [line.split(" ||| ") for line in output.splitlines()]
        return [(i, text) for i, text, _ in rows], [float(score) for _, _, score in rows]

    assert entries(small.stdout)[0] == entries(whole.stdout)[0] and entries(small.stdout)[
        1
    ] == pytest.approx(entries(whole.stdout)[1], abs=2e-4)
    assert [i for i, _ in entries(small.stdout)[0]] == ["0", "0", "1", "2", "2", "3", "3", "4", "4"]
    src = tmp_path / "in.en"
    src.write_text(text)
    out = tmp_path / "out.txt"
    assert (
        invoke(*args, "--buffer-size", "2", "-i", src, "-o", out).exit_code == 0
        and out.read_text() == small.stdout
    )
    result = invoke("translate", "--checkpoint", trained_run, "--buffer-size", "0", input="x\n")
    assert result.exit_code == 2 and "--buffer-size must be 1 to 10,000,000 lines" in result.output


def test_invalid_utf8_late_in_a_stream_leaves_earlier_output_and_no_partial_file(
    trained_run, tmp_path
):
    out = tmp_path / "out.de"
    out.write_text("earlier\n")
    text = "a dog .\nthe cat .\ncaf\xe9\n".encode("latin-1")
    result = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "--buffer-size",
        "1",
        "--max-len-b",
        "3",
        "-o",
        out,
        input=text,
    )
    assert result.exit_code == 2 and "<stdin>:3: invalid UTF-8" in result.output
    assert out.read_text() == "earlier\n" and [p.name for p in tmp_path.iterdir()] == ["out.de"]
    piped = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "--buffer-size",
        "1",
        "--max-len-b",
        "3",
        input=text,
    )
    # the two good lines were already written
    assert piped.exit_code == 2 and len(piped.stdout.splitlines()) == 2


def test_ensemble_of_a_checkpoint_with_itself_and_tokenizer_mismatch(trained_run, tmp_path):
    import torch

    from nmt.config import TokenizerConfig
    from nmt.data.corpus import read_lines
    from nmt.data.tokenizer import train_tokenizer
    from nmt.runs.checkpoint import save_checkpoint, tokenizer_to_tensors

    text = "the dog sees a cat .\nthe big man likes the small house .\n"
    args = ("--beam-size", "3", "--max-len-b", "5", "--n-best", "2")
    single = invoke("translate", "--checkpoint", trained_run, *args, input=text)
    double = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "--checkpoint",
        trained_run / "best.pt",
        *args,
        input=text,
    )
    assert double.exit_code == 0, double.output
    assert [line.rsplit(" ||| ", 1)[0] for line in double.stdout.splitlines()] == [
        line.rsplit(" ||| ", 1)[0] for line in single.stdout.splitlines()
    ]
    payload = torch.load(trained_run / "best.pt", weights_only=True)
    src, tgt = read_lines(TOY / "train.en")[:300], read_lines(TOY / "train.de")[:300]
    # as many pieces, other ones
    payload["tokenizer"] = tokenizer_to_tensors(
        train_tokenizer(src, tgt, TokenizerConfig(vocab_size=200)).protos()
    )
    save_checkpoint(payload, tmp_path / "other.pt")
    result = invoke(
        "translate", "--checkpoint", trained_run, "--checkpoint", tmp_path / "other.pt", input=text
    )
    assert (
        result.exit_code == 2
        and "other.pt: its tokenizer differs from" in result.output
        and re.search(r"src piece \d+ is '.*' vs '.*'", result.output)
    )


def test_sampling_flags(trained_run):
    text = "the dog sees a cat .\n\nthe big man likes the small house .\nthe woman .\n"
    args = ("translate", "--checkpoint", trained_run, "--max-len-b", "5", "--sampling")
    first = invoke(*args, "--n-best", "4", "--seed", "3", input=text)
    assert first.exit_code == 0, first.output
    assert [line.split(" ||| ")[0] for line in first.stdout.splitlines()] == ["0"] * 4 + ["1"] + [
        "2"
    ] * 4 + ["3"] * 4
    # however batched
    assert (
        invoke(
            *args,
            "--n-best",
            "4",
            "--seed",
            "3",
            "--buffer-size",
            "1",
            "--max-tokens",
            "8",
            input=text,
        ).stdout
        == first.stdout
    )
    assert invoke(*args, "--n-best", "4", "--seed", "4", input=text).stdout != first.stdout
    greedy = invoke(
        "translate", "--checkpoint", trained_run, "--max-len-b", "5", "--beam-size", "1", input=text
    )
    assert invoke(*args, "--top-k", "1", input=text).stdout == greedy.stdout
    bad = invoke("translate", "--checkpoint", trained_run, "--top-p", "0.9", input=text)
    assert bad.exit_code == 2 and "--top-p only apply with --sampling" in bad.output
    bad = invoke(*args, "--top-p", "0", input=text)
    assert bad.exit_code == 2 and "--top-p must be in (0, 1]" in bad.output


def test_print_alignment_and_int8(trained_run):
    import torch
    from conftest import load_model

    _, tokenizer, _ = load_model(trained_run, torch.device("cpu"))
    text = "the dog sees a cat .\n\nthe big man likes the small house .\n"
    for dtype in ("float32", "int8"):
        result = invoke(
            "translate",
            "--checkpoint",
            trained_run,
            "--beam-size",
            "2",
            "--max-len-b",
            "4",
            "--print-alignment",
            "--dtype",
            dtype,
            input=text,
        )
        assert result.exit_code == 0, result.output
        lines = result.stdout.split("\n")[:-1]
        assert len(lines) == 3 and lines[1] == " ||| "
        for source, line in zip(text.splitlines(), lines):
            pairs = [tuple(map(int, p.split("-"))) for p in line.split(" ||| ")[1].split()]
            # one pair per output piece
            assert [j for _, j in pairs] == list(range(len(pairs))) and bool(pairs) == bool(source)
            assert all(0 <= i < len(tokenizer.encode_src([source])[0]) for i, _ in pairs)


def test_plot_attention_writes_a_png(trained_run, tmp_path):
    result = invoke(
        "plot",
        "attention",
        "the dog sees a cat .",
        "--checkpoint",
        trained_run,
        "--out",
        tmp_path / "a.png",
        "--beam-size",
        "2",
    )
    assert result.exit_code == 0, result.output
    data = (tmp_path / "a.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5_000
    assert (
        invoke("plot", "metrics", trained_run, "--out", tmp_path / "m.png").exit_code == 0
        and (tmp_path / "m.png").stat().st_size > 10_000
    )
    result = invoke(
        "plot", "attention", "  ", "--checkpoint", trained_run, "--out", tmp_path / "b.png"
    )
    assert result.exit_code == 2 and "empty" in result.output
    # what translate leaves untranslated is refused, not drawn: too many pieces, or only unknown
    # ones
    result = invoke(
        "plot",
        "attention",
        "the dog sees a cat .",
        "--checkpoint",
        trained_run,
        "--out",
        tmp_path / "b.png",
        "--max-input-pieces",
        "3",
    )
    assert (
        result.exit_code == 2
        and "over the limit of 3 (--max-input-pieces)" in result.output
        and not (tmp_path / "b.png").exists()
    )
    result = invoke(
        "plot",
        "attention",
        "\U0001f600\U0001f600",
        "--checkpoint",
        trained_run,
        "--out",
        tmp_path / "b.png",
    )
    assert (
        result.exit_code == 2
        and "has only text the model's vocabulary lacks ('😀😀')" in result.output
        and not (tmp_path / "b.png").exists()
    )


def test_train_checks_every_input_before_writing_anything(tmp_path):
    (tmp_path / "v.en").write_text("a dog .\n" * 50)
    (tmp_path / "v.de").write_text("ein Hund .\n" * 49)
    (tmp_path / "latin.de").write_bytes(b"ein Hund .\n" * 49 + b"ein M\xe4dchen .\n")
    (tmp_path / "blank.de").write_text("\n" * 50)
    cache = tmp_path / "shared-cache"
    for valid_tgt, message in (
        ("v.de", "v.en has 50 lines but .*v.de has 49"),
        ("latin.de", r"latin.de:50: invalid UTF-8"),
        ("blank.de", r"the validation set \(.*v.en and .*blank.de\) has no pair"),
    ):
        result = invoke(
            "train",
            "--run-dir",
            tmp_path / "run",
            "--set",
            f"data.train_src={TOY / 'train.en'}",
            "--set",
            f"data.train_tgt={TOY / 'train.de'}",
            "--set",
            f"data.valid_src={tmp_path / 'v.en'}",
            "--set",
            f"data.valid_tgt={tmp_path / valid_tgt}",
            "--set",
            f"data.cache_dir={cache}",
        )
        assert result.exit_code == 2 and re.search(message, result.output), result.output
        # no tokenizer, no cache, no run directory
        assert not (tmp_path / "run").exists() and not cache.exists()


def test_lines_without_pieces_and_overlong_lines_give_empty_output_lines(
    trained_run, tmp_path, caplog
):
    huge = " ".join(["dog"] * 3000)
    src = tmp_path / "in.en"
    src.write_text(f"the dog .\n\u200b\n{huge}\nthe cat .\n", encoding="utf-8")
    result = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "-i",
        src,
        "--beam-size",
        "2",
        "--max-len-b",
        "5",
        "--max-input-pieces",
        "2000",
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.split("\n")
    assert len(lines) == 5 and lines[1] == "" and lines[2] == "" and lines[0] and lines[3]
    assert re.search(
        r"input line 3 has 3000 pieces, over the limit of 2000 \(--max-input-pieces\)", caplog.text
    )
    alone = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "--beam-size",
        "2",
        "--max-len-b",
        "5",
        input="the dog .\nthe cat .\n",
    )
    # the other lines translate as they do on their own
    assert alone.stdout.split("\n")[:2] == [lines[0], lines[3]]


def test_translate_length_normalization_flag(trained_run):
    text = "the dog sees a cat .\nthe big man likes the small house .\n"
    for name in ("gnmt", "length", "none"):
        result = invoke(
            "translate",
            "--checkpoint",
            trained_run,
            "--beam-size",
            "3",
            "--length-normalization",
            name,
            "--n-best",
            "3",
            "--max-len-b",
            "4",
            input=text,
        )
        assert result.exit_code == 0, result.output
        assert len(result.stdout.splitlines()) == 6
    bad = invoke(
        "translate", "--checkpoint", trained_run, "--length-normalization", "average", input=text
    )
    assert (
        bad.exit_code == 2
        and "error: --length-normalization must be gnmt, length or none, got 'average'"
        in bad.output
    )


def test_tune_decode_table_and_best_setting_reproduce_with_evaluate(trained_run, tmp_path):
    src, ref = tmp_path / "valid6.en", tmp_path / "valid6.de"
    src.write_text(
        "".join((TOY / "valid.en").read_text(encoding="utf-8").splitlines(keepends=True)[:6]),
        encoding="utf-8",
    )
    ref.write_text(
        "".join((TOY / "valid.de").read_text(encoding="utf-8").splitlines(keepends=True)[:6]),
        encoding="utf-8",
    )
    args = [
        "tune-decode",
        "--checkpoint",
        trained_run,
        "--beam-sizes",
        "1,2",
        "--length-penalties",
        "0.6,1.0",
        "--threads",
        "1",
    ]
    result = invoke(
        *args,
        "--src",
        TOY / "valid.en",
        "--ref",
        TOY / "valid.de",
        "--max-sentences",
        "6",
        "--json",
    )
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["sentences"] == 6
    assert [
        (r["beam_size"], r["length_normalization"], r["length_penalty"]) for r in out["rows"]
    ] == [
        (1, "none", 0.0),
        (2, "gnmt", 0.6),
        (2, "gnmt", 1.0),
        (2, "length", 0.6),
        (2, "length", 1.0),
    ]
    best = out["best"]
    assert best["bleu"] == max(r["bleu"] for r in out["rows"])
    again = invoke(
        "evaluate",
        "--checkpoint",
        trained_run,
        "--src",
        src,
        "--ref",
        ref,
        "--threads",
        "1",
        "--json",
        *out["flags"].split(),
    )
    assert again.exit_code == 0, again.output
    assert json.loads(again.stdout)["bleu"] == best["bleu"]
    table = invoke(*args, "--src", src, "--ref", ref)
    assert (
        table.exit_code == 0
        and f"best: BLEU {best['bleu']:.2f} with {out['flags']}" in table.stdout
    )


def test_tune_decode_refuses_test_files_before_reading_them(trained_run, tmp_path):
    valid = TOY / "valid.de"
    for flag, other, named in (
        ("--src", "--ref", "test.en"),
        ("--ref", "--src", "newstest2014.de"),
    ):
        # the test file does not even exist
        result = invoke(
            "tune-decode", "--checkpoint", trained_run, flag, tmp_path / named, other, valid
        )
        assert (
            result.exit_code == 2
            and f"{flag} {tmp_path / named}: the name says test data" in result.output
            and "not found" not in result.output
        )
    # a validation set named like a test set, declared as such
    renamed = tmp_path / "newstest2013.en"
    renamed.write_text("the dog sees a cat .\n", encoding="utf-8")
    one_ref = tmp_path / "valid1.de"
    one_ref.write_text("der Hund sieht eine Katze .\n", encoding="utf-8")
    result = invoke(
        "tune-decode",
        "--checkpoint",
        trained_run,
        "--src",
        renamed,
        "--ref",
        one_ref,
        "--beam-sizes",
        "1",
        "--allow-test-names",
        "--json",
        "--threads",
        "1",
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["sentences"] == 1
    result = invoke(
        "tune-decode",
        "--checkpoint",
        trained_run,
        "--src",
        renamed,
        "--ref",
        valid,
        "--allow-test-names",
    )
    assert result.exit_code == 2 and "differ in length (1 and 500 lines)" in result.output
    result = invoke(
        "tune-decode",
        "--checkpoint",
        trained_run,
        "--src",
        renamed,
        "--ref",
        one_ref,
        "--allow-test-names",
        "--beam-sizes",
        "4,x",
    )
    assert (
        result.exit_code == 2
        and "--beam-sizes '4,x': expected comma-separated int values" in result.output
    )


def test_misspelt_config_key_names_the_file_and_lists_config_keys(tmp_path):
    config = tmp_path / "bad.yaml"
    config.write_text("train:\n  max_stepz: 3\n")
    message = _one_line_error(invoke("train", "--config", config, "--run-dir", tmp_path / "r"))
    assert (
        message == f"error: {config}:2: unknown key train.max_stepz; did you mean train.max_steps?"
    )
    config.write_text("train:\n  zzz: 3\n")
    message = _one_line_error(invoke("train", "--config", config, "--run-dir", tmp_path / "r"))
    assert message.startswith(f"error: {config}:2: unknown key train.zzz; the keys of [train] are ")
    # the keys a config file can hold, not flags
    assert " run_dir," in message and "--run-dir" not in message
    assert not (tmp_path / "r").exists()


def test_translate_with_prefix_constraints_and_bans_from_files(trained_run, tmp_path):
    src, prefixes, terms, bans = (
        tmp_path / name for name in ("src.en", "prefix.de", "terms.de", "ban.de")
    )
    src.write_text("the dog sees a cat .\nthe man .\n")
    prefixes.write_text("der Hund \n\n")
    terms.write_text("Katze\tsieht\n\n")
    bans.write_text("\nder\n")
    result = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "-i",
        src,
        "--beam-size",
        "3",
        "--max-len-b",
        "6",
        "--prefix-file",
        prefixes,
        "--constraints-file",
        terms,
        "--ban-file",
        bans,
        "--ban",
        "Hund Hund",
    )
    assert result.exit_code == 0, result.output
    first, second = result.stdout.splitlines()
    assert (
        first.startswith("der Hund ")
        and "Katze" in first
        and "sieht" in first
        and "Hund Hund" not in first
    )
    assert "der" not in second.split()
    prefixes.write_text("der Hund \n")  # one line short
    result = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "-i",
        src,
        "--prefix-file",
        prefixes,
        "-o",
        tmp_path / "out.de",
    )
    assert (
        result.exit_code == 2
        and f"--prefix-file {prefixes} has 1 lines, the input has more" in result.output
        and not (tmp_path / "out.de").exists()
    )
    prefixes.write_text("a\nb\nc\n")
    result = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "-i",
        src,
        "--prefix-file",
        prefixes,
        "-o",
        tmp_path / "out.de",
    )
    assert (
        result.exit_code == 2
        and "has more lines than the input" in result.output
        and not (tmp_path / "out.de").exists()
    )
    result = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "-i",
        src,
        "--sampling",
        "--constraints-file",
        terms,
    )
    assert result.exit_code == 2 and "--constraints-file needs beam search" in result.output


def test_an_output_that_is_an_input_is_refused_before_anything_is_read(trained_run, tmp_path):
    """Nmt translate -i same.en -o same.en replaced the source with its translation and exited 0."""
    src = tmp_path / "same.en"
    src.write_text("the dog .\n")
    (tmp_path / "link.en").symlink_to(src)
    for out in (src, tmp_path / "link.en"):
        result = invoke("translate", "--checkpoint", trained_run, "-i", src, "-o", out)
        assert result.exit_code == 2 and "is the same file as --input" in result.output
    assert src.read_text() == "the dog .\n"
    result = invoke(
        "evaluate",
        "--checkpoint",
        trained_run,
        "--src",
        src,
        "--ref",
        src,
        "-o",
        tmp_path / "link.en",
    )
    assert (
        result.exit_code == 2
        and "is the same file as --src" in result.output
        and src.read_text() == "the dog .\n"
    )


def _nmt(*args, stdin=None, stdout=subprocess.PIPE, env=None, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "nmt", *map(str, args)],
        stdin=stdin,
        stdout=stdout,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
        timeout=300,
        **kwargs,
    )


def test_closed_standard_streams_are_one_line_not_a_traceback(trained_run, tmp_path):
    ref = tmp_path / "ref.de"
    ref.write_text("der Hund .\n")
    closed_out = _nmt(
        "evaluate", "--hyp", ref, "--ref", ref, stdout=None, preexec_fn=lambda: os.close(1)
    )
    assert (
        closed_out.returncode == 2
        and closed_out.stderr.decode().startswith("error: standard output is closed")
        and closed_out.stderr.count(b"\n") == 1
    )
    closed_in = _nmt("translate", "--checkpoint", trained_run, preexec_fn=lambda: os.close(0))
    assert (
        closed_in.returncode == 2
        and closed_in.stderr.decode().startswith("error: standard input is closed")
        and closed_in.stderr.count(b"\n") == 1
    )


@pytest.mark.parametrize(
    "env",
    [
        {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": "ascii"},
        {"PYTHONIOENCODING": "latin-1"},
    ],
)
def test_output_is_utf8_whatever_the_locale(trained_run, tmp_path, env):
    """German once crashed after the work under an ASCII locale, and was written in latin-1 under
    that one."""
    hyp = tmp_path / "hyp.de"
    hyp.write_text("Die Straße ist groß .\n", encoding="utf-8")
    result = _nmt("evaluate", "--hyp", hyp, "--ref", hyp, "--json", env=env)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.decode("utf-8"))["bleu"] == pytest.approx(100.0)
    out = _nmt(
        "translate", "--checkpoint", trained_run, "--max-len-b", "4", input=b"the dog .\n", env=env
    )
    assert out.returncode == 0, out.stderr
    out.stdout.decode("utf-8")  # strict: valid UTF-8


@pytest.mark.parametrize(
    "env",
    [
        {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": "ascii"},
        {"PYTHONIOENCODING": "latin-1"},
    ],
)
def test_the_warnings_about_text_forms_reach_an_ascii_terminal(tmp_path, env):
    """The evaluate warnings quote the text they are about (NFD Japanese, a byte-order mark): under
    an ASCII or Latin-1 locale they are written in one piece, and the score is unchanged."""
    import unicodedata

    ref, hyp = tmp_path / "ref.ja", tmp_path / "hyp.ja"
    ref.write_text("これはガイドです。\n\ufeff犬が寝ています。\n", encoding="utf-8")
    hyp.write_text(
        unicodedata.normalize("NFD", "これはガイドでした。") + "\n犬が寝ています。\n",
        encoding="utf-8",
    )
    result = _nmt("evaluate", "--hyp", hyp, "--ref", ref, "--tokenize", "char", "--json", env=env)
    err = result.stderr.decode("utf-8")
    assert result.returncode == 0 and "Logging error" not in err, err
    assert "1 line(s) of the hypotheses differ from" in err and "Unicode normalisation" in err
    assert "differ in invisible characters (line 2: '\\ufeff'" in err


def test_translate_writes_through_a_fifo_and_keeps_it(trained_run, tmp_path):
    import stat
    import threading

    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    result = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "--max-len-b",
        "4",
        "-o",
        fifo,
        input="the dog .\na cat .\n",
    )
    reader.join(timeout=60)
    assert result.exit_code == 0, result.output
    assert received and received[0].count(b"\n") == 2 and stat.S_ISFIFO(os.stat(fifo).st_mode)


def test_text_read_once_may_come_from_a_pipe_and_training_text_may_not(trained_run, tmp_path):
    """Evaluate --ref <(zcat ref.gz), --hyp /dev/stdin and translate -i <(head -3 f) were refused
    with the training-data message."""
    import threading

    ref = tmp_path / "ref.de"
    ref.write_text("der Hund sieht die Katze .\nein Mann .\n")
    script = f"{sys.executable} -m nmt evaluate --hyp /dev/stdin --ref <(cat {ref}) --json < {ref}"
    result = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["bleu"] == pytest.approx(100.0)
    fifo = tmp_path / "src.fifo"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text("the dog .\na cat .\nthe man .\n"))
    writer.start()
    translated = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "--max-len-b",
        "3",
        "-i",
        fifo,
        "-o",
        tmp_path / "out.de",
    )
    writer.join(timeout=60)
    assert translated.exit_code == 0, translated.output
    assert (tmp_path / "out.de").read_text().count("\n") == 3
    os.mkfifo(tmp_path / "train.en")
    line = _one_line_error(
        invoke(
            "train",
            "--set",
            f"data.train_src={tmp_path / 'train.en'}",
            "--set",
            f"data.train_tgt={ref}",
            "--set",
            f"data.valid_src={ref}",
            "--set",
            f"data.valid_tgt={ref}",
            "--run-dir",
            tmp_path / "run",
        )
    )
    assert (
        "not a regular file (a pipe?); nmt train reads its text more than once" in line
        and "zcat f.gz > f" in line
    )


def test_gzip_on_standard_input_is_read_as_text(trained_run):
    """Gzip data on stdin was reported as invalid UTF-8, with advice to run iconv."""
    import gzip

    plain = invoke(
        "translate", "--checkpoint", trained_run, "--max-len-b", "3", input="the dog .\na cat .\n"
    )
    zipped = runner.invoke(
        app,
        ["translate", "--checkpoint", str(trained_run), "--max-len-b", "3"],
        input=gzip.compress(b"the dog .\na cat .\n"),
    )
    assert zipped.exit_code == 0, zipped.output
    assert zipped.stdout == plain.stdout and plain.stdout.count("\n") == 2
    truncated = runner.invoke(
        app,
        ["translate", "--checkpoint", str(trained_run)],
        input=gzip.compress(b"the dog .\n")[:-6],
    )
    assert truncated.exit_code == 2 and "the gzip data ends early" in truncated.output


def test_shortlist_command_builds_a_file_that_translate_and_evaluate_take(trained_run, tmp_path):
    shortlist = tmp_path / "shortlist.txt"
    result = invoke(
        "shortlist",
        "--checkpoint",
        trained_run,
        "--src",
        TOY / "train.en",
        "--tgt",
        TOY / "train.de",
        "-o",
        shortlist,
        "--per-source",
        "5",
    )
    assert result.exit_code == 0, result.output
    assert (
        shortlist.read_text(encoding="utf-8").startswith("\t") and "up to 5 each" in result.stdout
    )
    src = tmp_path / "src.en"
    src.write_text("the dog .\n\na cat .\n", encoding="utf-8")
    out = tmp_path / "out.de"
    result = invoke(
        "translate",
        "--checkpoint",
        trained_run,
        "-i",
        src,
        "-o",
        out,
        "--shortlist",
        shortlist,
        "--quiet",
    )
    assert result.exit_code == 0, result.output
    assert len(out.read_text(encoding="utf-8").splitlines()) == 3
    ref = tmp_path / "ref.de"
    ref.write_text("der Hund .\n\neine Katze .\n", encoding="utf-8")
    result = invoke(
        "evaluate",
        "--checkpoint",
        trained_run,
        "--src",
        src,
        "--ref",
        ref,
        "--shortlist",
        shortlist,
        "--json",
        "--quiet",
    )
    assert result.exit_code == 0, result.output
    line = _one_line_error(invoke("evaluate", "--hyp", ref, "--ref", ref, "--shortlist", shortlist))
    assert line.startswith("error: --shortlist: these set how --checkpoint translates")
    line = _one_line_error(
        invoke("translate", "--checkpoint", trained_run, "-i", src, "--shortlist", src)
    )
    assert f"{src}, line 1: no tab" in line
    line = _one_line_error(
        invoke(
            "translate",
            "--checkpoint",
            trained_run,
            "-i",
            src,
            "-o",
            shortlist,
            "--shortlist",
            shortlist,
        )
    )
    # the output may not overwrite an input
    assert "--shortlist" in line and shortlist.read_text(encoding="utf-8").startswith("\t")
    line = _one_line_error(
        invoke(
            "evaluate",
            "--checkpoint",
            trained_run,
            "--src",
            src,
            "--ref",
            ref,
            "--shortlist",
            shortlist,
            "-o",
            shortlist,
        )
    )
    assert (
        "--output" in line
        and "--shortlist" in line
        and shortlist.read_text(encoding="utf-8").startswith("\t")
    )
    misaligned = tmp_path / "short.de"
    misaligned.write_text("der Hund .\n", encoding="utf-8")
    line = _one_line_error(
        invoke(
            "shortlist",
            "--checkpoint",
            trained_run,
            "--src",
            src,
            "--tgt",
            misaligned,
            "-o",
            tmp_path / "x.txt",
        )
    )
    assert "3 lines but" in line and not (tmp_path / "x.txt").exists()


def test_no_output_overwrites_the_checkpoint_a_run_directory_names(trained_run, tmp_path):
    """--checkpoint RUN reads RUN/best.pt: writing -o RUN/best.pt would destroy the model being
    read."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    before = (run / "best.pt").read_bytes()
    src = tmp_path / "src.en"
    src.write_text("the dog .\n", encoding="utf-8")
    commands = [
        ("translate", "--checkpoint", run, "-i", src, "-o", run / "best.pt"),
        ("evaluate", "--checkpoint", run, "--src", src, "--ref", src, "-o", run / "best.pt"),
        ("shortlist", "--checkpoint", run, "--src", src, "--tgt", src, "-o", run / "best.pt"),
    ]
    for command in commands:
        line = _one_line_error(invoke(*command))
        assert (
            f"{run / 'best.pt'} would replace a training checkpoint of the run in {run}" in line
        ), command
    assert (run / "best.pt").read_bytes() == before
    # a checkpoint outside a run directory: refused as the input it is
    alone = tmp_path / "model.pt"
    shutil.copy(run / "best.pt", alone)
    for command in commands:
        command = tuple(alone if part in (run, run / "best.pt") else part for part in command)
        line = _one_line_error(invoke(*command))
        assert f"is the same file as --checkpoint {alone}" in line, command
    assert alone.read_bytes() == before


def test_stopping_translate_leaves_its_output_as_it_was_and_says_so(trained_run, tmp_path):
    """Ctrl-C on a streaming `translate -o` kept nothing and said nothing; the output is still whole
    or untouched (never partial), and now the message says so and where lines as they come can
    go."""
    import signal
    import time

    out = tmp_path / "out.txt"
    out.write_text("an earlier translation\n")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nmt",
            "translate",
            "--checkpoint",
            str(trained_run),
            "-o",
            str(out),
            "--threads",
            "1",
        ],
        stdin=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    proc.stdin.write(b"the dog sees a cat .\n")
    proc.stdin.flush()
    deadline = time.monotonic() + 120
    while (
        not list(tmp_path.glob(".out.txt.tmp*"))
        and proc.poll() is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.05)  # until the translation has started writing its temporary
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err.decode()
    assert f"{out} was left as it was (an output file appears only when complete" in err.decode()
    assert out.read_text() == "an earlier translation\n" and sorted(
        p.name for p in tmp_path.iterdir()
    ) == ["out.txt"]


def test_chinese_piped_into_evaluate_scores_as_from_a_file_in_the_c_locale(tmp_path):
    """A non-Latin target read from standard input under LC_ALL=C: bytes are UTF-8 whatever the
    locale."""
    ref, hyp = tmp_path / "ref.zh", tmp_path / "hyp.zh"
    ref.write_text("一只狗在草地上奔跑。\n两个男人在说话。\n", encoding="utf-8")
    hyp.write_text("一只狗在草地上跑。\n两个男人在谈话。\n", encoding="utf-8")
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONPATH": str(ROOT)}
    run = [
        sys.executable,
        "-m",
        "nmt",
        "evaluate",
        "--ref",
        str(ref),
        "--tokenize",
        "zh",
        "--json",
        "--hyp",
    ]
    piped = subprocess.run(
        [*run, "-"], input=hyp.read_bytes(), capture_output=True, env=env, timeout=120
    )
    from_file = subprocess.run([*run, str(hyp)], capture_output=True, env=env, timeout=120)
    assert piped.returncode == 0, piped.stderr.decode()
    scores = json.loads(piped.stdout)
    assert scores == json.loads(from_file.stdout) and 0 < scores["bleu"] < 100


@pytest.mark.parametrize(
    "error",
    [
        MemoryError(),
        RuntimeError(
            "[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: "
            "you tried to allocate 1073741824 bytes."
        ),
        torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
    ],
    ids=["MemoryError", "cpu-allocator", "cuda"],
)
@pytest.mark.parametrize("command", ["translate", "evaluate"])
def test_running_out_of_memory_is_one_line_naming_what_to_lower_and_leaves_the_output_as_it_was(
    trained_run, tmp_path, monkeypatch, error, command
):
    """A process that ran out of memory printed a 187-line traceback."""
    from nmt.translation.inference import Inference

    def exhausted(self, lines, *args, **kwargs):
        raise error

    monkeypatch.setattr(Inference, "translate", exhausted)
    (tmp_path / "src.en").write_text("a dog .\n")
    (tmp_path / "ref.de").write_text("ein hund .\n")
    out = tmp_path / "hyp.de"
    out.write_text("kept\n")
    args = (
        ["-i", tmp_path / "src.en"]
        if command == "translate"
        else ["--src", tmp_path / "src.en", "--ref", tmp_path / "ref.de"]
    )
    result = invoke(command, "--checkpoint", trained_run, *args, "-o", out)
    line = _one_line_error(result)
    assert (
        result.exit_code == 2
        and line.startswith(f"error: nmt {command} ran out of memory (")
        and "lower --max-tokens" in line
    )
    assert out.read_text() == "kept\n" and sorted(p.name for p in tmp_path.iterdir()) == [
        "hyp.de",
        "ref.de",
        "src.en",
    ]


def test_other_runtime_errors_are_not_taken_for_running_out_of_memory():
    from nmt.runtime.device import out_of_memory

    assert out_of_memory(MemoryError()) and out_of_memory(
        torch.OutOfMemoryError("CUDA out of memory")
    )
    assert not out_of_memory(
        RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    ) and not out_of_memory(ValueError("out of memory"))


def test_export_ctranslate2_says_only_what_concerns_a_ctranslate2_user(trained_run, tmp_path):
    """`export --format ctranslate2` printed warnings about generate(), generation_config.json and
    MarianTokenizer (of the Marian directory it converts from, which it then removes) and a
    library's progress bars."""
    pytest.importorskip("ctranslate2")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "nmt",
            "export",
            str(tmp_path / "ct2"),
            "--checkpoint",
            str(trained_run),
            "--format",
            "ctranslate2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    said = proc.stdout + proc.stderr
    for foreign in (
        "generate()",
        "generation_config.json",
        "MarianTokenizer",
        "Writing model shards",
        "Loading weights",
        "it/s",
    ):
        assert foreign not in said, said
    hf = subprocess.run(
        [
            sys.executable,
            "-m",
            "nmt",
            "export",
            str(tmp_path / "hf"),
            "--checkpoint",
            str(trained_run),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    # the directory's own users are told
    assert (
        hf.returncode == 0
        and "MarianTokenizer" in hf.stderr
        and "Writing model shards" not in hf.stderr
    )


def _commands():
    """Every command of the app as (the words that run it, its Click command), plot's subcommands
    included."""
    import typer.main

    def walk(words, command):
        if hasattr(command, "commands"):
            for name, sub in command.commands.items():
                yield from walk([*words, name], sub)
        else:
            yield words, command

    return list(walk([], typer.main.get_command(app)))


def _options(repeatable: bool):
    """(words, option) for every option of every command that the command sees: repeatable
    (``multiple``) or not."""
    return [
        (words, p)
        for words, command in _commands()
        for p in command.params
        if p.param_type_name == "option" and p.multiple == repeatable
    ]


def _occurrence(draw, option):
    """One occurrence of ``option`` on a command line, in any spelling: --long VALUE, --long=VALUE,
    -s VALUE, -sVALUE, or a flag's names."""
    spelling = draw(st.sampled_from([*option.opts, *option.secondary_opts]))
    if option.is_flag:
        return [spelling]
    value = draw(
        st.text("abc~/._-0123456789", min_size=1, max_size=6).filter(
            lambda v: not v.startswith("-")
        )
    )
    if spelling.startswith("--"):
        return draw(st.sampled_from([[spelling, value], [f"{spelling}={value}"]]))
    return draw(st.sampled_from([[spelling, value], [spelling + value]]))


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_an_option_that_is_not_repeatable_given_twice_in_any_spelling_is_one_line_naming_it(data):
    """`nmt evaluate --hyp a --hyp b` scored b alone, silently; so did every option that takes one
    value, in every command."""
    words, option = data.draw(st.sampled_from(_options(repeatable=False)))
    times = data.draw(st.integers(2, 3))
    args = [arg for _ in range(times) for arg in _occurrence(data.draw, option)]
    spellings = "/".join(sorted(option.opts, key=len, reverse=True) + option.secondary_opts)
    count = "twice" if times == 2 else f"{times} times"
    line = _one_line_error(invoke(*words, *args))
    assert (
        line
        == f"error: option {spellings} is given {count}; it is not repeatable: give it once (see "
        f"root {' '.join(words)} --help)"
    )


@settings(max_examples=50, deadline=None)
@given(data=st.data())
def test_a_repeatable_option_given_twice_is_taken(data):
    words, option = data.draw(st.sampled_from(_options(repeatable=True)))
    args = [arg for _ in range(2) for arg in _occurrence(data.draw, option)]
    result = invoke(*words, *args, "--help")  # help, not the work: the command line was taken
    assert result.exit_code == 0 and result.output.startswith(f"Usage: root {' '.join(words)} "), (
        result.output
    )


def test_the_reported_repeated_hyp_is_refused_and_repeated_refs_are_scored(tmp_path):
    hyp, ref, other = tmp_path / "hyp.de", tmp_path / "ref.de", tmp_path / "other.de"
    hyp.write_text("der Hund sieht eine Katze .\n", encoding="utf-8")
    ref.write_text("der Hund sieht eine Katze .\n", encoding="utf-8")
    other.write_text("ein Hund sieht die Katze .\n", encoding="utf-8")
    line = _one_line_error(invoke("evaluate", "--hyp", other, "--hyp", hyp, "--ref", ref))
    assert (
        line == "error: option --hyp is given twice; it is not repeatable: give it once (see root "
        "evaluate --help)"
    )
    scored = invoke("evaluate", "--hyp", hyp, "--ref", other, "--ref", ref, "--json")
    assert scored.exit_code == 0 and json.loads(scored.stdout)["bleu"] == pytest.approx(100.0)
    assert len(_options(repeatable=False)) > 100 and {
        p.opts[0] for _, p in _options(repeatable=True)
    } == {"--ref", "--checkpoint", "--set", "--ban"}


@settings(max_examples=15, deadline=None)
@given(
    start=st.sampled_from(["~", "~USER", "~no_such_user_here", "./~"]),
    rest=st.sampled_from(["", "/", "/runs/x", "/a b/é.de"]),
    attached=st.booleans(),
)
def test_a_leading_tilde_in_every_path_of_every_command_is_the_home_directory(
    start, rest, attached
):
    """A shell leaves ~ as written in a quoted word and after --flag= (`--output=~/hyp.de`): every
    path a command takes, option or argument, expands it as the shell would have; text that is not a
    path (--host, --ban) is left as written."""
    import getpass
    import pwd
    from pathlib import Path

    start = start.replace("USER", getpass.getuser())
    given_path = start + rest
    home = {
        "~": "/home/of/a/user",
        f"~{getpass.getuser()}": pwd.getpwnam(getpass.getuser()).pw_dir,
    }.get(start)
    expected = Path(home + rest if home is not None else given_path)
    paths = 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", "/home/of/a/user")
        for words, command in _commands():
            for param in command.params:
                if getattr(param, "is_flag", False):
                    continue
                required = [p for p in command.params if p.required and p is not param]
                args = [
                    a for p in required if p.param_type_name == "option" for a in (p.opts[0], "req")
                ]
                args += ["req" for p in required if p.param_type_name == "argument"]
                if param.param_type_name == "argument":
                    args.append(given_path)
                else:
                    long = max(param.opts, key=len)
                    args += [f"{long}={given_path}"] if attached else [long, given_path]
                try:
                    value = command.make_context(words[-1], args).params[param.name]
                except Exception as exc:  # a number's option: not a path
                    assert type(exc).__name__ == "BadParameter", (words, param.name, exc)
                    continue
                values = value if isinstance(value, (list, tuple)) else [value]
                if isinstance(values[-1], Path):
                    paths += 1
                    assert values[-1] == expected, (words, param.name, values)
                else:
                    # text is not a path
                    assert values[-1] == given_path, (words, param.name, values)
    assert paths >= 35


def test_a_run_directory_under_home_written_with_a_tilde_is_under_home(tmp_path, monkeypatch):
    """`run_dir: ~/runs/x` in a config made ./~/runs/x and exited 0."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "taken").write_text("a file\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"data:\n  dir: {TOY}\ntrain:\n  run_dir: ~/taken\n")
    line = _one_line_error(invoke("train", "--config", config))
    assert (
        line == f"error: train.run_dir {tmp_path / 'home' / 'taken'} is a file; choose a directory"
    )
    line = _one_line_error(invoke("train", "--config", config, "--run-dir=~/taken"))
    assert line == f"error: --run-dir {tmp_path / 'home' / 'taken'} is a file; choose a directory"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.yaml", "home"]  # no ./~


def test_a_run_directory_written_with_a_variable_is_where_the_variable_says(tmp_path, monkeypatch):
    """`run_dir: $HOME/runs/r2` (and --set 'train.run_dir=${HOME}/...') trained into ./$HOME/runs,
    exit 0. A config's variables are expanded; --run-dir's path is as the shell left it (it has
    expanded the variables there), so a $ in it is the directory's own."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("NMT_TEST_UNSET", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "taken").write_text("a file\n")
    (tmp_path / "a$HOME").write_text("a file\n")
    config = tmp_path / "c.yaml"
    config.write_text(f"data:\n  dir: {TOY}\ntrain:\n  run_dir: $HOME/taken\n")
    taken = f"error: train.run_dir {tmp_path / 'home' / 'taken'} is a file; choose a directory"
    assert _one_line_error(invoke("train", "--config", config)) == taken
    assert _one_line_error(invoke("train", "--set", "train.run_dir=${HOME}/taken")) == taken
    line = _one_line_error(invoke("train", "--config", config, "--run-dir", tmp_path / "a$HOME"))
    assert line == f"error: --run-dir {tmp_path / 'a$HOME'} is a file; choose a directory"
    config.write_text(f"data:\n  dir: {TOY}\ntrain:\n  run_dir: $NMT_TEST_UNSET/r2\n")
    assert _one_line_error(invoke("train", "--config", config)) == (
        f"error: {config}:4: train.run_dir '$NMT_TEST_UNSET/r2' names $NMT_TEST_UNSET, which is "
        "not set; set it in the environment (export NMT_TEST_UNSET=...), or write $$NMT_TEST_UNSET "
        "for the text $NMT_TEST_UNSET"
    )
    # the braces as written: ${NAME} is named, and escaped, as ${NAME}
    line = _one_line_error(invoke("train", "--set", "train.run_dir=${NMT_TEST_UNSET}/r"))
    assert line.endswith(
        "names ${NMT_TEST_UNSET}, which is not set; set it in the environment (export "
        "NMT_TEST_UNSET=...), or write $${NMT_TEST_UNSET} for the text ${NMT_TEST_UNSET}"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a$HOME", "c.yaml", "home"]


def _warning_texts(path: Path) -> list[tuple[int, str | None]]:
    """Each ``X.warning(text, ...)`` call in ``path``: its line and the text's literal start (an
    f-string's placeholders as ``{}``), or None where the text is not written there."""
    import ast

    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        # log.warning(text, ...), and Capped's said(kind, text, ...) (nmt.errors.Capped)
        function = getattr(node, "func", None)
        place = {"warning": 0, "said": 1}.get(getattr(function, "attr", ""), -1)
        if not (isinstance(node, ast.Call) and 0 <= place < len(node.args)):
            continue
        text = node.args[place]
        if isinstance(text, ast.JoinedStr):
            parts = [v.value if isinstance(v, ast.Constant) else "{}" for v in text.values]
            found.append((node.lineno, "".join(parts)))
        elif isinstance(text, ast.Constant) and isinstance(text.value, str):
            found.append((node.lineno, text.value))
        else:
            found.append((node.lineno, None))
    return found


def test_every_warning_nmt_logs_says_it_is_one():
    """A warning reads ``warning: ...`` wherever it lands (a terminal, a log file, a library
    user's handler): the text is written in the call, never built elsewhere where it could lose
    the word."""
    package = Path(__file__).resolve().parents[1] / "nmt"
    calls = {
        f"{p.relative_to(package)}:{line}": text
        for p in package.rglob("*.py")
        for line, text in _warning_texts(p)
    }
    assert len(calls) > 40  # the scan finds them
    wrong = {k: t for k, t in calls.items() if not (t or "").startswith("warning: ")}
    # Capped (nmt.errors) logs what its callers wrote, each checked at its said(kind, text) call
    assert len([k for k in wrong if k.startswith("errors.py:")]) == 2
    assert {k: t for k, t in wrong.items() if not k.startswith("errors.py:")} == {}


def test_a_long_command_says_it_is_still_working_and_a_short_one_says_nothing(capsys):
    import time

    from nmt.cli.commands.options import still_working

    with still_working("nmt export", at=(0.3, 0.6)):
        time.sleep(1.45)  # said at 0.3, 0.6 and 1.2 s: each wait then at[-1] more
    said = capsys.readouterr().err.splitlines()
    # at least the first two (a busy machine may delay the thread past the third)
    assert 2 <= len(said) <= 3 and all(
        re.fullmatch(r"nmt export: still working, \d+ s", s) for s in said
    )
    with still_working("nmt export", at=(0.5,)):
        pass
    time.sleep(0.7)  # the block ended: its thread has ended, and says nothing later
    assert capsys.readouterr().err == ""
