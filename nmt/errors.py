"""User errors: one base class, so that the command line reports every one as one line and exit code
2.

An error names what it is about as data, not only as text: :class:`Key` parts of its
message are config keys (``decode.n_best``) or argument names (``out``). Python callers
read them as written; ``nmt`` prints the flag the user typed instead (``--n-best``,
``--out``), without touching the rest of the message, so a path that happens to contain
a key's name is never rewritten.
"""

from __future__ import annotations

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
