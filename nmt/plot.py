"""``nmt plot``: a run's metrics over training steps, or a translation's cross-attention, as a PNG."""

from __future__ import annotations

import json
from pathlib import Path

from .corpus import DataError


def read_metrics(run_dir: Path) -> list[dict]:
    """Records of ``run_dir/metrics.jsonl``. Raises :class:`~nmt.corpus.DataError` if absent or malformed."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        raise DataError(f"{path}: not found; is {run_dir} a run directory?")
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            raise DataError(f"{path}:{number}: not a JSON object") from None
    return records


def _pyplot():
    """matplotlib's pyplot on the file-only Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_metrics(run_dir: Path, out: Path | None = None) -> Path:
    """Write loss (training and validation, nats per target token), validation BLEU and
    learning rate against optimizer steps to ``out`` (default ``run_dir/metrics.png``).

    The format follows ``out``'s suffix (PNG when it has none); the file is written at
    exactly ``out``, and that path is returned.

    Raises:
        nmt.corpus.DataError: no or malformed ``metrics.jsonl``, or a suffix matplotlib
            cannot write.
    """
    plt = _pyplot()
    out = Path(out) if out else Path(run_dir) / "metrics.png"
    image_format = out.suffix[1:].lower() or "png"
    formats = plt.figure().canvas.get_supported_filetypes()
    plt.close("all")
    if image_format not in formats:
        raise DataError(f"{out}: cannot write .{image_format} images; use .png, .pdf or .svg")
    records = read_metrics(run_dir)
    train = [r for r in records if "loss" in r]
    valid = [r for r in records if "bleu" in r]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    axes[0].plot([r["step"] for r in train], [r["loss"] for r in train], label="train (label-smoothed)")
    axes[0].plot([r["step"] for r in valid], [r["valid_loss"] for r in valid], "o-", label="validation (label-smoothed)")
    axes[0].set(xlabel="step", ylabel="loss (nats/token)", title="loss")
    axes[0].legend()
    axes[1].plot([r["step"] for r in valid], [r["bleu"] for r in valid], "o-")
    axes[1].set(xlabel="step", ylabel="BLEU", title="validation BLEU")
    axes[2].plot([r["step"] for r in train], [r["lr"] for r in train])
    axes[2].set(xlabel="step", ylabel="learning rate", title="learning rate")
    fig.tight_layout()
    fig.savefig(out, dpi=100, format=image_format)
    plt.close(fig)
    return out


def plot_attention(weights, src_pieces: list[str], tgt_pieces: list[str], out: Path, marked_layer: int | None = None) -> Path:
    """Write heatmaps of cross-attention ``weights`` ``(n_layers, tgt_len, src_len)`` (heads
    averaged; each row sums to 1), one panel per decoder layer: source pieces across, output
    pieces down, darker = more attention. ``marked_layer``'s title says that alignments come from it."""
    plt = _pyplot()
    n_layers, tgt_len, src_len = weights.shape
    fig, axes = plt.subplots(1, n_layers, figsize=(1.5 + n_layers * (1.8 + 0.35 * src_len), 1.5 + 0.3 * tgt_len), squeeze=False, layout="constrained")
    for layer, ax in enumerate(axes[0]):
        image = ax.imshow(weights[layer], cmap="Greys", vmin=0.0, vmax=1.0, aspect="auto")
        ax.set_xticks(range(src_len), src_pieces, rotation=90)
        ax.set_yticks(range(tgt_len), tgt_pieces)
        ax.set(xlabel="source piece", title=f"decoder layer {layer + 1}" + (" (alignments)" if layer == marked_layer else ""))
    axes[0][0].set_ylabel("output piece")
    fig.colorbar(image, ax=axes[0].tolist(), label="attention (heads averaged)")
    out = Path(out)
    fig.savefig(out, dpi=100, bbox_inches="tight")
    plt.close(fig)
    return out
