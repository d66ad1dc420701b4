"""``nmt plot``: a run's metrics over training steps, or a translation's cross-attention, as a
PNG."""

from __future__ import annotations

import functools
import json
import logging
import math
import warnings
from pathlib import Path

from nmt.data.corpus import DataError
from nmt.files import atomic_write

log = logging.getLogger("nmt.plot")

#: Where a font for Chinese, Japanese or Korean labels comes from, for the warning when none is
#: installed.
CJK_FONT_HINT = (
    "install one: Debian's fonts-noto-cjk (apt install fonts-noto-cjk), or for "
    "Japanese pip's japanize-matplotlib"
)


def read_metrics(run_dir: Path) -> list[dict]:
    """Records of ``run_dir/metrics.jsonl``. Raises :class:`~nmt.data.corpus.DataError` if absent or
    malformed."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        if (Path(run_dir) / ".lock").is_file():  # a run's, stopped before it logged a step
            raise DataError(
                f"{path}: not found: the run in {run_dir} logged nothing yet (train.log_every "
                "steps, or a validation, write a record)"
            )
        raise DataError(f"{path}: not found; is {run_dir} a run directory?")
    records = []
    for number, line in enumerate(path.read_bytes().splitlines(), start=1):
        try:
            record = json.loads(line)
        except ValueError:  # also not UTF-8
            raise DataError(f"{path}:{number}: not a JSON object") from None
        if not _is_record(record):
            raise DataError(
                f"{path}:{number}: not a record of nmt train (an object with an integer step, and "
                "numbers for loss and lr,"
                " or for bleu and valid_loss); remove or correct the line"
            )
        records.append(record)
    return records


def _is_record(record) -> bool:
    """Whether a ``metrics.jsonl`` record has what :func:`plot_metrics` reads, of the right
    types."""

    def number(key: str) -> bool:
        return isinstance(record.get(key), (int, float)) and not isinstance(record[key], bool)

    if (
        not isinstance(record, dict)
        or not number("step")
        or not math.isfinite(record["step"])
        or record["step"] != int(record["step"])
    ):
        return False
    return ("loss" not in record or number("loss") and number("lr")) and (
        "bleu" not in record or number("bleu") and number("valid_loss")
    )


def _pyplot():
    """Matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _suffix_format(out: Path) -> str:
    """The image format ``out``'s suffix names, ``png`` when it has none."""
    return Path(out).suffix[1:].lower() or "png"


def check_image_format(out: Path) -> str:
    """The image format ``out``'s suffix names (``png`` when it has none), checked before any work.

    Raises:
        nmt.data.corpus.DataError: a suffix matplotlib cannot write.
    """
    plt, image_format = _pyplot(), _suffix_format(out)
    figure = plt.figure()
    formats = figure.canvas.get_supported_filetypes()
    plt.close(figure)
    if image_format not in formats:
        raise DataError(f"{out}: cannot write .{image_format} images; use .png, .pdf or .svg")
    return image_format


def plot_metrics(run_dir: Path, out: Path | None = None) -> Path:
    """Write loss (training and validation, nats per target token), validation BLEU and
    learning rate against optimizer steps to ``out`` (default ``run_dir/metrics.png``). A run of
    several directions shows each one's validation loss and BLEU beside their mean.

    The format follows ``out``'s suffix (PNG when it has none); the file is written at
    exactly ``out``, and that path is returned.

    Raises:
        nmt.data.corpus.DataError: no or malformed ``metrics.jsonl``, or a suffix matplotlib
            cannot write.
    """
    plt = _pyplot()
    out = Path(out) if out else Path(run_dir) / "metrics.png"
    image_format = check_image_format(out)
    records = read_metrics(run_dir)
    train = [r for r in records if "loss" in r]
    valid = [r for r in records if "bleu" in r]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot(
        [r["step"] for r in train], [r["loss"] for r in train], label="train (label-smoothed)"
    )
    # the directions, if several
    names = list(
        dict.fromkeys(k.partition("/")[2] for r in valid for k in r if k.startswith("bleu/"))
    )
    mean = f" (mean of {len(names)} directions)" if names else ""
    axes[0].plot(
        [r["step"] for r in valid],
        [r["valid_loss"] for r in valid],
        "o-",
        label=f"validation{mean or ' (label-smoothed)'}",
    )
    axes[1].plot(
        [r["step"] for r in valid],
        [r["bleu"] for r in valid],
        "o-",
        label=f"mean{', which best.pt follows' if names else ''}",
    )
    for name in names:
        each = [r for r in valid if f"bleu/{name}" in r]
        axes[0].plot(
            [r["step"] for r in each],
            [r[f"valid_loss/{name}"] for r in each],
            ".--",
            label=f"validation {name}",
        )
        axes[1].plot(
            [r["step"] for r in each], [r[f"bleu/{name}"] for r in each], ".--", label=name
        )
    axes[0].set(
        xlabel="step",
        ylabel="loss (nats/token)",
        title="loss" + (" (label-smoothed)" if names else ""),
    )
    axes[0].legend()
    axes[1].set(xlabel="step", ylabel="BLEU", title="validation BLEU")
    if names:
        axes[1].legend()
    axes[2].plot([r["step"] for r in train], [r["lr"] for r in train])
    axes[2].set(xlabel="step", ylabel="learning rate", title="learning rate")
    fig.tight_layout()
    atomic_write(out, lambda f: fig.savefig(f, dpi=100, format=image_format))
    plt.close(fig)
    return out


@functools.lru_cache(maxsize=None)
def _characters(font_path: str) -> frozenset[int]:
    """The code points a font file has glyphs for."""
    from matplotlib import ft2font

    try:
        return frozenset(ft2font.FT2Font(font_path).get_charmap())
    except (OSError, RuntimeError, ValueError):  # a font FreeType cannot open draws nothing
        return frozenset()


def label_fonts(
    labels: list[str], candidates: list[tuple[str, str]] | None = None
) -> list[str] | None:
    """Font families that draw every character of ``labels``: matplotlib's DejaVu Sans first, then
    the first of ``candidates`` (``(family, file)``; default: every font matplotlib finds installed,
    by name) that has the characters DejaVu Sans lacks, for matplotlib's per-glyph fallback.

    Returns:
        None when DejaVu Sans has them all (the default font will do) or no candidate has them
        (then one warning names the characters and how to install a font).
    """
    from matplotlib import font_manager

    needed = {ord(c) for label in labels for c in label if not c.isspace()}
    missing = needed - _characters(font_manager.findfont("DejaVu Sans"))
    if not missing:
        return None
    if candidates is None:
        candidates = sorted({(f.name, f.fname) for f in font_manager.fontManager.ttflist})
    for family, path in candidates:
        if missing <= _characters(path):
            return ["DejaVu Sans", family]
    sample = "".join(sorted(map(chr, missing))[:8])
    log.warning(
        "warning: no installed font has %d of the labels' characters (%s...): they are drawn as "
        "boxes; %s",
        len(missing),
        sample,
        CJK_FONT_HINT,
    )
    return None


def plot_attention(
    weights,
    src_pieces: list[str],
    tgt_pieces: list[str],
    out: Path,
    marked_layer: int | None = None,
) -> Path:
    """Write heatmaps of cross-attention ``weights`` ``(n_layers, tgt_len, src_len)`` (heads
    averaged; each row sums to 1), one panel per decoder layer: source pieces across, output
    pieces down, darker = more attention. ``marked_layer``'s title says that alignments come from
    it."""
    plt = _pyplot()
    fonts = label_fonts(src_pieces + tgt_pieces)
    with plt.rc_context({"font.family": fonts} if fonts else {}), warnings.catch_warnings():
        # said once above, not once per glyph
        warnings.filterwarnings("ignore", message="Glyph .* missing from")
        return _draw_attention(plt, weights, src_pieces, tgt_pieces, Path(out), marked_layer)


# an attention plot's image (160 MB as RGBA): beyond it, drawn at a lower resolution
MAX_PIXELS = 40_000_000


def attention_figure(n_layers: int, tgt_len: int, src_len: int) -> tuple[tuple[float, float], int]:
    """The figure size (inches) and resolution (dots per inch, at most 100) of an attention plot: a
    column per source piece and a row per output piece in each layer's panel, at most
    :data:`MAX_PIXELS`."""
    size = (1.5 + n_layers * (1.8 + 0.35 * src_len), 1.5 + 0.3 * tgt_len)
    return size, max(1, min(100, int((MAX_PIXELS / (size[0] * size[1])) ** 0.5)))


def _draw_attention(
    plt, weights, src_pieces: list[str], tgt_pieces: list[str], out: Path, marked_layer: int | None
) -> Path:
    n_layers, tgt_len, src_len = weights.shape
    size, dpi = attention_figure(n_layers, tgt_len, src_len)
    fig, axes = plt.subplots(
        1, n_layers, figsize=size, dpi=dpi, squeeze=False, layout="constrained"
    )
    for layer, ax in enumerate(axes[0]):
        image = ax.imshow(weights[layer], cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(src_len), src_pieces, rotation=90)
        ax.set_yticks(range(tgt_len), tgt_pieces)
        ax.set(
            xlabel="source piece",
            title=f"decoder layer {layer + 1}" + (" (alignments)" if layer == marked_layer else ""),
        )
    axes[0][0].set_ylabel("output piece")
    fig.colorbar(image, ax=axes[0].tolist(), label="attention (heads averaged)")
    # checked before the translation
    atomic_write(
        out, lambda f: fig.savefig(f, dpi=dpi, bbox_inches="tight", format=_suffix_format(out))
    )
    plt.close(fig)
    return out
