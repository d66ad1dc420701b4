"""Parallel text: reading, cleaning, encoding with a cache, token-budget batching, collation.

Notation: ``src_len``/``tgt_len`` count pieces plus the one EOS (source) or BOS/EOS
(target) that :func:`collate` adds; every budget in tokens counts padding.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .tokenizer import BOS, EOS, PAD, Tokenizer


class DataError(ValueError):
    """Input text cannot be used; the message names the file, the line and what to do."""


# ---------------------------------------------------------------------------- reading


def read_lines(path: str | Path) -> list[str]:
    """Read a plain or gzipped UTF-8 text file, one sentence a line.

    Lines are split on ``\\n`` only (never on the Unicode separators that
    ``str.splitlines`` also honours, which would shift the alignment of a parallel
    corpus); a trailing ``\\r`` (CRLF files) and a UTF-8 byte-order mark on the first
    line are removed. Blank lines are kept, so line numbers stay aligned.

    Raises:
        DataError: the file does not exist or a line is not valid UTF-8.
    """
    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path}: is a directory, not a text file")
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as exc:
        raise DataError(f"{path}: cannot read ({exc}); is the file complete and, if .gz, really gzip?") from None
    if raw.startswith(b"\xef\xbb\xbf"):
        raw = raw[3:]
    chunks = raw.split(b"\n")
    if chunks and chunks[-1] == b"":
        chunks.pop()
    lines = []
    for number, chunk in enumerate(chunks, start=1):
        try:
            line = chunk.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DataError(
                f"{path}:{number}: invalid UTF-8 at byte {exc.start} of the line; "
                "convert the file to UTF-8 (e.g. iconv -f latin1 -t utf-8)"
            ) from None
        lines.append(line[:-1] if line.endswith("\r") else line)
    return lines


def read_parallel(src_path: str | Path, tgt_path: str | Path) -> tuple[list[str], list[str]]:
    """Read two aligned files. Raises :class:`DataError` if their line counts differ."""
    src, tgt = read_lines(src_path), read_lines(tgt_path)
    if len(src) != len(tgt):
        raise DataError(
            f"{src_path} has {len(src)} lines but {tgt_path} has {len(tgt)}: "
            "a parallel corpus needs one target line per source line"
        )
    return src, tgt


def find_split_file(directory: str | Path, split: str, lang: str) -> Path:
    """``{directory}/{split}.{lang}`` or its ``.gz``. Raises :class:`DataError` if neither exists."""
    for name in (f"{split}.{lang}", f"{split}.{lang}.gz"):
        path = Path(directory) / name
        if path.is_file():
            return path
    raise DataError(f"{directory}: neither {split}.{lang} nor {split}.{lang}.gz exists")


def load_hf_split(name: str, config: str | None, data_files: dict[str, str] | None, split: str, src_lang: str, tgt_lang: str) -> tuple[list[str], list[str]]:
    """Read a split through ``datasets.load_dataset``; rows carry ``translation[lang]``.

    Raises:
        DataError: the dataset has no such split or no ``translation`` column for the languages.
    """
    import datasets

    try:
        ds = datasets.load_dataset(name, config, data_files=data_files, split=split)
    except (FileNotFoundError, ValueError) as exc:
        raise DataError(f"dataset {name!r} split {split!r}: {exc}") from None
    if "translation" not in ds.column_names:
        raise DataError(f"dataset {name!r} split {split!r}: no 'translation' column (columns: {ds.column_names})")
    rows = ds["translation"]
    try:
        return [r[src_lang] or "" for r in rows], [r[tgt_lang] or "" for r in rows]
    except (KeyError, TypeError):
        raise DataError(f"dataset {name!r} split {split!r}: translation entries need keys {src_lang!r} and {tgt_lang!r}") from None


def load_split(cfg, split: str) -> tuple[list[str], list[str]]:
    """Source and target lines of ``split`` ("train" or "valid") as ``cfg`` (a DataConfig) says.

    Raises:
        DataError: no source is configured, a file is missing or unreadable, counts differ.
    """
    explicit = (cfg.train_src, cfg.train_tgt) if split == "train" else (cfg.valid_src, cfg.valid_tgt)
    if explicit[0] and explicit[1]:
        return read_parallel(*explicit)
    if cfg.hf_dataset:
        name = cfg.train_split if split == "train" else cfg.valid_split
        return load_hf_split(cfg.hf_dataset, cfg.hf_config, cfg.hf_data_files, name, cfg.src_lang, cfg.tgt_lang)
    if cfg.dir:
        name = cfg.train_split if split == "train" else cfg.valid_split
        return read_parallel(find_split_file(cfg.dir, name, cfg.src_lang), find_split_file(cfg.dir, name, cfg.tgt_lang))
    raise DataError(f"no {split} data configured: set data.dir, data.{split}_src/{split}_tgt or data.hf_dataset")


# --------------------------------------------------------------------------- cleaning


@dataclass
class CleanReport:
    total: int = 0
    empty: int = 0
    too_long: int = 0
    bad_ratio: int = 0

    @property
    def kept(self) -> int:
        return self.total - self.empty - self.too_long - self.bad_ratio

    def __str__(self) -> str:
        return f"{self.kept}/{self.total} pairs kept ({self.empty} with an empty side, {self.too_long} over max_len, {self.bad_ratio} over max_len_ratio)"


def strip_pairs(src: list[str], tgt: list[str]) -> tuple[list[str], list[str], CleanReport]:
    """Strip whitespace and drop pairs with an empty side."""
    report = CleanReport(total=len(src))
    out_src, out_tgt = [], []
    for s, t in zip(src, tgt):
        s, t = s.strip(), t.strip()
        if not s or not t:
            report.empty += 1
            continue
        out_src.append(s)
        out_tgt.append(t)
    return out_src, out_tgt, report


# --------------------------------------------------------------------------- encoding


@dataclass
class EncodedCorpus:
    """Token ids of a parallel corpus in two flat arrays with offsets (memory-mappable).

    Example ``i`` is ``src_ids[src_offsets[i]:src_offsets[i+1]]`` (no EOS yet).
    """

    src_ids: np.ndarray
    src_offsets: np.ndarray
    tgt_ids: np.ndarray
    tgt_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.src_offsets) - 1

    def src(self, i: int) -> np.ndarray:
        return self.src_ids[self.src_offsets[i] : self.src_offsets[i + 1]]

    def tgt(self, i: int) -> np.ndarray:
        return self.tgt_ids[self.tgt_offsets[i] : self.tgt_offsets[i + 1]]

    @property
    def src_lengths(self) -> np.ndarray:
        """Pieces per source sentence plus EOS, shape ``(n,)``."""
        return np.diff(self.src_offsets) + 1

    @property
    def tgt_lengths(self) -> np.ndarray:
        """Pieces per target sentence plus BOS (input) or EOS (output), shape ``(n,)``."""
        return np.diff(self.tgt_offsets) + 1

    @classmethod
    def from_lists(cls, src: list[list[int]], tgt: list[list[int]]) -> "EncodedCorpus":
        def flat(seqs: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
            offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
            np.cumsum([len(s) for s in seqs], out=offsets[1:])
            ids = np.fromiter((t for s in seqs for t in s), dtype=np.int32, count=int(offsets[-1]))
            return ids, offsets

        return cls(*flat(src), *flat(tgt))

    def save(self, directory: Path) -> None:
        """Write four ``.npy`` files atomically (a half-written cache is never read)."""
        tmp = directory.with_name(directory.name + f".tmp{os.getpid()}")
        tmp.mkdir(parents=True, exist_ok=True)
        for name in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets"):
            np.save(tmp / f"{name}.npy", getattr(self, name))
        os.replace(tmp, directory)

    @classmethod
    def load(cls, directory: Path) -> "EncodedCorpus":
        return cls(*(np.load(directory / f"{n}.npy", mmap_mode="r") for n in ("src_ids", "src_offsets", "tgt_ids", "tgt_offsets")))


def encode_corpus(
    src: list[str], tgt: list[str], tokenizer: Tokenizer, cache_dir: Path | None, max_len: int | None = None, max_len_ratio: float | None = None, write: bool = True
) -> tuple[EncodedCorpus, CleanReport]:
    """Strip, encode and (for training) length-filter a parallel corpus, caching the result.

    The cache key hashes the text, the tokenizer and the filter settings, so a second run
    on the same input loads ids from ``cache_dir`` without tokenizing again; ``write=False``
    reads the cache but never writes it.
    """
    src, tgt, report = strip_pairs(src, tgt)
    key = hashlib.sha1()
    for proto in tokenizer.protos().values():
        key.update(proto)
    key.update(repr((max_len, max_len_ratio)).encode())
    for line in (*src, "\0", *tgt):
        key.update(line.encode())
        key.update(b"\n")
    path = cache_dir / key.hexdigest()[:16] if cache_dir is not None else None
    if path is not None and (path / "tgt_offsets.npy").is_file():
        corpus = EncodedCorpus.load(path)
        report.too_long = report.kept - len(corpus)  # filtered pairs, lumped together on a cache hit
        return corpus, report
    src_ids, tgt_ids = tokenizer.encode_src(src), tokenizer.encode_tgt(tgt)
    if max_len is not None:
        keep_src, keep_tgt = [], []
        for s, t in zip(src_ids, tgt_ids):
            if len(s) > max_len or len(t) > max_len:
                report.too_long += 1
            elif max_len_ratio and max(len(s), len(t)) > max_len_ratio * max(1, min(len(s), len(t))):
                report.bad_ratio += 1
            else:
                keep_src.append(s)
                keep_tgt.append(t)
        src_ids, tgt_ids = keep_src, keep_tgt
    corpus = EncodedCorpus.from_lists(src_ids, tgt_ids)
    if path is not None and write:
        path.parent.mkdir(parents=True, exist_ok=True)
        corpus.save(path)
    return corpus, report


# --------------------------------------------------------------------------- batching


def token_batches(lengths: np.ndarray, max_tokens: int, order: np.ndarray) -> list[np.ndarray]:
    """Greedily cut ``order`` into batches whose padded size ``n · max(lengths)`` fits ``max_tokens``.

    ``lengths`` holds one length per example (tokens, the longer side for pairs);
    ``order`` should already sort examples by length so that padding stays small.
    An example longer than ``max_tokens`` on its own gets a batch of its own.
    """
    batches, start, longest = [], 0, 0
    for i, index in enumerate(order):
        n = int(lengths[index])
        if i > start and max(longest, n) * (i - start + 1) > max_tokens:
            batches.append(order[start:i])
            start, longest = i, 0
        longest = max(longest, n)
    if len(order) > start:
        batches.append(order[start:])
    return batches


class TokenBatchSampler:
    """Length-bucketed batches under a token budget, reshuffled every epoch by seed.

    Each epoch sorts examples by (source length, target length) with ties broken by a
    seeded permutation, cuts them into batches of at most ``max_tokens`` tokens counting
    padding (``batch_size · max(src_len, tgt_len)``), then shuffles the batch order.
    Every example appears exactly once per epoch. With ``world_size > 1`` each rank takes
    every ``world_size``-th batch and all ranks get the same number of batches (the
    remainder is dropped that epoch), so no rank waits for another at an epoch's end.
    """

    def __init__(self, src_lengths: np.ndarray, tgt_lengths: np.ndarray, max_tokens: int, seed: int, rank: int = 0, world_size: int = 1):
        self.lengths = np.maximum(src_lengths, tgt_lengths)
        self.src_lengths, self.tgt_lengths = np.asarray(src_lengths), np.asarray(tgt_lengths)
        self.max_tokens, self.seed, self.rank, self.world_size = max_tokens, seed, rank, world_size

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The batches (arrays of example indices) of ``epoch``, in training order."""
        rng = np.random.default_rng([self.seed, epoch])
        tie = rng.permutation(len(self.lengths))
        order = tie[np.lexsort((self.tgt_lengths[tie], self.src_lengths[tie]))]
        batches = token_batches(self.lengths, self.max_tokens, order)
        batches = [batches[i] for i in rng.permutation(len(batches))]
        if self.world_size > 1:
            per_rank = len(batches) // self.world_size
            batches = batches[self.rank : per_rank * self.world_size : self.world_size]
        return batches

    def padding_fraction(self, epoch: int = 0) -> float:
        """Share of padded positions in ``epoch``'s batches (0 = no padding)."""
        real = padded = 0
        for b in self.epoch_batches(epoch):
            real += int(self.src_lengths[b].sum() + self.tgt_lengths[b].sum())
            padded += len(b) * int(self.src_lengths[b].max() + self.tgt_lengths[b].max())
        return 1.0 - real / max(1, padded)


@dataclass
class Batch:
    """A padded batch. ``src``: ``(batch, src_len)`` pieces + EOS; ``tgt_in``: BOS + pieces;
    ``tgt_out``: pieces + EOS, both ``(batch, tgt_len)``; PAD fills the rest."""

    src: torch.Tensor
    tgt_in: torch.Tensor
    tgt_out: torch.Tensor

    @property
    def n_tgt_tokens(self) -> int:
        return int((self.tgt_out != PAD).sum())

    def to(self, device: torch.device) -> "Batch":
        return Batch(*(t.to(device, non_blocking=True) for t in (self.src, self.tgt_in, self.tgt_out)))


def pad_sources(seqs: list[np.ndarray | list[int]]) -> torch.Tensor:
    """Append EOS to each source and right-pad with PAD: ``(batch, src_len)``."""
    width = max(len(s) for s in seqs) + 1
    out = torch.full((len(seqs), width), PAD, dtype=torch.long)
    for i, s in enumerate(seqs):
        out[i, : len(s)] = torch.as_tensor(np.asarray(s, dtype=np.int64))
        out[i, len(s)] = EOS
    return out


def collate(corpus: EncodedCorpus, indices: np.ndarray) -> Batch:
    src = pad_sources([corpus.src(i) for i in indices])
    tgts = [corpus.tgt(i) for i in indices]
    width = max(len(t) for t in tgts) + 1
    tgt_in = torch.full((len(tgts), width), PAD, dtype=torch.long)
    tgt_out = torch.full((len(tgts), width), PAD, dtype=torch.long)
    for i, t in enumerate(tgts):
        t = torch.as_tensor(np.asarray(t, dtype=np.int64))
        tgt_in[i, 0] = BOS
        tgt_in[i, 1 : len(t) + 1] = t
        tgt_out[i, : len(t)] = t
        tgt_out[i, len(t)] = EOS
    return Batch(src, tgt_in, tgt_out)

