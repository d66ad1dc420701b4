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
    *(
        "--set",
        "train.max_steps=12",
        "--set",
        "train.save_every=2",
        "--set",
        "train.validate_every=6",
        "--set",
        "train.log_every=4",
    ),
    *(
        "--set",
        "train.valid_beam_size=1",
        "--set",
        "train.threads=1",
        "--set",
        "train.progress_bar=false",
        "--set",
        "train.keep_last=5",
    ),
]


def data_dir(tmp_path, lines: dict[str, int]):
    """The toy corpus's first ``lines[split]`` pairs of each split, as {split}.{en,de} (valid and
    test gzipped: either name is found)."""
    import gzip

    data = tmp_path / "data"
    data.mkdir(parents=True)
    for split, n in lines.items():
        for lang in ("en", "de"):
            text = "".join(
                (TOY / f"{split}.{lang}").read_text(encoding="utf-8").splitlines(True)[:n]
            )
            if split == "train":
                (data / f"{split}.{lang}").write_text(text, encoding="utf-8")
            else:
                (data / f"{split}.{lang}.gz").write_bytes(gzip.compress(text.encode("utf-8")))
    return data


def run_recipe(tmp_path, data, tests: str, *extra: str):
    """Run the script with a logging `nmt` first on PATH; returns (process, the nmt command lines in
    order)."""
    shim, log = tmp_path / "bin", tmp_path / "nmt_calls.log"
    shim.mkdir(exist_ok=True)
    log.unlink(missing_ok=True)
    (shim / "nmt").write_text(
        f'#!/bin/sh\necho "$*" >> {log}\nexec {sys.executable} -m nmt "$@"\n', encoding="utf-8"
    )
    (shim / "nmt").chmod(0o755)
    env = {
        **os.environ,
        "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}",
        "PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
        "OMP_NUM_THREADS": "1",
    }
    args = [
        "bash",
        str(SCRIPT),
        str(ROOT / "configs" / "toy.yaml"),
        str(tmp_path / "run"),
        tests,
        "--set",
        f"data.dir={data}",
        *TINY,
        *extra,
    ]
    proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path)
    return proc, (log.read_text(encoding="utf-8").splitlines() if log.exists() else [])


@pytest.mark.slow
def test_the_recipe_chooses_on_validation_and_reads_the_test_split_only_at_the_end(tmp_path):
    data = data_dir(tmp_path, {"train": 600, "valid": 12, "test": 10})
    # explicit validation files win over data.dir's valid split, in training as in tuning
    for lang in ("en", "de"):
        (data / f"dev.{lang}").write_text(
            "".join((TOY / f"valid.{lang}").read_text(encoding="utf-8").splitlines(True)[20:32]),
            encoding="utf-8",
        )
    proc, calls = run_recipe(
        tmp_path,
        data,
        "test",
        "--set",
        f"data.valid_src={data / 'dev.en'}",
        "--set",
        f"data.valid_tgt={data / 'dev.de'}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    run = tmp_path / "run"

    # The commands, in order; the test split appears in the last one only.
    assert [c.split()[0] for c in calls] == [
        "train",
        "average",
        "tune-decode",
        "tune-decode",
        "evaluate",
    ]
    assert (
        all("test." not in c for c in calls[:-1])
        and "test.en.gz" in calls[-1]
        and "test.de.gz" in calls[-1]
    )
    assert all(f"--src {data / 'dev.en'} --ref {data / 'dev.de'}" in c for c in calls[2:4])

    # The choice is the highest validation BLEU over both checkpoints, every α and both stopping
    # rules.
    rows = [
        (r["bleu"], name, r["length_penalty"], r["patience"] or 0)
        for name in ("best", "average")
        for r in json.loads((run / f"tune_{name}.json").read_text())["rows"]
    ]
    assert len(rows) == 12
    _, name, alpha, patience = max(rows, key=lambda r: r[0])
    rule = f"patience {patience}" if patience else "the exact stop"
    assert (run / "choice.txt").read_text(
        encoding="utf-8"
    ).strip() == f"chosen on valid: {name}.pt, length normalisation 'length', α {alpha}, {rule}"
    assert f"--checkpoint {run}/{name}.pt" in calls[-1] and f"--length-penalty {alpha}" in calls[-1]
    assert f"--patience {patience}" in calls[-1]

    # The test score is sacreBLEU's on the translations written beside it.
    hyps = (run / "test.hyp.de").read_text(encoding="utf-8").splitlines()
    refs = (TOY / "test.de").read_text(encoding="utf-8").splitlines()[:10]
    assert len(hyps) == 10
    result = json.loads((run / "test.json").read_text())
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)

    # The header's way out of a last step that fails: fix the file and rerun with --resume. The
    # finished training is not repeated, and the failed step leaves the earlier result as it was.
    import gzip

    valid_args = (
        "--set",
        f"data.valid_src={data / 'dev.en'}",
        "--set",
        f"data.valid_tgt={data / 'dev.de'}",
    )
    good_ref, last = (data / "test.de.gz").read_bytes(), (run / "last.pt").read_bytes()
    (data / "test.de.gz").write_bytes(gzip.compress("".join(f"{r}\n" for r in refs[:7]).encode()))
    proc, calls = run_recipe(tmp_path, data, "test", *valid_args, "--resume")
    assert proc.returncode != 0 and [c.split()[0] for c in calls] == [
        "train",
        "average",
        "tune-decode",
        "tune-decode",
        "evaluate",
    ]
    assert (
        "test.de.gz" in proc.stderr
        and json.loads((run / "test.json").read_text()) == result
        and not (run / "test.json.tmp").exists()
    )
    (data / "test.de.gz").write_bytes(good_ref)
    proc, calls = run_recipe(tmp_path, data, "test", *valid_args, "--resume")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "nothing left to do" in proc.stderr and (run / "last.pt").read_bytes() == last
    assert json.loads((run / "test.json").read_text()) == result


@pytest.mark.parametrize(
    "tests, extra, message",
    [
        (
            "test",
            (),
            "the test split 'test' has no test.{en,de}[.gz] files in DATA; the test splits are the "
            "script's third argument",
        ),
        (
            "valid",
            (),
            "the test split 'valid' is the validation split, which the recipe tunes on; name "
            "another",
        ),
        (
            "other",
            ("--set", "train.save_every=0"),
            "the recipe averages the last 5 step checkpoints; set train.save_every > 0 (it is 0) "
            "and train.keep_last >= 5 (it is 5)",
        ),
        (
            "other",
            ("--set", "train.keep_last=4"),
            "the recipe averages the last 5 step checkpoints; set train.save_every > 0 (it is 2) "
            "and train.keep_last >= 5 (it is 4)",
        ),
        (
            "other",
            ("--set", "data.dir=null"),
            "the recipe tunes on validation files: set data.dir (with data.valid_split) or "
            "data.valid_src and data.valid_tgt",
        ),
        (
            "other",
            ("--set", "data.valid_split=newstest2013"),
            "data.valid_split newstest2013 names test data: choosing checkpoints on it overstates "
            "its score; validate on a validation split "
            "(e.g. val), or set data.allow_test_names=true if it is one named like a test set",
        ),
        (
            "other",
            ("--set", "data.valid_split=newstest2013", "--set", "data.allow_test_names=true"),
            "the validation file DATA/newstest2013.en.gz's name says test data, which tune-decode "
            "refuses to tune on; "
            "if it is a validation set, give it a name without 'test'",
        ),
        # The last of `--set k=v` and `--set=k=v` wins, as in nmt train: here a directory without
        # the test split.
        (
            "other",
            ("--set=data.dir=EMPTY",),
            "the test split 'other' has no other.{en,de}[.gz] files in EMPTY; the test splits are "
            "the script's third argument",
        ),
    ],
)
def test_what_the_recipe_cannot_run_fails_before_any_training_in_one_line(
    tmp_path, tests, extra, message
):
    data = data_dir(tmp_path, {"train": 50, "valid": 5, "test": 5})
    # the test split here is called "other"; a copy of valid is named like WMT's validation sets
    for lang in ("en", "de"):
        (data / f"test.{lang}.gz").rename(data / f"other.{lang}.gz")
        (data / f"newstest2013.{lang}.gz").write_bytes((data / f"valid.{lang}.gz").read_bytes())
    empty = data_dir(tmp_path / "e", {"train": 50, "valid": 5})
    extra = tuple(a.replace("EMPTY", str(empty)) for a in extra)
    proc, calls = run_recipe(tmp_path, data, tests, *extra)
    assert proc.returncode != 0 and calls == []
    assert proc.stderr.strip() == "error: " + message.replace("DATA", str(data)).replace(
        "EMPTY", str(empty)
    )
    assert not (tmp_path / "run").exists()
