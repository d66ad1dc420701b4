"""Config fields that carry their own rules, and one reader of values for YAML files and ``--set``.

A field is declared with :func:`setting`: its default, a line of help, and the range of a
number or the pattern of a text beside its type (choices as ``Literal``). A section class
deriving from :class:`Checked` checks its fields whenever it is built, ``dataclasses.replace``
included, so a bad value is refused wherever it comes from.

Values are read by their field's type (:func:`read`), the same way from a YAML file and
from ``--set``: YAML's own guesses at types are not used, so ``tgt_lang: no`` is Norwegian.

* text is taken as written; ``null``, ``~`` or nothing is null, where a key allows it;
* a path (:data:`PathText`) is text whose leading ``~`` or ``~user`` and whose ``$NAME`` and
  ``${NAME}`` are expanded as a shell expands them (``~/runs/x``, ``$SCRATCH/runs/x``, quoted or
  not; ``$$`` is a ``$``; ``~`` alone is null where a key allows it); an unset or empty variable is
  an error (:func:`expand_path`);
* a boolean is ``true``/``false``, ``yes``/``no``, ``on``/``off`` or ``1``/``0``, in any case;
* a number is written as in Python or JSON: ``5e-4``, ``1_000_000``, ``0x10``, ``.5``;
  ``2e4`` is a whole number; leading zeros are decimal (``010`` is 10, as in YAML 1.2);
* a list is ``[0.9, 0.98]`` (a list of text may also be written ``en-de,en-fr``), a mapping
  ``{train: a.json}``; quotes make a value text.

Errors name the key as :class:`~nmt.errors.Key` data and repeat the value as written.
"""

# Size: module at most 580 lines: the field declaration and the one reader of values (YAML and
# --set) with its limits and a path's expansion as a shell's, which every field's rule relies on.

from __future__ import annotations

import difflib
import functools
import math
import os
import re
import types
import typing
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar, Literal, NewType

import yaml

from .errors import Key, NmtError


class ConfigError(NmtError, ValueError):
    """A config value, key or file, or an option, is invalid; the message names it (as
    :class:`~nmt.errors.Key` data)."""


@dataclass(frozen=True)
class Range:
    """The values a number may take: ``low`` to ``high``, each end included unless ``*_open``; never
    nan, and inf only where ``unbounded`` (a limit for which inf means none, as 0 does)."""

    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    unbounded: bool = False

    def __contains__(self, value: float) -> bool:
        if not math.isfinite(value):
            return value == math.inf and self.unbounded
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        low, high = _show(self.low), _show(self.high)
        if self.high == math.inf:
            return (
                "a finite number"
                if self.low == -math.inf
                else f"{'>' if self.low_open else '>='} {low}{' or inf' if self.unbounded else ''}"
            )
        return f"in {'(' if self.low_open else '['}{low}, {high}{')' if self.high_open else ']'}"


def _show(x: float) -> str:
    """``x`` without a spurious ``.0`` or exponent: 4294967295, not 4.29497e+09."""
    return str(int(x)) if math.isfinite(x) and x == int(x) else f"{x:g}"


#: A config key that names a file or directory: text, its leading ``~`` or ``~user`` and its
#: environment variables expanded as a shell expands them (:func:`expand_path`).
PathText = NewType("PathText", str)

# every whole number of a config, unless its range says otherwise: what SentencePiece's and the
# OS's C ints hold
MAX_INT = 2**31 - 1
LANGUAGE = (
    r"[A-Za-z][A-Za-z0-9_-]*",
    "a language code: a letter, then letters, digits, _ or - (en, zh_TW, pt-BR)",
)
AT_LEAST_1, AT_LEAST_0, POSITIVE, PROBABILITY = (
    Range(1),
    Range(0),
    Range(0, low_open=True),
    Range(0, 1, high_open=True),
)


def setting(
    default: Any, help: str, allowed: Range | None = None, pattern: tuple[str, str] | None = None
) -> Any:
    """A config field: its default, one line of help, and the values it may take beyond its type.

    Args:
        allowed: the range of a number (of each number, for a tuple); every number has one.
        pattern: ``(regular expression, the same in words)`` that a text value must match.
    """
    return field(default=default, metadata={"help": help, "range": allowed, "pattern": pattern})


class Checked:
    """A config section (``section`` names it) that checks every field against its choices, range
    and pattern when it is built."""

    section: ClassVar[str]

    def __post_init__(self) -> None:
        for f in fields(self):  # type: ignore[arg-type]
            _check(
                f"{self.section}.{f.name}",
                getattr(self, f.name),
                hints(type(self))[f.name],
                f.metadata,
            )


@functools.cache
def hints(cls: type) -> dict[str, Any]:
    """The resolved type of each field of ``cls``."""
    return typing.get_type_hints(cls)


def _members(tp: Any) -> tuple[Any, ...]:
    """The types a value of ``tp`` may have: a union's members, else ``tp`` itself."""
    return (
        typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)
    )


def _choices(tp: Any) -> tuple[str, ...]:
    """The text values a ``Literal`` in ``tp`` allows (empty if none)."""
    return tuple(
        v for m in _members(tp) if typing.get_origin(m) is Literal for v in typing.get_args(m)
    )


def _either(words: list[str]) -> str:
    """``a, b or c``."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"


def _describe(tp: Any, allowed: Range | None) -> str:
    """What a value of ``tp`` may be, in words: ``an integer >= 1``, ``auto, true or false``."""
    words: list[str] = []
    for m in _members(tp):
        origin = typing.get_origin(m)
        if origin is Literal:
            words += typing.get_args(m)
        elif m is bool:
            words += ["true", "false"]
        elif m in (int, float):
            noun = "an integer" if m is int else "a number"
            words.append(
                noun
                if allowed is None
                else str(allowed)
                if str(allowed).startswith("a ")
                else f"{noun} {allowed}"
            )
        elif m in (str, PathText):
            words.append("text")
        elif origin is tuple and typing.get_args(m)[-1] is Ellipsis:
            words.append("a list of text (or text with commas: a,b)")
        elif origin is tuple:
            words.append(f"a list of {len(typing.get_args(m))} numbers {allowed}")
        elif origin is dict:
            words.append("a mapping of text to text")
        elif m is type(None):
            words.append("null")
    return _either(words)


def did_you_mean(word: str, choices: list[str] | tuple[str, ...], prefix: str = "") -> str:
    """``"; did you mean X?"`` for the choices closest to ``word`` (all that are equally close; case
    does not count), or ``""``."""
    lowered = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(lowered), n=3)
    ratio = {lowered[c]: difflib.SequenceMatcher(None, word.lower(), c).ratio() for c in close}
    best = [prefix + c for c in sorted(ratio) if ratio[c] == max(ratio.values())]
    return f"; did you mean {' or '.join(best)}?" if best else ""


def _check(key: str, value: Any, tp: Any, meta: Any) -> None:
    """Refuse a built field's value outside its choices, range or pattern.

    Raises:
        ConfigError: naming ``key`` and the values it allows.
    """
    choices = _choices(tp)
    if value is None:
        return
    if isinstance(value, str) and choices:
        if value not in choices:
            raise ConfigError(
                Key(key),
                f" must be {_describe(tp, meta['range'])}, got "
                f"{value!r}{did_you_mean(value, choices)}",
            )
        return
    allowed, pattern = meta["range"], meta["pattern"]
    # a path or a name: "" would mean the current directory or "train."
    if isinstance(value, str) and not value.strip():
        raise ConfigError(
            Key(key),
            f" must not be empty, got {value!r}: write a value"
            + (", or null for none" if type(None) in _members(tp) else ""),
        )
    for i, number in enumerate(value) if isinstance(value, tuple) else [(None, value)]:
        if (
            allowed is not None
            and isinstance(number, (int, float))
            and not isinstance(number, bool)
            and number not in allowed
        ):
            where = key if i is None else f"{key}[{i}]"
            raise ConfigError(
                Key(where),
                f" must be {_either([*choices, 'a number'])} {allowed}"
                if choices
                else f" must be {allowed}",
                f", got {number}",
            )
        if (
            isinstance(number, int)
            and not isinstance(number, bool)
            and abs(number) > MAX_INT
            and allowed is not None
            and allowed.high == math.inf
        ):
            raise ConfigError(
                Key(key if i is None else f"{key}[{i}]"),
                f" must be at most {MAX_INT:,}, got {number}",
            )
    for i, text in enumerate(value) if isinstance(value, tuple) else [(None, value)]:
        if pattern is not None and isinstance(text, str) and not re.fullmatch(pattern[0], text):
            raise ConfigError(
                Key(key if i is None else f"{key}[{i}]"), f" must be {pattern[1]}, got {text!r}"
            )


class Written(str):
    """Text as a user wrote it in YAML or ``--set``, quoted or not: the environment variables of a
    path in it are expanded. Text read back from a checkpoint or a run's config (plain ``str``) was
    expanded when it was written, and a ``$`` left in it is a ``$``."""


class Plain(Written):
    """Text written without quotes in YAML or ``--set``: its key's type decides what it means."""


# What follows a $ in a path: $$ (a $), a variable ($NAME, ${NAME}), or a form a shell would
# substitute from something an environment does not hold (${NAME:-x}, ${}, $1, $?, $#); a $ before
# anything else stays a $, as in a shell.
_DOLLAR = re.compile(
    r"\$(?:(\$)|([A-Za-z_]\w*)|\{([A-Za-z_]\w*)\}|(\{[^}]*\}?|[\d#?!@*-]))", re.ASCII
)


def expand_path(text: str, key: str) -> str:
    """``text`` (a path written for ``key``) with a leading ``~`` or ``~user``, and where it is
    :class:`Written`, each ``$NAME`` and ``${NAME}``, expanded as a shell expands them; ``$$`` is
    a ``$``. What a variable holds is taken as it is (its ``$`` and ``~`` are not expanded again).

    Raises:
        ConfigError: naming ``key``: a variable that is unset or empty (which would move the path
            to ``/`` or the working directory), or a ``$`` form only a shell has values for.
    """

    def value(match: re.Match) -> str:
        if match[1]:
            return "$"
        name = match[2] or match[3]
        if name is None:
            raise ConfigError(
                Key(key),
                f" {text!r}: {match[0]} is not a variable nmt expands; write $NAME or "
                "${NAME}, or $$ for the text $",
            )
        if not os.environ.get(name):
            raise ConfigError(
                Key(key),
                f" {text!r} names {match[0]}, which is "
                f"{'empty' if name in os.environ else 'not set'}; set it in the environment "
                f"(export {name}=...), or write ${match[0]} for the text {match[0]}",
            )
        return os.environ[name]

    # a shell's tilde prefix: up to the first /, expanded before the variables and not after
    tilde = re.match(r"~[^/]*", text)
    home = os.path.expanduser(tilde[0]) if tilde else None
    start, rest = (home, text[tilde.end() :]) if tilde and home != tilde[0] else ("", str(text))
    return start + (_DOLLAR.sub(value, rest) if isinstance(text, Written) else rest)


NULL = ("", "~", "null", "Null", "NULL")  # YAML 1.2's null, only where a key allows null
_BOOLEANS = {
    "true": True,
    "false": False,
    "yes": True,
    "no": False,
    "on": True,
    "off": False,
    "1": True,
    "0": False,
}


class _Mismatch(Exception):
    """A value is not of the type tried (the caller tries the next, or says what it allows)."""


def _number(value: Any, integer: bool) -> int | float:
    """``value`` (a number, or text as Python or JSON writes it) as an int or a float; an integral
    float is an int."""
    if isinstance(value, str):
        text = value.strip()
        try:
            value = int(text, 0)
        except ValueError:
            try:
                value = float(text)
            except ValueError:
                raise _Mismatch from None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _Mismatch
    if not integer:
        return float(value)
    if isinstance(value, float) and not value.is_integer():
        raise _Mismatch
    return int(value)


def _read_as(value: Any, tp: Any, key: str, allowed: Range | None) -> Any:
    """``value`` as one member type ``tp`` of a key's type.

    Raises:
        _Mismatch: it is not one; ConfigError: an element of a list is not of its type.
    """
    origin = typing.get_origin(tp)
    if origin is Literal:
        if isinstance(value, str) and value.strip() in typing.get_args(tp):
            return value.strip()
    elif tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.strip().lower() in _BOOLEANS:
            return _BOOLEANS[value.strip().lower()]
    elif tp in (int, float):
        return _number(value, tp is int)
    elif tp in (str, PathText):
        if isinstance(value, str):
            return expand_path(value, key) if tp is PathText else str(value)
    # any length: a list, or text with commas (fairseq's --lang-pairs)
    elif origin is tuple and typing.get_args(tp)[-1] is Ellipsis:
        # an empty item is refused, not dropped
        items = (
            ([v.strip() for v in value.split(",")] if value.strip() else [])
            if isinstance(value, str)
            else value
        )
        if isinstance(items, (list, tuple)):
            return tuple(
                read(v, typing.get_args(tp)[0], f"{key}[{i}]", allowed) for i, v in enumerate(items)
            )
    elif origin is tuple:
        if isinstance(value, (list, tuple)) and len(value) == len(typing.get_args(tp)):
            return tuple(
                read(v, t, f"{key}[{i}]", allowed)
                for i, (v, t) in enumerate(zip(value, typing.get_args(tp)))
            )
    elif origin is dict:
        if isinstance(value, dict) and all(
            not isinstance(v, (dict, list, tuple)) and v is not None for v in value.values()
        ):
            return {
                str(k): read(
                    v if isinstance(v, str) else str(v), typing.get_args(tp)[1], f"{key}.{k}"
                )
                for k, v in value.items()
            }
    raise _Mismatch


def as_written(values: dict[str, Any], cls: type) -> dict[str, Any]:
    """``values`` of the section ``cls`` as a config writes them to read back the same: each path's
    ``$`` doubled (one left in an expanded path is the text ``$``, not a variable)."""

    def written(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: written(v) for k, v in value.items()}
        return value.replace("$", "$$") if isinstance(value, str) else value

    paths = {PathText, dict[str, PathText]}
    return {
        k: written(v) if paths & set(_members(hints(cls).get(k))) else v for k, v in values.items()
    }


def _shown(value: Any) -> str:
    """``value`` as the user wrote it, for a message."""
    if isinstance(value, Plain) and value.strip() in NULL:
        return value.strip() or "nothing"
    return repr(
        str(value)
        if isinstance(value, str)
        else [str(v) if isinstance(v, str) else v for v in value]
        if isinstance(value, list)
        else value
    )


def read(value: Any, tp: Any, key: str, allowed: Range | None = None) -> Any:
    """A raw value (text from YAML or ``--set``, or a Python value) as the type ``tp`` of ``key``.

    Raises:
        ConfigError: naming ``key``, what it allows and the value as written.
    """
    members = _members(tp)
    if value is None or isinstance(value, Plain) and value.strip() in NULL:
        if type(None) in members:
            return None
    else:
        for member in members:
            try:
                return _read_as(value, member, key, allowed)
            except _Mismatch:
                pass
    hint = did_you_mean(value, _choices(tp)) if isinstance(value, str) else ""
    if isinstance(value, Plain) and value.strip() in NULL and {str, PathText} & set(members):
        meaning = (
            "your home directory" if value.strip() == "~" and PathText in members else "the text"
        )
        hint = f"; write '{value.strip()}' in quotes to mean {meaning}" if value.strip() else ""
    raise ConfigError(Key(key), f" must be {_describe(tp, allowed)}, got {_shown(value)}{hint}")


def written(name: str) -> str:
    """A key as the user wrote it, quoted where it holds a line break or other unprintable character
    (a message is one line)."""
    return name if name.isprintable() else repr(name)


def kind(value: Any) -> str:
    """What sort of value ``value`` is, in words (``a list``, ``text``)."""
    return {dict: "a mapping", list: "a list", type(None): "nothing"}.get(
        type(value), "text" if isinstance(value, str) else type(value).__name__
    )


MAX_YAML_VALUES, MAX_YAML_DEPTH = (
    100_000,
    64,
    # far beyond any config; what aliases can reach past them (a list holding itself, "billion
    # laughs") is refused
)


def _from_node(
    node: yaml.Node,
    path: Path | None,
    lines: dict[str, int],
    key: str = "",
    budget: list[int] | None = None,
    depth: int = 0,
) -> Any:
    """A YAML node as Python values, every scalar as text (unquoted: :class:`Plain`); ``lines`` gets
    each key's line.

    Raises:
        ConfigError: a key that is not text, one written twice in a mapping, or values nested
            deeper than :data:`MAX_YAML_DEPTH` or more than :data:`MAX_YAML_VALUES` of them
            (aliases that contain or repeat themselves).
    """
    budget = [MAX_YAML_VALUES] if budget is None else budget
    budget[0] -= 1
    if budget[0] < 0 or depth > MAX_YAML_DEPTH:
        what = (
            f"nests values deeper than {MAX_YAML_DEPTH} levels"
            if depth > MAX_YAML_DEPTH
            else f"expands to more than {MAX_YAML_VALUES:,} values"
        )
        raise ConfigError(
            f"the YAML {what} (an alias that contains or repeats itself?); write the values out",
            path=path,
            line=node.start_mark.line + 1 if path else None,
        )
    if isinstance(node, yaml.ScalarNode):
        return Plain(node.value) if node.style is None else Written(node.value)
    if isinstance(node, yaml.SequenceNode):
        return [_from_node(item, path, lines, key, budget, depth + 1) for item in node.value]
    out: dict[str, Any] = {}
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        if not isinstance(key_node, yaml.ScalarNode):
            raise ConfigError("a key must be text, not a list or mapping", path=path, line=line)
        name = f"{key}.{key_node.value}" if key else key_node.value
        if key_node.value in out:
            first = f" (first at line {lines[name]})" if path is not None else ""
            what = "key" if key else "section"
            raise ConfigError(
                f"duplicate {what} {written(name)}{first}; write each once",
                key=name,
                path=path,
                line=line if path else None,
            )
        lines[name] = line
        out[key_node.value] = _from_node(value_node, path, lines, name, budget, depth + 1)
    return out


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What PyYAML says is wrong, in one line."""
    return getattr(exc, "problem", None) or str(exc).splitlines()[0]


def read_yaml(text: str, path: Path | None = None, key: str = "") -> tuple[Any, dict[str, int]]:
    """``text`` (a YAML document) as Python values, every scalar as text (:class:`Plain` where
    unquoted), and the line of each key.

    Args:
        path: the file ``text`` comes from, named in errors with the line; None for the value of a
            ``--set``.
        key: the key ``text`` is the value of (a ``--set``'s), for naming the keys inside it.

    Raises:
        ConfigError: ``text`` is not YAML, or a mapping writes a key twice or has a key that is not
            text.
    """
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        # a ReaderError (a control character) has a position
        line = mark.line + 1 if mark else text[: getattr(exc, "position", 0)].count("\n") + 1
        raise ConfigError(
            f"not valid YAML ({_yaml_problem(exc)})", path=path, line=line if path else None
        ) from None
    lines: dict[str, int] = {}
    return (None if node is None else _from_node(node, path, lines, key)), lines


def read_override(text: str, key: str) -> Any:
    """The value of a ``--set``: read as YAML where it starts as a list, a mapping or quoted text
    would, else the text as written.

    Raises:
        ConfigError: a list, mapping or quoted text that is not valid YAML.
    """
    text = text.strip()
    return read_yaml(text, key=key)[0] if text.startswith(("[", "{", '"', "'")) else Plain(text)


# A file name that says "test": test.de, test_2016_flickr.en.gz, newstest2014.de (but not
# latest.en).
_TEST_NAME = re.compile(r"(?:^|[^a-z])(?:news)?test", re.IGNORECASE)


def looks_like_test_data(path: str | Path) -> bool:
    """Whether a file's (or a split's) name, not its directory, says it holds a test set.

    A name check, not a guarantee: it guards against the common mistake of choosing settings
    or checkpoints on the test set (validation and ``nmt tune-decode`` refuse such names), and
    cannot know what a file really holds.
    """
    return bool(_TEST_NAME.search(Path(path).name))
