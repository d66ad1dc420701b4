"""``nmt serve``'s process: the application (:mod:`nmt.serve`) run by uvicorn until a signal, and
its log."""

from __future__ import annotations

import logging
import signal

from .serve import Limits, Translator, create_app

log = logging.getLogger("nmt.serve")


def serve(
    translator: Translator, limits: Limits, host: str, port: int, quiet: bool = False
) -> None:
    """Serve until SIGTERM or SIGINT, then finish the requests in flight and return.

    Each request is logged in one line on stderr (status, lines, source tokens, milliseconds),
    unless ``quiet``, which leaves warnings and errors only.

    uvicorn answers the signal by refusing new connections and waiting for the requests in
    flight; afterwards it raises the signal again under the handler installed before it
    started. That handler is a no-op here, so the process ends with exit code 0 once every
    answer is out instead of being killed by the re-raised signal.
    """
    import uvicorn

    app = create_app(translator, limits)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: None)
    logging.basicConfig(
        level=logging.WARNING if quiet else logging.INFO,
        format="%(asctime)s %(message)s",
        datefmt="%H:%M:%S",
    )
    log.setLevel(logging.WARNING if quiet else logging.INFO)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning" if quiet else "info",
        access_log=False,
        timeout_graceful_shutdown=60,
    )
    uvicorn.Server(config).run()
