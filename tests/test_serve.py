import asyncio
import errno
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from urllib.parse import urlparse

import httpx
import pytest
import torch
from conftest import ROOT, TOY, tiny_config, translate_lines
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from nmt.config import Config, ConfigError, DataConfig, DecodeConfig, config_to_dict
from nmt.core.model import Transformer
from nmt.data.tokenizer import Tokenizer, train_sentencepiece
from nmt.runs.checkpoint import save_checkpoint, tokenizer_to_tensors
from nmt.serve.api import MAX_BODY_BYTES, Body, RequestError, parse_request
from nmt.serve.app import Limits, Translator, create_app
from nmt.translation.inference import Inference

SENTENCES = [
    "the dog sees a cat .",
    "the big man likes the small house .",
    "a woman .",
    "the old teacher gives the child a red book .",
]


@pytest.fixture(scope="module")
def translator() -> Translator:
    """A random tiny model over a SentencePiece model trained on the shipped corpus (outputs are
    nonsense, but fixed: the server's answers are checked against translate_lines itself)."""
    lines = (TOY / "train.en").read_text(encoding="utf-8").splitlines()[:2000] + (
        TOY / "train.de"
    ).read_text(encoding="utf-8").splitlines()[:2000]
    sp = train_sentencepiece(lines, vocab_size=200)
    torch.manual_seed(0)
    cfg = Config(
        model=tiny_config(src_vocab_size=200, tgt_vocab_size=200, dropout=0.0),
        data=DataConfig(src_lang="en", tgt_lang="de"),
        decode=DecodeConfig(beam_size=4, length_penalty=0.6, max_len_a=1.0, max_len_b=4),
    )
    return Translator(
        Inference([Transformer(cfg.model).eval()], Tokenizer(sp, sp), torch.device("cpu"), cfg),
        "tiny.pt",
        7,
    )


@pytest.fixture(scope="module")
def client(translator):
    with TestClient(
        create_app(
            translator, Limits(max_lines=8, max_input_pieces=40, max_beam_size=6, max_wait_ms=1.0)
        )
    ) as c:
        yield c


async def asgi_call(
    app,
    path: str,
    body: dict | None = None,
    leaves: bool = False,
    uploaded: asyncio.Event | None = None,
    parts: list[bytes] | None = None,
    leaves_after: int | None = None,
) -> list:
    """One request straight to the ASGI ``app`` (GET without ``body``, else a JSON POST); the
    messages it sent back. ``leaves``: the client disconnects right after sending, instead of after
    its answer;
    ``uploaded``: the body arrives only once this event is set (a slow upload); ``parts``: the body
    sent as these chunks instead of ``body``; ``leaves_after``: the client leaves once it has sent
    that many of them."""
    method = "GET" if body is None and parts is None else "POST"
    parts = parts if parts is not None else [json.dumps(body).encode() if body is not None else b""]
    messages = [
        {"type": "http.request", "body": part, "more_body": i + 1 < len(parts)}
        for i, part in enumerate(parts)
    ][:leaves_after]
    leaves = leaves or leaves_after is not None
    sent, done = [], asyncio.Event()

    async def receive():
        if messages:
            if uploaded is not None:
                await uploaded.wait()
            return messages.pop(0)
        if not leaves:
            await done.wait()  # a client that stays: its connection ends after the answer
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            done.set()

    scope = {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(b"content-type", b"application/json")],
        "query_string": b"",
    }
    await app(scope, receive, send)
    return sent


def expected(translator, lines, beam_size, n_best, length_penalty=0.6):
    decode = replace(
        translator.cfg.decode, beam_size=beam_size, n_best=n_best, length_penalty=length_penalty
    )
    results = translate_lines(
        translator.model, translator.tokenizer, lines, decode, translator.device
    )
    return [
        [(translator.tokenizer.decode_tgt([h.tokens])[0], h.score, h.log_prob) for h in hyps]
        for hyps in results
    ]


def as_tuples(translation):
    return [(h["text"], h["score"], h["log_prob"]) for h in translation["n_best"]]


def test_translate_equals_translate_lines_in_input_order(client, translator):
    lines = [SENTENCES[1], "", SENTENCES[0]]
    response = client.post(
        "/translate", json={"text": lines, "beam_size": 3, "n_best": 2, "length_penalty": 1.0}
    )
    assert response.status_code == 200, response.text
    got = response.json()["translations"]
    want = expected(translator, lines, beam_size=3, n_best=2, length_penalty=1.0)
    assert len(got) == 3
    for translation, hyps in zip(got, want):
        assert [t for t, _, _ in as_tuples(translation)] == [t for t, _, _ in hyps]
        assert [s for _, s, _ in as_tuples(translation)] == pytest.approx(
            [s for _, s, _ in hyps], abs=1e-5
        )
        assert [p for _, _, p in as_tuples(translation)] == pytest.approx(
            [p for _, _, p in hyps], abs=1e-5
        )
    # a blank line is not translated
    assert got[1] == {"text": "", "score": 0.0, "log_prob": 0.0, "n_best": []}
    assert (
        got[0]["text"] == got[0]["n_best"][0]["text"]
        and got[0]["score"] >= got[0]["n_best"][1]["score"]
    )


def test_single_string_and_checkpoint_defaults(client, translator):
    response = client.post("/translate", json={"text": SENTENCES[2]})
    assert response.status_code == 200, response.text
    (translation,) = response.json()["translations"]
    assert len(translation["n_best"]) == 1  # n_best defaults to 1, beam_size to the checkpoint's 4
    (hyp,) = expected(translator, [SENTENCES[2]], beam_size=4, n_best=1)[0]
    assert translation["text"] == hyp[0] and translation["score"] == pytest.approx(hyp[1], abs=1e-5)


def test_concurrent_requests_share_batches_and_each_gets_its_own_answer(translator):
    limits = Limits(max_wait_ms=300.0, max_batch_tokens=4096)
    want = {s: expected(translator, [s], beam_size=2, n_best=1)[0][0] for s in SENTENCES}
    with TestClient(create_app(translator, limits)) as c:
        order = SENTENCES * 3
        with ThreadPoolExecutor(len(order)) as pool:
            answers = list(
                pool.map(
                    lambda s: c.post("/translate", json={"text": s, "beam_size": 2}).json()[
                        "translations"
                    ][0],
                    order,
                )
            )
        batches = c.get("/health").json()["batches"]
    for sentence, answer in zip(order, answers):
        assert answer["text"] == want[sentence][0]
        assert answer["score"] == pytest.approx(want[sentence][1], abs=1e-4)
    assert batches < len(order)  # requests that arrived within 300 ms of each other were gathered


def test_token_budget_splits_batches(translator):
    """A budget of one long line's tokens lets no two such requests share a batch."""
    line = SENTENCES[3]
    tokens = len(translator.tokenizer.encode_src([line])[0]) + 1
    with TestClient(
        create_app(
            translator,
            Limits(max_wait_ms=300.0, max_batch_tokens=tokens, max_input_pieces=tokens - 1),
        )
    ) as c:
        with ThreadPoolExecutor(3) as pool:
            answers = list(
                pool.map(
                    lambda _: c.post("/translate", json={"text": line, "beam_size": 1}).status_code,
                    range(3),
                )
            )
        assert answers == [200] * 3 and c.get("/health").json()["batches"] == 3


BAD = [
    (b"{not json", 400, "invalid JSON"),
    (b'["a"]', 422, "JSON object"),
    (b"{}", 422, 'missing field "text"'),
    (b'{"text": 3}', 422, "string or a non-empty list"),
    (b'{"text": []}', 422, "string or a non-empty list"),
    (b'{"text": ["a", null]}', 422, "string or a non-empty list"),
    (b'{"text": "a", "beam": 2}', 422, 'unknown field(s) "beam"'),
    (b'{"text": "a", "beam-size": 2}', 422, '"beam-size" (did you mean beam_size?); known: '),
    (b'{"text": "a", "nbest": 2, "zz": 1}', 422, '"nbest" (did you mean n_best?), "zz"; known'),
    (b'{"text": "a", "beam_size": 0}', 422, "beam_size must be in [1, 6], got 0"),
    (b'{"text": "a", "beam_size": 7}', 422, "beam_size must be in [1, 6], got 7"),
    (b'{"text": "a", "beam_size": "2"}', 422, "beam_size must be an integer"),
    (b'{"text": "a", "beam_size": true}', 422, "beam_size must be an integer"),
    (b'{"text": "a", "beam_size": 2.5}', 422, "beam_size must be an integer"),
    (b'{"text": "a", "beam_size": 2, "n_best": 3}', 422, "n_best must be in [1, 2], got 3"),
    (b'{"text": "a", "length_penalty": "x"}', 422, "length_penalty must be a number"),
    (b'{"text": "a", "length_penalty": NaN}', 422, "length_penalty must be in [-10, 10], got nan"),
    (b'{"text": "a", "length_penalty": -11}', 422, "length_penalty must be in [-10, 10], got -11"),
    (
        json.dumps({"text": ["a"] * 9}).encode(),
        413,
        "9 lines in one request; the limit is 8 (--max-lines)",
    ),
    (json.dumps({"text": ["a", "the dog " * 30]}).encode(), 413, "text[1] has"),
    (b'{"text": "' + b"a" * (1 << 20) + b'"}', 413, "larger than"),
    (b"\xff\xfe", 400, "invalid JSON"),
    (b'{"text": "a", "alignment": "yes"}', 422, 'alignment must be true or false, got "yes"'),
    (b'{"text": "a", "text": "b"}', 422, 'the key "text" appears more than once in one object'),
    (
        b'{"text": ["a"], "ban": [{"x": 1, "x": 2}]}',
        422,
        'the key "x" appears more than once in one object',
    ),
]


@pytest.mark.parametrize("body,status,reason", BAD, ids=[r for _, _, r in BAD])
def test_bad_request_gets_4xx_with_one_line_reason(client, body, status, reason):
    response = client.post("/translate", content=body, headers={"content-type": "application/json"})
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert reason in error and "\n" not in error
    # the server still serves
    assert client.post("/translate", json={"text": "a dog ."}).status_code == 200


def test_alignment_and_attention_equal_the_translate_path(client, translator):
    from nmt.translation.align import format_alignment

    lines = [SENTENCES[3], "", SENTENCES[0]]
    response = client.post(
        "/translate", json={"text": lines, "beam_size": 3, "n_best": 2, "alignment": True}
    )
    assert response.status_code == 200, response.text
    got = response.json()["translations"]
    decode = replace(translator.cfg.decode, beam_size=3, n_best=2)
    want = translate_lines(
        translator.model, translator.tokenizer, lines, decode, translator.device, alignment=True
    )
    assert [[h["alignment"] for h in t["n_best"]] for t in got] == [
        [format_alignment(h.alignment) for h in hyps] for hyps in want
    ]
    assert (
        "attention" not in got[1]
        and "alignment"
        not in client.post("/translate", json={"text": "a dog ."}).json()["translations"][0]
    )
    for line, translation, hyps in zip(lines, got, want):
        if not hyps:
            continue
        attention = translation["attention"]
        src_ids = translator.tokenizer.encode_src([line])[0]
        weights = torch.tensor(attention["weights"])
        assert attention["src_pieces"] == [
            translator.tokenizer.src.id_to_piece(i) for i in src_ids
        ] + ["</s>"]
        # one row per output piece and EOS
        assert weights.shape == (len(hyps[0].tokens) + 1, len(src_ids) + 1)
        # each row a distribution over the source
        assert torch.allclose(weights.sum(1), torch.ones(weights.size(0)), atol=1e-5)
        # The hard alignment is the row-wise argmax of these weights, source EOS excluded.
        assert [
            (int(weights[j, : len(src_ids)].argmax()), j) for j in range(len(hyps[0].tokens))
        ] == list(hyps[0].alignment)


def test_wrong_method_and_path_are_answered_in_the_apis_error_shape(client):
    """They were plain text where every other error is {"error": "one line"}."""
    wrong = client.get("/translate")
    assert (
        wrong.status_code == 405
        and wrong.json() == {"error": "GET /translate: Method Not Allowed"}
        and wrong.headers["allow"] == "POST"
    )
    missing = client.post("/nothing", json={})
    assert missing.status_code == 404 and missing.json() == {"error": "POST /nothing: Not Found"}


def test_model_error_is_500_for_that_request_only(translator, monkeypatch):
    with TestClient(create_app(translator, Limits(max_wait_ms=0.0))) as c:
        monkeypatch.setattr(
            translator,
            "translate",
            lambda *args: (_ for _ in ()).throw(RuntimeError("out of memory")),
        )
        failed = c.post("/translate", json={"text": "a dog ."})
        monkeypatch.undo()
        assert (
            failed.status_code == 500
            and failed.json()["error"] == "translation failed: RuntimeError: out of memory"
        )
        assert c.post("/translate", json={"text": "a dog ."}).status_code == 200


def test_lines_of_unknown_characters_or_no_text_are_answered_empty_and_counted(client, translator):
    before = client.get("/health").json()["untranslated_lines"]
    response = client.post(
        "/translate", json={"text": ["😀😀😀", SENTENCES[2], "\u202e\u200b", ""]}
    )
    assert response.status_code == 200
    first, second, third, fourth = response.json()["translations"]
    assert (
        first == third == fourth == {"text": "", "score": 0.0, "log_prob": 0.0, "n_best": []}
        and second["text"]
    )
    after = client.get("/health").json()["untranslated_lines"]
    # a blank line is not counted
    assert after == {"unknown_only": before["unknown_only"] + 1, "no_text": before["no_text"] + 1}
    # the per-line warnings are counted there too, past the ten the log names
    warned = client.get("/health").json()["warned_lines"]
    assert warned["only text the vocabulary lacks"] >= 1 and warned["no text to translate"] >= 1
    for _ in range(12):
        client.post("/translate", json={"text": "the 3 dogs ."})
    again = client.get("/health").json()["warned_lines"]
    assert again["text the model's vocabulary lacks"] >= 12


def test_health_and_info(client, translator):
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["device"] == "cpu" and health["dtype"] == "float32"
    assert (
        health["checkpoint"] == "tiny.pt"
        and health["checkpoint_step"] == 7
        and health["queued_requests"] == health["running_requests"] == 0
    )
    info = client.get("/info").json()
    assert (info["src_lang"], info["tgt_lang"]) == ("en", "de")
    assert info["tokenizer"] == {
        "type": "bpe",
        "joint": True,
        "src_vocab_size": 200,
        "tgt_vocab_size": 200,
    }
    assert info["config"]["model"]["d_model"] == 32 and info["config"]["decode"]["beam_size"] == 4
    assert info["limits"] == {
        "max_batch_tokens": 4096,
        "max_wait_ms": 1.0,
        "max_input_pieces": 40,
        "max_lines": 8,
        "max_beam_size": 6,
        "max_queued_requests": 256,
    }


def test_page_is_self_contained(client):
    response = client.get("/")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/html")
    page = response.text
    assert 'id="translate"' in page and 'id="source"' in page and 'id="nbest"' in page
    assert "http://" not in page and "https://" not in page  # nothing fetched from elsewhere


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    name=st.sampled_from(
        [
            "max_batch_tokens",
            "max_input_pieces",
            "max_lines",
            "max_beam_size",
            "max_queued_requests",
            "max_wait_ms",
        ]
    ),
    value=st.one_of(
        st.integers(-5, 3000),
        st.integers(2**31 - 3, 2**31 + 3),
        st.integers(10**19, 10**21),
        st.floats(-1e300, 1e300),
    ),
)
def test_any_limit_is_refused_by_its_flag_or_every_request_it_admits_is_answered(
    translator, name, value
):
    """--max-beam-size 2000 was accepted, and a request for beam 1,500 then got a bare 500 from the
    search's own range check; --max-input-pieces above the checkpoint's decode.max_input_pieces let
    lines in that came back empty. Every limit is in its search setting's range or refused naming
    its flag, and a request at the limits is parsed."""
    from nmt.serve.api import RequestError, parse_request

    if name != "max_wait_ms":
        value = int(value)
    limits = replace(Limits(max_batch_tokens=2**31 - 1), **{name: value})
    try:
        limits.check()
    except ConfigError as exc:
        assert str(exc).startswith(
            f"--{name.replace('_', '-')} must be"
        ) or "--max-batch-tokens (" in str(exc), exc
        return
    line = "the dog sees a cat ."
    body = {
        "text": [line] * min(limits.max_lines, 3),
        "beam_size": limits.max_beam_size,
        "n_best": limits.max_beam_size,
    }
    if len(translator.tokenizer.encode_src([line])[0]) > limits.max_input_pieces:
        with pytest.raises(RequestError, match=r"--max-input-pieces") as refused:
            parse_request(json.dumps(body).encode(), translator, limits)
        assert refused.value.status == 413
        return
    job = parse_request(json.dumps(body).encode(), translator, limits)
    assert (
        job.decode.beam_size == limits.max_beam_size
        and job.decode.max_input_pieces == limits.max_input_pieces
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def checkpoint(translator, tmp_path_factory):
    path = tmp_path_factory.mktemp("serve") / "tiny.pt"
    payload = {
        "model": translator.model.state_dict(),
        "config": config_to_dict(translator.cfg),
        "tokenizer": tokenizer_to_tensors(translator.tokenizer.protos()),
        "progress": {"step": 7},
    }
    save_checkpoint(payload, path)
    return path


def start_server(checkpoint, *flags, output=subprocess.PIPE, preexec_fn=None):
    """``nmt serve`` on ``checkpoint`` in a child process with ``flags``, its log to ``output``
    (a pipe, or an open file), ``preexec_fn`` run in the child before it starts; the process and
    its URL once ``/health`` answers (within 60 s)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "nmt",
            "serve",
            "--checkpoint",
            str(checkpoint),
            "--port",
            str(port),
            "--threads",
            "1",
            *flags,
        ],
        stdout=output,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
        preexec_fn=preexec_fn,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            time.sleep(0.1)
        if proc.poll() is not None:
            break
    proc.kill()
    pytest.fail(f"server did not start: {proc.communicate()[0]}")


class HandDrivenLoop:
    """What :class:`~nmt.serve.process.AcceptShortage` uses of an event loop (its clock, timers and
    default exception handler), driven by hand."""

    def __init__(self):
        self.now, self.timers, self.defaulted = 0.0, [], []

    def time(self) -> float:
        return self.now

    def call_later(self, delay: float, callback, *args) -> None:
        self.timers.append((self.now + delay, callback, args))

    def default_exception_handler(self, context: dict) -> None:
        self.defaulted.append(context)

    def advance(self, to: float) -> None:
        """Run the timers due by ``to``, in time order, and set the clock to it."""
        while due := [t for t in self.timers if t[0] <= to]:
            timer = min(due, key=lambda t: t[0])
            self.timers.remove(timer)
            self.now = timer[0]
            timer[1](*timer[2])
        self.now = to


@settings(max_examples=200, deadline=None)
@given(
    # seconds before each report: within an episode (asyncio retries every second, and tries the
    # whole backlog at once), or after the quiet that ends one
    gaps=st.lists(st.floats(0, 2.0) | st.floats(3.0, 400.0), min_size=1, max_size=60),
    kinds=st.lists(st.sampled_from(["EMFILE", "ENFILE", "ENOBUFS", "other"]), min_size=1),
)
def test_running_short_of_descriptors_is_one_line_an_episode_and_a_line_a_minute_at_most(
    gaps, kinds
):
    """However the failures come, each episode is a line when it starts and one when it ends (with
    the count of its failures), and at most one in between a minute; every other report of the loop
    goes to its default handler."""
    from nmt.serve.process import AcceptShortage

    loop, handler = HandDrivenLoop(), AcceptShortage(every_s=60.0, quiet_s=2.5)
    records: list[logging.LogRecord] = []
    catcher = logging.Handler()
    catcher.emit = records.append
    logger = logging.getLogger("nmt.serve")
    logger.addHandler(catcher)
    at, episodes, shortages, others = 0.0, [], 0, 0
    try:
        for i, gap in enumerate(gaps):
            kind = kinds[i % len(kinds)]
            at += gap
            loop.advance(at)
            code = getattr(errno, kind, errno.ECONNABORTED)
            context = {"message": "m", "exception": OSError(code, os.strerror(code)), "socket": 6}
            handler(loop, context)
            if kind == "other":
                others += 1
                continue
            if not episodes or at - episodes[-1][1] > 2.5:
                episodes.append([at, at, 0])
            episodes[-1][1:] = [at, episodes[-1][2] + 1]
            shortages += 1
        handler(loop, {"message": "not about accept", "exception": ValueError("x")})
        loop.advance(at + 10)
    finally:
        logger.removeHandler(catcher)
    assert len(loop.defaulted) == others + 1
    lines = [r.getMessage() for r in records]
    assert all(r.levelno == logging.WARNING and not r.exc_info for r in records)
    starts = [m for m in lines if m.startswith("warning: cannot accept connections")]
    ends = [m for m in lines if m.startswith("warning: accepting connections again")]
    assert len(starts) == len(ends) == len(episodes), lines
    counts = [int(re.search(r"in which ([\d,]+) attempts", m)[1].replace(",", "")) for m in ends]
    assert counts == [n for _, _, n in episodes]
    assert sum(counts) == shortages
    assert len(lines) <= sum(2 + (last - first) // 60 for first, last, _ in episodes), lines


@pytest.mark.slow
@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_NOFILE is a POSIX limit")
def test_out_of_descriptors_is_logged_once_and_service_resumes_when_they_free_up(
    checkpoint, tmp_path
):
    """At its file-descriptor limit the server cannot accept connections. That costs a few log
    lines, not a line and a traceback per failed accept (asyncio's accept loop tries the whole
    listen backlog before it pauses: thousands a second), and it answers again once clients close
    their connections."""
    import resource

    def few_descriptors():
        resource.setrlimit(resource.RLIMIT_NOFILE, (32, 32))

    log_path = tmp_path / "serve.log"
    with open(log_path, "w") as log_file:
        proc, url = start_server(checkpoint, output=log_file, preexec_fn=few_descriptors)
    port = int(url.rsplit(":", 1)[1])
    held = []
    try:
        # more connections than descriptors: the rest wait in the listen queue
        held = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(60)]
        time.sleep(3)  # three of asyncio's one-second pauses between attempts to accept
        assert log_path.stat().st_size < 100_000, log_path.read_text()[:3000]
        for s in held:
            s.close()
        response = httpx.post(f"{url}/translate", json={"text": SENTENCES[0]}, timeout=10)
        assert response.status_code == 200, response.text
        deadline = time.monotonic() + 10
        while "accepting connections again" not in log_path.read_text():
            assert time.monotonic() < deadline, log_path.read_text()[-3000:]
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        for s in held:
            s.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = log_path.read_text()
    assert "Traceback" not in output, output[:3000]
    about_it = [line for line in output.splitlines() if "accept" in line]
    assert len(about_it) == 2, output
    assert "cannot accept connections" in about_it[0] and "ulimit -n: 32" in about_it[0], about_it


@pytest.mark.slow
def test_sigterm_finishes_the_request_in_flight_and_exits_0(checkpoint, translator):
    proc, url = start_server(checkpoint, "--max-wait-ms", "0")
    try:
        # A client that sends a request and leaves before the answer costs the server nothing.
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as s:
            body = json.dumps({"text": SENTENCES}).encode()
            s.sendall(
                b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: "
                b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
        deadline = time.monotonic() + 60
        while (health := httpx.get(f"{url}/health", timeout=10).json())["batches"] == 0 or health[
            "running_requests"
        ]:
            assert time.monotonic() < deadline, "the abandoned request was never translated"
            time.sleep(0.02)
        # Nor does one that leaves halfway through its body: one line in the log, no traceback
        # (asserted below).
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1]))) as s:
            s.sendall(
                b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: "
                b"application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body[:9])
            )
            # admitted, its body not yet whole
            while httpx.get(f"{url}/health", timeout=10).json()["queued_requests"] == 0:
                assert time.monotonic() < deadline, "the half-sent request was never admitted"
                time.sleep(0.02)

        # 4 lines of 250 pieces, beam 4: the translation takes seconds, so it is
        # still running when SIGTERM arrives right after /health reports it started.
        line = translator.tokenizer.src.decode(
            translator.tokenizer.encode_src([" ".join(SENTENCES * 20)])[0][:250]
        )
        assert len(translator.tokenizer.encode_src([line])[0]) <= 256
        lines = [line] * 4
        answer: dict = {}

        def ask():
            answer["response"] = httpx.post(
                f"{url}/translate", json={"text": lines, "beam_size": 4}, timeout=120
            )
            answer["at"] = time.monotonic()

        asker = threading.Thread(target=ask)
        asker.start()
        while httpx.get(f"{url}/health", timeout=10).json()["running_requests"] == 0:
            assert asker.is_alive(), "the request was answered before it was seen running"
            time.sleep(0.02)
        terminated_at = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        asker.join(timeout=120)
        output = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output
    response = answer["response"]
    assert response.status_code == 200 and len(response.json()["translations"]) == 4
    assert answer["at"] > terminated_at  # answered after the signal, not before it
    assert "Shutting down" in output and "Traceback" not in output
    assert re.search(r"POST /translate 499 0 lines 0 tokens \d+ ms", output), output


def test_serve_cli_errors_are_one_line_exit_2(tmp_path):
    from typer.testing import CliRunner

    from nmt.cli.main import app

    runner = CliRunner()
    missing = runner.invoke(app, ["serve", "--checkpoint", str(tmp_path / "none.pt")])
    assert (
        missing.exit_code == 2
        and "not found" in missing.output
        and len(missing.output.strip().splitlines()) == 1
    )
    limits = runner.invoke(
        app, ["serve", "--checkpoint", str(tmp_path / "none.pt"), "--max-lines", "0"]
    )
    assert (
        limits.exit_code == 2 and "--max-lines must be in [1, 2147483647], got 0" in limits.output
    )


def find_chromium() -> str | None:
    return next(
        (p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None
    )


def behind_prefix(app, prefix: str):
    """``app`` as a reverse proxy serves it under ``prefix`` (nginx's ``location /mt/ { proxy_pass
    http://127.0.0.1:8000/; }``): the prefix is taken off each request's path, and a request for a
    path outside it is answered 404 without reaching ``app``."""

    async def proxy(scope, receive, send):
        if scope["type"] == "http":
            if scope["path"] != prefix and not scope["path"].startswith(prefix + "/"):
                await send({"type": "http.response.start", "status": 404, "headers": []})
                return await send({"type": "http.response.body", "body": b"outside the prefix"})
            path = scope["path"][len(prefix) :] or "/"
            scope = {**scope, "path": path, "raw_path": path.encode()}
        await app(scope, receive, send)

    return proxy


@pytest.mark.slow
def test_page_in_a_real_browser(translator):
    """Load the page in headless chromium, type, click Translate, read the translation off the page.
    The server is behind a reverse proxy that serves it under a prefix: the page's requests went to
    absolute paths (/info, /translate), past the prefix; every request it makes now stays under it,
    loaded with its trailing slash or without."""
    executable = find_chromium()
    if executable is None:
        pytest.skip(
            "no chromium on PATH: install Debian's chromium package (apt-get install chromium) to "
            "run the browser test"
        )
    import uvicorn
    from playwright.sync_api import sync_playwright

    port, prefix = free_port(), "/mt/v1"
    app = behind_prefix(create_app(translator, Limits(max_beam_size=6)), prefix)
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        want = expected(translator, SENTENCES[:2], beam_size=3, n_best=2)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
            page = browser.new_page()
            requested = []
            page.on("request", lambda request: requested.append(urlparse(request.url).path))
            page.goto(f"http://127.0.0.1:{port}{prefix}/")
            page.wait_for_function("document.getElementById('pair').textContent.includes('→')")
            assert page.text_content("#pair") == "en → de"
            page.fill("#source", "\n".join(SENTENCES[:2]))
            page.fill("#beam_size", "3")
            page.fill("#n_best", "2")
            page.click("#translate")
            page.wait_for_function("document.getElementById('translation').textContent.length > 0")
            assert page.text_content("#translation") == "\n".join(hyps[0][0] for hyps in want)
            rows = page.locator("#nbest tbody tr")
            assert rows.count() == 4
            assert rows.nth(1).locator("td").nth(2).text_content() == want[0][1][0]
            assert float(rows.nth(1).locator("td").nth(3).text_content()) == pytest.approx(
                want[0][1][1], abs=1e-4
            )
            page.check("#alignment")
            page.click("#translate")
            page.wait_for_function("document.querySelectorAll('#heatmaps table').length === 2")
            first = page.locator("#heatmaps table").first
            src_pieces = [
                translator.tokenizer.src.id_to_piece(i)
                for i in translator.tokenizer.encode_src([SENTENCES[0]])[0]
            ] + ["</s>"]
            assert first.locator("thead th.src").all_text_contents() == src_pieces
            decode = replace(translator.cfg.decode, beam_size=3, n_best=2)
            best = translate_lines(
                translator.model, translator.tokenizer, SENTENCES[:1], decode, translator.device
            )[0][0]
            # one row per output piece and EOS
            assert first.locator("tbody tr").count() == len(best.tokens) + 1
            assert first.locator("tbody td").count() == (len(best.tokens) + 1) * len(src_pieces)
            page.uncheck("#alignment")
            page.fill("#prefix", "die ")
            page.fill("#constraints", "Haus; Mann")
            page.click("#translate")
            page.wait_for_function(
                "document.getElementById('translation').textContent.startsWith('die ')"
            )
            steered = page.text_content("#translation").split("\n")
            assert all(t.startswith("die ") and "Haus" in t and "Mann" in t for t in steered), (
                steered
            )
            page.fill("#beam_size", "99")
            page.click("#translate")
            page.wait_for_function("document.getElementById('error').textContent.length > 0")
            assert "beam_size must be in [1, 6], got 99" in page.text_content("#error")
            page.goto(f"http://127.0.0.1:{port}{prefix}")  # without the trailing slash
            page.wait_for_function("document.getElementById('pair').textContent.includes('→')")
            browser.close()
        assert {f"{prefix}/", f"{prefix}/info", f"{prefix}/translate", prefix} <= set(requested)
        assert all(path == prefix or path.startswith(f"{prefix}/") for path in requested), requested
    finally:
        server.should_exit = True
        thread.join(timeout=30)


def test_a_checkpoint_is_read_once_and_its_step_served(checkpoint, tmp_path, monkeypatch):
    """The server read its checkpoint whole a second time for the step: twice the time, and a run
    directory's warning (another run's best.pt) said twice. A checkpoint without a step (an
    import) serves none."""
    import nmt.runs.checkpoint

    reads, check = [], nmt.runs.checkpoint.check_payload
    monkeypatch.setattr(
        nmt.runs.checkpoint, "check_payload", lambda *args: reads.append(args[1]) or check(*args)
    )
    assert Translator.load([checkpoint], torch.device("cpu"), torch.float32).step == 7
    assert reads == [checkpoint]
    payload = torch.load(checkpoint, weights_only=True)
    del payload["progress"]
    save_checkpoint(payload, tmp_path / "imported.pt")
    assert (
        Translator.load([tmp_path / "imported.pt"], torch.device("cpu"), torch.float32).step is None
    )


def test_int8_loads_through_the_translate_dtype_path(checkpoint, translator):
    """``nmt serve --dtype int8`` once crashed at start (``nn.Module.to`` with ``torch.qint8``)."""
    from nmt.translation.inference import Inference

    int8 = Translator.load([checkpoint], torch.device("cpu"), torch.qint8)
    assert int8.dtype == "int8" and any(
        isinstance(m, torch.ao.nn.quantized.dynamic.Linear) for m in int8.model.modules()
    )
    decode = replace(translator.cfg.decode, beam_size=2)
    loaded = Inference.load([checkpoint], torch.device("cpu"), torch.qint8)
    expected, tokenizer = loaded.model, loaded.tokenizer
    assert [h.tokens for h in int8.translate(SENTENCES[:2], decode)[0]] == [
        h.tokens
        for h in translate_lines(expected, tokenizer, SENTENCES[:2], decode, torch.device("cpu"))[0]
    ]
    with TestClient(create_app(int8, Limits(max_wait_ms=0.0))) as c:
        assert c.get("/health").json()["dtype"] == "int8"
        assert c.post("/translate", json={"text": SENTENCES[0]}).status_code == 200


def test_a_lone_surrogate_gets_a_json_4xx(client):
    r"""``"\ud800"`` once gave a plain-text 500 (the tokenizer could not encode it)."""
    for body in (
        b'{"text": "a \\ud800 b"}',
        b'{"text": ["ok", "\\udfff"]}',
        b'{"text": "a", "\\ud800": 1}',
    ):
        response = client.post(
            "/translate", content=body, headers={"content-type": "application/json"}
        )
        assert response.status_code == 422 and "\n" not in response.json()["error"], response.text
    assert (
        "lone UTF-16 surrogate ('\\ud800') at character 2"
        in client.post("/translate", content=b'{"text": "a \\ud800 b"}').json()["error"]
    )


JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=True)
    | st.text(st.characters(), max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELD_VALUES = st.fixed_dictionaries(
    {},
    optional={
        "text": JSON
        | st.text(st.characters(), max_size=40)
        | st.lists(st.text(st.characters(), max_size=30), min_size=1, max_size=3),
        "beam_size": JSON | st.integers(-2, 8),
        "n_best": JSON | st.integers(-2, 8),
        "length_penalty": JSON,
        "alignment": JSON,
        "prefix": JSON | st.text(max_size=10),
        "constraints": JSON | st.lists(st.text(max_size=8), max_size=3),
        "ban": JSON | st.lists(st.text(max_size=8), max_size=3),
    },
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=FIELD_VALUES | JSON)
def test_any_json_request_gets_a_json_answer(client, body):
    """Random JSON (valid fields with random values, random documents): 200 or a 4xx, always
    JSON."""
    # \\uXXXX escapes: lone surrogates travel as JSON allows
    raw = json.dumps(body, ensure_ascii=True).encode()
    response = client.post("/translate", content=raw, headers={"content-type": "application/json"})
    assert response.status_code == 200 or 400 <= response.status_code < 500, response.text
    answer = response.json()
    if response.status_code == 200:
        texts = body["text"] if isinstance(body["text"], list) else [body["text"]]
        assert len(answer["translations"]) == len(texts) and all(
            "\n" not in t["text"] for t in answer["translations"]
        )
    else:
        assert "\n" not in answer["error"]


def test_each_request_is_logged_in_one_line(client, caplog):
    with caplog.at_level("INFO", logger="nmt.serve"):
        client.post("/translate", json={"text": [SENTENCES[0], SENTENCES[2]]})
        client.post("/translate", json={"text": "a", "n_best": 99})
    first, refused = [r.getMessage() for r in caplog.records if r.name == "nmt.serve"]
    assert re.fullmatch(r"POST /translate 200 2 lines \d+ tokens \d+ ms", first) and re.fullmatch(
        r"POST /translate 422 0 lines 0 tokens \d+ ms", refused
    )


def test_prefix_constraints_and_bans_per_line_equal_the_translate_path(client, translator):
    from nmt.translation.steering_text import steering

    body = {
        "text": [SENTENCES[0], SENTENCES[2]],
        "beam_size": 3,
        "n_best": 2,
        "prefix": ["die ", ""],
        "constraints": [["Haus"], []],
        "ban": [[], ["der"]],
    }
    response = client.post("/translate", json=body)
    assert response.status_code == 200, response.text
    decode = replace(translator.cfg.decode, beam_size=3, n_best=2)
    wishes = [
        steering(translator.tokenizer, "die ", ["Haus"]),
        steering(translator.tokenizer, bans=["der"]),
    ]
    want = translate_lines(
        translator.model,
        translator.tokenizer,
        body["text"],
        decode,
        translator.device,
        steering=wishes,
    )
    got = response.json()["translations"]
    assert [[e["text"] for e in t["n_best"]] for t in got] == [
        translator.tokenizer.decode_tgt([h.tokens for h in hyps]) for hyps in want
    ]
    # The best holds the term; a lower entry may be one the length limit cut short of it (ranked
    # after those that hold it).
    assert (
        all(e["text"].startswith("die ") for e in got[0]["n_best"])
        and "Haus" in got[0]["n_best"][0]["text"]
    )
    single = client.post(
        "/translate",
        json={"text": SENTENCES[1], "prefix": "der ", "constraints": ["Haus"], "ban": ["klein"]},
    )
    assert single.status_code == 200 and single.json()["translations"][0]["text"].startswith("der ")


@pytest.mark.parametrize(
    "body,reason",
    [
        ({"text": "a", "prefix": ["x"]}, "prefix must be a string"),
        (
            {"text": ["a", "b"], "constraints": [["x"]]},
            "constraints must be a list of strings, or a list of 2 of them, one per line of text",
        ),
        ({"text": ["a"], "ban": [[3]]}, "ban[0] must be a list of strings, got [3]"),
        ({"text": "a", "constraints": ["x"] * 17}, "constraints has 17 phrases; the limit is 16"),
        # a constrained search's state grows with their pieces
        ({"text": ["a"], "constraints": [[SENTENCES[3]] * 8]}, "constraints[0] hold 1"),
        ({"text": "a", "prefix": "\ud800"}, "prefix holds a lone UTF-16 surrogate"),
    ],
)
def test_steering_fields_of_the_wrong_shape_get_one_line(client, body, reason):
    response = client.post(
        "/translate",
        content=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    assert response.status_code in (413, 422) and reason in response.json()["error"], response.text


def test_a_request_whose_client_has_gone_is_not_translated(translator, monkeypatch):
    """Clients that timed out once had their lines translated anyway, ahead of everyone queued
    behind them: a request whose connection closes while it waits for its batch is dropped, and
    logged as 499."""
    calls = []
    real = translator.translate
    monkeypatch.setattr(
        translator,
        "translate",
        lambda lines, *args: calls.append(list(lines)) or real(lines, *args),
    )
    app = create_app(translator, Limits(max_wait_ms=300.0))

    async def main():
        async with app.router.lifespan_context(app):
            return await asyncio.gather(
                asgi_call(app, "/translate", {"text": ["the dog sees a cat ."]}, leaves=True),
                asgi_call(app, "/translate", {"text": ["a woman ."]}),
            )

    gone, stayed = asyncio.run(main())
    assert gone[0]["status"] == 499 and stayed[0]["status"] == 200
    assert calls == [["a woman ."]]  # the gone client's line never reached the model
    assert [t["text"] for t in json.loads(stayed[1]["body"])["translations"]] == [
        expected(translator, ["a woman ."], 4, 1)[0][0][0]
    ]


def test_requests_beyond_the_queue_limit_are_refused_at_once_and_the_rest_answered(
    translator, monkeypatch
):
    """An unbounded queue let clients that stay connected pile up memory and wait past their
    timeouts: with ``max_queued_requests`` waiting, the next request is answered 503 with
        Retry-After at once,
    and every request already queued is still translated."""
    release, started, calls = threading.Event(), threading.Event(), []
    real = translator.translate

    def blocked(lines, *args):
        calls.append(list(lines))
        started.set()
        release.wait(30)
        return real(lines, *args)

    monkeypatch.setattr(translator, "translate", blocked)
    app = create_app(translator, Limits(max_wait_ms=0.0, max_queued_requests=2))

    async def main():
        async with app.router.lifespan_context(app):
            running = asyncio.ensure_future(asgi_call(app, "/translate", {"text": [SENTENCES[0]]}))
            # the worker holds the first request
            await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
            queued = [
                asyncio.ensure_future(asgi_call(app, "/translate", {"text": [line]}))
                for line in SENTENCES[1:3]
            ]
            for _ in range(1000):  # bounded: until both wait in the queue
                if json.loads((await asgi_call(app, "/health"))[1]["body"])["queued_requests"] == 2:
                    break
                await asyncio.sleep(0.01)
            # while the worker is still blocked
            refused = await asyncio.wait_for(
                asgi_call(app, "/translate", {"text": [SENTENCES[3]]}), 10
            )
            release.set()
            return await running, [await q for q in queued], refused

    running, queued, refused = asyncio.run(main())

    # admitted requests whose bodies have not arrived count as waiting too
    async def slow_uploads():
        # a new server: the first has shut down
        app = create_app(translator, Limits(max_wait_ms=0.0, max_queued_requests=2))
        async with app.router.lifespan_context(app):
            release.clear()
            started.clear()
            running = asyncio.ensure_future(asgi_call(app, "/translate", {"text": [SENTENCES[0]]}))
            await asyncio.get_running_loop().run_in_executor(None, started.wait, 30)
            uploaded = asyncio.Event()
            slow = [
                asyncio.ensure_future(
                    asgi_call(app, "/translate", {"text": [line]}, uploaded=uploaded)
                )
                for line in SENTENCES[1:3]
            ]
            await asyncio.sleep(0.05)  # both admitted, neither body arrived
            refused = await asyncio.wait_for(
                asgi_call(app, "/translate", {"text": [SENTENCES[3]]}), 10
            )
            uploaded.set()
            release.set()
            return await running, [await q for q in slow], refused

    assert refused[0]["status"] == 503 and (b"retry-after", b"1") in refused[0]["headers"]
    assert (
        "2 requests wait for a batch (--max-queued-requests)"
        in json.loads(refused[1]["body"])["error"]
    )
    assert [r[0]["status"] for r in [running, *queued]] == [200, 200, 200]
    # the refused line never reached the model
    assert [line for batch in calls for line in batch] == SENTENCES[:3]
    calls.clear()
    late_running, late_queued, late_refused = asyncio.run(slow_uploads())
    assert late_refused[0]["status"] == 503 and [
        r[0]["status"] for r in [late_running, *late_queued]
    ] == [200, 200, 200]
    assert sorted(line for batch in calls for line in batch) == sorted(SENTENCES[:3])


def test_alignment_answers_are_bounded_by_the_weights_they_could_hold(translator, monkeypatch):
    """A 49 KB request with alignment asked for 64 lines of 254 pieces and got a 136 MB answer. By
    hand: a line of n pieces is n + 1 source positions (EOS) and at most max_len_a · (n + 1) +
        max_len_b + 1 output rows (1.0 and 4 here)."""
    import nmt.serve.api
    from nmt.serve.api import RequestError, parse_request

    n = len(translator.tokenizer.encode_src([SENTENCES[1]])[0])
    weights = 2 * (n + 1) * ((n + 1) + 4 + 1)
    body = json.dumps({"text": [SENTENCES[1]] * 2, "alignment": True}).encode()
    monkeypatch.setattr(nmt.serve.api, "MAX_ATTENTION_WEIGHTS", weights)
    assert parse_request(body, translator, Limits()).alignment
    monkeypatch.setattr(nmt.serve.api, "MAX_ATTENTION_WEIGHTS", weights - 1)
    with pytest.raises(
        RequestError,
        match=rf"could hold {weights:,} weights; the limit is {weights - 1:,}: send fewer or "
        r"shorter lines",
    ) as refused:
        parse_request(body, translator, Limits())
    assert refused.value.status == 413
    # without alignment: no such bound
    parse_request(json.dumps({"text": [SENTENCES[1]] * 2}).encode(), translator, Limits())
    # a prefix longer than the limit
    prefixed = {
        "text": [SENTENCES[1]] * 2,
        "alignment": True,
        "prefix": [" ".join(SENTENCES * 2)] * 2,
    }
    monkeypatch.setattr(nmt.serve.api, "MAX_ATTENTION_WEIGHTS", 10**9)
    steered = parse_request(json.dumps(prefixed).encode(), translator, Limits()).steering[0]
    # the whole words, and at most a piece for each state of the cut last one
    forced = len(steered.prefix) + len(steered.fragment)
    assert forced > n + 1  # so the output limit grows to hold it, and the bound with it
    monkeypatch.setattr(nmt.serve.api, "MAX_ATTENTION_WEIGHTS", weights)
    with pytest.raises(
        RequestError, match=rf"could hold {2 * (n + 1) * (forced + 4 + 1):,} weights"
    ):
        parse_request(json.dumps(prefixed).encode(), translator, Limits())


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    alpha=st.floats(-10, 10), beam=st.integers(1, 6), asked=st.one_of(st.none(), st.floats(-12, 12))
)
def test_a_checkpoint_setting_in_its_configs_range_is_served_and_requests_are_judged_by_it(
    translator, alpha, beam, asked
):
    """A checkpoint whose own decode.length_penalty was negative (the config allows it, tune-decode
    may choose it) was answered 422 on every request: the server checked it against a narrower range
    of its own."""
    from nmt.config import LENGTH_PENALTY
    from nmt.serve.api import RequestError, parse_request

    served = replace(
        translator,
        inference=replace(
            translator.inference,
            cfg=replace(
                translator.cfg,
                decode=replace(translator.cfg.decode, length_penalty=alpha, beam_size=beam),
            ),
        ),
    )
    # JSON's 1.0 is the integer 1
    body = {
        "text": "a dog .",
        **({"length_penalty": asked} if asked is not None else {}),
        "n_best": 1.0,
    }
    if asked is None or asked in LENGTH_PENALTY:
        job = parse_request(json.dumps(body).encode(), served, Limits())
        assert (
            job.decode.length_penalty == (alpha if asked is None else asked)
            and job.decode.n_best == 1
        )
    else:
        with pytest.raises(RequestError, match=r"^length_penalty must be in \[-10, 10\]"):
            parse_request(json.dumps(body).encode(), served, Limits())


def compressed(data: bytes, coding: str, empty_blocks: int = 0) -> bytes:
    """``data`` as a client sends it with ``Content-Encoding: coding`` (deflate is zlib's format,
    RFC 9110 §8.4.1.2), after ``empty_blocks`` empty deflate blocks, which decompress to nothing."""
    if coding.strip().lower() in ("", "identity"):
        return data
    stream = zlib.compressobj(6, zlib.DEFLATED, 31 if "gzip" in coding.lower() else 15)
    # the header and one empty stored block
    head = stream.compress(b"") + stream.flush(zlib.Z_SYNC_FLUSH)
    return head + b"\x00\x00\x00\xff\xff" * empty_blocks + stream.compress(data) + stream.flush()


def chunked(data: bytes, cuts: list[int]) -> list[bytes]:
    """``data`` cut at ``cuts`` (taken modulo its length) into the chunks a client sends it in."""
    points = sorted({cut % (len(data) + 1) for cut in cuts})
    return [data[a:b] for a, b in zip([0, *points], [*points, len(data)])]


def read_body(coding: str, parts: list[bytes]) -> bytes | RequestError:
    try:
        body = Body(coding)
        for part in parts:
            body.add(part)
        return bytes(body.finish())
    except RequestError as exc:
        return exc


ACCEPTED = ["gzip", "deflate", "x-gzip", "GZip", " deflate ", "identity", ""]


@settings(max_examples=60, deadline=None)
@given(
    unit=st.binary(min_size=1, max_size=3),
    size=st.integers(0, 3000)
    | st.integers(MAX_BODY_BYTES - 2, MAX_BODY_BYTES + 2)
    | st.integers(0, 3 * MAX_BODY_BYTES),
    coding=st.sampled_from(ACCEPTED),
    empty_blocks=st.integers(0, 2) | st.just(MAX_BODY_BYTES // 5 + 1),
    damage=st.sampled_from(["none", "cut", "extra", "mislabelled"]),
    cuts=st.lists(st.integers(0, 2**21), max_size=4),
)
def test_a_compressed_body_reads_as_sent_within_the_limit_both_as_sent_and_decompressed(
    unit, size, coding, empty_blocks, damage, cuts
):
    """A gzip body was read as JSON bytes and refused as invalid JSON. Any body, in any chunks, in
    each accepted coding, reads as the bytes compressed; MAX_BODY_BYTES holds both for the bytes
    sent (a stream of empty blocks decompresses to nothing however long) and for the bytes they
    decompress to (a bomb: a few kilobytes of one repeated byte); a damaged stream is a 400."""
    data = (unit * (size // len(unit) + 1))[:size]
    plain = coding.strip().lower() in ("", "identity")
    wire = compressed(data, coding, empty_blocks)
    if not plain and damage == "cut":
        wire = wire[: -1 - size % 4]  # into the checksum after the data
    elif not plain and damage == "extra":
        wire += unit
    elif not plain and damage == "mislabelled":
        wire = compressed(data, "deflate" if "gzip" in coding.lower() else "gzip", empty_blocks)
    got = read_body(coding, chunked(wire, cuts))
    # refused at its header, unless the chunks before it passed the limit
    if damage == "mislabelled" and not plain:
        assert (
            isinstance(got, RequestError)
            and got.status in (400, 413)
            and (got.status == 400 or len(wire) > MAX_BODY_BYTES)
        ), got
    elif len(wire) > MAX_BODY_BYTES or len(data) > MAX_BODY_BYTES:
        assert (
            isinstance(got, RequestError)
            and got.status == 413
            and f"larger than {MAX_BODY_BYTES} bytes" in str(got)
        ), got
    elif plain:
        assert got == wire
    elif damage != "none":
        assert (
            isinstance(got, RequestError)
            and got.status == 400
            and coding.strip().lower() in str(got)
        ), got
    else:
        assert got == data


@settings(max_examples=60, deadline=None)
@given(
    coding=st.sampled_from(
        ACCEPTED + ["br", "zstd", "compress", "gzip, gzip", "gzip, deflate", "identity, gzip"]
    )
    | st.text(max_size=12)
)
def test_a_content_coding_other_than_those_accepted_is_refused_415_naming_them(coding):
    got = read_body(coding, [compressed(b'{"text": "a"}', coding)])
    if coding.strip().lower() in ("", "identity", "gzip", "x-gzip", "deflate"):
        assert got == b'{"text": "a"}'
    else:
        assert (
            isinstance(got, RequestError)
            and got.status == 415
            and got.headers == {"Accept-Encoding": "gzip, deflate"}
        )
        assert str(got).endswith(
            "is not accepted; send the body as gzip, deflate or unencoded"
        ) and "\n" not in str(got)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=FIELD_VALUES, coding=st.sampled_from(ACCEPTED + ["br", "gzip, gzip"]))
def test_a_compressed_request_is_answered_as_the_same_request_uncompressed(client, body, coding):
    raw = json.dumps(body, ensure_ascii=True).encode()
    plain = client.post("/translate", content=raw, headers={"content-type": "application/json"})
    sent = client.post(
        "/translate",
        content=compressed(raw, coding),
        headers={"content-type": "application/json", "content-encoding": coding},
    )
    if coding in ("br", "gzip, gzip"):
        assert sent.status_code == 415 and sent.headers["accept-encoding"] == "gzip, deflate", (
            sent.text
        )
        assert sent.json() == {
            "error": f'Content-Encoding "{coding}" is not accepted; send the body as gzip, deflate '
            "or unencoded"
        }
    else:
        assert (sent.status_code, sent.json()) == (plain.status_code, plain.json())
    bomb = compressed(b" " * (MAX_BODY_BYTES + 1), "gzip")  # about a kilobyte
    refused = client.post(
        "/translate",
        content=bomb,
        headers={"content-type": "application/json", "content-encoding": "gzip"},
    )
    assert refused.status_code == 413 and refused.json() == {
        "error": f"the body is larger than {MAX_BODY_BYTES} bytes once decompressed (gzip)"
    }


class Pairs(list):
    """A JSON object written as these (key, value) pairs, in order, a key perhaps more than once."""


def written(value) -> str:
    """``value`` as JSON text, each :class:`Pairs` with every pair it holds."""
    if isinstance(value, Pairs):
        return "{" + ", ".join(f"{json.dumps(k)}: {written(v)}" for k, v in value) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(map(written, value)) + "]"
    return json.dumps(value)


def first_repeat(value) -> str | None:
    """The repeated key a JSON reader meets first: an object ends after the objects inside it, in
    order."""
    if isinstance(value, Pairs):
        inner = next((key for key in (first_repeat(v) for _, v in value) if key is not None), None)
        keys = [k for k, _ in value]
        return (
            inner
            if inner is not None
            else next((k for i, k in enumerate(keys) if k in keys[:i]), None)
        )
    if isinstance(value, list):
        return next((key for key in map(first_repeat, value) if key is not None), None)
    return None


KEYS = st.sampled_from(["text", "beam_size", "ban", "a", ""]) | st.text(max_size=3)
DOCUMENTS = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.lists(st.tuples(KEYS, inner), max_size=4).map(Pairs)
    ),
    max_leaves=12,
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=DOCUMENTS
    | st.lists(st.tuples(KEYS, DOCUMENTS), max_size=4).map(
        lambda pairs: Pairs([("text", "a dog ."), *pairs])
    )
)
def test_a_key_repeated_in_any_object_at_any_depth_is_refused_naming_it(translator, body):
    """``{"text": "a", "text": "b"}`` was taken silently, the last value winning."""
    repeat = first_repeat(body)
    try:
        parse_request(written(body).encode(), translator, Limits())
    except RequestError as exc:
        if repeat is None:
            assert "appears more than once" not in str(exc)
        else:
            assert (
                exc.status == 422
                and str(exc)
                == f"the key {json.dumps(repeat)} appears more than once in one object; send each "
                "key once"
            )
    else:
        assert repeat is None


# \n, \r, \v, \f, \x1c-\x1e, \x85, U+2028, U+2029
LINE_BREAKS = [c for c in map(chr, range(0x110000)) if len(f"a{c}b".splitlines()) == 2]
WORDS = sorted({word for sentence in SENTENCES for word in sentence.split()})


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    words=st.lists(st.sampled_from(WORDS), max_size=8),
    breaks=st.lists(
        st.tuples(st.integers(0, 60), st.sampled_from([*LINE_BREAKS, "\r\n"])),
        min_size=1,
        max_size=3,
    ),
    prefix=st.sampled_from(["", "die ", "der Hund "]),
)
def test_a_line_break_inside_a_line_reads_as_a_space_and_the_line_stays_one_line(
    client, words, breaks, prefix
):
    r"""``"text": ["a\nb"]`` had no stated meaning. A break of any kind str.splitlines knows,
    anywhere in a line or its prefix, is read as a space (as nmt translate reads a line): the answer
    is the one for the line with spaces there, one line for the line, attention included."""

    def broken(text: str, space: bool) -> str:
        for at, brk in sorted(((at % (len(text) + 1), brk) for at, brk in breaks), reverse=True):
            text = text[:at] + (" " if space else brk) + text[at:]
        return text

    line = " ".join(words)
    asked = [
        {
            "text": [broken(line, space), SENTENCES[2]],
            "prefix": [broken(prefix, space), ""],
            "beam_size": 2,
            "n_best": 2,
            "alignment": True,
        }
        for space in (False, True)
    ]
    got, want = (
        client.post(
            "/translate",
            content=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        for body in asked
    )
    assert got.status_code == want.status_code == 200, got.text
    assert got.json() == want.json() and len(got.json()["translations"]) == 2
    assert all(
        len(entry["text"].splitlines()) <= 1
        for t in got.json()["translations"]
        for entry in t["n_best"]
    )


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    body=FIELD_VALUES | JSON,
    cuts=st.lists(st.integers(0, 2**10), max_size=3),
    leaves_after=st.integers(0, 4),
)
def test_a_client_that_leaves_at_any_point_of_its_request_costs_one_log_line(
    translator, caplog, body, cuts, leaves_after
):
    """Each client that disconnected while it sent its body wrote a 46-line ClientDisconnect
    traceback. Leaving before any chunk or between any two is one line, 499; once all were sent, one
    line too (499 while its lines wait, the request's own 4xx, or 200 where its answer was ready
    first); the app raises nothing and goes on serving."""
    parts = chunked(json.dumps(body, ensure_ascii=True).encode(), cuts)
    leaves_after = min(leaves_after, len(parts))
    app = create_app(translator, Limits(max_wait_ms=0.0))

    async def main():
        async with app.router.lifespan_context(app):
            return await asgi_call(
                app, "/translate", parts=parts, leaves_after=leaves_after
            ), await asgi_call(app, "/translate", {"text": "a woman ."})

    caplog.clear()
    with caplog.at_level(logging.INFO):
        gone, stayed = asyncio.run(main())
    # what the connection costs; a warning about a line's text (nmt.translate: '00' is text the
    # toy vocabulary lacks) comes only where the line was translated before the client left
    lines = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.INFO
        and r.name.startswith(("nmt", "uvicorn", "starlette"))
        and r.name != "nmt.translate"
    ]
    assert len(lines) == 2 and all(
        re.fullmatch(r"POST /translate \d{3} \d+ lines \d+ tokens \d+ ms", line) for line in lines
    ), lines
    assert not any(r.exc_info for r in caplog.records)
    assert (
        lines[0].startswith(f"POST /translate {gone[0]['status']} ") and stayed[0]["status"] == 200
    )
    assert (
        gone[0]["status"] == 499
        if leaves_after < len(parts)
        else gone[0]["status"] in (200, 499) or 400 <= gone[0]["status"] < 500
    )
