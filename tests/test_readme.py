"""Every command the README shows runs as written, in a fresh copy of the repository.

The commands are read from the README itself: the `nmt` parts of the quick-start block and
every line of the "Commands" block. Placeholders (RUN, CONFIG, test.en, HF_DIR, ...) become
small files, optional `[...]` parts are kept, and each `nmt train` gets tiny settings
appended (a later `--set` wins), so that the whole list runs in a couple of minutes.
"""

import os
import re
import shutil
import subprocess
import sys

import pytest
from conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")
# Tiny settings: model and tokenizer for fresh runs only (a resume refuses to change them).
TINY_MODEL = "--set model.d_model=32 --set model.d_ff=64 --set tokenizer.vocab_size=200"
TINY_TRAIN = (
    "--set train.log_every=2 --set data.valid_max_sentences=8 --set "
    "train.valid_beam_size=1 --set train.threads=1 --set train.save_every=2"
)


def bash_blocks(heading: str) -> list[str]:
    """The lines of the first ```bash block after ``heading`` (comments and blank lines dropped)."""
    section = README[README.index(heading) :]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    lines = [
        line.split("  #")[0].split("# ")[0].strip() if not line.lstrip().startswith("#") else ""
        for line in block.splitlines()
    ]
    return [line for line in lines if line]


def quick_start_commands() -> list[str]:
    return [
        part.strip()
        for line in bash_blocks("# nmt")
        for part in line.split("&&")
        if part.strip().startswith("nmt ")
    ]


def command_list() -> list[str]:
    return bash_blocks("## Commands")


def runnable(command: str, python: str, steps: int) -> str:
    """``command`` as bash runs it here: `nmt` from this checkout, brackets opened, tiny
    training."""
    command = re.sub(r"\[([^\]]*)\]", r"\1", command)
    command = re.sub(r"--nproc_per_node \d+", "--nproc_per_node 2", command)  # 2 cores here
    if command.startswith("torchrun"):
        command = command.replace("torchrun", f"{python} -m torch.distributed.run", 1)
    else:
        command = re.sub(r"^nmt(?=\s)", f"{python} -m nmt", command)
    if " nmt train" in command:
        command += f" {TINY_TRAIN} --set train.max_steps={steps}" + (
            "" if "--resume" in command else f" {TINY_MODEL}"
        )
    return command


def fresh_copy(tmp_path):
    """The repository's tracked files, as a clone would have them."""
    files = (
        subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
        .stdout.decode()
        .split("\0")
    )
    copy = tmp_path / "repo"
    for name in filter(None, files):
        if (ROOT / name).is_file():
            (copy / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, copy / name)
    return copy


def run_all(commands: list[str], cwd, replacements: dict[str, str]) -> list[str]:
    """Run ``commands`` in order in ``cwd`` with placeholders replaced; fail on the first that
    fails."""
    env = {**os.environ, "PYTHONPATH": str(cwd), "OMP_NUM_THREADS": "1"}
    done, steps = [], 4
    for command in commands:
        for placeholder, value in replacements.items():
            command = re.sub(rf"(?<![\w./-]){re.escape(placeholder)}(?![\w-])", value, command)
        line = runnable(command, sys.executable, steps)
        result = subprocess.run(
            ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
        )
        assert result.returncode == 0, (
            f"README command failed: {command}\nran: {line}\n{result.stderr[-3000:]}"
        )
        done.append(command)
        steps += 2 * (" nmt train" in line)  # a --resume continues past the previous run
    return done


def test_readme_command_lists_are_found():
    commands = command_list()
    assert len(commands) >= 10 and all(c.startswith(("nmt ", "torchrun ")) for c in commands)
    assert any("--resume" in c for c in commands) and any(
        "--format ctranslate2" in c for c in commands
    )
    assert quick_start_commands()[0].startswith("nmt train -c configs/toy.yaml")


@pytest.mark.slow
def test_quick_start_runs_as_written(tmp_path):
    repo = fresh_copy(tmp_path)
    assert len(run_all(quick_start_commands(), repo, {})) == 2
    assert (repo / "runs" / "toy" / "best.pt").is_file()


@pytest.mark.slow
def test_every_readme_command_runs_as_written(tmp_path):
    pytest.importorskip("transformers")
    pytest.importorskip("ctranslate2")
    repo = fresh_copy(tmp_path)
    data = tmp_path / "data"
    (data / "multi30k").mkdir(parents=True)
    toy = repo / "data" / "toy"
    for lang in (
        "en",
        "de",
        "fr",
        # Multi30k's file names (its validation split is "val"), toy text; "French" is the English
        # in capitals
    ):
        text = {
            split: (toy / f"{split}.{'en' if lang == 'fr' else lang}").read_text(encoding="utf-8")
            for split in ("train", "valid", "test")
        }
        text = {split: lines.upper() if lang == "fr" else lines for split, lines in text.items()}
        (data / "multi30k" / f"train.{lang}").write_text(
            "".join(text["train"].splitlines(True)[:2000]), encoding="utf-8"
        )
        # tune-decode's input
        (data / "multi30k" / f"val.{lang}").write_text(
            "".join(text["valid"].splitlines(True)[:40]), encoding="utf-8"
        )
        (data / f"test.{lang}").write_text(
            "".join(text["test"].splitlines(True)[:20]), encoding="utf-8"
        )
    (data / "test2.de").write_text((data / "test.de").read_text(encoding="utf-8"), encoding="utf-8")
    (data / "test.ja").write_text("犬が猫を見る。\n私は毎朝紅茶を飲みます。\n", encoding="utf-8")
    (tmp_path / "hyp.ja").write_text(
        "犬が猫を見た。\n私は毎朝コーヒーを飲みます。\n", encoding="utf-8"
    )
    (data / "prefix.de").write_text("der \n" + "\n" * 19, encoding="utf-8")
    (data / "terms.de").write_text("Hund\tKatze\n" + "\n" * 19, encoding="utf-8")
    run = tmp_path / "run"
    replacements = {
        "PATH/multi30k": str(data / "multi30k"),
        "RUN": str(run),
        "CONFIG": "configs/toy.yaml",
        "test.en": str(data / "test.en"),
        "test.de": str(data / "test.de"),
        "test.fr": str(data / "test.fr"),
        "MULTI": str(tmp_path / "multi"),
        "val.en": str(data / "multi30k" / "val.en"),
        "val.de": str(data / "multi30k" / "val.de"),
        "train.en": str(data / "multi30k" / "train.en"),
        "train.de": str(data / "multi30k" / "train.de"),
        "shortlist.txt": str(tmp_path / "shortlist.txt"),
        "test2.de": str(data / "test2.de"),
        "hyp.de": str(tmp_path / "hyp.de"),
        "test.ja": str(data / "test.ja"),
        "hyp.ja": str(tmp_path / "hyp.ja"),
        "prefix.de": str(data / "prefix.de"),
        "terms.de": str(data / "terms.de"),
        "HF_DIR": str(tmp_path / "hf"),
        "CT2_DIR": str(tmp_path / "ct2"),
        "model.pt": str(tmp_path / "model.pt"),
        "avg.pt": str(tmp_path / "avg.pt"),
    }
    assert len(run_all(command_list(), repo, replacements)) == len(command_list())
    assert (tmp_path / "hyp.de").read_text(encoding="utf-8").count("\n") == 20
    assert (
        (run / "avg5.pt").is_file()
        and (run / "metrics.png").is_file()
        and (tmp_path / "ct2" / "model.bin").is_file()
    )
    assert (repo / "runs" / "toy" / "last.pt").is_file()  # the torchrun line, with CONFIG's run_dir
