"""``nmt serve``'s process: the application (:mod:`nmt.serve.app`) run by uvicorn until a signal,
its log, and what the event loop says when the process runs out of file descriptors.

At its descriptor limit (``ulimit -n``) a server cannot accept connections: they wait in the
listen queue until one of its connections closes. asyncio reports each failed ``accept()`` with a
traceback and, before it pauses for a second, goes on trying the rest of the listen backlog (2,048
with uvicorn; CPython issue 151615, seen on 3.11): thousands of log lines a second for as long as
the shortage lasts, 7.6 MB in 3 s at ``ulimit -n 32`` with 60 connections held open.
:class:`AcceptShortage` says it once: a line when it starts, one a minute while it lasts, and one
when connections are accepted again. The failed attempts themselves still cost about a fifth of a
core while it lasts (measured on a 2-core Xeon); stopping them would mean replacing a private
method of asyncio's event loop.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import signal

from .app import Limits, Translator, create_app

# imported now: out of descriptors, an import could not open the module's file
try:
    import resource
except ImportError:  # not a POSIX system
    resource = None

log = logging.getLogger("nmt.serve")

#: errors of ``accept()`` that mean a shortage, after which asyncio pauses accepting for a second
SHORTAGES = {
    errno.EMFILE: "this process has as many files open as it may (ulimit -n: {limit})",
    errno.ENFILE: "the system has as many files open as it may (sysctl fs.file-max)",
    errno.ENOBUFS: "the system is out of socket buffers",
    errno.ENOMEM: "the system is out of memory",
}


def _descriptor_limit() -> str:
    """This process's soft limit on open files, as ``ulimit -n`` says it ("?" where unknown)."""
    if resource is None:
        return "?"
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return "unlimited" if soft == resource.RLIM_INFINITY else str(soft)


class AcceptShortage:
    """The event loop's exception handler: ``accept()`` failing for want of descriptors or memory
    is logged once an episode, every other report as asyncio would (its default handler).

    An episode starts at its first failure (one warning line: what ran short, and what to do),
    says every ``every_s`` seconds while it lasts how many attempts failed, and ends once no
    attempt has failed for ``quiet_s`` seconds (a warning line with its length and count). While a
    shortage lasts asyncio tries again every second, so a quiet ``quiet_s`` above that means
    connections are accepted again.
    """

    def __init__(self, every_s: float = 60.0, quiet_s: float = 2.5):
        self.every_s, self.quiet_s = every_s, quiet_s
        self.started: float | None = None  # loop time of the episode's first failure
        self.last = 0.0  # loop time of its latest failure
        self.reported = 0.0  # loop time of its latest line
        self.failures = 0  # failed attempts in the episode
        self.unreported = 0  # of which since its latest line

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict) -> None:
        """Handle one report of ``loop`` (``context`` as :meth:`asyncio.loop.call_exception_handler`
        gives it)."""
        exc = context.get("exception")
        if not (isinstance(exc, OSError) and exc.errno in SHORTAGES and "socket" in context):
            loop.default_exception_handler(context)
            return
        now = self.last = loop.time()
        self.failures += 1
        self.unreported += 1
        if self.started is None:
            self.started = self.reported = now
            self.unreported = 0
            log.warning(
                "warning: cannot accept connections: %s: %s; new ones wait until a connection "
                "closes. Raise the limit, or have clients hold fewer connections open",
                exc.strerror,
                SHORTAGES[exc.errno].format(limit=_descriptor_limit()),
            )
            loop.call_later(self.quiet_s, self._check, loop)
        elif now - self.reported >= self.every_s:
            log.warning(
                "warning: still cannot accept connections (%s): %s attempts failed in the last "
                "%.0f s",
                exc.strerror,
                f"{self.unreported:,}",
                now - self.reported,
            )
            self.reported, self.unreported = now, 0

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        """End the episode if no attempt has failed for ``quiet_s`` seconds, else look again
        then."""
        quiet = loop.time() - self.last
        if quiet < self.quiet_s:
            # not less than a tenth of a second: a remainder within rounding would come back at once
            loop.call_later(max(self.quiet_s - quiet, 0.1), self._check, loop)
            return
        log.warning(
            "warning: accepting connections again, after %.1f s in which %s attempts failed",
            self.last - self.started,
            f"{self.failures:,}",
        )
        self.started, self.failures, self.unreported = None, 0, 0


async def _serve(server) -> None:
    """Run the uvicorn ``server`` in this event loop (asyncio's own, as ``server.run()`` chooses
    where uvloop is not installed), its shortages said by :class:`AcceptShortage`."""
    asyncio.get_running_loop().set_exception_handler(AcceptShortage())
    await server.serve()


def serve(
    translator: Translator, limits: Limits, host: str, port: int, quiet: bool = False
) -> None:
    """Serve until SIGTERM or SIGINT, then finish the requests in flight and return.

    Each request is logged in one line on stderr (status, lines, source tokens, milliseconds),
    unless ``quiet``, which leaves warnings and errors only; running out of file descriptors is
    said once an episode (:class:`AcceptShortage`).

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
    asyncio.run(_serve(uvicorn.Server(config)))
