"""``nmt serve``."""

from __future__ import annotations

import errno
import socket
from pathlib import Path
from typing import Annotated

import typer

from nmt.errors import NmtError

from .options import CKPT_HELP, Asked, Device, DType, Threads


def serve(
    ctx: typer.Context,
    checkpoint: Annotated[
        list[Path],
        typer.Option(
            "--checkpoint",
            metavar="<path>",
            help=f"{CKPT_HELP[:-1]}; one, as ensembles cannot be served yet.",
        ),
    ],
    host: Annotated[
        str,
        typer.Option(
            "--host", help="Address to listen on; keep 127.0.0.1 unless a reverse proxy guards it."
        ),
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option("--port", help="TCP port (0: any free one).", min=0, max=65535)
    ] = 8000,
    max_batch_tokens: Annotated[
        int,
        typer.Option(
            "--max-batch-tokens",
            help="Source tokens (EOS included) of concurrent requests gathered into one batch.",
        ),
    ] = 4096,
    max_wait_ms: Annotated[
        float,
        typer.Option(
            "--max-wait-ms",
            help="How long a request waits for others to share its batch (milliseconds).",
        ),
    ] = 5.0,
    max_input_pieces: Annotated[
        int,
        typer.Option(
            "--max-input-pieces",
            help="Longest line accepted, in SentencePiece pieces (longer: HTTP 413).",
        ),
    ] = 256,
    max_lines: Annotated[
        int, typer.Option("--max-lines", help="Most lines in one request (more: HTTP 413).")
    ] = 64,
    max_beam_size: Annotated[
        int,
        typer.Option(
            "--max-beam-size", help="Largest beam_size (and n_best) a request may ask for."
        ),
    ] = 16,
    max_queued_requests: Annotated[
        int,
        typer.Option(
            "--max-queued-requests",
            help="Requests waiting for a batch beyond which a new one is refused (HTTP 503, "
            "Retry-After: 1).",
        ),
    ] = 256,
    quiet: Annotated[
        bool,
        typer.Option(
            "--quiet",
            "-q",
            help="No line per request and no info messages on stderr (warnings and errors still "
            "print).",
        ),
    ] = False,
    device: Device = "auto",
    threads: Threads = 0,
    dtype: DType = "float32",
) -> None:
    """Serve translations over HTTP: POST /translate, GET /health, GET /info, and a web page at /.
    Needs the serve extra: pip install -e ".[serve]"."""
    try:
        from nmt.serve.app import Limits, Translator
        from nmt.serve.process import serve as run_server
    except ImportError as exc:
        raise NmtError(
            f'serving needs the serve extra ({exc.name} is missing): pip install -e ".[serve]"'
        ) from None
    limits = Limits(
        max_batch_tokens,
        max_wait_ms,
        max_input_pieces,
        max_lines,
        max_beam_size,
        max_queued_requests,
    )
    limits.check()
    check_address(host, port)  # before the model loads: a port in use is said in one line, at once
    dev, torch_dtype = Asked.of(ctx.params).device_and_dtype()
    run_server(Translator.load(checkpoint, dev, torch_dtype), limits, host, port, quiet)


def check_address(host: str, port: int) -> None:
    """Raise if ``host``:``port`` cannot be listened on now (a port in use, an unknown host,
    an address of no interface here); the probe is closed again before the server binds.

    Raises:
        NmtError: naming the address, the reason and what to change.
    """
    if not host.strip():
        raise NmtError("--host is empty; give an address to listen on (e.g. 127.0.0.1)")
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        addresses = {(family, kind, proto, address) for family, kind, proto, _, address in found}
    # unknown name; one IDNA cannot encode; a NUL
    except (socket.gaierror, UnicodeError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, socket.gaierror) else "not a host name"
        raise NmtError(
            f"--host {host!r}: {reason}; give an IP address, or a name that resolves here (e.g. "
            "127.0.0.1)"
        ) from None
    # uvicorn binds every address the name has
    for family, kind, proto, address in sorted(addresses, key=str):
        with socket.socket(family, kind, proto) as probe:
            # as uvicorn binds: a port left in TIME_WAIT is free
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                # as asyncio's create_server binds IPv6
                probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                hint = (
                    "choose another --port (0: any free one)"
                    if exc.errno == errno.EADDRINUSE
                    else "check --host and --port"
                )
                raise NmtError(f"cannot listen on {host}:{port}: {exc.strerror}; {hint}") from None
