"""``nmt serve``: translation over HTTP, with a web page (``pip install -e ".[serve]"``).

Endpoints:

* ``POST /translate``: ``{"text": "..."}`` or ``{"text": ["...", ...]}``, optional
  ``beam_size``, ``length_penalty``, ``n_best``, ``alignment``, ``tgt_lang`` (required by a
  multilingual model: the language to translate into), and per line ``prefix``, ``constraints`` and
  ``ban`` (as ``nmt translate --prefix-file`` etc.); answers ``{"translations": [...]}`` in input
  order, each ``{"text", "score", "log_prob", "n_best": [{"text", "score", "log_prob"}, ...]}``.
  With ``"alignment": true`` every n-best entry also has ``"alignment"`` (``i-j`` pairs, as ``nmt
  translate --print-alignment``) and each translation ``"attention"``: its best hypothesis's source
  and output pieces (each ending in ``</s>``) and ``weights`` ``[tgt_len][src_len]``, the
  heads-averaged cross-attention of the layer alignments are read from
  (:mod:`nmt.translation.align`), which the page draws as a heatmap.
* ``GET /health``: model loaded, device, dtype, checkpoint step, requests queued and running.
* ``GET /info``: languages (``directions``, ``tgt_langs``), tokenizer, model and decode config, the
  server's limits.
* ``GET /``: the page (``nmt/serve/static/index.html``).

Batching. Each request becomes a :class:`Job` on an asyncio queue. One batcher task takes
the first waiting job, then keeps taking jobs until their source tokens reach
``max_batch_tokens`` or ``max_wait_ms`` has passed, and hands the batch to one worker thread
that runs the model (torch releases the GIL while it computes, so the event loop keeps
accepting and queueing requests meanwhile; under load the next batch is already waiting).
Each job's future is resolved with its own lines' results, in its input order.

A bad request gets a 4xx answer ``{"error": "one line"}``; a body may come compressed
(``Content-Encoding: gzip`` or ``deflate``, :class:`~nmt.serve.api.Body`; any other is a 415).
A client that leaves before its answer, while it sends its body or while its lines wait, only
loses the answer: its request is logged in one line as 499 (nginx's "client closed request"),
never as a traceback. When ``max_queued_requests`` requests already wait, a new one is
answered 503 with ``Retry-After: 1`` at once (before its body is parsed).

The process that runs the application (uvicorn, signals, the log) is :mod:`nmt.serve.process`.
"""

# Size: module at most 440 lines, create_app() at most 140: create_app()'s routes, admission count
# and error handler are closures over one batcher and translator (Starlette's idiom).

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from importlib import resources
from pathlib import Path

import torch
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import HTMLResponse, JSONResponse
from starlette.routing import Route

from nmt.config import Config, ConfigError, DecodeConfig, config_to_dict
from nmt.data.multilingual import directions, target_languages
from nmt.data.tokenizer import Tokenizer
from nmt.decode.search import Hypothesis
from nmt.decode.steering import Steering
from nmt.runs.checkpoint import checkpoint_file
from nmt.runs.runid import peek
from nmt.translation.align import alignment_layer, format_alignment
from nmt.translation.inference import Decoding, Inference

from .api import Body, Job, Limits, RequestError, parse_request

log = logging.getLogger("nmt.serve")


@dataclass
class Translator:
    """The served :class:`~nmt.translation.inference.Inference` and what ``/health`` and ``/info``
    report about it."""

    inference: Inference
    checkpoint: str = ""
    step: int | None = None
    dtype: str = "float32"
    # lines left untranslated since the start, by reason
    skipped: Counter = field(default_factory=Counter)

    @property
    def tokenizer(self) -> Tokenizer:
        """The model's tokenizer."""
        return self.inference.tokenizer

    @property
    def cfg(self) -> Config:
        """The checkpoint's config (hence the decode defaults)."""
        return self.inference.cfg

    @property
    def model(self):
        """The served model."""
        return self.inference.model

    @property
    def device(self) -> torch.device:
        """Where the model runs."""
        return self.inference.device

    @classmethod
    def load(cls, checkpoints: list[Path], device: torch.device, dtype: torch.dtype) -> Translator:
        """Read a checkpoint (a file or a run directory) once, in ``dtype`` as ``nmt translate``
        does (:meth:`nmt.translation.inference.Inference.load`: float32, bfloat16, float16 or int8).

        Raises:
            ConfigError: more than one checkpoint (ensembles are not supported by the server yet).
            nmt.runs.checkpoint.CheckpointError: the checkpoint is missing or damaged.
        """
        if len(checkpoints) != 1:
            raise ConfigError(
                f"give exactly one --checkpoint (got {len(checkpoints)}); serving an ensemble is "
                "not supported"
            )
        inference = Inference.load(checkpoints, device, dtype)
        step = peek(checkpoint_file(checkpoints[0]))[0]  # lazily: the weights are read once, above
        name = "int8" if dtype == torch.qint8 else str(dtype).removeprefix("torch.")
        return cls(inference, str(checkpoints[0]), step if step >= 0 else None, name)

    def translate(
        self,
        lines: list[str],
        decode: DecodeConfig,
        alignment: bool = False,
        steering: list[Steering] | None = None,
        src_prefix: tuple[int, ...] = (),
    ) -> list[list[Hypothesis]]:
        """Each line's n-best list, in input order
        (:meth:`nmt.translation.inference.Inference.translate`); the lines left untranslated (only
        unknown characters, or no text) are counted in ``skipped``, for ``/health``."""
        return self.inference.translate(
            lines,
            Decoding(decode, alignment=alignment, src_prefix=src_prefix),
            steering,
            skipped=self.skipped,
        )

    def attention(self, line: str, hyp: Hypothesis, src_prefix: tuple[int, ...] = ()) -> dict:
        """``{"src_pieces", "tgt_pieces", "weights"}`` for ``hyp``, a translation of ``line``:
        ``weights`` ``[tgt_len][src_len]`` (EOS included on both sides, and a multilingual model's
        target tag, ``src_prefix``, first among the source pieces), row ``t`` the step that
        produced output piece ``t``: the heads-averaged cross-attention of the alignment layer
        (:func:`nmt.translation.align.alignment_layer`), as alignments read it."""
        src_pieces, tgt_pieces, weights = self.inference.attention(line, hyp, src_prefix)
        layer = alignment_layer(weights.size(0), self.cfg.decode.alignment_layer)
        return {
            "src_pieces": src_pieces,
            "tgt_pieces": tgt_pieces,
            "weights": weights[layer].tolist(),
        }


class Batcher:
    """Gathers queued jobs into batches and runs them, one batch at a time, on one worker thread."""

    def __init__(self, translator: Translator, limits: Limits):
        self.translator = translator
        self.limits = limits
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nmt-model")
        self.batches = 0  # batches run so far, for /health
        self.running = 0  # requests in the batch the worker is translating now, for /health
        # /translate requests admitted and not yet answered (their bodies may still be arriving)
        self.admitted = 0
        # taken from the queue but over the budget: first in the next batch
        self._held: Job | None = None

    async def gather(self) -> list[Job]:
        """The next batch: the first waiting job, then more until the token budget or the wait runs
        out."""
        first, self._held = self._held or await self.queue.get(), None
        batch, tokens = [first], first.tokens
        deadline = asyncio.get_running_loop().time() + self.limits.max_wait_ms / 1000
        while tokens < self.limits.max_batch_tokens:
            try:
                job = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self.queue.get(), remaining)
                except asyncio.TimeoutError:
                    break
            if tokens + job.tokens > self.limits.max_batch_tokens:
                self._held = job
                break
            batch.append(job)
            tokens += job.tokens
        return batch

    def run(self, batch: list[Job]) -> list[list[dict] | Exception]:
        """Translate a batch (on the worker thread): one call per distinct search setting and
        alignment choice, with the largest n_best asked for; returns each job's translations, or
        the error it met."""
        groups: dict[tuple[DecodeConfig, bool, tuple[int, ...]], list[int]] = {}
        for i, job in enumerate(batch):
            groups.setdefault(
                (replace(job.decode, n_best=1), job.alignment, job.src_prefix), []
            ).append(i)
        out: list = [None] * len(batch)
        for (decode, alignment, src_prefix), members in groups.items():
            lines = [line for i in members for line in batch[i].lines]
            n_best = max(batch[i].decode.n_best for i in members)
            steered = any(batch[i].steering for i in members)
            steering = (
                [
                    s
                    for i in members
                    for s in (batch[i].steering or [Steering()] * len(batch[i].lines))
                ]
                if steered
                else None
            )
            try:
                results = self.translator.translate(
                    lines, replace(decode, n_best=n_best), alignment, steering, src_prefix
                )
                start = 0
                for i in members:
                    job = batch[i]
                    out[i] = [
                        self._entry(line, hyps[: job.decode.n_best], alignment, src_prefix)
                        for line, hyps in zip(job.lines, results[start : start + len(job.lines)])
                    ]
                    start += len(job.lines)
            # answered as a 500 to these requests; the server keeps serving
            except Exception as exc:
                for i in members:
                    out[i] = exc
        return out

    def _entry(
        self, line: str, hyps: list[Hypothesis], alignment: bool, src_prefix: tuple[int, ...] = ()
    ) -> dict:
        texts = self.translator.tokenizer.decode_tgt(
            [h.tokens for h in hyps], [h.copied for h in hyps]
        )
        n_best = [
            {"text": t, "score": h.score, "log_prob": h.log_prob} for t, h in zip(texts, hyps)
        ]
        if alignment:
            for entry, h in zip(n_best, hyps):
                entry["alignment"] = format_alignment(h.alignment)
        entry = {
            **(n_best[0] if n_best else {"text": "", "score": 0.0, "log_prob": 0.0}),
            "n_best": n_best,
        }
        if alignment and hyps:
            entry["attention"] = self.translator.attention(line, hyps[0], src_prefix)
        return entry

    async def serve_forever(self) -> None:
        """Gather, run, resolve; a job whose client has gone (future cancelled) is not
        translated."""
        loop = asyncio.get_running_loop()
        while True:
            batch = [job for job in await self.gather() if not job.future.done()]
            if not batch:
                continue
            self.running = len(batch)
            results = await loop.run_in_executor(self.executor, self.run, batch)
            self.running = 0
            self.batches += 1
            for job, result in zip(batch, results):
                if job.future.done():
                    continue
                if isinstance(result, Exception):
                    job.future.set_exception(result)
                else:
                    job.future.set_result(result)


CLIENT_GONE = 499  # nginx's "client closed request": logged, never received


async def _client_gone(request: Request) -> None:
    """Return when the client of ``request`` (whose body has been read) disconnects."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _error(message: str, status: int, headers: dict[str, str] | None = None) -> JSONResponse:
    """``{"error": message}`` with ``status``; what a message repeats of the request is escaped if
    it is not valid Unicode."""
    return JSONResponse(
        {"error": message.encode("utf-8", "backslashreplace").decode("utf-8")},
        status_code=status,
        headers=headers,
    )


def create_app(translator: Translator, limits: Limits = Limits()) -> Starlette:  # noqa: B008 (Limits is frozen)
    """The Starlette application; the batcher runs for the application's lifespan."""
    limits.check()
    page = resources.files("nmt.serve").joinpath("static/index.html").read_text(encoding="utf-8")
    batcher = Batcher(translator, limits)

    async def translate(request: Request) -> JSONResponse:
        started = time.perf_counter()
        response, job = await answer(request)
        log.info(
            "POST /translate %d %d lines %d tokens %.0f ms",
            response.status_code,
            len(job.lines) if job else 0,
            job.tokens if job else 0,
            1000 * (time.perf_counter() - started),
        )
        return response

    async def answer(request: Request) -> tuple[JSONResponse, Job | None]:
        """The answer to one ``/translate`` request, and its job (None when the request was
        refused).

        Requests count as waiting from their admission (before their body arrives) until they are
        answered, less the batch being translated: a slow upload holds its place as a queued job
        does."""
        waiting = batcher.admitted - batcher.running
        if waiting >= limits.max_queued_requests:
            return _error(
                f"the server is busy: {waiting} requests wait for a batch (--max-queued-requests); "
                "retry later",
                503,
                {"Retry-After": "1"},
            ), None
        batcher.admitted += 1
        try:
            return await admitted(request)
        finally:
            batcher.admitted -= 1

    async def admitted(request: Request) -> tuple[JSONResponse, Job | None]:
        try:
            body = Body(", ".join(request.headers.getlist("content-encoding")))
            async for chunk in request.stream():
                body.add(chunk)
            job = parse_request(body.finish(), translator.inference, limits)
        except RequestError as exc:
            return _error(str(exc), exc.status, exc.headers), None
        # a client that leaves while it sends is no fault of the server's: one line, 499, as below
        except ClientDisconnect:
            return _error(
                "the client closed the connection before its body arrived", CLIENT_GONE
            ), None
        job.future = asyncio.get_running_loop().create_future()
        await batcher.queue.put(job)
        gone = asyncio.ensure_future(_client_gone(request))
        try:
            await asyncio.wait({job.future, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        # the client left while it waited: its lines are not translated (Batcher skips it)
        if not job.future.done():
            job.future.cancel()
            return _error("the client closed the connection before its answer", CLIENT_GONE), job
        try:
            return JSONResponse({"translations": job.future.result()}), job
        except Exception as exc:
            return _error(
                f"translation failed: {type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else ''}",
                500,
            ), job

    async def health(request: Request) -> JSONResponse:
        return JSONResponse(
            {
                "status": "ok",
                "device": str(translator.device),
                "dtype": translator.dtype,
                "checkpoint": translator.checkpoint,
                "checkpoint_step": translator.step,
                "queued_requests": batcher.admitted - batcher.running,
                "running_requests": batcher.running,
                "batches": batcher.batches,
                "untranslated_lines": {
                    "unknown_only": translator.skipped["unknown"],
                    "no_text": translator.skipped["no_text"],
                },
                # every per-line warning by kind, named in the log or not (nmt.errors.Capped)
                "warned_lines": dict(translator.inference.said.counts),
            }
        )

    async def info(request: Request) -> JSONResponse:
        cfg = config_to_dict(translator.cfg)
        tok = translator.tokenizer
        pairs = directions(translator.cfg.data)
        one = pairs[0] if len(pairs) == 1 else None  # several directions have no one pair to name
        return JSONResponse(
            {
                "src_lang": one and one.src,
                "tgt_lang": one and one.tgt,
                "directions": list(map(str, pairs)),
                "tgt_langs": list(target_languages(translator.cfg.data)),
                "tokenizer": {
                    "type": translator.cfg.tokenizer.type,
                    "joint": tok.joint,
                    "src_vocab_size": tok.src.get_piece_size(),
                    "tgt_vocab_size": tok.tgt.get_piece_size(),
                },
                "config": {k: cfg[k] for k in ("model", "tokenizer", "decode")},
                "limits": vars(limits),
            }
        )

    async def index(request: Request) -> HTMLResponse:
        return HTMLResponse(page)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        task = asyncio.create_task(batcher.serve_forever())
        try:
            yield
        finally:
            task.cancel()
            batcher.executor.shutdown(wait=True)

    # 404, 405: the API's one error shape
    async def http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return _error(
            f"{request.method} {request.url.path}: {exc.detail}", exc.status_code, exc.headers
        )

    routes = [
        Route("/translate", translate, methods=["POST"]),
        Route("/health", health),
        Route("/info", info),
        Route("/", index),
    ]
    return Starlette(
        routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error}
    )
