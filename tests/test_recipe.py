"""scripts/train_recipe.sh (the recipe behind scripts/train_multi30k.sh): train, average, choose
on the validation split, then score the test splits, and only then read them."""

import json
import os
import subprocess
import sys

import pytest
import sacrebleu
from conftest import ROOT, TOY

SCRIPT = ROOT / "scripts" / "train_recipe.sh"
TINY = [
    *("--set", "model.d_model=32", "--set", "model.d_ff=64", "--set", "tokenizer.vocab_size=200"),
    *("--set", "train.max_steps=12", "--set", "train.save_every=2", "--set", "train.validate_every=6", "--set", "train.log_every=4"),
    *("--set", "train.valid_beam_size=1", "--set", "train.threads=1", "--set", "train.progress_bar=false"),
]


def data_dir(tmp_path, lines: dict[str, int]):
    """The toy corpus's first ``lines[split]`` pairs of each split, as {split}.{en,de} (valid and test gzipped: either name is found)."""
    import gzip

    data = tmp_path / "data"
    data.mkdir()
    for split, n in lines.items():
        for lang in ("en", "de"):
            text = "".join((TOY / f"{split}.{lang}").read_text(encoding="utf-8").splitlines(True)[:n])
            if split == "train":
                (data / f"{split}.{lang}").write_text(text, encoding="utf-8")
            else:
                (data / f"{split}.{lang}.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    return data


def run_recipe(tmp_path, data, tests: str):
    """Run the script with a logging `nmt` first on PATH; returns (process, the nmt command lines in order)."""
    shim, log = tmp_path / "bin", tmp_path / "nmt_calls.log"
    shim.mkdir()
    (shim / "nmt").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {sys.executable} -m nmt "$@"\n', encoding="utf-8")
    (shim / "nmt").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = ["bash", str(SCRIPT), str(ROOT / "configs" / "toy.yaml"), str(tmp_path / "run"), tests, "--set", f"data.dir={data}", *TINY]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    return proc, (log.read_text(encoding="utf-8").splitlines() if log.exists() else [])


@pytest.mark.slow
def test_the_recipe_chooses_on_validation_and_reads_the_test_split_only_at_the_end(tmp_path):
    data = data_dir(tmp_path, {"train": 600, "valid": 12, "test": 10})
    proc, calls = run_recipe(tmp_path, data, "test")
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"

    # The commands, in order; the test split appears in the last one only.
    assert [c.split()[0] for c in calls] == ["train", "average", "tune-decode", "tune-decode", "evaluate"]
    assert all("test." not in c for c in calls[:-1]) and "test.en.gz" in calls[-1] and "test.de.gz" in calls[-1]
    assert all("valid.en.gz" in c for c in calls[2:4])

    # The choice is the highest validation BLEU over both checkpoints and every α.
    rows = [(r["bleu"], name, r["length_penalty"]) for name in ("best", "average") for r in json.loads((run / f"tune_{name}.json").read_text())["rows"]]
    assert len(rows) == 6
    _, name, alpha = max(rows, key=lambda r: r[0])
    assert (run / "choice.txt").read_text(encoding="utf-8").strip() == f"chosen on valid: {name}.pt, length normalisation 'length', α {alpha}"
    assert f"--checkpoint {run}/{name}.pt" in calls[-1] and f"--length-penalty {alpha}" in calls[-1]

    # The test score is sacreBLEU's on the translations written beside it.
    hyps = (run / "test.hyp.de").read_text(encoding="utf-8").splitlines()
    refs = (TOY / "test.de").read_text(encoding="utf-8").splitlines()[:10]
    assert len(hyps) == 10
    result = json.loads((run / "test.json").read_text())
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)


def test_a_missing_test_split_fails_before_any_training(tmp_path):
    data = data_dir(tmp_path, {"train": 50, "valid": 5})
    proc, calls = run_recipe(tmp_path, data, "test")
    assert proc.returncode != 0 and calls == []
    assert "neither test.en nor test.en.gz exists" in proc.stderr and str(data) in proc.stderr
    assert not (tmp_path / "run").exists()
