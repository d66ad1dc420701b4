"""``nmt serve``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ..errors import NmtError
from .options import CKPT_HELP, Device, DType, Threads
from .options import device as running_device


def serve(
    ctx: typer.Context,
    checkpoint: Annotated[list[Path], typer.Option("--checkpoint", help=f"{CKPT_HELP[:-1]}; one, as ensembles cannot be served yet.")],
    host: Annotated[str, typer.Option("--host", help="Address to listen on; keep 127.0.0.1 unless a reverse proxy guards it.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="TCP port (0: any free one).", min=0, max=65535)] = 8000,
    max_batch_tokens: Annotated[
        int, typer.Option("--max-batch-tokens", help="Source tokens (EOS included) of concurrent requests gathered into one batch.")
    ] = 4096,
    max_wait_ms: Annotated[float, typer.Option("--max-wait-ms", help="How long a request waits for others to share its batch (milliseconds).")] = 5.0,
    max_input_pieces: Annotated[int, typer.Option("--max-input-pieces", help="Longest line accepted, in SentencePiece pieces (longer: HTTP 413).")] = 256,
    max_lines: Annotated[int, typer.Option("--max-lines", help="Most lines in one request (more: HTTP 413).")] = 64,
    max_beam_size: Annotated[int, typer.Option("--max-beam-size", help="Largest beam_size (and n_best) a request may ask for.")] = 16,
    max_queued_requests: Annotated[
        int, typer.Option("--max-queued-requests", help="Requests waiting for a batch beyond which a new one is refused (HTTP 503, Retry-After: 1).")
    ] = 256,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No line per request and no info messages on stderr (warnings and errors still print).")] = False,
    device: Device = "auto",
    threads: Threads = 0,
    dtype: DType = "float32",
) -> None:
    """Serve translations over HTTP: POST /translate, GET /health, GET /info, and a web page at /. Needs the serve extra: pip install "nmt[serve]"."""
    try:
        from ..serve import Limits, Translator
        from ..serve import serve as run_server
    except ImportError as exc:
        raise NmtError(f'serving needs the serve extra ({exc.name} is missing): pip install "nmt[serve]"') from None
    limits = Limits(max_batch_tokens, max_wait_ms, max_input_pieces, max_lines, max_beam_size, max_queued_requests)
    limits.check()
    dev, torch_dtype = running_device(ctx)
    run_server(Translator.load(checkpoint, dev, torch_dtype), limits, host, port, quiet)
