import errno
import os
import zipfile

import pytest
import torch
from conftest import cached_tokenizer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nmt import __version__
from nmt.config import config_from_dict, config_to_dict
from nmt.core.model import Transformer
from nmt.files import OutputError, atomic_write, check_writable
from nmt.runs.checkpoint import (
    CheckpointError,
    checkpoint_file,
    load_checkpoint,
    save_checkpoint,
    tokenizer_to_tensors,
)

MODEL = {
    "d_model": 32,
    "d_ff": 64,
    "n_heads": 4,
    "n_encoder_layers": 2,
    "n_decoder_layers": 2,
    "src_vocab_size": 40,
    "tgt_vocab_size": 40,
}


@pytest.fixture(scope="module")
def protos():
    return cached_tokenizer(40).protos()


def write(path, protos, seed=0, **model):
    torch.manual_seed(seed)
    cfg = config_from_dict({"model": {**MODEL, **model}})
    state = Transformer(cfg.model).state_dict()
    save_checkpoint(
        {"model": state, "config": config_to_dict(cfg), "tokenizer": tokenizer_to_tensors(protos)},
        path,
    )
    return state


def data_offset(path, name_part):
    """Byte offset of the data of the first archive entry whose name contains ``name_part``."""
    with zipfile.ZipFile(path) as z:
        info = max((i for i in z.infolist() if name_part in i.filename), key=lambda i: i.file_size)
    with open(path, "rb") as f:
        f.seek(info.header_offset + 26)
        name_len, extra_len = (
            int.from_bytes(f.read(2), "little"),
            int.from_bytes(f.read(2), "little"),
        )
    return info.header_offset + 30 + name_len + extra_len + info.file_size // 2


def flip_bit(path, offset):
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x10
    path.write_bytes(bytes(data))


def test_round_trip_records_the_version(tmp_path, protos):
    state = write(tmp_path / "a.pt", protos)
    loaded = load_checkpoint(tmp_path / "a.pt")
    assert loaded.payload["nmt_version"] == __version__
    model = loaded.model
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, state[name])


def test_a_checkpoint_from_before_the_exact_stop_keeps_the_rule_its_alpha_was_chosen_under(
    tmp_path, protos
):
    """Before decode.patience existed the search ended a sentence once beam_size hypotheses had
    finished: such a checkpoint decodes so (patience 1) unless asked otherwise; a newer one keeps
    what it stored, the exact rule included."""
    cfg = config_from_dict({"model": MODEL, "decode": {"length_penalty": 2.0}})
    state = Transformer(cfg.model).state_dict()
    stored = config_to_dict(cfg)
    assert stored["decode"]["patience"] is None
    older = {**stored, "decode": {k: v for k, v in stored["decode"].items() if k != "patience"}}
    for config, patience in ((older, 1.0), (stored, None)):
        path = tmp_path / "a.pt"
        save_checkpoint(
            {"model": state, "config": config, "tokenizer": tokenizer_to_tensors(protos)}, path
        )
        assert load_checkpoint(path).config.decode.patience == patience


def test_a_flipped_bit_in_a_weight_is_detected(tmp_path, protos):
    path = tmp_path / "a.pt"
    write(path, protos)
    flip_bit(path, data_offset(path, "/data/"))
    with pytest.raises(
        CheckpointError,
        match=r"^damaged checkpoint: .*a\.pt \(entry .* does not match its checksum",
    ):
        load_checkpoint(path)


# general-purpose flags: "encrypted"; compression method: deflate
@pytest.mark.parametrize("field, value", [(8, 0x01), (10, 0x08)])
def test_a_flipped_bit_in_the_zip_directory_is_a_damaged_checkpoint(tmp_path, protos, field, value):
    path = tmp_path / "a.pt"
    write(path, protos)
    with zipfile.ZipFile(path) as z:
        name = max(z.infolist(), key=lambda i: i.file_size).filename.encode()
    data = bytearray(path.read_bytes())
    # the entry's central-directory header: 46 fixed bytes, then its name
    entry = data.rfind(name) - 46
    assert data[entry : entry + 4] == b"PK\x01\x02"
    data[entry + field] ^= value
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"^damaged checkpoint: .*a\.pt \("):
        load_checkpoint(path)


def test_a_truncated_checkpoint_gives_a_whole_sentence(tmp_path, protos):
    path = tmp_path / "a.pt"
    write(path, protos)
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert message.startswith(f"damaged checkpoint: {path} (") and message.endswith(
        "probably truncated or overwritten)"
    )


@pytest.mark.parametrize(
    "content, looks_like",
    [
        (b"ein Hund rennt\nzwei Katzen\n", "a text file (first line 'ein Hund rennt')"),
        (b"model:\n  d_model: 32\ntrain:\n  max_steps: 5\n", "YAML text"),
        (b"", "an empty file"),
        (b"\x00\x01\x02\xff\xfe" * 100, "binary data"),
    ],
)
def test_files_that_are_not_checkpoints_are_named(tmp_path, content, looks_like):
    path = tmp_path / "x.pt"
    path.write_bytes(content)
    with pytest.raises(
        CheckpointError, match=rf"x\.pt is not an nmt checkpoint: it is {looks_like[:12]}"
    ) as err:
        load_checkpoint(path)
    assert looks_like in str(err.value)


def test_a_sentencepiece_model_is_named(tmp_path, protos):
    path = tmp_path / "spm.model"
    path.write_bytes(protos["joint"])
    with pytest.raises(
        CheckpointError, match="is not an nmt checkpoint: it is a SentencePiece model"
    ):
        load_checkpoint(path)


def test_another_programs_torch_file_is_not_said_to_be_written_by_nmt(tmp_path):
    torch.save({"a": 1, "state_dict": {}}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(tmp_path / "other.pt")
    expected = (
        "is not an nmt checkpoint: a dict without nmt's model, config and tokenizer "
        "entries "
        "(its keys: 'a', 'state_dict')"
    )
    assert str(err.value) == f"{tmp_path / 'other.pt'} {expected}"


def test_inconsistent_checkpoints_give_one_line_naming_keys_and_version(tmp_path, protos):
    path = tmp_path / "a.pt"
    state = write(path, protos)
    payload = load_checkpoint(path).payload
    save_checkpoint({**payload, "tokenizer": "not tensors"}, path)
    with pytest.raises(
        CheckpointError,
        match=rf"inconsistent checkpoint: 'tokenizer' is not .* \(written by nmt {__version__}\)",
    ):
        load_checkpoint(path)
    wrong = config_from_dict({"model": {**MODEL, "n_encoder_layers": 1}})
    save_checkpoint({**payload, "config": config_to_dict(wrong)}, path)
    with pytest.raises(CheckpointError) as err:
        load_checkpoint(path)
    message = str(err.value)
    assert (
        "\n" not in message
        and "unexpected: encoder.1." in message
        and f"nmt {__version__}" in message
    )
    renamed = {("x." + k if k.startswith("decoder.0.") else k): v for k, v in state.items()}
    save_checkpoint({**payload, "model": renamed}, path)
    with pytest.raises(
        CheckpointError, match=r"unexpected: x\.decoder\.0\..*missing: decoder\.0\."
    ):
        load_checkpoint(path)


def test_a_full_disk_leaves_the_old_checkpoint_and_no_temporary(tmp_path, protos, monkeypatch):
    path = tmp_path / "last.pt"
    write(path, protos)
    before = path.read_bytes()

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OutputError, match=rf"^cannot write {path}: no space left on the device$"):
        write(path, protos, seed=1)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


def test_torch_save_failing_mid_write_is_one_line(tmp_path):
    def half_then_full(f):
        f.write(b"x" * 10)
        raise OSError(errno.EROFS, "Read-only file system")

    with pytest.raises(OutputError, match="read-only file system"):
        atomic_write(tmp_path / "out.txt", half_then_full)
    assert list(tmp_path.iterdir()) == []


def test_outputs_are_checked_before_work(tmp_path):
    with pytest.raises(OutputError, match="does not exist; create it first"):
        check_writable(tmp_path / "missing" / "out.pt", "--out")
    with pytest.raises(OutputError, match="is a directory"):
        check_writable(tmp_path, "--out")
    check_writable(tmp_path / "fine.pt")
    assert list(tmp_path.iterdir()) == []


def test_read_only_mount_is_refused_before_work(tmp_path):
    """On a real read-only file system (needs mount rights; skipped without them)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.system(f"mount -t tmpfs -o ro tmpfs {ro} 2>/dev/null") != 0:
        pytest.skip("cannot mount a read-only tmpfs here")
    try:
        with pytest.raises(
            OutputError, match=rf"cannot write --output {ro}/hyp.txt: read-only file system"
        ):
            check_writable(ro / "hyp.txt", "--output")
        with pytest.raises(OutputError, match="read-only file system"):
            atomic_write(ro / "hyp.txt", "text\n")
    finally:
        os.system(f"umount {ro}")


def test_a_tokenizer_that_is_not_sentencepiece_or_not_the_models_is_refused_by_every_reader(
    tmp_path, protos
):
    """Nmt info, export --format nmt and average once accepted tokenizer bytes that are not a
    SentencePiece model (info even said it could be resumed); translate then refused what they
    wrote."""
    from nmt.interop.export import export_slim
    from nmt.tools.average import average_checkpoints
    from nmt.tools.info import checkpoint_info

    path = tmp_path / "a.pt"
    write(path, protos)
    payload = load_checkpoint(path).payload
    save_checkpoint(
        {**payload, "tokenizer": tokenizer_to_tensors({"joint": b"\x00not a model"})}, path
    )
    for read in (
        load_checkpoint,
        checkpoint_info,
        lambda p: export_slim(p, tmp_path / "slim.pt"),
        lambda p: average_checkpoints([p], tmp_path / "avg.pt"),
    ):
        with pytest.raises(
            CheckpointError,
            match=r"a\.pt: inconsistent checkpoint: checkpoint tokenizer: cannot load "
            r"SentencePiece model",
        ):
            read(path)
    assert not (tmp_path / "slim.pt").exists() and not (tmp_path / "avg.pt").exists()
    bigger = config_from_dict({"model": {**MODEL, "src_vocab_size": 50, "tgt_vocab_size": 50}})
    save_checkpoint(
        {
            **payload,
            "config": config_to_dict(bigger),
            "model": Transformer(bigger.model).state_dict(),
        },
        path,
    )
    with pytest.raises(
        CheckpointError,
        match=r"its tokenizer has 40 source and 40 target pieces, its model 50 and 50",
    ):
        load_checkpoint(path)


def test_the_uninitialised_model_has_the_real_ones_names_shapes_and_dtypes():
    from nmt.core.model import count_parameters, uninitialised_model

    cfg = config_from_dict({"model": {**MODEL, "share_embeddings": False}}).model
    real, skeleton = Transformer(cfg).state_dict(), uninitialised_model(cfg).state_dict()
    assert list(skeleton) == list(real)
    assert all(
        skeleton[k].shape == real[k].shape and skeleton[k].dtype == real[k].dtype for k in real
    )
    assert count_parameters(uninitialised_model(cfg)) == count_parameters(Transformer(cfg))
    state = torch.get_rng_state()
    uninitialised_model(cfg)
    # draws nothing: a resumed run's random stream is untouched
    assert torch.equal(torch.get_rng_state(), state)


def test_checking_a_checkpoint_does_not_import_dynamo(tmp_path, protos):
    # Building the model on the meta device to check a checkpoint's shapes imported torch._dynamo
    # (PyTorch's Python reference kernels): seconds at the start of every command.
    import subprocess
    import sys

    write(tmp_path / "a.pt", protos)
    code = (
        "import sys; from nmt.tools.info import checkpoint_info; "
        f"checkpoint_info({str(tmp_path / 'a.pt')!r}); sys.exit('torch._dynamo' in sys.modules)"
    )
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0


@given(
    names=st.sets(
        st.sampled_from(
            ["best.pt", "last.pt", "step_2.pt", "average.pt", "config.yaml", "best.pt.tmp"]
        )
    ),
    best_is_dir=st.booleans(),
)
def test_a_run_directory_names_its_best_pt_or_says_what_it_lacks(
    tmp_path_factory, names, best_is_dir
):
    run = tmp_path_factory.mktemp("run")
    for name in names:
        (run / name).mkdir() if name == "best.pt" and best_is_dir else (run / name).write_bytes(
            b"x"
        )
    if (run / "best.pt").is_file():
        assert checkpoint_file(run) == run / "best.pt"
        return
    with pytest.raises(CheckpointError) as err:
        checkpoint_file(run)
    message = str(err.value)
    assert message.startswith(f"{run} ") and "\n" not in message
    # the advice names only a file that is there
    assert (f"pass --checkpoint {run / 'last.pt'}" in message) == (run / "last.pt").is_file()
    # a file is itself, whatever it holds
    assert checkpoint_file(run / "config.yaml") == run / "config.yaml"


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    key=st.sampled_from(
        [
            "d_model",
            "d_ff",
            "n_encoder_layers",
            "n_decoder_layers",
            "src_vocab_size",
            "tgt_vocab_size",
        ]
    ),
    factor=st.integers(2, 2**24),
)
def test_a_config_larger_than_its_tensors_is_refused_before_anything_is_built(
    tmp_path_factory, protos, key, factor
):
    """A hand-edited or damaged config (d_model 2^20, 10^7 layers) once built its model before the
    tensors could refuse it: terabytes asked of the allocator, or millions of modules. Any size
    larger than the tensors show is refused first, naming the key (a vocabulary size by the
    tokenizer check, which comes first)."""
    path = tmp_path_factory.mktemp("big") / "a.pt"
    write(path, protos)
    payload = load_checkpoint(path).payload
    value = min(MODEL[key] * factor, 2**31 - 4) // 4 * 4  # a multiple of n_heads
    wrong = config_from_dict({"model": {**MODEL, key: value}})
    save_checkpoint({**payload, "config": config_to_dict(wrong)}, path)
    pattern = (
        rf"model\.{key} {value} in the config vs {MODEL[key]} in the tensors"
        if "vocab" not in key
        else str(path)
    )
    with pytest.raises(CheckpointError, match=pattern):
        load_checkpoint(path)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    entry=st.sampled_from(
        [
            "progress",
            "optimizer",
            "scheduler",
            "rng",
            "run",
            "averaged_from",
            "imported_from",
            "init_from",
        ]
    ),
    value=st.one_of(
        st.none(),
        st.integers(),
        st.text(max_size=3),
        st.lists(st.integers(), max_size=2),
        st.dictionaries(st.text(max_size=3), st.integers(), max_size=2),
    ),
)
def test_an_entry_of_the_wrong_type_is_named_by_every_reader(
    tmp_path_factory, protos, entry, value
):
    """`nmt info` on a checkpoint whose progress was None raised AttributeError; translate and
    average took it. The optional entries are checked where every reader loads a checkpoint: of the
    wrong type, or a progress field that is not a whole number (best_bleu: a number), they are one
    line naming the entry."""
    path = tmp_path_factory.mktemp("entry") / "a.pt"
    write(path, protos)
    payload = {**load_checkpoint(path).payload, entry: value}
    save_checkpoint(payload, path)
    fine = {
        "progress": dict,
        "optimizer": dict,
        "scheduler": dict,
        "rng": (dict, list),
        "run": dict,
        "averaged_from": list,
    }.get(entry, dict)
    if isinstance(value, fine):
        # a progress field this nmt does not know (generated keys are none of its) is a newer
        # nmt's
        load_checkpoint(path)
        if entry == "progress" and value:
            with pytest.raises(
                CheckpointError, match=r"'progress' has .*, which this nmt does not know"
            ):
                load_checkpoint(path, training=True)  # but --resume would have to continue it
        return
    with pytest.raises(CheckpointError, match=rf"inconsistent checkpoint: '{entry}' "):
        load_checkpoint(path)


def test_weights_that_are_not_finite_are_refused_naming_them(tmp_path, protos):
    """A diverged model's checkpoint (nan weights) translated every line to an empty one, exit code
    0."""
    path = tmp_path / "a.pt"
    state = write(path, protos)
    payload = load_checkpoint(path).payload
    for bad in (float("nan"), float("inf"), -float("inf")):
        broken = {
            **state,
            "decoder.1.ffn.fc2.bias": state["decoder.1.ffn.fc2.bias"]
            .clone()
            .index_fill_(0, torch.tensor([3]), bad),
        }
        save_checkpoint({**payload, "model": broken}, path)
        with pytest.raises(
            CheckpointError,
            match=r"1 weight tensor\(s\) hold nan or inf \(decoder\.1\.ffn\.fc2\.bias\): the "
            r"training diverged",
        ):
            load_checkpoint(path)
    tied = {**state, "src_embed.weight": state["src_embed.weight"].clone().fill_(float("nan"))}
    # one matrix under two names, as a joint vocabulary ties them
    tied["tgt_embed.weight"] = tied["src_embed.weight"]
    save_checkpoint({**payload, "model": tied}, path)
    with pytest.raises(
        CheckpointError, match=r"1 weight tensor\(s\) hold nan or inf \(src_embed\.weight\)"
    ):
        load_checkpoint(path)
