"""User errors: one base class, so that the command line reports every one as one line and exit code
2; and warnings about single inputs, capped (:class:`Capped`).

An error names what it is about as data, not only as text: :class:`Key` parts of its
message are config keys (``decode.n_best``) or argument names (``out``). Python callers
read them as written; ``nmt`` prints the flag the user typed instead (``--n-best``,
``--out``), without touching the rest of the message, so a path that happens to contain
a key's name is never rewritten.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from pathlib import Path


class Key(str):
    """A config key (``decode.n_best``) or an argument name (``out``) inside an error message."""


class NmtError(Exception):
    """Something the user gave (a file, a config value, an option) is wrong; said in one line.

    Args:
        parts: the message, in order: text and :class:`Key` parts.
        key: what the error is about, where no :class:`Key` part says it (a config section).
        path: the file the error is in, shown first (``path:line: message``).
        line: the 1-based line of ``path``.
    """

    def __init__(
        self,
        *parts: str,
        key: str | None = None,
        path: str | Path | None = None,
        line: int | None = None,
    ):
        self.parts = parts
        self.key = (
            key if key is not None else next((str(p) for p in parts if isinstance(p, Key)), None)
        )
        self.path, self.line = path, line
        super().__init__(self.render())

    def located(self, path: str | Path, line: int | None = None) -> NmtError:
        """This error, now saying it is at ``path`` (and ``line``)."""
        self.path, self.line = path, line
        self.args = (self.render(),)
        return self

    def render(self, name: Callable[[str], str] = str) -> str:
        """The one-line message, each :class:`Key` part written as ``name(key)``."""
        text = "".join(name(p) if isinstance(p, Key) else p for p in self.parts)
        if self.path is None:
            return text
        return f"{self.path}:{self.line}: {text}" if self.line else f"{self.path}: {text}"

    def __str__(self) -> str:
        return self.render()


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type's name where it has none: what a one-line
    error quotes of an exception from torch, a compiler or a file reader."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Capped:
    """Warnings about single inputs (a translated line), by kind, logged to ``log``: the first
    :attr:`NAMED` of each kind are logged, naming their input, the rest only counted (a file of
    100,000 lines with digits the vocabulary lacks would otherwise write 100,000 lines to stderr);
    :meth:`say_unnamed` says how many at the end. Each message is written where it is said,
    beginning ``warning: ``."""

    NAMED = 10

    def __init__(self, log: logging.Logger):
        self.log, self.counts = log, Counter()

    def __call__(self, kind: str, message: str, *args) -> None:
        """Log ``message % args`` (a ``warning: ...`` line), or count it once ``kind`` has had
        :attr:`NAMED`; the last one named says that more are counted."""
        self.counts[kind] += 1
        if self.counts[kind] < self.NAMED:
            self.log.warning(message, *args)  # the caller's text, "warning: ..."
        elif self.counts[kind] == self.NAMED:
            self.log.warning(message + "; further lines like this are counted, not named", *args)

    def say_unnamed(self) -> None:
        """Log one line per kind with lines counted but not named (at the end of a run)."""
        for kind, n in self.counts.items():
            if n > self.NAMED:
                self.log.warning(
                    "warning: %d more input line(s) not named above: %s", n - self.NAMED, kind
                )
