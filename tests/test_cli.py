import json
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from nmt.cli import app

from conftest import ROOT, TOY

runner = CliRunner()


def invoke(*args, input=None):
    return runner.invoke(app, [str(a) for a in args], input=input)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory):
    """A few steps on the shipped corpus with the shipped config, shrunk for speed."""
    run = tmp_path_factory.mktemp("cli") / "run"
    result = invoke(
        "train", "--config", ROOT / "configs" / "toy.yaml", "--run-dir", run,
        "--set", f"data.dir={TOY}", "--set", "train.max_steps=4", "--set", "train.log_every=2",
        "--set", "model.d_model=32", "--set", "model.d_ff=64", "--set", "tokenizer.vocab_size=200",
        "--set", "data.valid_max_sentences=10", "--set", "train.valid_beam_size=1", "--set", "train.threads=1",
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["step"] == 4
    return run


def test_run_directory_contents(trained_run):
    names = {p.name for p in trained_run.iterdir()}
    assert {"best.pt", "last.pt", "config.yaml", "spm.model", "metrics.jsonl", "cache", "tensorboard"} <= names
    records = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "loss" in r] == [2, 4] and [r["step"] for r in records if "bleu" in r] == [4]


def test_translate_keeps_one_line_per_input_line(trained_run, tmp_path):
    src = tmp_path / "in.en"
    src.write_text("the dog sees a cat .\n\n   \nthe big man likes the small house .\n", encoding="utf-8")
    out = tmp_path / "out.de"
    result = invoke("translate", "--checkpoint", trained_run / "best.pt", "-i", src, "-o", out, "--beam-size", "3", "--max-len-b", "5")
    assert result.exit_code == 0, result.output
    lines = out.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 5 and lines[-1] == ""  # 4 lines, each newline-terminated
    assert lines[1] == "" and lines[2] == ""
    piped = invoke("translate", "--checkpoint", trained_run, "--beam-size", "3", "--max-len-b", "5", input=src.read_text())
    assert piped.exit_code == 0
    assert piped.stdout == out.read_text(encoding="utf-8")


def test_translate_n_best_format(trained_run):
    result = invoke("translate", "--checkpoint", trained_run / "last.pt", "--beam-size", "3", "--n-best", "2", "--max-len-b", "4", input="a dog .\nthe cat .\n")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert [line.split(" ||| ")[0] for line in lines] == ["0", "0", "1", "1"]
    blank = invoke("translate", "--checkpoint", trained_run, "--beam-size", "2", "--n-best", "2", "--max-len-b", "3", input="a dog .\n\nthe cat .\n")
    assert [line.split(" ||| ")[0] for line in blank.stdout.splitlines()] == ["0", "0", "1", "2", "2"]
    scores = [float(line.split(" ||| ")[2]) for line in lines[:2]]
    assert scores[0] >= scores[1]


def test_evaluate_hyp_and_checkpoint(trained_run, tmp_path):
    ref = tmp_path / "ref.de"
    ref.write_text("der Hund sieht eine Katze .\ndie Frau mag das Haus .\n", encoding="utf-8")
    result = invoke("evaluate", "--hyp", ref, "--ref", ref, "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["bleu"] == 100.0
    src = tmp_path / "src.en"
    src.write_text("the dog sees a cat .\nthe woman likes the house .\n", encoding="utf-8")
    hyp = tmp_path / "hyp.de"
    result = invoke("evaluate", "--checkpoint", trained_run, "--src", src, "--ref", ref, "--json", "--output", hyp, "--beam-size", "2")
    assert result.exit_code == 0, result.output
    scored = json.loads(result.stdout)
    rescored = json.loads(invoke("evaluate", "--hyp", hyp, "--ref", ref, "--json").stdout)
    assert scored["bleu"] == rescored["bleu"] and scored["sentences"] == 2


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
    assert result.exit_code == 2 and "short.de has 1 lines but there are 2 hypotheses" in result.output
    result = invoke("translate", "--checkpoint", trained_run, input="fine\nsecond\ncaf\xe9\n".encode("latin-1"))
    assert result.exit_code == 2 and "<stdin>:3: invalid UTF-8" in result.output
    result = invoke("translate", "--checkpoint", trained_run, "-o", tmp_path / "no" / "such" / "dir.de", input="x\n")
    assert result.exit_code == 2 and "does not exist; create it first" in result.output
    result = invoke("translate", "--checkpoint", trained_run, "--beam-size", "0", input="x\n")
    assert result.exit_code == 2 and "--beam-size must be at least 1" in result.output
    result = invoke("translate", "--checkpoint", tmp_path / "missing.pt", input="x\n")
    assert result.exit_code == 2 and "missing.pt not found" in result.output
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    result = invoke("translate", "--checkpoint", garbage, input="x\n")
    assert result.exit_code == 2 and "not a readable nmt checkpoint" in result.output


def test_train_rejects_misaligned_corpus(tmp_path):
    data = tmp_path / "d"
    data.mkdir()
    (data / "train.en").write_text("a\nb\nc\n")
    (data / "train.de").write_text("a\nb\n")
    (data / "valid.en").write_text("a\n")
    (data / "valid.de").write_text("a\n")
    result = invoke("train", "--run-dir", tmp_path / "r", "--set", f"data.dir={data}")
    assert result.exit_code == 2
    assert "train.en has 3 lines but" in result.output and "train.de has 2" in result.output
    assert not (tmp_path / "r").exists()  # a refused run leaves no directory behind
    result = invoke("train", "--run-dir", tmp_path / "r2", "--set", f"data.dir={tmp_path / 'nowhere'}")
    assert result.exit_code == 2 and "neither train.en nor train.en.gz" in result.output and not (tmp_path / "r2").exists()
    result = invoke("train", "--run-dir", tmp_path / "r", "--set", "train.max_stepz=3")
    assert result.exit_code == 2 and "unknown key(s) in [train]: max_stepz" in result.output


def test_module_entry_point_help():
    env = {**os.environ, "COLUMNS": "300", "NO_COLOR": "1"}
    result = subprocess.run([sys.executable, "-m", "nmt", "translate", "--help"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert result.returncode == 0
    assert "--beam-size" in result.stdout and "padding included" in result.stdout


def test_export_command(trained_run, tmp_path):
    pytest.importorskip("transformers")
    result = invoke("export", tmp_path / "hf", "--checkpoint", trained_run)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "hf" / "config.json").is_file() and (tmp_path / "hf" / "source.spm").is_file()
    result = invoke("export", tmp_path / "x", "--checkpoint", trained_run, "--format", "onnx")
    assert result.exit_code == 2 and "not supported" in result.output


def test_plot_writes_a_png(trained_run, tmp_path):
    result = invoke("plot", trained_run, "--out", tmp_path / "m.png")
    assert result.exit_code == 0, result.output
    data = (tmp_path / "m.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    result = invoke("plot", tmp_path)
    assert result.exit_code == 2 and "metrics.jsonl: not found" in result.output


def test_average_command(trained_run, tmp_path):
    result = invoke("average", trained_run / "last.pt", trained_run / "best.pt", "--out", tmp_path / "avg.pt")
    assert result.exit_code == 0, result.output
    result = invoke("translate", "--checkpoint", tmp_path / "avg.pt", "--beam-size", "2", "--max-len-b", "3", input="a dog .\n")
    assert result.exit_code == 0 and len(result.stdout.splitlines()) == 1


def test_translate_in_bfloat16(trained_run):
    text = "the dog sees a cat .\n\nthe big man likes the small house .\n"
    fp32 = invoke("translate", "--checkpoint", trained_run, "--beam-size", "2", "--max-len-b", "4", input=text)
    bf16 = invoke("translate", "--checkpoint", trained_run, "--beam-size", "2", "--max-len-b", "4", "--dtype", "bfloat16", input=text)
    assert bf16.exit_code == 0, bf16.output
    assert len(bf16.stdout.split("\n")) == len(fp32.stdout.split("\n")) == 4 and bf16.stdout.split("\n")[1] == ""
    bad = invoke("translate", "--checkpoint", trained_run, "--dtype", "int3", input=text)
    assert bad.exit_code == 2 and "--dtype must be" in bad.output


def test_the_cli_module_loads_without_torch():
    """Encoding workers are spawned and re-import the `nmt` script's module: it must not pull in torch (200 MB each)."""
    import subprocess
    import sys

    code = "import sys, nmt.cli, nmt.corpus; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_help_shows_flags_as_flags():
    """A flag takes no value, so help must not print a type after it (`--resume <bool>` invites `--resume true`)."""
    for command in ["train", "translate", "evaluate", "average", "plot", "export"]:
        result = invoke(command, "--help")
        assert result.exit_code == 0, result.output
        assert "<bool>" not in result.output and "BOOLEAN" not in result.output
    lines = invoke("train", "--help").output.splitlines()
    assert any(line.split() == ["--resume", "Continue", *line.split()[2:]] for line in lines)
    assert "--beam-size <int>" in invoke("translate", "--help").output  # options that take values keep their type
