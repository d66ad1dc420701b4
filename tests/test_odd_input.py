"""Kinds of odd input, each generated: what reaches a mechanism that once crashed, hung or destroyed
a file.

* an output named by one of the process's own descriptors (``/dev/stdout``, ``/dev/fd/N``) or
  by a file of a run directory (directly, through a link, through a linked directory);
* sampling at any temperature, and a model whose scores are NaN;
* numbers beyond what C code holds, YAML aliases that repeat or hold themselves, odd
  ``metrics.jsonl`` records, lines without an end, target text the vocabulary cannot write.
"""

import io
import json
import math
import os
import re
import socket
import stat
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import nmt.data.corpus as corpus
from nmt.config import BEAM, LENGTH_PENALTY, THREADS, ConfigError, DecodeConfig, config_from_dict
from nmt.data.corpus import DataError, iter_lines, stream_buffers
from nmt.data.tokenizer import EOS
from nmt.decode.sampling import Sampling, sampling_probs
from nmt.decode.search import sample
from nmt.fields import MAX_INT, read_yaml
from nmt.files import OutputError, atomic_write, check_not_a_run_file, check_writable, inherited_fd
from nmt.runs.rundir import RunDir
from nmt.tools.plot import read_metrics
from nmt.tools.tune import grid

PROPERTY = settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


# ---------------------------------------------------------------- outputs


@PROPERTY
@given(
    before=st.binary(max_size=50),
    content=st.binary(max_size=200),
    name=st.sampled_from(["/dev/fd/{}", "/proc/self/fd/{}", "link"]),
)
def test_an_output_naming_an_open_descriptor_is_written_through_it_in_its_mode(
    tmp_path_factory, before, content, name
):
    """`nmt translate -o /dev/stdout >> log` appends to log, as `cat` would; it used to replace
    log."""
    tmp = tmp_path_factory.mktemp("fd")
    log = tmp / "log"
    log.write_bytes(before)
    fd = os.open(log, os.O_WRONLY | os.O_APPEND)
    try:
        path = tmp / "alias" if name == "link" else name.format(fd)
        if name == "link":
            os.symlink(f"/proc/self/fd/{fd}", path)
        assert inherited_fd(path) == fd
        check_writable(path)
        atomic_write(path, content)
    finally:
        os.close(fd)
    assert log.read_bytes() == before + content
    assert sorted(p.name for p in tmp.iterdir()) == sorted(
        ["log"] + (["alias"] if name == "link" else [])
    )


def test_a_descriptor_open_for_reading_is_refused(tmp_path):
    (tmp_path / "in").write_text("x")
    fd = os.open(tmp_path / "in", os.O_RDONLY)
    try:
        with pytest.raises(OutputError, match="open for reading only"):
            check_writable(f"/dev/fd/{fd}")
    finally:
        os.close(fd)
    assert inherited_fd("/dev/fd/99999") is None and inherited_fd(tmp_path / "in") is None


RUN_FILES = st.one_of(
    st.sampled_from(
        [
            "last.pt",
            "best.pt",
            "config.yaml",
            "metrics.jsonl",
            "spm.model",
            "spm.src.model",
            "spm.tgt.model",
            ".lock",
        ]
    ),
    st.integers(0, 10**6).map(lambda n: f"step_{n}.pt"),
)


@PROPERTY
@given(
    name=RUN_FILES,
    marker=st.sampled_from(["metrics.jsonl", ".lock"]),
    via=st.sampled_from(["direct", "file link", "directory link"]),
)
def test_no_output_replaces_a_file_of_a_run_directory(tmp_path_factory, name, marker, via):
    tmp = tmp_path_factory.mktemp("run")
    run = tmp / "run"
    run.mkdir()
    (run / marker).write_text("")
    (run / name).write_bytes(b"kept")
    if via == "file link":
        (tmp / "out.pt").symlink_to(run / name)
        given_path = tmp / "out.pt"
    elif via == "directory link":
        (tmp / "alias").symlink_to(run)
        given_path = tmp / "alias" / name
    else:
        given_path = run / name
    with pytest.raises(OutputError, match="would replace"):
        check_writable(given_path, "--output")
    assert (run / name).read_bytes() == b"kept"
    check_writable(run / "hypotheses.txt")  # other names in a run directory are the user's
    check_writable(run / "average.pt")


def test_a_directory_without_run_marker_is_anyones(tmp_path):
    check_not_a_run_file(tmp_path / "last.pt", tmp_path / "last.pt")
    check_writable(tmp_path / "config.yaml")


# ---------------------------------------------------------------- sampling


@PROPERTY
@given(
    logits=st.lists(st.floats(-1e4, 1e4), min_size=6, max_size=6),
    banned=st.lists(st.booleans(), min_size=6, max_size=6),
    temperature=st.one_of(
        st.floats(1e-300, 1e300), st.just(math.inf), st.sampled_from([1e-40, 1e-10, 1e10])
    ),
)
def test_any_temperature_gives_a_distribution_over_what_may_follow(logits, banned, temperature):
    if all(banned):
        banned[0] = False
    lprobs = torch.log_softmax(torch.tensor([logits]), -1).masked_fill(
        torch.tensor([banned]), -math.inf
    )
    probs = sampling_probs(lprobs, Sampling(temperature=temperature))
    assert torch.isfinite(probs).all() and probs.sum().item() == pytest.approx(1.0, abs=1e-5)
    assert (probs[0, torch.tensor(banned)] == 0).all()
    best = lprobs[0].max()
    # the likeliest stay the likeliest
    assert probs[0, lprobs[0] == best].sum() >= max(probs[0].max().item(), 1e-30) - 1e-6


class NaNScorer:
    """A damaged model: every score NaN."""

    def step(self, prefix, state):
        return torch.full((prefix.size(0), 9), math.nan), state

    def reorder(self, state, index):
        return state

    def keep_sentences(self, state, keep):
        return state


@pytest.mark.parametrize("temperature", [1.0, math.inf, 1e-40])
def test_sampling_ends_at_the_length_limit_whatever_the_scores(temperature):
    """It looped for ever when NaN probabilities never drew EOS (temperature inf, or a NaN
    model)."""
    out = sample(
        NaNScorer(),
        None,
        torch.tensor([3, 5]),
        DecodeConfig(n_best=2, beam_size=2),
        Sampling(temperature=temperature),
        [0, 1],
    )
    assert [len(s) for s in out] == [2, 2]
    assert all(len(h.tokens) <= limit for s, limit in zip(out, [3, 5]) for h in s)
    assert all(EOS not in h.tokens for s in out for h in s)


# ---------------------------------------------------------------- numbers, YAML, records, lines


INT_KEYS = [
    "tokenizer.vocab_size",
    "tokenizer.input_sentence_size",
    "train.max_steps",
    "train.max_tokens",
    "data.max_len",
    "decode.max_tokens",
]


@PROPERTY
@given(key=st.sampled_from(INT_KEYS), value=st.integers(MAX_INT + 1, 10**40))
def test_whole_numbers_beyond_a_c_int_are_config_errors(key, value):
    section, name = key.split(".")
    with pytest.raises(ConfigError, match=f"{key} must be at most 2,147,483,647, got {value}"):
        config_from_dict({section: {name: value}})


def text_keys() -> list[str]:
    """Every config key whose value is text (a path, a name, a language code)."""
    import dataclasses

    from nmt.config import Config
    from nmt.fields import PathText, _members, hints

    return [
        f"{section.name}.{f.name}"
        for section in dataclasses.fields(Config)
        for f in dataclasses.fields(section.default_factory)
        if {str, PathText} & set(_members(hints(section.default_factory)[f.name]))
    ]


@PROPERTY
@given(
    key=st.sampled_from(text_keys()),
    blank=st.text(" \t\u3000\u00a0", max_size=4),
    quoted=st.booleans(),
)
def test_empty_text_is_refused_for_every_text_key_whichever_way_written(
    tmp_path_factory, key, blank, quoted
):
    """`train.run_dir: ""` in YAML meant the current directory (and `data.tgt_lang: ""` the files
    `train.`) where `--set train.run_dir=` was refused: text is never empty, from YAML (quoted or
    not) or from a checkpoint's dict."""
    section, name = key.split(".")
    assert len(text_keys()) >= 10 and "train.run_dir" in text_keys()
    with pytest.raises(ConfigError, match=f"^{key} must (not be empty|be text)"):
        config_from_dict({section: {name: blank}})
    path = tmp_path_factory.mktemp("cfg") / "c.yaml"
    # a tab cannot start a YAML token
    written = json.dumps(blank) if quoted else blank.replace("\t", " ")
    path.write_text(f"{section}:\n  {name}: {written}\n", encoding="utf-8")
    from nmt.config import Config, load_config
    from nmt.fields import _members, hints

    nullable = type(None) in _members(hints(type(getattr(Config(), section)))[name])
    # unquoted nothing is YAML's null: refused where a key needs text, else null
    if quoted or not nullable:
        with pytest.raises(ConfigError, match=f"{key} must (not be empty|be text)"):
            load_config(path)
    else:
        assert getattr(getattr(load_config(path), section), name) is None


@PROPERTY
@given(code=st.text(max_size=8))
def test_a_language_code_names_files_it_cannot_escape(code):
    """`data.tgt_lang` becomes part of a file name (`train.{tgt_lang}`): a separator, a space or a
    dot is refused."""
    valid = (
        bool(code)
        and code[0].isascii()
        and code[0].isalpha()
        and all(c.isascii() and (c.isalnum() or c in "_-") for c in code)
    )
    if valid:
        assert config_from_dict({"data": {"tgt_lang": code}}).data.tgt_lang == code
    else:
        with pytest.raises(ConfigError, match="data.tgt_lang must"):
            config_from_dict({"data": {"tgt_lang": code}})


@PROPERTY
@given(
    beam=st.integers(BEAM.high + 1, 10**30),
    threads=st.integers(THREADS.high + 1, 10**30),
    alpha=st.floats(allow_nan=True, allow_infinity=True),
)
def test_decode_numbers_that_size_memory_or_overflow_are_refused(beam, threads, alpha):
    with pytest.raises(ConfigError, match="decode.beam_size must be in"):
        DecodeConfig(beam_size=beam)
    with pytest.raises(ConfigError, match="train.threads must be in"):
        config_from_dict({"train": {"threads": threads}})
    if alpha not in LENGTH_PENALTY:
        with pytest.raises(ConfigError, match="length_penalty must be in"):
            DecodeConfig(length_penalty=alpha)
        with pytest.raises(ConfigError, match="alphas must all be in"):
            grid([5], ["length"], [alpha])
    else:
        assert DecodeConfig(length_penalty=alpha).length_penalty == alpha


@PROPERTY
@given(depth=st.integers(1, 12), fan=st.integers(1, 12))
def test_yaml_aliases_expand_within_bounds_or_are_refused(depth, fan):
    text = "l0: &l0 [x]\n" + "".join(
        f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * fan)}]\n" for i in range(1, depth + 1)
    )
    try:
        value, _ = read_yaml(text, "c.yaml")
    except ConfigError as exc:
        assert str(exc).startswith("c.yaml:") and "expands to more than" in str(exc)
        assert sum(fan**i for i in range(depth + 1)) > 100_000 / 2  # refused only where it is large
    else:
        assert len(value) == depth + 1


def test_a_yaml_list_holding_itself_is_refused():
    with pytest.raises(ConfigError, match="nests values deeper than"):
        read_yaml("train: &a [*a]\n", "c.yaml")


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda c: (
        st.lists(c, max_size=3)
        | st.dictionaries(
            st.sampled_from(["step", "loss", "lr", "bleu", "valid_loss"]), c, max_size=5
        )
    ),
    max_leaves=8,
)


@PROPERTY
@given(odd=st.one_of(JSON.map(lambda v: json.dumps(v).encode()), st.binary(max_size=20)))
def test_any_metrics_line_is_dropped_on_resume_or_named_by_plot(tmp_path_factory, odd):
    run = tmp_path_factory.mktemp("run")
    good = [{"step": 100, "loss": 3.0, "lr": 1e-3}, {"step": 200, "bleu": 10.0, "valid_loss": 2.5}]
    (run / "metrics.jsonl").write_bytes(
        b"".join(json.dumps(r).encode() + b"\n" for r in good) + odd.replace(b"\n", b" ") + b"\n"
    )
    try:
        records = read_metrics(run)
    except DataError as exc:
        assert str(exc).startswith(f"{run / 'metrics.jsonl'}:3: ")
    else:
        assert records[:2] == good and len(records) == 3
    # never raises: a line that is no record is not in the history
    RunDir(run).keep_history_until(200)
    kept = (run / "metrics.jsonl").read_bytes().splitlines()
    assert [json.loads(line) for line in kept[:2]] == good and len(kept) <= 3
    newest = RunDir(run).last_validation()
    assert newest == good[1] or (len(kept) == 3 and newest == json.loads(kept[2]))


def test_a_line_longer_than_the_limit_is_an_error_naming_it(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus, "MAX_LINE_BYTES", 8)
    text = b"short\n" + b"a" * 20 + b"\nok\n"
    (tmp_path / "in.txt").write_bytes(text)
    with pytest.raises(DataError, match=r"in\.txt:2: the line is longer than"):
        list(iter_lines(tmp_path / "in.txt"))
    with pytest.raises(DataError, match="<stdin>:2: the line is longer than"):
        list(stream_buffers(io.BytesIO(text), 10))
    # no newline yet: refused before it is all in memory
    with pytest.raises(DataError, match="<stdin>:1: the line is longer than"):
        list(stream_buffers(io.BytesIO(b"a" * 100), 10))
    (tmp_path / "fits.txt").write_bytes(b"12345678\n1234567")
    assert list(iter_lines(tmp_path / "fits.txt")) == ["12345678", "1234567"]


def test_writing_to_a_full_standard_output_is_one_line(tmp_path):
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        done = subprocess.run(
            [sys.executable, "-m", "nmt", "--version"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    assert (
        done.returncode == 2
        and done.stderr == "error: cannot write standard output: no space left on the device\n"
    )


@PROPERTY
@given(
    text=st.text(st.characters(codec="utf-8", exclude_characters="\0\r\n\ufeff"), max_size=40),
    lines=st.integers(1, 4),
    codec=st.sampled_from(["utf-16-le", "utf-16-be"]),
)
def test_utf16_without_a_mark_is_named_and_utf8_never_mistaken_for_it(
    tmp_path_factory, text, lines, codec
):
    tmp = tmp_path_factory.mktemp("enc")
    body = "".join(f"{text}{i}\n" for i in range(lines))
    (tmp / "u8.txt").write_bytes(body.encode("utf-8"))
    assert list(iter_lines(tmp / "u8.txt")) == body.split("\n")[:-1]
    latin = "".join(c for c in body if c < "\u0100")
    # Latin text: a NUL in every other byte
    if len(latin.encode(codec)) == len(body.encode(codec)) and len(body) >= 4:
        (tmp / "u16.txt").write_bytes(body.encode(codec))
        with pytest.raises(DataError, match="UTF-16 text; convert it to UTF-8"):
            list(iter_lines(tmp / "u16.txt"))
    # NULs only (`-i /dev/zero` was called UTF-16): no text of any encoding
    (tmp / "zeros.txt").write_bytes(b"\0" * 8 * lines + b"\n")
    assert list(iter_lines(tmp / "zeros.txt")) == ["\0" * 8 * lines]


@PROPERTY
@given(zeros=st.integers(1, 300), tail=st.binary(min_size=1, max_size=5))
def test_zeros_after_gzip_data_are_ignored_on_standard_input_as_in_files(
    tmp_path_factory, zeros, tail
):
    import gzip

    data = gzip.compress(b"hello\nworld\n") + b"\0" * zeros
    assert [line for chunk in stream_buffers(io.BytesIO(data), 10) for line in chunk] == [
        "hello",
        "world",
    ]
    if tail.strip(b"\0"):
        with pytest.raises(DataError, match="damaged gzip data"):
            list(stream_buffers(io.BytesIO(data + tail), 10))


@pytest.mark.parametrize("via", ["the file", "a link", "a hard link"])
def test_a_fresh_run_never_replaces_the_config_file_it_was_given(tmp_path, via):
    """`nmt train -c exp/config.yaml --run-dir exp` replaced the user's file (comments and all) with
    the resolved configuration; now refused before anything is written, whichever name reaches the
    file."""
    from typer.testing import CliRunner

    from nmt.cli.main import app

    run = tmp_path / "exp"
    run.mkdir()
    mine = run / "config.yaml"
    mine.write_text("# my settings\nmodel:\n  preset: tiny\n", encoding="utf-8")
    given = {
        "the file": mine,
        "a link": tmp_path / "link.yaml",
        "a hard link": tmp_path / "hard.yaml",
    }[via]
    if via == "a link":
        given.symlink_to(mine)
    elif via == "a hard link":
        os.link(mine, given)
    result = CliRunner().invoke(
        app, ["train", "-c", str(given), "--run-dir", str(run), "--set", f"data.dir={tmp_path}"]
    )
    assert result.exit_code == 2, result.output
    assert (
        result.output.startswith(f"error: --config {given} is the run's own config.yaml")
        and result.output.count("\n") == 1
    )
    assert mine.read_text(encoding="utf-8") == "# my settings\nmodel:\n  preset: tiny\n" and sorted(
        p.name for p in run.iterdir()
    ) == ["config.yaml"]


@PROPERTY
@given(
    names=st.sets(
        st.sampled_from(
            [
                "config.yaml",
                "metrics.jsonl",
                "spm.model",
                "spm.src.model",
                "last.pt",
                "step_3.pt",
                "notes.txt",
            ]
        ),
        min_size=1,
    )
)
def test_a_fresh_run_never_replaces_files_of_a_directory_no_run_has_used(tmp_path_factory, names):
    """`nmt train --run-dir proj` replaced a user's proj/config.yaml (and would have replaced a
    spm.model or metrics.jsonl of that name): only --config itself was protected. A directory
    without a run's .lock that holds any file a run writes is refused before anything is written;
    files of other names are anyone's."""
    directory = tmp_path_factory.mktemp("proj")
    for name in names:
        (directory / name).write_text(f"mine: {name}\n")
    run = RunDir(directory)
    # a run copied without its .lock: check_fresh names the checkpoints
    copied_run = bool(names & {"last.pt", "step_3.pt"})
    theirs = sorted(names & {"config.yaml", "metrics.jsonl", "spm.model", "spm.src.model"})
    if copied_run:
        run.lock()
        with pytest.raises(ConfigError, match=r"already holds a run \("):
            run.check_fresh()
        run.release()
    elif theirs:
        with pytest.raises(
            ConfigError,
            match=rf"is not a run directory \(no .lock\) but holds {re.escape(', '.join(theirs))}, "
            r"which a run writes",
        ):
            run.lock()
    else:
        run.lock()
        run.release()
    assert sorted(p.name for p in directory.iterdir()) == sorted(
        names | ({".lock"} if copied_run or not theirs else set())
    )
    assert all((directory / name).read_text() == f"mine: {name}\n" for name in names)
    RunDir(directory).lock(resuming=True)  # --resume still reads a directory as it is


def test_a_tokenizer_the_run_reads_may_lie_in_its_new_directory(tmp_path):
    """A run directory prepared with the spm.model that tokenizer.model names was refused as foreign
    (it had trained)."""
    for name in ("given", "other"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "spm.model").write_text("the user's tokenizer\n")
    run = RunDir(tmp_path / "given")
    run.lock(inputs=(tmp_path / "given" / ".." / "given" / "spm.model",))
    run.release()
    with pytest.raises(ConfigError, match="holds spm.model, which a run writes"):
        RunDir(tmp_path / "other").lock(inputs=(tmp_path / "given" / "spm.model",))


@PROPERTY
@given(
    port=st.one_of(st.integers(max_value=-1), st.integers(min_value=65536)),
    wait=st.floats().filter(lambda w: not 0 <= w <= 10_000),
)
def test_serve_refuses_a_port_or_a_wait_it_cannot_use_in_one_line(port, wait):
    """--port 70000 reached bind() and came back as a traceback; --max-wait-ms 1e300 left a lone
    request unanswered."""
    from typer.testing import CliRunner

    from nmt.cli.main import app
    from nmt.serve.api import Limits

    result = CliRunner().invoke(app, ["serve", "--checkpoint", "missing.pt", "--port", str(port)])
    bound = "greater than or equal to 0" if port < 0 else "less than or equal to 65535"
    assert (
        result.exit_code == 2
        and result.output.startswith(f"error: invalid value for '--port': Input should be {bound}")
        and result.output.count("\n") == 1
    )
    with pytest.raises(
        ConfigError, match=r"^--max-wait-ms must be in \[0, 10000\] \(milliseconds\)"
    ):
        Limits(max_wait_ms=wait).check()


@PROPERTY
@given(
    host=st.one_of(
        st.text(max_size=30),
        st.sampled_from(
            ["", " ", "\x00", "localhost\x00", "ü" * 70, "10.99.99.99", "::1", "127.0.0.1"]
        ),
    )
)
def test_serve_names_an_address_it_cannot_listen_on_before_loading_anything(host):
    """A port in use ended uvicorn after the model had loaded, with its exit code 3; an unknown host
    the same. Any --host either can be listened on or is refused in one line naming it, before the
    checkpoint is read."""
    from nmt.cli.commands.serve import check_address
    from nmt.errors import NmtError

    try:
        check_address(host, 0)
    except NmtError as exc:
        assert "--host" in str(exc) or f"cannot listen on {host}:0" in str(exc), exc
        assert "\n" not in str(exc)
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(
            NmtError,
            match=rf"^cannot listen on 127.0.0.1:{port}: Address already in use; choose another "
            r"--port \(0: any free one\)$",
        ):
            check_address("127.0.0.1", port)


@pytest.mark.parametrize("kind", ["fifo", "directory", "dangling link", "link loop"])
def test_a_split_file_that_is_no_file_is_named_for_what_it_is(tmp_path, kind):
    """A FIFO or a directory named train.en was reported as "neither train.en nor train.en.gz
    exists", which pointed at data.train_split; a link to nothing or a loop of links likewise."""
    from nmt.data.corpus import find_split_file

    path = tmp_path / "train.en"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "dangling link":
        path.symlink_to(tmp_path / "gone")
    else:
        path.symlink_to(path)
    expected = {
        "fifo": "not a regular file (a pipe?)",
        "directory": "is a directory, not a text file",
        "dangling link": "a link to nothing (or a loop of links)",
        "link loop": "a link to nothing (or a loop of links)",
    }[kind]
    pattern = (
        rf"^{tmp_path / 'train.en'}: {expected}".replace("(", r"\(")
        .replace(")", r"\)")
        .replace("?", r"\?")
    )
    with pytest.raises(DataError, match=pattern):
        find_split_file(tmp_path, "train", "en")
    # the same words for any input read through check_file (-i, --src, --ref); a FIFO is fine
    # read once
    if kind != "fifo":
        with pytest.raises(DataError, match=pattern):
            corpus.read_lines(path)


@PROPERTY
@given(
    n_layers=st.integers(1, 64), tgt_len=st.integers(1, 100_000), src_len=st.integers(1, 100_000)
)
def test_an_attention_plot_of_any_size_fits_the_pixel_budget(n_layers, tgt_len, src_len):
    """`nmt plot attention` of 300 words asked matplotlib for 23 GB: the figure grew with the pieces
    at 100 dpi."""
    from nmt.tools.plot import MAX_PIXELS, attention_figure

    (width, height), dpi = attention_figure(n_layers, tgt_len, src_len)
    assert 1 <= dpi <= 100 and (width * dpi) * (height * dpi) <= MAX_PIXELS or dpi == 1
    if width * height * 100**2 <= MAX_PIXELS:
        assert dpi == 100  # a plot that fits is drawn at full resolution


@pytest.mark.parametrize(
    "kind", ["directory", "dangling link", "link loop", "over 1 MiB", "fifo", "character device"]
)
def test_a_config_that_is_no_file_is_named_and_one_read_once_is_read(tmp_path, kind):
    """`-c /dev/null` said "does not exist" and `-c /dev/zero` would read forever: a config path is
    named for what it is, read at most 1 MiB, and a pipe (`-c <(...)`) or device is read once, as
    its text."""
    import threading

    from nmt.config import load_config

    path = tmp_path / "config.yaml"
    expected = {
        "directory": "is a directory",
        "dangling link": "is a link to nothing",
        "link loop": "is a link to nothing",
        "over 1 MiB": "larger than 1 MiB, which no config is",
    }.get(kind)
    if kind == "directory":
        path.mkdir()
    elif kind == "dangling link":
        path.symlink_to(tmp_path / "missing.yaml")
    elif kind == "link loop":
        path.symlink_to(path)
    elif kind == "over 1 MiB":
        path.write_text("# " + "x" * (1 << 20) + "\nmodel:\n  preset: tiny\n")
    elif kind == "fifo":
        os.mkfifo(path)
        threading.Thread(
            target=lambda: path.write_text("model:\n  preset: tiny\n"), daemon=True
        ).start()
    else:
        try:
            # the null device: an empty config
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except OSError:
            pytest.skip("cannot make a device node here")
    if expected is None:
        assert load_config(path).model.d_model == (64 if kind == "fifo" else 512)
        return
    with pytest.raises(ConfigError, match=re.escape(expected)):
        load_config(path)


def test_plotting_a_run_that_logged_nothing_yet_says_so(tmp_path):
    """A run stopped before its first log was asked whether it was a run directory at all."""
    (tmp_path / "run").mkdir()
    run = RunDir(tmp_path / "run")
    run.lock()  # what a run stopped while preparing its data leaves
    run.release()
    with pytest.raises(
        DataError, match=r"metrics.jsonl: not found: the run in .* logged nothing yet"
    ):
        read_metrics(tmp_path / "run")
    with pytest.raises(DataError, match=r"metrics.jsonl: not found; is .* a run directory\?"):
        read_metrics(tmp_path)


@pytest.mark.parametrize("given", [".", "..", "./", "sub/.."])
def test_an_export_into_the_current_directory_or_above_it_is_refused_in_one_line(
    tmp_path, monkeypatch, given
):
    """`nmt export CKPT .` raised ValueError ("has an empty name"); exporting there would replace
    the working directory."""
    from nmt.files import OutputError
    from nmt.interop.export import export

    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub" if given == ".." else tmp_path)
    with pytest.raises(
        OutputError,
        match=r"is the current directory or holds it, which an export replaces; give a new "
        r"directory",
    ):
        export("missing.pt", given)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sub"]


def test_a_config_given_as_a_pipe_is_read_once_by_every_reader(tmp_path):
    """`nmt train --resume -c <(...)` read the pipe twice (the config, then the keys it writes): the
    second read was empty, so the keys were dropped in silence and the run stopped as finished."""
    import threading

    from nmt.config import load_config
    from nmt.runs.rundir import _written_keys

    fifo = tmp_path / "config.yaml"
    os.mkfifo(fifo)
    writer = threading.Thread(
        target=lambda: fifo.write_text("train:\n  max_steps: 31\nmodel:\n  dropout: 0.3\n"),
        daemon=True,
    )
    writer.start()
    assert load_config(fifo).train.max_steps == 31
    writer.join(10)
    assert _written_keys(["decode.beam_size=2"], fifo) == [
        ("train", "max_steps"),
        ("model", "dropout"),
        ("decode", "beam_size"),
    ]
