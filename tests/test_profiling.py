import pytest
import torch
from conftest import tiny_config

from nmt.cli.commands.profile import format_profile
from nmt.config import ModelConfig
from nmt.core.model import Transformer
from nmt.tools.profiling import PARTS, TRAIN_PARTS, Shape, cache_bytes, profile


@pytest.fixture(scope="module")
def result():
    torch.manual_seed(0)
    model = Transformer(tiny_config(src_vocab_size=60, tgt_vocab_size=60)).eval()
    return profile(model, Shape(batch=3, src_len=7, tgt_len=6, beam=4), torch.device("cpu"))


def test_time_shares_are_the_parts_of_the_whole(result):
    for section, parts in (("decode", PARTS), ("train", TRAIN_PARTS)):
        timed = result[section]["parts"]
        assert list(timed) == list(parts)
        assert sum(v["share"] for v in timed.values()) == pytest.approx(1.0, abs=1e-9)
        assert sum(v["ms"] for v in timed.values()) == pytest.approx(
            1000 * result[section]["seconds"], rel=1e-6
        )
        assert all(v["ms"] >= 0 for v in timed.values()) and all(
            timed[p]["ms"] > 0 for p in parts if p != "other"
        )
    assert result["decode"]["tokens_per_s"] == pytest.approx(
        result["decode"]["sentences_per_s"] * 6
    )
    assert result["decode"]["peak_memory_bytes"] > 0 and set(result["latency_ms_per_piece"]) == {
        "beam 1",
        "beam 5",
    }
    assert "decoder self-attention" in format_profile(result)
    cpu = result["cpu"]
    assert 0 < cpu["cpu_seconds"] and 0 < cpu["wall_seconds"]
    assert cpu["threads_busy"] == pytest.approx(cpu["cpu_seconds"] / cpu["wall_seconds"])
    assert "thread(s) busy" in format_profile(result)


def test_a_busy_machine_is_said_beside_the_profile():
    from nmt.cli.commands.profile import busy_machine

    def said(device, threads, cpu_seconds, wall_seconds=2.0):
        busy = cpu_seconds / wall_seconds
        return busy_machine(
            {
                "device": device,
                "threads": threads,
                "cpu": {
                    "cpu_seconds": cpu_seconds,
                    "wall_seconds": wall_seconds,
                    "threads_busy": busy,
                },
            }
        )

    assert said("cpu", 2, 3.8) == [
        "CPU time: 3.8 s in 2.0 s of wall time, 1.90 of 2 thread(s) busy"
    ]
    (line, warning) = said("cpu", 2, 2.0)  # one of two threads' time: the other went elsewhere
    assert line.endswith("1.00 of 2 thread(s) busy")
    assert warning.startswith("warning: only 1.00 of 2 thread(s) were busy: other work shares")
    assert len(said("cpu", 1, 1.5)) == 2 and len(said("cpu", 1, 1.7)) == 1  # 80% of one thread
    assert said("cuda:0", 2, 0.1) == []  # a GPU's host thread waits: its CPU time says nothing


# 70 outgrows the cache's first capacity
@pytest.mark.parametrize("beam,tgt_len", [(1, 5), (4, 6), (3, 70)])
def test_cache_bytes_equal_the_formula(beam, tgt_len):
    cfg = ModelConfig(
        d_model=48,
        d_ff=64,
        n_heads=4,
        n_encoder_layers=1,
        n_decoder_layers=3,
        src_vocab_size=50,
        tgt_vocab_size=50,
    )
    model = Transformer(cfg).eval()
    shape = Shape(batch=2, src_len=9, tgt_len=tgt_len, beam=beam)
    c = cache_bytes(model, shape, torch.float32)
    assert (
        c["self_kv_bytes_measured"]
        == c["self_kv_bytes_formula"]
        == 2 * 3 * 2 * beam * 4 * tgt_len * 12 * 4
    )
    assert (
        c["source_kv_bytes_measured"] == c["source_kv_bytes_formula"] == 2 * 3 * 2 * 4 * 9 * 12 * 4
    )
    assert c["source_kv_bytes_if_copied_per_beam"] == beam * c["source_kv_bytes_measured"]
    assert c["self_kv_bytes_allocated"] >= c["self_kv_bytes_measured"]


def test_profile_command_prints_one_json_object_or_one_line_errors():
    import json

    from typer.testing import CliRunner

    from nmt.cli.main import app

    runner = CliRunner()
    result = runner.invoke(
        app,
        [
            "profile",
            "--preset",
            "tiny",
            "--batch",
            "2",
            "--src-len",
            "5",
            "--tgt-len",
            "4",
            "--beam-size",
            "2",
            "--threads",
            "1",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (
        report["shape"] == {"batch": 2, "src_len": 5, "tgt_len": 4, "beam": 2}
        and report["model"]["d_model"] == 64
    )
    for args, message in (
        (["profile"], "give a model to profile"),
        (["profile", "--preset", "huge"], "--preset 'huge' is not one of"),
        (
            ["profile", "--preset", "tiny", "--batch", "0"],
            "--batch must be in [1, 2147483647], got 0",
        ),
        (
            ["profile", "--preset", "tiny", "--batch", str(10**20)],
            f"--batch must be in [1, 2147483647], got {10**20}",
        ),
        (
            ["profile", "--preset", "tiny", "--beam-size", "1025"],
            "--beam-size must be in [1, 1024], got 1025",
        ),
        (
            ["profile", "--preset", "tiny", "--src-len", "10000000"],
            "need at least 143051147.5 GiB for their largest tensors, more than the",
        ),
    ):
        result = runner.invoke(app, args)
        assert result.exit_code == 2 and message in result.output and result.output.count("\n") == 1


def test_the_memory_a_shape_needs_is_bounded_below_by_its_largest_tensors():
    """`nmt profile --batch 100000 --src-len 1000` was killed for memory and `--src-len 100000` ran
    for minutes: a shape whose largest tensors exceed the memory available is refused first. By
    hand, for the tiny preset (d_model 64, 4 heads, 2 decoder layers, 8,000 pieces) and batch 2,
    src_len 3, tgt_len 4, beam 5: training logits 3·2·4·8000 = 192,000 floats; attention 3·2·4·4² =
    384; the cache 2·2·10·4·4·16 = 10,240 and the step's scores 2·10·8000 = 160,000, together
    170,240: the largest is 192,000 floats, 768,000 bytes."""
    from nmt.config import PRESETS, ModelConfig
    from nmt.tools.profiling import Shape, largest_tensors_bytes

    cfg = ModelConfig(**PRESETS["tiny"], src_vocab_size=8000, tgt_vocab_size=8000)
    assert largest_tensors_bytes(cfg, Shape(batch=2, src_len=3, tgt_len=4, beam=5)) == 768_000
    assert largest_tensors_bytes(cfg, Shape(batch=2, src_len=3, tgt_len=4, beam=50)) == 4 * (
        2 * 2 * 100 * 4 * 4 * 16 + 2 * 100 * 8000
    )
    # bfloat16 profiles decoding only: its 2-byte cache and float32 scores, 2·2·200·4·4·16·2 +
    # 2·200·8000·4 bytes
    assert (
        largest_tensors_bytes(cfg, Shape(batch=2, src_len=3, tgt_len=4, beam=100), "bfloat16")
        == 409_600 + 12_800_000
    )
