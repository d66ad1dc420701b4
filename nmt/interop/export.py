"""Export to a Hugging Face ``MarianMTModel`` directory, a CTranslate2 model, or a slim checkpoint.

The weights map to Marian's as :mod:`nmt.interop.marian` describes (the model dimension permuted
between nmt's interleaved sinusoids and Marian's half/half layout; the exported model
computes exactly the same function). A model nmt trained keeps its own ids and starts
decoding from BOS; an imported model (``nmt import``) gets Marian's ids and ``<pad>`` start
back, so exporting it again writes the weights it was imported from.

A directory is written beside its destination (``.NAME.tmpPID-TOKEN``, held by the writer:
:func:`nmt.temporaries.held_temporary`) and renamed into place when it is complete: a kill or a
full disk leaves the previous directory, or none, and never a partial one that would load (a
tokenizer without its config, say); the temporary directory of a killed export is removed by
the next export to the same place, while that of an export at work is left to it.
"""

# Size: module at most 765 lines, write_huggingface() at most 80, export() at most 70: three export
# formats and the directory they share; export() checks each format's options before it writes.

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
from pathlib import Path

from nmt.config import DecodeConfig
from nmt.core.model import Transformer
from nmt.data import multilingual
from nmt.data.tokenizer import BOS, EOS, PAD, UNK, Tokenizer
from nmt.data.vocab import MarianTokenizer
from nmt.errors import Key, NmtError
from nmt.files import OutputError, os_error, reason
from nmt.runs.checkpoint import checkpoint_file, load_checkpoint, save_checkpoint
from nmt.temporaries import replace_directory, temporary_name

from .marian import MarianError, Rows, to_marian

log = logging.getLogger("nmt.export")

#: What a checkpoint keeps through ``--format nmt`` and ``nmt average`` besides its model: where it
#: came from, for ``nmt info``.
ORIGIN = ("progress", "averaged_from", "init_from", "imported_from", "run")


class ExportError(NmtError, ValueError):
    """The export cannot be made: the model uses a feature the target format cannot express, or a
    format, option or package is missing."""


def marian_ids(tokenizer: Tokenizer) -> dict[str, int]:
    """The Marian ids of pad (the decoder's start for an imported model), eos, unk and the decoder
    start, and the vocabulary sizes."""
    if isinstance(tokenizer, MarianTokenizer):
        spec = tokenizer.spec
        vocab, target = spec["vocab"], spec["target_vocab"] or spec["vocab"]
        return {
            "pad": vocab[spec["pad"]],
            "eos": vocab[spec["eos"]],
            "unk": target[spec["unk"]],
            "start": tokenizer.tgt.layout.marian_ids[BOS],
            "vocab_size": len(vocab),
            "decoder_vocab_size": len(target),
        }
    sizes = {
        "vocab_size": tokenizer.src.get_piece_size(),
        "decoder_vocab_size": tokenizer.tgt.get_piece_size(),
    }
    return {"pad": PAD, "eos": EOS, "unk": UNK, "start": BOS, **sizes}


def marian_model(model: Transformer, tokenizer: Tokenizer, max_positions: int = 1024):
    """A ``transformers.MarianMTModel`` computing the same function as ``model`` (see
    :mod:`nmt.interop.marian`).

    Raises:
        ExportError: the model is Pre-LN.
        ImportError: ``transformers`` is not installed (``pip install transformers``).
    """
    from transformers import MarianConfig, MarianMTModel

    cfg = model.cfg
    if cfg.norm_position != "post":
        raise ExportError("Marian is a Post-LN model; a Pre-LN model cannot be exported to it")
    ids = marian_ids(tokenizer)
    config = MarianConfig(
        vocab_size=ids["vocab_size"],
        decoder_vocab_size=ids["decoder_vocab_size"],
        max_position_embeddings=max_positions,
        d_model=cfg.d_model,
        encoder_layers=cfg.n_encoder_layers,
        decoder_layers=cfg.n_decoder_layers,
        encoder_attention_heads=cfg.n_heads,
        decoder_attention_heads=cfg.n_heads,
        encoder_ffn_dim=cfg.d_ff,
        decoder_ffn_dim=cfg.d_ff,
        activation_function=cfg.activation,
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        activation_dropout=cfg.activation_dropout,
        scale_embedding=True,
        pad_token_id=ids["pad"],
        eos_token_id=ids["eos"],
        bos_token_id=BOS if ids["start"] == BOS else None,
        decoder_start_token_id=ids["start"],
        forced_eos_token_id=ids["eos"],
        share_encoder_decoder_embeddings=cfg.share_embeddings,
        tie_word_embeddings=True,
    )
    hf = MarianMTModel(config)
    missing, unexpected = hf.load_state_dict(
        to_marian(model.state_dict(), cfg, Rows.of(tokenizer)), strict=False
    )
    missing = [k for k in missing if "embed_positions" not in k]
    if missing or unexpected:
        raise ExportError(f"weight mapping incomplete: missing {missing}, unexpected {unexpected}")
    return hf


def generation_settings(
    decode: DecodeConfig, tokenizer: Tokenizer, max_positions: int, tags: tuple[str, ...] = ()
) -> tuple[dict, list[str]]:
    """``generation_config.json``'s values that make ``generate()`` search as ``nmt translate`` does
    by default, and what it cannot say.

    ``num_beams`` is ``decode.beam_size``; ``length_penalty`` α (generate() divides by ``|Y|^α``,
    |Y| counting EOS: nmt's ``length`` normalisation); ``early_stopping`` ``"never"``, generate()'s
    exact stop, where its bound is nmt's (α <= 0, or an absolute limit), else true (a sentence ends
    once ``num_beams`` hypotheses have: nmt's ``decode.patience`` 1; taken at the model's position
    limit, generate()'s exact bound would search every sentence to it);
    ``max_length`` ``max_len_b + 2`` when ``max_len_a`` is 0 (generate()'s limit is absolute and
    counts the start token), else the model's position limit; ``min_length`` ``min_len + 1``; the
    start token, a multilingual model's target ``tags`` (``>>fr<<``, never generated) and UNK unless
    ``allow_unk``, banned.
    """
    ids = marian_ids(tokenizer)
    notes = []
    values = {
        "decoder_start_token_id": ids["start"],
        "eos_token_id": ids["eos"],
        "pad_token_id": ids["pad"],
        "forced_eos_token_id": ids["eos"],
    }
    banned = list(
        dict.fromkeys(
            [ids["start"], ids["pad"], *(tokenizer.tgt.piece_to_id(t) for t in tags)]
            + ([] if decode.allow_unk else [ids["unk"]])
        )
    )
    if isinstance(tokenizer, MarianTokenizer):
        # as OPUS-MT's own generation_config.json bans <pad>
        values["bad_words_ids"] = [[i] for i in banned]
    else:
        values |= {"bos_token_id": BOS, "suppress_tokens": sorted(banned)}
    if decode.beam_size > 1:
        alpha = 0.0 if decode.length_normalization == "none" else decode.length_penalty
        exact = decode.patience is None and (alpha <= 0 or decode.max_len_a == 0)
        values |= {"num_beams": decode.beam_size, "early_stopping": "never" if exact else True}
        values["length_penalty"] = alpha
        if decode.patience is None and not exact:
            notes.append(
                "generate() stops a sentence once num_beams hypotheses have finished (nmt's "
                "decode.patience 1), where nmt searches until no running hypothesis can change "
                "the result: generate()'s exact stop (early_stopping 'never') would search every "
                f"sentence to max_length {max_positions}"
            )
        elif decode.patience not in (None, 1.0):
            notes.append(
                "generate() has no patience: it stops a sentence once num_beams hypotheses have "
                f"finished (nmt: beam_size x {decode.patience:g})"
            )
        if decode.length_normalization == "gnmt":
            notes.append(
                "generate() has no GNMT length penalty: generation_config.json divides by "
                f"|Y|^{decode.length_penalty} instead"
            )
    if decode.max_len_a == 0:
        values["max_length"] = decode.max_len_b + 2
    else:
        values["max_length"] = max_positions
        notes.append(
            f"generate() has no output limit relative to the source (nmt: {decode.max_len_a:g} x "
            f"source pieces + {decode.max_len_b}): "
            f"generation_config.json sets max_length {max_positions}, the model's position limit"
        )
    if decode.min_len:
        values["min_length"] = decode.min_len + 1
    return values, notes


#: The files an export writes, by format: a directory holding only the files of one of them is an
#: earlier export, which a new one replaces whole; anything else in it (a user's script, a
#: subfolder) makes the directory the user's, and the export refuses it.
EXPORT_FILES = {
    "huggingface": frozenset(
        "config.json generation_config.json model.safetensors source.spm target.spm vocab.json "
        "target_vocab.json "
        "tokenizer_config.json special_tokens_map.json".split()
    ),
    "ctranslate2": frozenset(
        "config.json model.bin shared_vocabulary.json source_vocabulary.json "
        "target_vocabulary.json vmap.txt spm.model source.spm target.spm README.md".split()
    ),
}


def _foreign_entry(out: Path) -> str | None:
    """The first entry of directory ``out`` that makes it not an earlier export
    (:data:`EXPORT_FILES`), named for the error; None for an empty directory or an earlier export.
    Links and subdirectories are never an export's."""
    entries = sorted(out.iterdir())
    plain = all(entry.is_file() and not entry.is_symlink() for entry in entries)
    if plain and any({entry.name for entry in entries} <= files for files in EXPORT_FILES.values()):
        return None
    for entry in entries:
        if entry.is_symlink() or not entry.is_file():
            return (
                f"{entry.name} (a {'link' if entry.is_symlink() else 'directory or special file'})"
            )
        if not any(entry.name in files for files in EXPORT_FILES.values()):
            return entry.name
    return "a mix of both export formats' files"


def _check_directory(out: Path, what: str = "out") -> None:
    """Fail before any work if a directory cannot be written at ``out``.

    Raises:
        OutputError: ``out`` is a file or a directory of other files, its parent is missing, or
            nothing can be created there.
    """
    out = Path(os.path.abspath(out))  # "." has no name to write beside
    if out.exists() and not out.is_dir():
        raise OutputError(Key(what), f" {out} is a file; give a directory")
    here = Path.cwd()
    if out.is_dir() and (out.samefile(here) or any(out.samefile(p) for p in here.parents)):
        raise OutputError(
            Key(what),
            f" {out} is the current directory or holds it, which an export replaces; give a new "
            f"directory, e.g. {out / 'export'}",
        )
    foreign = _foreign_entry(out) if out.is_dir() else None
    if foreign is not None:
        raise OutputError(
            Key(what),
            f" {out} holds {foreign}, which no export writes; give a new or empty directory (an "
            "earlier export there is replaced)",
        )
    if not out.parent.is_dir():
        raise OutputError(
            Key(what), f" {out}: directory {out.parent} does not exist; create it first"
        )
    probe = temporary_name(out, "probe")
    try:
        probe.mkdir()
    except OSError as exc:
        raise OutputError("cannot write ", Key(what), f" {out}: {reason(exc)}") from None
    probe.rmdir()


def _write_failure(exc: BaseException, out: Path) -> OutputError | None:
    """The one-line error of a write that failed for want of space or permission (some writers
    report the OS error only in text)."""
    cause = os_error(exc)
    code = cause.errno if cause is not None else None
    if code is None:  # safetensors: "... IoError(Os { code: 28, kind: StorageFull, ... })"
        match = re.search(r"(?:os error|code:) (\d+)", str(exc))
        code = int(match[1]) if match else None
    if code not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM):
        return None
    return OutputError(f"cannot write {out}: {reason(OSError(code, os.strerror(code)))}")


@contextlib.contextmanager
def directory_in_place(out: Path):
    """Yield an empty directory beside ``out`` to write into; when the block ends, it replaces
    ``out`` (:func:`nmt.temporaries.replace_directory`: never a partial export, and never none).

    Raises:
        OutputError: ``out`` cannot be written (checked first, see :func:`_check_directory`), or the
            disk filled up.
    """
    out = Path(os.path.abspath(out))  # "." has no name to write beside
    _check_directory(out)
    try:
        with replace_directory(out) as tmp:
            yield tmp
    except Exception as exc:
        failure = _write_failure(exc, out)
        if failure is not None:
            raise failure from None
        raise


def export_huggingface(
    model: Transformer,
    tokenizer: Tokenizer,
    out_dir: Path,
    max_positions: int = 1024,
    decode: DecodeConfig | None = None,
    name: str | Path | None = None,
    languages: tuple[str, str] | None = None,
    tags: tuple[str, ...] = (),
) -> None:
    """Write ``out_dir`` (in place, see :func:`directory_in_place`) so that
    ``MarianMTModel.from_pretrained(out_dir)`` and ``MarianTokenizer.from_pretrained(out_dir)`` load
    it, with ``generation_config.json`` set so that ``generate()`` searches as ``nmt translate``
    does with ``decode`` (:func:`generation_settings`), and ``tokenizer_config.json`` naming the
    ``languages`` (source, target) of a model nmt trained.

    A model nmt trained: generation starts from BOS, stops at EOS, never emits PAD or BOS (nor UNK
    unless ``decode.allow_unk``). The tokenizer gives the ids nmt gives for any text (special-token
    spellings such as ``</s>`` and ``<pad>`` and very long words included) with two exceptions that
    ``MarianTokenizer`` cannot be configured out of: it removes a leading ``>>...<<`` (Marian's
    target-language tag), which nmt reads as text; and it hands control characters to SentencePiece
    as they are, where nmt reads them as spaces (:func:`nmt.data.tokenizer.controls_as_spaces`). The
    export warns about both (naming ``name``, the place the user gave); for such lines, pass
    ``input_ids`` from nmt's tokenizer. A multilingual model's target ``tags`` (``>>de<<``;
    :mod:`nmt.data.multilingual`) stay pieces of the vocabulary, so the export takes its input as
    OPUS-MT's multi-target models do, ``">>fr<< A dog runs."``: ``MarianTokenizer`` turns a leading
    tag into its id and encodes the rest, the ids ``nmt translate --tgt-lang fr`` gives the model.
    An imported model gets its Marian directory back:
    ``vocab.json``, both SentencePiece models, Marian's ids; its tokenizer is exact for every text.

    Raises:
        ExportError: as :func:`marian_model`.
        ImportError: ``transformers`` is not installed (``pip install transformers``).
        nmt.files.OutputError: ``out_dir`` cannot be written.
    """
    with directory_in_place(Path(out_dir)) as tmp:
        write_huggingface(
            model, tokenizer, tmp, max_positions, decode, name or out_dir, languages, tags
        )


def write_huggingface(
    model: Transformer,
    tokenizer: Tokenizer,
    tmp: Path,
    max_positions: int,
    decode: DecodeConfig | None,
    name: str | Path,
    languages: tuple[str, str] | None = None,
    tags: tuple[str, ...] = (),
    say: bool = True,
) -> None:
    """:func:`export_huggingface`'s files, written into the empty directory ``tmp``; messages name
    ``name``, and with ``say`` say what a user of the directory (of ``generate()``,
    ``MarianTokenizer``) should know."""
    from transformers import GenerationConfig
    from transformers import MarianTokenizer as HFMarianTokenizer

    imported = isinstance(tokenizer, MarianTokenizer)
    decode = decode or DecodeConfig()
    hf = marian_model(model, tokenizer, max_positions)
    values, said = generation_settings(decode, tokenizer, max_positions, tags)
    hf.generation_config = GenerationConfig(**values)
    for note in said if say else ():
        log.warning("warning: %s: %s", name, note)
    with quiet_transformers():
        hf.save_pretrained(tmp)
    if imported:
        spec = tokenizer.spec
        vocab, target_vocab = spec["vocab"], spec.get("target_vocab")
        options = {
            "eos_token": spec["eos"],
            "unk_token": spec["unk"],
            "pad_token": spec["pad"],
            "source_lang": spec.get("source_lang"),
            "target_lang": spec.get("target_lang"),
            "split_special_tokens": bool(spec.get("split_special_tokens")),
        }
    else:
        _check_special_spellings(tokenizer)
        vocab, target_vocab = (
            _piece_ids(tokenizer.src),
            None if tokenizer.joint else _piece_ids(tokenizer.tgt),
        )
        sp = tokenizer.tgt
        # split_special_tokens: a literal "</s>" or "<pad>" in the text is text, as nmt reads it,
        # not an id.
        options = {
            "eos_token": sp.id_to_piece(EOS),
            "unk_token": sp.id_to_piece(UNK),
            "pad_token": sp.id_to_piece(PAD),
            "split_special_tokens": True,
        }
        if languages:
            options |= {"source_lang": languages[0], "target_lang": languages[1]}
    protos = tokenizer.protos()
    files = {
        "source_spm": tmp / "source.spm",
        "target_spm": tmp / "target.spm",
        "vocab": tmp / "vocab.json",
    }
    files["source_spm"].write_bytes(protos.get("src") or protos["joint"])
    files["target_spm"].write_bytes(protos.get("tgt") or protos["joint"])
    files["vocab"].write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    if target_vocab is not None:  # a vocabulary per side: Marian's target_vocab.json
        files["target_vocab_file"] = tmp / "target_vocab.json"
        files["target_vocab_file"].write_text(
            json.dumps(target_vocab, ensure_ascii=False), encoding="utf-8"
        )
        options["separate_vocabs"] = True
    HFMarianTokenizer(
        **{k: str(v) for k, v in files.items()}, model_max_length=max_positions, **options
    ).save_pretrained(tmp)
    if not say:
        return
    if tags:
        log.warning(
            "warning: %s: a multilingual model: start each input with its target's tag (%s), as "
            "for OPUS-MT's multi-target models; MarianTokenizer "
            "keeps control characters, which nmt reads as spaces; for such lines give the exported "
            "model the ids nmt's tokenizer gives",
            name,
            ", ".join(tags),
        )
    elif not imported:
        log.warning(
            "warning: %s: MarianTokenizer removes a leading '>>...<<' (Marian's language tag) from "
            "its input, where nmt reads it as text, "
            "and keeps control characters, which nmt reads as spaces; for such lines give the "
            "exported model the ids nmt's tokenizer gives",
            name,
        )


def _check_special_spellings(tokenizer: Tokenizer) -> None:
    """Marian's tokenizer spells PAD, UNK and EOS once for both sides; raise :class:`ExportError`
    where nmt's two models differ."""
    for name, i in (("PAD", PAD), ("UNK", UNK), ("EOS", EOS)):
        src, tgt = tokenizer.src.id_to_piece(i), tokenizer.tgt.id_to_piece(i)
        if src != tgt:
            raise ExportError(
                f"the source SentencePiece model spells {name} {src!r} and the target's {tgt!r}; "
                "Marian's tokenizer has one spelling for both sides, "
                "so this model cannot be exported: train both models with the same pad_piece, "
                "unk_piece and eos_piece"
            )


def _piece_ids(sp) -> dict[str, int]:
    """Marian's ``vocab.json`` of a SentencePiece model nmt trained: each piece and its id, the ids
    nmt uses."""
    return {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}


def sentencepiece_files(tokenizer: Tokenizer) -> dict[str, bytes]:
    """The SentencePiece model(s) a CTranslate2 export carries, by file name: ``spm.model`` for a
    joint one, else ``source.spm`` and ``target.spm`` (a vocabulary per side, or an imported model's
    two segmenters)."""
    protos = tokenizer.protos()
    return (
        {"spm.model": protos["joint"]}
        if "joint" in protos
        else {"source.spm": protos["src"], "target.spm": protos["tgt"]}
    )


def export_slim(path: str | Path, out: str | Path) -> dict:
    """Write a checkpoint with only what ``nmt translate`` and ``nmt evaluate`` need: the
    model weights, config and tokenizer (plus, a few bytes, the progress record and where the
    weights came from, :data:`ORIGIN`, for ``nmt info``). Without the optimizer's two moment
    estimates per weight and the RNG states it is about a third of the size; it cannot be resumed.

    Returns:
        The payload written.

    Raises:
        nmt.runs.checkpoint.CheckpointError: ``path`` is not a readable checkpoint.
    """
    payload = load_checkpoint(path).payload
    slim = {
        key: payload[key] for key in ("model", "config", "tokenizer", *ORIGIN) if key in payload
    }
    save_checkpoint(slim, Path(out))
    return slim


def export_ctranslate2(
    hf_dir: Path, out_dir: Path, quantization: str | None = None, vmap: Path | None = None
) -> None:
    """Convert an exported Marian directory to a CTranslate2 model (C++ inference).

    CTranslate2's stock Marian loader assumes the decoder starts from a zero embedding and
    deletes the last vocabulary row, an extra PAD. An nmt model starts from its BOS row and has
    no extra row; a fine-tuned imported one's start row need not be zero any more. So this
    conversion uses the stock loader with both conventions switched off, starting from the
    decoder start token the exported config names: the result computes what nmt does. It also
    registers a directory's ``target_vocab.json`` as the target vocabulary, where the stock loader
    takes ``vocab.json`` for both sides.

    Args:
        quantization: None (float32), ``"int8"``, ``"float16"``, ``"bfloat16"``, ...
        vmap: a vocabulary map (``nmt shortlist``'s file) copied into the model, for
            ``translate_batch(..., use_vmap=True)``.

    Raises:
        ImportError: ``ctranslate2`` (and ``transformers``) are not installed.
    """
    import ctranslate2.converters.transformers as ct2t

    class NmtMarianLoader(ct2t.MarianMTLoader):
        def get_model_spec(self, model):
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return ct2t.BartLoader.get_model_spec(self, model)

        def set_config(self, config, model, tokenizer):
            config.eos_token = tokenizer.eos_token
            config.unk_token = tokenizer.unk_token
            config.decoder_start_token = tokenizer.convert_ids_to_tokens(
                model.config.decoder_start_token_id
            )

        def set_decoder(self, spec, decoder):
            ct2t.BartLoader.set_decoder(self, spec, decoder)

        def get_vocabulary(self, model, tokenizer):
            source = ct2t.BartLoader.get_vocabulary(self, model, tokenizer)
            if not tokenizer.separate_vocabs:
                return source, source
            return source, [
                piece
                for piece, _ in sorted(tokenizer.target_encoder.items(), key=lambda item: item[1])
            ]

        # the stock loader registers the source vocabulary on both sides
        def set_vocabulary(self, spec, tokens):
            spec.register_source_vocabulary(tokens[0])
            spec.register_target_vocabulary(tokens[1])

    stock = ct2t._MODEL_LOADERS["MarianConfig"]
    ct2t._MODEL_LOADERS["MarianConfig"] = NmtMarianLoader()
    try:
        ct2t.TransformersConverter(str(hf_dir)).convert(
            str(out_dir),
            vmap=None if vmap is None else str(vmap),
            quantization=quantization,
            force=True,
        )
    finally:
        ct2t._MODEL_LOADERS["MarianConfig"] = stock


@contextlib.contextmanager
def quiet_transformers():
    """Within the block, transformers shows no progress bars ("Writing model shards", "Loading
    weights") and logs only errors: nmt says what concerns its user itself."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _ctranslate2_differences(decode: DecodeConfig) -> tuple[str, str]:
    """What the CTranslate2 README says it computes, and the differences from ``nmt translate`` it
    names (lines that start with a line break, or none)."""
    exact = decode.patience is not None and decode.length_normalization != "gnmt"
    computes = "It computes what `nmt translate` computes with that checkpoint" + (
        "" if exact else ", but for the differences said below"
    )
    stop = (
        ""
        if decode.patience is not None
        else "\nnmt ends a sentence's search once no running hypothesis can change its result "
        "(exact);\nCTranslate2 has no such rule and ends it once beam size × `patience` hypotheses "
        "have\nfinished, so on some lines nmt finds a translation it scores higher (a larger "
        "`patience`\ncomes closer, and is slower)."
    )
    gnmt = (
        "\nCTranslate2 has no GNMT length penalty: it divides by |Y|^α."
        if decode.length_normalization == "gnmt"
        else ""
    )
    return computes, gnmt + stop


def ctranslate2_readme(tokenizer: Tokenizer, decode: DecodeConfig, source: str, out: str) -> str:
    """The README written beside a CTranslate2 model: where it came from and the Python lines that
    translate with it."""
    imported = isinstance(tokenizer, MarianTokenizer)
    pieces = tokenizer.tgt.id_to_piece
    # what nmt never writes; an OPUS-MT import's start piece is its pad
    banned = list(dict.fromkeys([pieces(BOS), pieces(PAD)]))
    names = list(sentencepiece_files(tokenizer))
    files = (names[0], names[-1])
    detok = '.replace("\\u2581", " ").strip()' if imported else ""
    code_note = (
        '\n# A multi-target model chooses its output language with a leading token: [">>fra<<"] + '
        "pieces.\n"
        if imported
        and any(p.startswith(">>") and p.endswith("<<") for p in tokenizer.src.layout.pieces)
        else ""
    )
    limit = (
        f"int({decode.max_len_a:g} * max(map(len, tokens)) + {decode.max_len_b})"
        if decode.max_len_a
        else str(decode.max_len_b)
    )
    unknown = "; pieces its vocabulary lacks are read as `<unk>`" if imported else ""
    alpha = decode.length_penalty if decode.length_normalization != "none" else 0.0
    suppress = [[p] for p in banned]
    limit_a = f"{decode.max_len_a:g} · source pieces + " if decode.max_len_a else ""
    patience = decode.patience or 1
    computes, differences = _ctranslate2_differences(decode)
    return f"""# CTranslate2 model

Written by `nmt export --format ctranslate2` from `{source}`.
{computes} (float32; `--quantization` changes that).
The SentencePiece model(s) beside it cut the text into the pieces it reads{unknown}.

```python
import ctranslate2
import sentencepiece as spm

translator = ctranslate2.Translator("{out}", device="cpu")
source = spm.SentencePieceProcessor(model_file="{out}/{files[0]}")
target = spm.SentencePieceProcessor(model_file="{out}/{files[1]}")
lines = ["A dog runs on the beach."]{code_note}
tokens = [source.encode(line, out_type=str) + ["</s>"] for line in lines]
results = translator.translate_batch(
    tokens, beam_size={decode.beam_size}, patience={patience:g}, length_penalty={alpha},
    max_decoding_length={limit}, min_decoding_length={decode.min_len},
    suppress_sequences={suppress!r}, disable_unk={not decode.allow_unk},
)
print([target.decode(result.hypotheses[0]){detok} for result in results])
```

nmt's defaults for this checkpoint are used above: beam size {decode.beam_size}, length penalty
α {decode.length_penalty} ({decode.length_normalization} normalisation, |Y| counting EOS), at most
{limit_a}{decode.max_len_b} output pieces (CTranslate2's limit is one number per batch), and at
least {decode.min_len} (CTranslate2's default, 1, would forbid an empty translation).{differences}
`scripts/bench_exports.py` in nmt's repository measures how often the two differ.
"""


FORMATS = ("huggingface", "ctranslate2", "nmt")


def marian_languages(data) -> tuple[str, str] | None:
    """``tokenizer_config.json``'s ``(source_lang, target_lang)`` for a model of ``data``'s
    directions: the pair, or one source into several targets (``mul``, as OPUS-MT's multi-target
        models say); None for several sources."""
    pairs = multilingual.directions(data)
    sources = list(dict.fromkeys(p.src for p in pairs))
    return (
        (pairs[0].src, pairs[0].tgt)
        if len(pairs) == 1
        else (sources[0], "mul")
        if len(sources) == 1
        else None
    )


def _max_positions(checkpoint) -> int:
    """The position table of ``checkpoint``'s export: an import's own ``max_position_embeddings``;
    else (nmt's sinusoidal positions have no end) room for the longest line nmt translates,
    ``decode.max_input_pieces`` and EOS, and at least 1024."""
    imported = checkpoint.payload.get("imported_from", {}).get("max_position_embeddings")
    return int(imported or max(1024, checkpoint.config.decode.max_input_pieces + 1))


def export(
    checkpoint: str | Path,
    out: str | Path,
    format: str = "huggingface",
    quantization: str | None = None,
) -> None:
    """Write ``checkpoint`` (a file, or a run directory's ``best.pt``) for deployment, as
    ``format``: a Hugging Face MarianMTModel directory, a CTranslate2 model directory (through the
    Marian one, with the SentencePiece model(s) and a README of the Python lines that translate with
    it) or a slim nmt checkpoint (:func:`export_slim`). Directories are written in place
    (:func:`directory_in_place`).

    Raises:
        ExportError: an unknown ``format``, a ``quantization`` without ctranslate2 or one
            CTranslate2 rejects, ``out`` the checkpoint itself, a missing package, or a model the
            format cannot express.
        nmt.runs.checkpoint.CheckpointError: the checkpoint is missing or damaged.
        nmt.files.OutputError: ``out`` cannot be written.
    """
    from nmt.files import check_writable

    checkpoint, out = Path(checkpoint), Path(out)
    if format not in FORMATS:
        raise ExportError(Key("format"), f" {format!r} is not supported; use {', '.join(FORMATS)}")
    if quantization is not None and format != "ctranslate2":
        raise ExportError(
            Key("quantization"), " applies to ", Key("format"), f" ctranslate2 only, not {format}"
        )
    if format == "nmt":
        check_writable(out, Key("out"))
        source = checkpoint_file(checkpoint)
        if out.exists() and source.exists() and out.samefile(source):
            raise ExportError(
                Key("out"), f" {out} is the checkpoint being exported; give another file name"
            )
        export_slim(checkpoint, out)
        return
    _check_directory(out)
    loaded = load_checkpoint(checkpoint)
    model, tokenizer, cfg = loaded.model, loaded.tokenizer, loaded.config
    max_positions = _max_positions(loaded)
    languages, tag_list = marian_languages(cfg.data), multilingual.tags(cfg.data)
    try:
        if format == "huggingface":
            export_huggingface(
                model, tokenizer, out, max_positions, cfg.decode, languages=languages, tags=tag_list
            )
            return
        # the Marian directory it is converted from is written inside, then removed
        with directory_in_place(out) as tmp:
            (tmp / "huggingface").mkdir()
            # The Marian directory is a step of the conversion: what its own users should know does
            # not concern this one's.
            write_huggingface(
                model,
                tokenizer,
                tmp / "huggingface",
                max_positions,
                cfg.decode,
                out,
                languages,
                tag_list,
                say=False,
            )
            try:
                with quiet_transformers():
                    export_ctranslate2(tmp / "huggingface", tmp / "ctranslate2", quantization)
            # CTranslate2 rejects an unknown quantization with a ValueError
            except ValueError as exc:
                if quantization is None:
                    raise
                raise ExportError(Key("quantization"), f" {quantization!r}: {exc}") from None
            shutil.rmtree(tmp / "huggingface")
            for part in (tmp / "ctranslate2").iterdir():
                part.rename(tmp / part.name)
            (tmp / "ctranslate2").rmdir()
            for filename, proto in sentencepiece_files(tokenizer).items():
                (tmp / filename).write_bytes(proto)
            (tmp / "README.md").write_text(
                ctranslate2_readme(tokenizer, cfg.decode, str(checkpoint), str(out)),
                encoding="utf-8",
            )
    except ImportError as exc:
        raise ExportError(
            f"exporting to {format} needs {exc.name or 'transformers and ctranslate2'}: pip "
            'install -e ".[export]"'
        ) from None
    except MarianError as exc:
        raise ExportError(str(exc)) from None
