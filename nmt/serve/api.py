r"""What a ``POST /translate`` request of ``nmt serve`` may ask for, and its checks.

A request is a JSON object: ``text`` (a string, or a list of strings), and optionally ``beam_size``,
``length_penalty``, ``n_best``, ``alignment``, ``tgt_lang`` (the target language, as ``nmt translate
--tgt-lang``: required by a multilingual model), and per line ``prefix``, ``constraints`` and
``ban`` (as ``nmt translate``'s files give them). :func:`parse_request` turns it into a
:class:`Job`, or refuses it with a :class:`RequestError` whose status is a 4xx and whose message is
one line. The server (:mod:`nmt.serve.app`) runs the jobs.

A line break inside a line of ``text`` (``\n``, ``\r``, or any other that ``str.splitlines``
splits on) reads as a space, as ``nmt translate`` reads such characters inside a line of its
input and training read them (:func:`nmt.data.tokenizer.controls_as_spaces`, and SentencePiece's
``nmt_nfkc`` for U+2028 and U+2029): each line of the request is one line of the answer, the
translation of its words on one line. Refusing it instead would turn away text that ``nmt
translate`` takes (a subtitle's two rows, a segment with a soft break) for a break the model has
never seen; splitting it would answer more lines than were sent.
"""

# Size: module at most 450 lines: every field a request may hold, with its check and its one-line
# error.

from __future__ import annotations

import asyncio
import json
import zlib
from dataclasses import dataclass, field, replace

import torch

from nmt.config import BEAM, LENGTH_PENALTY, ConfigError, DecodeConfig
from nmt.data.multilingual import target
from nmt.decode.search import output_limits
from nmt.decode.steering import Steering
from nmt.fields import MAX_INT, Range, did_you_mean
from nmt.translation.inference import Inference
from nmt.translation.steering_text import UnwritableText, steering

FIELDS = (
    "text",
    "beam_size",
    "length_penalty",
    "n_best",
    "alignment",
    "prefix",
    "constraints",
    "ban",
    "tgt_lang",
)
# read no further: a body this large is beyond every other limit anyway (a compressed one: as
# sent, and decompressed)
MAX_BODY_BYTES = 1 << 20
# zlib's wbits for each (RFC 9110 §8.4.1)
CODINGS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


class RequestError(ValueError):
    """A request the server refuses; ``status`` is the HTTP status to answer with, ``headers`` any
    the answer must carry. The message is one line whatever the request held: line breaks and other
    controls it quotes are escaped."""

    def __init__(self, message: str, status: int = 422, headers: dict[str, str] | None = None):
        super().__init__(
            "".join(c if c.isprintable() or c == " " else ascii(c)[1:-1] for c in message)
        )
        self.status = status
        self.headers = headers


class Body:
    """A request's body as its chunks arrive, decompressed as its ``Content-Encoding`` says:
    ``gzip`` and ``deflate`` (zlib's format) are what HTTP clients that compress their requests
    send, and such a client expects the answer it would get uncompressed; none, or ``identity``, is
    the body as sent.

    The bytes sent and the bytes they decompress to are each held to :data:`MAX_BODY_BYTES` as they
    arrive, never after: a few kilobytes of gzip can hold gigabytes of zeros, and a stream of empty
    deflate blocks decompresses to nothing however long it runs.

    Raises:
        RequestError: 415 for any other coding, or several stacked (``Accept-Encoding`` names those
            accepted, RFC 9110 §15.5.16); 413 past the limit; 400 for a body its coding cannot read
            (damaged, cut short, or with bytes after the compressed stream's end).
    """

    def __init__(self, content_encoding: str = ""):
        self.coding = content_encoding.strip().lower() or "identity"
        if self.coding != "identity" and self.coding not in CODINGS:
            message = (
                f"Content-Encoding {json.dumps(content_encoding)} is not accepted; send the "
                "body as gzip, deflate or unencoded"
            )
            raise RequestError(message, 415, {"Accept-Encoding": "gzip, deflate"})
        self._inflate = zlib.decompressobj(CODINGS[self.coding]) if self.coding in CODINGS else None
        self.sent, self.data = 0, bytearray()

    def add(self, chunk: bytes) -> None:
        """Take the next chunk as sent."""
        self.sent += len(chunk)
        if self.sent > MAX_BODY_BYTES:
            raise RequestError(f"the body is larger than {MAX_BODY_BYTES} bytes", 413)
        if self._inflate is None:
            self.data += chunk
            return
        try:
            self.data += self._inflate.decompress(chunk, MAX_BODY_BYTES + 1 - len(self.data))
        except zlib.error as exc:
            raise RequestError(
                f"the body is not valid {self.coding} (its Content-Encoding): {exc}", 400
            ) from None
        # so too where input is left unread: zlib stops only once it has written the bytes
        # allowed
        if len(self.data) > MAX_BODY_BYTES:
            raise RequestError(
                f"the body is larger than {MAX_BODY_BYTES} bytes once decompressed ({self.coding})",
                413,
            )
        if self._inflate.unused_data:
            raise RequestError(f"the body has bytes after the end of its {self.coding} stream", 400)

    def finish(self) -> bytearray:
        """The whole body, decompressed."""
        if self._inflate is not None and not self._inflate.eof:
            raise RequestError(f"the body ends before its {self.coding} stream does", 400)
        return self.data


# a lone request is answered after at most this wait: beyond it clients time out first
MAX_WAIT_MS = 10_000.0


@dataclass(frozen=True)
class Limits:
    """What one request may ask for, and how requests are gathered into batches.

    ``max_batch_tokens``: source tokens (EOS included) gathered into one batch;
    ``max_wait_ms``: how long the first request of a batch waits for others (milliseconds);
    ``max_input_pieces``: SentencePiece pieces in one line; ``max_lines``: lines in one request;
    ``max_beam_size``: the largest ``beam_size`` (and so ``n_best``) a request may ask for;
    ``max_queued_requests``: requests waiting for a batch (not counting the batch being
    translated) beyond which a new one is refused with 503 and ``Retry-After``, so that under
    overload memory stays bounded and clients learn to back off instead of timing out.
    """

    max_batch_tokens: int = 4096
    max_wait_ms: float = 5.0
    max_input_pieces: int = 256
    max_lines: int = 64
    max_beam_size: int = 16
    max_queued_requests: int = 256

    def check(self) -> None:
        """Raises: ConfigError: a limit out of range, named by its flag (each is a setting of the
        searches it starts, so each lies in that setting's range: a beam of at most 1,024, whole
        numbers a C int holds)."""
        ranges = {
            name: Range(1, MAX_INT)
            for name in ("max_batch_tokens", "max_input_pieces", "max_lines", "max_queued_requests")
        }
        for name, allowed in {
            **ranges,
            "max_beam_size": BEAM,
            "max_wait_ms": Range(0, MAX_WAIT_MS),
        }.items():
            if getattr(self, name) not in allowed:
                unit = " (milliseconds)" if name == "max_wait_ms" else ""
                raise ConfigError(
                    f"--{name.replace('_', '-')} must be {allowed}{unit}, got "
                    f"{getattr(self, name):g}"
                )
        if self.max_batch_tokens < self.max_input_pieces + 1:
            raise ConfigError(
                f"--max-batch-tokens ({self.max_batch_tokens}) must hold one line of "
                f"--max-input-pieces ({self.max_input_pieces}) plus EOS"
            )


@dataclass
class Job:
    """One request: its lines, the search settings it asked for (``decode``, the checkpoint's
    with the request's fields), its source tokens (EOS included), whether alignments are wanted,
    each line's :class:`~nmt.decode.steering.Steering` (None when no line has any), the ids before
    each source (a multilingual model's target tag), and the future its answer resolves."""

    lines: list[str]
    decode: DecodeConfig
    tokens: int
    alignment: bool = False
    steering: list[Steering] | None = None
    future: asyncio.Future | None = field(default=None, repr=False)
    src_prefix: tuple[int, ...] = ()


def _number(body: dict, name: str, default, kind: type, allowed: Range):
    """The request's ``name`` as ``kind``, or ``default`` (the checkpoint's setting, which its
    config already checked) where the request does not give it.

    Raises:
        RequestError: the request's value is not a number (an integer for ``kind`` int: JSON's
            ``5.0`` counts as 5) or lies outside ``allowed``, the range the config gives the
            setting.
    """
    if name not in body:
        return default
    value = body[name]
    if kind is int and isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else int):
        raise RequestError(
            f"{name} must be {'a number' if kind is float else 'an integer'}, got "
            f"{json.dumps(value)}"
        )
    if value not in allowed:
        raise RequestError(f"{name} must be {allowed}, got {value}")
    return kind(value)


def parse_request(raw: bytes | bytearray, translator: Inference, limits: Limits) -> Job:
    """Validate a ``/translate`` body into a :class:`Job`: its lines, the search settings (the
    checkpoint's ``decode`` with the request's ``beam_size``, ``length_penalty`` and ``n_best``,
    and ``max_tokens`` the server's batch budget), its source tokens, whether alignments are
    asked for, each line's ``prefix``, ``constraints`` and ``ban`` (:func:`steering_of`), and the
    target ``tgt_lang`` chooses (:func:`nmt.data.multilingual.target`).

    Raises:
        RequestError: invalid JSON (400), an object that repeats a key, at any depth (422), a
            missing, unknown or ill-typed field (422), too many lines or a line with too many pieces
            (413).
    """
    try:
        body = json.loads(raw, object_pairs_hook=_object)
    except RequestError:
        raise
    except (ValueError, UnicodeDecodeError) as exc:
        raise RequestError(f"invalid JSON: {exc}", 400) from None
    # [[[...]]] nested beyond the parser's stack: no request of this API nests more than two levels
    except RecursionError:
        raise RequestError("invalid JSON: nested too deeply", 400) from None
    if not isinstance(body, dict):
        raise RequestError('the body must be a JSON object such as {"text": "a sentence"}')
    unknown = sorted(set(body) - set(FIELDS))
    if unknown:
        hints = [did_you_mean(u.replace("-", "_"), FIELDS)[2:] for u in unknown]  # "did you..."
        named = [json.dumps(u) + (f" ({h})" if h else "") for u, h in zip(unknown, hints)]
        raise RequestError(f"unknown field(s) {', '.join(named)}; known: {', '.join(FIELDS)}")
    if "text" not in body:
        raise RequestError('missing field "text" (a string, or a list of strings)')
    text = body["text"]
    lines = [text] if isinstance(text, str) else text
    if not isinstance(lines, list) or not lines or not all(isinstance(line, str) for line in lines):
        raise RequestError("text must be a string or a non-empty list of strings")
    for i, line in enumerate(lines):
        _check_unicode(line, f"text[{i}]")
    if len(lines) > limits.max_lines:
        raise RequestError(
            f"{len(lines)} lines in one request; the limit is {limits.max_lines} (--max-lines)", 413
        )
    decode = _search_settings(body, translator.cfg.decode, limits)
    alignment = body.get("alignment", False)
    if not isinstance(alignment, bool):
        raise RequestError(f"alignment must be true or false, got {json.dumps(alignment)}")
    tgt_lang = body.get("tgt_lang")
    if tgt_lang is not None and not isinstance(tgt_lang, str):
        raise RequestError(
            f"tgt_lang must be a language code (a string), got {json.dumps(tgt_lang)}"
        )
    try:
        goal = target(translator.cfg, translator.tokenizer, tgt_lang)
    except ConfigError as exc:
        raise RequestError(str(exc)) from None
    pieces = [
        len(ids)
        for ids in translator.tokenizer.encode_src([line.strip() for line in lines], threads=1)
    ]
    for i, n in enumerate(pieces):
        if n > limits.max_input_pieces:
            raise RequestError(
                f"text[{i}] has {n} pieces; the limit is {limits.max_input_pieces} "
                "(--max-input-pieces): split it into sentences",
                413,
            )
    steered = steering_of(body, isinstance(text, str), len(lines), translator, limits)
    if alignment:
        _check_attention_size(pieces, steered, len(goal.src_prefix), decode)
    tokens = sum(pieces) + len(pieces) * (1 + len(goal.src_prefix))
    return Job(lines, decode, tokens, alignment, steered, src_prefix=goal.src_prefix)


def _object(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object of the body: Python's JSON reader keeps a repeated key's last value, silently,
    where the sender may have meant the first (or a proxy read the first), so a repeat is refused.

    Raises:
        RequestError: naming the repeated key.
    """
    found: dict = {}
    for key, value in pairs:
        if key in found:
            raise RequestError(
                f"the key {json.dumps(key)} appears more than once in one object; send each key "
                "once"
            )
        found[key] = value
    return found


def _search_settings(body: dict, default: DecodeConfig, limits: Limits) -> DecodeConfig:
    """The checkpoint's search settings ``default`` with the request's ``beam_size``,
    ``length_penalty`` and ``n_best``, and the server's limits as the search's (a line the request
    limit lets in is translated).

    Raises:
        RequestError: a value out of its range, or one the limits let through but the search refuses
            (the request's fault).
    """
    beam_size = _number(
        body,
        "beam_size",
        min(default.beam_size, limits.max_beam_size),
        int,
        Range(1, limits.max_beam_size),
    )
    try:
        return replace(
            default,
            beam_size=beam_size,
            length_penalty=_number(
                body, "length_penalty", default.length_penalty, float, LENGTH_PENALTY
            ),
            n_best=_number(body, "n_best", 1, int, Range(1, beam_size)),
            max_tokens=limits.max_batch_tokens,
            max_input_pieces=limits.max_input_pieces,
        )
    except ConfigError as exc:
        raise RequestError(str(exc)) from None


def _check_attention_size(
    pieces: list[int], steered: list[Steering] | None, tag: int, decode: DecodeConfig
) -> None:
    """Refuse alignments whose attention matrices could exceed :data:`MAX_ATTENTION_WEIGHTS`: each
    line's source (its ``pieces``, EOS and ``tag`` pieces) × at most its output limit (room for a
    prefix and constraints included).

    Raises:
        RequestError: 413, naming the count.
    """
    lengths = torch.tensor([n + 1 + tag for n in pieces])  # as the search counts a source
    # + 1: the row of EOS
    weights = int((lengths * (output_limits(lengths, decode, steered) + 1)).sum())
    if weights > MAX_ATTENTION_WEIGHTS:
        raise RequestError(
            f"with alignment, these lines' attention matrices could hold {weights:,} weights;"
            f" the limit is {MAX_ATTENTION_WEIGHTS:,}: send fewer or shorter lines",
            413,
        )


def _check_unicode(text: str, where: str) -> None:
    try:
        text.encode("utf-8")
    # JSON's "\ud800" escapes decode to a lone surrogate, which is no character
    except UnicodeEncodeError as exc:
        raise RequestError(
            f"{where} holds a lone UTF-16 surrogate ({ascii(text[exc.start])}) at character "
            f"{exc.start}: send valid Unicode text"
        ) from None


MAX_PHRASES = 16  # constraints or banned phrases for one line
# target pieces of one line's constraints together: the constrained search's state grows with them
MAX_CONSTRAINT_PIECES = 64
# source × output pieces a request's "attention" matrices may hold (about 20 MB of JSON)
MAX_ATTENTION_WEIGHTS = 1_000_000


def steering_of(
    body: dict, single: bool, n: int, translator: Inference, limits: Limits
) -> list[Steering] | None:
    """Each line's prefix, constraints and banned phrases from a request, as ``nmt translate``'s
    files give them (:func:`nmt.translation.steering_text.steering`): for a ``text`` string,
    ``prefix`` is a string and ``constraints`` and ``ban`` lists of strings; for a list, one of
    those per line. None when the request has none of the three.

    Raises:
        RequestError: a field of the wrong shape or type, a line with more than
            :data:`MAX_PHRASES` phrases, a phrase over ``--max-input-pieces`` pieces (413), or a
            prefix or constraint with characters the target vocabulary lacks.
    """
    if not any(name in body for name in ("prefix", "constraints", "ban")):
        return None

    def per_line(name: str, phrases: bool) -> list:
        empty = [] if phrases else ""
        value = body.get(name, empty if single else [empty] * n)
        values = [value] if single else value
        one = "a list of strings" if phrases else "a string"
        if not isinstance(values, list) or len(values) != n:
            raise RequestError(
                f"{name} must be {one}"
                + ("" if single else f", or a list of {n} of them, one per line of text")
            )
        for i, v in enumerate(values):
            items = v if phrases else [v]
            if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
                raise RequestError(
                    f"{name}{'' if single else f'[{i}]'} must be {one}, got {json.dumps(v)}"
                )
            if len(items) > MAX_PHRASES:
                raise RequestError(
                    f"{name}{'' if single else f'[{i}]'} has {len(items)} phrases; the limit is "
                    f"{MAX_PHRASES}",
                    413,
                )
            for x in items:
                _check_unicode(x, name)
            lengths = (
                [len(ids) for ids in translator.tokenizer.encode_tgt(items, threads=1)]
                if items
                else []
            )
            if any(n > limits.max_input_pieces for n in lengths):
                raise RequestError(
                    f"a phrase of {name} has more than {limits.max_input_pieces} pieces "
                    "(--max-input-pieces)",
                    413,
                )
            if name == "constraints" and sum(lengths) > MAX_CONSTRAINT_PIECES:
                where = "" if single else f"[{i}]"
                raise RequestError(
                    f"constraints{where} hold {sum(lengths)} target pieces together; the limit is "
                    f"{MAX_CONSTRAINT_PIECES}",
                    413,
                )
        return values

    prefixes, constraints, bans = (
        per_line("prefix", False),
        per_line("constraints", True),
        per_line("ban", True),
    )
    try:
        return [
            steering(translator.tokenizer, p, c, b) for p, c, b in zip(prefixes, constraints, bans)
        ]
    except UnwritableText as exc:
        raise RequestError(str(exc)) from None
