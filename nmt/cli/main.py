"""The ``nmt`` command line: train, translate, evaluate, tune-decode, average, plot, info, export,
import, serve, profile, shortlist.

Each command (a module of :mod:`nmt.cli.commands`) parses its options and calls the function
that does the work; the rules that protect users live in those functions, so the Python
API has them too. Every user error is an :class:`~nmt.errors.NmtError`, reported here
once, by :class:`Command`, as one line, ``error: ...``, exit code 2, naming the flag the
user typed for each key the error names. Usage errors (a misspelt flag, an option that is not
repeatable given twice) are one line too.
"""

from __future__ import annotations

import collections
import contextlib
import difflib
import errno
import os
import sys
from collections.abc import Callable
from dataclasses import fields
from pathlib import PurePath
from typing import Annotated

import typer
from typer.core import TyperCommand, TyperGroup

from nmt.cli.commands.options import DECODE_KEYS, on_command_line
from nmt.errors import NmtError, first_line
from nmt.files import reason

from .commands import (
    average,
    evaluate,
    export,
    import_,
    info,
    plot,
    profile,
    serve,
    shortlist,
    train,
    translate,
    tune,
)

try:  # typer 0.2x runs its own copy of click
    from typer._click import exceptions as click_errors
except ImportError:  # older typer runs click itself
    from click import exceptions as click_errors

# torch is imported inside the commands, not here: `nmt --help`, `nmt evaluate --hyp` and
# usage errors answer in a fraction of a second without it (importing torch takes seconds).

# Options that set a config key. An error about the key names the option's flag when the
# flag set it, and always on a command without --config (the flag is the only way there).
CONFIG_KEYS = {"run_dir": "train.run_dir", **{name: f"decode.{name}" for name in DECODE_KEYS}}


def _names(ctx: typer.Context) -> Callable[[str], str]:
    """How errors name each key in ``ctx``'s command: argument names and config keys (see
    CONFIG_KEYS) by their flags."""
    names = {}
    for param in ctx.command.params:
        flag = (
            max(param.opts, key=len)
            if param.param_type_name == "option"
            else param.metavar or param.name.upper()
        )
        names[param.name] = flag
        if param.name in CONFIG_KEYS and (
            on_command_line(ctx, param.name) or "config" not in ctx.params
        ):
            names[CONFIG_KEYS[param.name]] = flag
    return lambda key: names.get(key, key)


#: What to lower when a command runs out of memory, by command (``nmt train`` names the config
#: keys).
SMALLER = {
    "train": "lower train.max_tokens (train.update_freq keeps the batch an update sees), or the "
    "model's size",
    "translate": "lower --max-tokens, --beam-size or --buffer-size",
    "evaluate": "lower --max-tokens or --beam-size",
    "tune-decode": "lower --max-tokens, the beam sizes or --max-sentences",
    "serve": "lower --max-batch-tokens or --max-beam-size",
    "profile": "lower --batch, --src-len, --tgt-len or --beam-size",
}


def refuse_repeated_options(ctx: typer.Context, order: list) -> None:
    """Refuse an option that is not repeatable given more than once (``order``: the parser's options
    as given, one per occurrence), in any spelling (``--hyp a --hyp=b``, ``-o a --output b``,
    ``--allow-unk --no-allow-unk``): the parser would keep the last without a word. Repeatable
    options (``multiple``: ``--ref``, ``--set``) and those the command never sees (``--help``) may
    repeat.

    Raises:
        click.BadOptionUsage: naming the option by all its spellings (a usage error: one line, exit
            code 2).
    """
    given = collections.Counter(
        p
        for p in order
        if p.param_type_name == "option"
        and p.expose_value
        and not p.multiple
        and not getattr(p, "count", False)
    )
    for param, times in given.items():
        if times > 1:
            # --output/-o, --allow-unk/--no-allow-unk
            spellings = "/".join(sorted(param.opts, key=len, reverse=True) + param.secondary_opts)
            raise click_errors.BadOptionUsage(
                param.name,
                f"option {spellings} is given {'twice' if times == 2 else f'{times} times'}; it is "
                "not repeatable: give it once",
                ctx=ctx,
            )


def expand_home(ctx: typer.Context, typed: dict) -> None:
    """Expand a leading ``~`` or ``~user`` in every path of ``ctx.params`` (a ``Path``) as a shell
    expands it, from the text ``typed`` for it (by parameter name); the shell itself leaves ``~`` in
    a quoted word and after ``--flag=`` (``--output=~/hyp.de``). ``./~`` stays the directory named
    ``~``. Config paths are expanded where they are read (:data:`nmt.fields.PathText`)."""
    for name, value in ctx.params.items():
        many = isinstance(value, (list, tuple))
        texts = typed.get(name) if many else [typed.get(name)]
        values = value if many else [value]
        if texts is None or len(texts) != len(values):
            continue
        values = [
            type(v)(os.path.expanduser(t))
            if isinstance(v, PurePath) and isinstance(t, str) and t.startswith("~")
            else v
            for v, t in zip(values, texts)
        ]
        ctx.params[name] = type(value)(values) if many else values[0]


class Command(TyperCommand):
    """A command whose user errors print as one line, ``error: ...``, with exit code 2; so does
    running out of memory, naming what to lower (:data:`SMALLER`), and an option given twice that
    takes one value. Paths given with a leading ``~`` are expanded (:func:`expand_home`)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        """Parse the command line, refusing an option given twice that is not repeatable
        (:func:`refuse_repeated_options`) and expanding ``~`` in paths (:func:`expand_home`)."""
        if ctx.resilient_parsing:  # shell completion
            return super().parse_args(ctx, args)
        # the text given for each parameter, before conversion
        typed, _, order = self.make_parser(ctx).parse_args(args=list(args))
        refuse_repeated_options(ctx, order)
        rest = super().parse_args(ctx, args)
        expand_home(ctx, typed)
        return rest

    def invoke(self, ctx: typer.Context):
        """Run the command; a user error becomes its one line on stderr and exit code 2."""
        try:
            return super().invoke(ctx)
        except NmtError as exc:
            typer.echo(f"error: {exc.render(_names(ctx))}", err=True)
            raise typer.Exit(code=2) from None
        except (MemoryError, RuntimeError) as exc:
            from nmt.runtime.device import out_of_memory  # here: `nmt --help` loads without torch

            if not out_of_memory(exc):
                raise
            first = first_line(exc)
            advice = SMALLER.get(ctx.info_name, "give it less to hold at once")
            typer.echo(
                f"error: nmt {ctx.info_name} ran out of memory ({first[:200]}); {advice}", err=True
            )
            raise typer.Exit(code=2) from None


def _setting_of(exc: click_errors.UsageError, ctx: typer.Context) -> str | None:
    """``--set SECTION.KEY=VALUE`` for an unknown option that names a config key, or nearly
    (``nmt train --threads 2``: ``--set train.threads=VALUE``), where the command takes ``--set``;
    every section holding the key, joined by "or"; else None."""
    from nmt.config import SECTIONS  # here: the config is read only for such an error

    if not isinstance(exc, click_errors.NoSuchOption):
        return None
    name = exc.option_name.lstrip("-").replace("-", "_")
    if not name or "--set" not in {o for p in ctx.command.params for o in p.opts}:
        return None
    keys = {f.name for cls in SECTIONS.values() for f in fields(cls)}
    if name not in keys:  # a key it begins (--warmup: warmup_steps), else one close to it
        begun = sorted(k for k in keys if k.startswith(name))
        name = next(iter(begun or difflib.get_close_matches(name, keys, 1, 0.85)), "")
    found = [s for s, cls in SECTIONS.items() if name in {f.name for f in fields(cls)}]
    return " or ".join(f"--set {s}.{name}=VALUE" for s in found) or None


@contextlib.contextmanager
def _usage_errors(ctx: typer.Context):
    """Report a usage error (a misspelt flag, a missing option) as one line, exit code 2, like every
    user error."""
    try:
        yield
    # `nmt plot` alone, which prints help (click 8.2+)
    except getattr(click_errors, "NoArgsIsHelpError", ()):
        raise
    except click_errors.UsageError as exc:
        message = exc.format_message().rstrip(".")
        # a misspelt flag: the closest of click's candidates
        setting = _setting_of(exc, exc.ctx or ctx)
        if setting:
            message = f"no such option: {exc.option_name}; did you mean {setting}?"
        elif getattr(exc, "possibilities", None):
            # an option the misspelling begins (--beam: --beam-size), else the closest
            begun = [p for p in exc.possibilities if p.startswith(exc.option_name)]
            (closest,) = begun[:1] or difflib.get_close_matches(
                exc.option_name, exc.possibilities, n=1, cutoff=0
            )
            message = f"no such option: {exc.option_name}; did you mean {closest}?"
        typer.echo(
            f"error: {message[:1].lower()}{message[1:]} (see {(exc.ctx or ctx).command_path} "
            "--help)",
            err=True,
        )
        raise typer.Exit(code=2) from None


class Group(TyperGroup):
    """A group of :class:`Command` whose usage errors print as one line too."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        """Parse the group's own options (``nmt --version``)."""
        with _usage_errors(ctx):
            return super().parse_args(ctx, args)

    def invoke(self, ctx: typer.Context):
        """Find and run the command named (a misspelt name is a usage error too)."""
        with _usage_errors(ctx):
            return super().invoke(ctx)


class _PlotGroup(Group):
    """``nmt plot RUN`` stays short for ``nmt plot metrics RUN``."""

    def resolve_command(self, ctx, args):
        """The command ``args`` name, ``metrics`` when they start with a run directory."""
        if args and args[0] not in self.commands and not args[0].startswith("-"):
            args = ["metrics", *args]
        return super().resolve_command(ctx, args)


# Plain help, not Rich panels: typer 0.29's Rich panel prints a `<bool>` type after every flag
# (`--resume <bool>`, as if it took a value), while its plain formatter leaves flags bare.
SETTINGS = {
    "no_args_is_help": True,
    "rich_markup_mode": None,
    "context_settings": {"max_content_width": 120},
}
app = typer.Typer(cls=Group, add_completion=False, **SETTINGS)
plot_app = typer.Typer(
    cls=_PlotGroup,
    **SETTINGS,
    help="Plot a run's metrics (nmt plot RUN, same as nmt plot metrics RUN) or a translation's "
    "cross-attention (nmt plot attention SENTENCE --checkpoint CKPT).",
)
for name, command in (
    ("train", train.train),
    ("translate", translate.translate),
    ("evaluate", evaluate.evaluate),
    ("tune-decode", tune.tune_decode),
    ("average", average.average),
    ("info", info.info),
    ("export", export.export),
    ("import", import_.import_),
    ("serve", serve.serve),
    ("profile", profile.profile),
    ("shortlist", shortlist.shortlist),
):
    app.command(name, cls=Command)(command)
app.add_typer(plot_app, name="plot")
plot_app.command("metrics", cls=Command)(plot.metrics)
plot_app.command("attention", cls=Command)(plot.attention)


def _package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("nmt")
    except PackageNotFoundError:  # running from a source tree that pip has not installed
        from nmt import __version__

        return __version__


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(
            f"nmt {_package_version()} (torch {version('torch')}, Python {sys.version.split()[0]})"
        )
        raise typer.Exit()


@app.callback()
def options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_print_version,
            is_eager=True,
            help="Print nmt's version (and torch's, Python's) and exit.",
        ),
    ] = False,
) -> None:
    """nmt: train Transformer translation models, translate with them, score the output, export
    them."""


def main() -> None:
    """The ``nmt`` script. Text on standard output and standard error is UTF-8 whatever the
    locale (as sacreBLEU and fairseq write it), so ``LC_ALL=C`` or ``PYTHONIOENCODING=ascii``
    cannot make a translation fail after the work, or write a file in another encoding."""
    for stream in (sys.stdout, sys.stderr):
        if stream is not None and hasattr(stream, "reconfigure"):
            # surrogateescape: a file name that is not UTF-8 (as the OS decoded it) is printed as
            # its own bytes, as ls does
            stream.reconfigure(
                encoding="utf-8",
                errors="surrogateescape" if stream is sys.stdout else "backslashreplace",
            )
    try:
        try:
            app()
        finally:
            if sys.stdout is not None:
                # here, where a failure can still be reported, not at the interpreter's exit
                sys.stdout.flush()
    # standard output on a full disk or a failing device (`> /dev/full`): files nmt writes say so
    # themselves
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO):
            raise
        # what is still buffered goes nowhere, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        typer.echo(f"error: cannot write standard output: {reason(exc)}", err=True)
        raise SystemExit(2) from None
