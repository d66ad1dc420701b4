"""Two Gloo processes on the CPU. Each run is under a timeout, so a hang fails instead of
blocking."""

import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch
from test_train import small_corpus

from nmt.config import TokenizerConfig
from nmt.data.corpus import read_parallel
from nmt.data.tokenizer import train_tokenizer
from nmt.runs.checkpoint import load_checkpoint

pytestmark = pytest.mark.slow
HANG = 240  # seconds: far beyond what these runs need, short enough to fail a hang


def common_args(data, tokenizer_model, **changes):
    settings = {
        "data.dir": data,
        "tokenizer.model": tokenizer_model,
        "model.d_model": 32,
        "model.d_ff": 64,
        "model.n_heads": 4,
        "model.n_encoder_layers": 1,
        "model.n_decoder_layers": 1,
        # dropout draws differ between 1 and 2 processes; the arithmetic must not
        "model.dropout": 0.0,
        "train.max_steps": 3,
        "train.max_tokens": 300,
        "train.warmup_steps": 2,
        "train.validate_every": 1000,
        "train.valid_beam_size": 1,
        "train.threads": 1,
        "train.log_every": 1,
        "train.progress_bar": False,
        "train.tensorboard": False,
        "decode.max_len_a": 0.0,
        "decode.max_len_b": 2,
        "data.workers": 1,
    }
    settings.update(changes)
    return [arg for key, value in settings.items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture
def corpus(tmp_path):
    data = small_corpus(tmp_path)
    src, tgt = read_parallel(data / "train.en", data / "train.de")
    (tmp_path / "spm.model").write_bytes(
        train_tokenizer(src, tgt, TokenizerConfig(vocab_size=120)).protos()["joint"]
    )
    return data, tmp_path / "spm.model"


def launch(run_dir, args, world=2, resume=False):
    """``world`` processes of one job, started as torchrun starts them (env:// rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world),
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
        }
        cmd = [
            sys.executable,
            "-m",
            "nmt",
            "train",
            "--run-dir",
            str(run_dir),
            *args,
            *(["--resume"] if resume else []),
        ]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    return procs


def wait(procs, timeout=HANG):
    """(returncode, stderr) of each process; all are killed and the test fails if any hangs."""
    deadline, results = time.time() + timeout, []
    try:
        for p in procs:
            _, err = p.communicate(timeout=max(1, deadline - time.time()))
            results.append((p.returncode, err))
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"a process hung for {timeout} s")
    return results


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


LOSSES = {
    "eager": {},
    "compiled": {"train.compile_loss": "true"},
    # the output matrix's gradient comes from outside the forward pass DDP wraps
    "chunks": {"train.loss_chunk_tokens": "7"},
}


@pytest.mark.parametrize("loss", list(LOSSES))
def test_two_gloo_processes_equal_one_process_with_update_freq_2(tmp_path, corpus, loss):
    """Also with the loss's passes compiled (train.compile_loss), and with the loss in chunks
    (train.loss_chunk_tokens), in every process."""
    args = common_args(*corpus, **LOSSES[loss])
    env_cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node=2",
        "-m",
        "nmt",
        "train",
    ]
    two = subprocess.run(
        [*env_cmd, "--run-dir", str(tmp_path / "ddp"), *args],
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert two.returncode == 0, two.stderr[-3000:]
    one = subprocess.run(
        [
            sys.executable,
            "-m",
            "nmt",
            "train",
            "--run-dir",
            str(tmp_path / "single"),
            "--set",
            "train.update_freq=2",
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert one.returncode == 0, one.stderr[-3000:]
    assert "compiling the loss failed" not in two.stderr + one.stderr
    a, b = (
        load_checkpoint(tmp_path / "ddp" / "last.pt").payload,
        load_checkpoint(tmp_path / "single" / "last.pt").payload,
    )
    assert a["progress"]["step"] == b["progress"]["step"] == 3
    # Same updates, different summation order: equal to float32 rounding (atol 1e-5).
    for name, tensor in a["model"].items():
        torch.testing.assert_close(tensor, b["model"][name], atol=1e-5, rtol=0, msg=name)


def test_run_ending_on_a_validation_step_ends_on_every_rank(tmp_path, corpus):
    run = tmp_path / "run"
    results = wait(
        launch(run, common_args(*corpus, **{"train.max_steps": 4, "train.validate_every": 2}))
    )
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    validations = [r["step"] for r in records(run) if "bleu" in r]
    assert validations == [2, 4]  # the final step was validated once, not again at the end
    assert load_checkpoint(run / "last.pt").payload["progress"]["step"] == 4


def test_time_limit_stops_every_rank_at_the_same_step(tmp_path, corpus):
    run = tmp_path / "run"
    results = wait(
        launch(run, common_args(*corpus, **{"train.max_steps": 100000, "train.max_time_s": 3}))
    )
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    last = load_checkpoint(run / "last.pt").payload
    assert 0 < last["progress"]["step"] < 100000
    # validated once, at the end
    assert [r["step"] for r in records(run) if "bleu" in r] == [last["progress"]["step"]]


def test_max_epochs_stops_every_rank_and_says_epochs(tmp_path, corpus):
    run = tmp_path / "run"
    results = wait(
        launch(run, common_args(*corpus, **{"train.max_steps": 100000, "train.max_epochs": 1}))
    )
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    progress = load_checkpoint(run / "last.pt").payload["progress"]
    assert (progress["epoch"], progress["batch_in_epoch"]) == (1, 0) and 0 < progress[
        "step"
    ] < 100000
    assert ["done (epochs)" in err for _, err in results] == [True, False]  # said once, by rank 0


def test_patience_stops_every_rank(tmp_path, corpus):
    run = tmp_path / "run"
    # lr 0: BLEU cannot change, so after the first validation every one is "no improvement".
    results = wait(
        launch(
            run,
            common_args(
                *corpus,
                **{
                    "train.max_steps": 50,
                    "train.lr_scale": 0.0,
                    "train.validate_every": 1,
                    "train.patience": 2,
                },
            ),
        )
    )
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:]
    progress = load_checkpoint(run / "last.pt").payload["progress"]
    assert (progress["step"], progress["bad_validations"]) == (3, 2)
    assert [r["step"] for r in records(run) if "bleu" in r] == [1, 2, 3]
    assert ["early stop" in err for _, err in results] == [True, False]  # said once, by rank 0


def test_sigterm_to_one_rank_stops_both_after_saving(tmp_path, corpus):
    run = tmp_path / "run"
    procs = launch(run, common_args(*corpus, **{"train.max_steps": 100000}))
    deadline = time.time() + HANG
    while time.time() < deadline and not (
        (run / "metrics.jsonl").exists() and len(records(run)) >= 3
    ):
        time.sleep(0.2)
    procs[1].send_signal(signal.SIGTERM)
    results = wait(procs)
    assert [code for code, _ in results] == [130, 130], (
        results[0][1][-3000:] + results[1][1][-3000:]
    )
    ckpt = load_checkpoint(run / "last.pt").payload
    assert ckpt["progress"]["step"] == max(r["step"] for r in records(run))
    assert len(ckpt["rng"]) == 2  # one RNG state per process
    assert not [r for r in records(run) if "bleu" in r]  # a signal does not start a validation


def test_fewer_batches_than_processes_is_a_clear_error(tmp_path, corpus):
    data, spm_model = corpus
    for name in ("train.en", "train.de"):  # 6 pairs: one batch of 600 tokens
        lines = (data / name).read_text().splitlines()[:6]
        (data / name).write_text("".join(line + "\n" for line in lines))
    results = wait(
        launch(
            tmp_path / "run",
            common_args(data, spm_model, **{"train.max_tokens": 600, "train.max_steps": 10}),
        )
    )
    assert [code for code, _ in results] == [2, 2]
    for _, err in results:
        assert "fewer batches" in err and "2 processes" in err, err[-2000:]
    assert not (tmp_path / "run" / "last.pt").exists()


def test_interrupted_and_resumed_equals_uninterrupted_with_two_ranks(tmp_path, corpus):
    # Dropout on: each process's own RNG stream must continue where it stopped.
    args = common_args(*corpus, **{"model.dropout": 0.3, "train.max_steps": 6})
    assert [c for c, _ in wait(launch(tmp_path / "whole", args))] == [0, 0]
    first = wait(
        launch(
            tmp_path / "split", common_args(*corpus, **{"model.dropout": 0.3, "train.max_steps": 3})
        )
    )
    assert [c for c, _ in first] == [0, 0], first[0][1][-3000:]
    resumed = wait(launch(tmp_path / "split", ["--set", "train.max_steps=6"], resume=True))
    assert [c for c, _ in resumed] == [0, 0], resumed[0][1][-3000:] + resumed[1][1][-3000:]
    a, b = (
        load_checkpoint(tmp_path / "whole" / "last.pt").payload,
        load_checkpoint(tmp_path / "split" / "last.pt").payload,
    )
    assert a["progress"]["step"] == b["progress"]["step"] == 6
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    losses = lambda run: {r["step"]: r["loss"] for r in records(run) if "loss" in r}  # noqa: E731
    assert losses(tmp_path / "whole") == losses(tmp_path / "split")


def test_an_error_in_rank_0_preparation_ends_every_rank(tmp_path, corpus):
    data, spm_model = corpus
    (data / "valid.de").unlink()
    results = wait(launch(tmp_path / "run", common_args(data, spm_model)))
    assert [code for code, _ in results] == [2, 2]
    assert all("valid.de" in err.splitlines()[-1] for _, err in results), results[1][1][-2000:]


def test_with_subword_sampling_rank_0_cuts_every_epoch_for_both(tmp_path, corpus):
    """tokenizer.subword_alpha: SentencePiece draws differently in each process, so rank 0 cuts
    each epoch and both ranks train on its cut; a rank that cut for itself fails this run."""
    only_rank_0 = (
        "import os, sys, nmt.training.train as t\nif os.environ['RANK'] != '0': "
        "t.sampled_training_corpus = None\nfrom nmt.cli.main import main\nsys.argv[0] = "
        "'nmt'\nmain()"
    )
    args = common_args(
        *corpus, **{"tokenizer.subword_alpha": 0.1, "train.max_steps": 12, "train.save_every": 6}
    )
    procs = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for rank in range(2):
        env = {
            **os.environ,
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": "2",
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
        }
        cmd = [
            sys.executable,
            "-c",
            only_rank_0,
            "train",
            "--run-dir",
            str(tmp_path / "ddp"),
            *args,
        ]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    for code, err in wait(procs):
        assert code == 0, err[-3000:]
    steps = {r["step"]: r.get("epoch") for r in records(tmp_path / "ddp") if "loss" in r}
    # an epoch boundary crossed: a second cut, shared too
    assert len(steps) == 12 and steps[12] >= 1
    cut = load_checkpoint(tmp_path / "ddp" / "last.pt").payload["subwords"]
    # every training pair, as rank 0 cut them
    assert cut["epoch"] == steps[12] and len(cut["src_offsets"]) == 101


def test_a_rank_killed_ends_the_survivor_in_one_line(tmp_path, corpus):
    """A rank killed under torchrun left a 104-line traceback on the survivor (the run still resumed
    exactly)."""
    run = tmp_path / "run"
    procs = launch(run, common_args(*corpus, **{"train.max_steps": 100000}))
    deadline = time.time() + HANG
    while time.time() < deadline and not (
        (run / "metrics.jsonl").exists() and len(records(run)) >= 3
    ):
        time.sleep(0.2)
    procs[1].kill()
    (code, err), _ = wait(procs)
    lines = [line for line in err.strip().splitlines() if line.startswith("error: ")]
    assert code == 2 and len(lines) == 1 and "another process of this run stopped" in lines[0], err[
        -3000:
    ]
    assert "Traceback" not in err, err[-3000:]
