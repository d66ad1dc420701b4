"""Text that scores otherwise than it reads: the warnings that :func:`nmt.scoring.evaluate.score`
gives before scoring, for ``nmt evaluate`` and validation alike, and the references that count
otherwise than meant (:func:`warn_if_references_look_wrong`).

sacreBLEU compares code points, so three kinds of difference lower BLEU and chrF where a reader
sees the same text: Unicode normalisation (``é`` as one code point or as ``e`` and a combining
accent; ``ﬁ`` against ``fi``), characters that draw nothing (a byte-order mark left inside a file
made by joining files), and Moses' escapes (``&apos;`` against ``'``). Each is found line by line
and warned about once per reference, with a count, the first line and the fix; the score itself
stays that of the text as given, so that it remains comparable.
"""

from __future__ import annotations

import logging
import unicodedata
from collections import Counter

log = logging.getLogger("nmt.text_forms")


def _nfkc(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def _shared_characters(a: str, b: str) -> int:
    """How many characters (spaces aside) ``a`` and ``b`` have in common, with repeats."""
    return sum((Counter(a.replace(" ", "")) & Counter(b.replace(" ", ""))).values())


def clusters(text: str) -> list[str]:
    """``text`` cut into characters each with the combining marks that follow it (a mark with
    nothing before it stands alone)."""
    found: list[str] = []
    for ch in text:
        if found and unicodedata.combining(ch):
            found[-1] += ch
        else:
            found.append(ch)
    return found


def _first_change(text: str) -> tuple[str, str]:
    """The first character of ``text`` (with the combining marks that follow it,
    :func:`clusters`) that NFKC changes, and what NFKC makes of it; ``("", "")`` if
    none."""
    return next(
        (
            (c, _nfkc(c))
            for c in clusters(text)
            if _nfkc(c) != c and not unicodedata.combining(c[0])
        ),
        ("", ""),
    )


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
            if not written:  # only combining marks with nothing before them change
                written, normal = hyp[:20], ref[:20]
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
                "warning: %d line(s) of the hypotheses differ from %s in Unicode normalisation "
                "(line %d: %s "
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
                "warning: %d line(s) of the hypotheses and %s differ in invisible characters (line "
                "%d: "
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
                "warning: %d line(s) of the hypotheses and %s differ in Moses escapes (line %d: %s "
                "on one "
                "side, the character on the other), which score as different words; unescape both "
                "first (html.unescape in Python, or Moses' deescape-special-chars.perl)",
                count,
                name,
                first[0],
                first[1],
            )


def warn_if_references_look_wrong(references: list[list[str]], names: tuple[str, ...]) -> None:
    """Say in one line each what makes a score mean less than it seems: a stream with empty lines
    (their pairs count for nothing in chrF and only against the hypothesis in BLEU), a stream whose
    every line holds a tab (several references a line, which sacreBLEU's ``--num-refs`` would
    split), and two streams of the same text (one reference counted twice)."""
    for name, ref in zip(names, references):
        empty = [i + 1 for i, line in enumerate(ref) if not line.strip()]
        if empty:
            log.warning(
                "warning: %s has %d empty line(s) (the first: line %d): a hypothesis is scored "
                "against nothing there; drop those pairs or give their references",
                name,
                len(empty),
                empty[0],
            )
        if ref and all("\t" in line for line in ref):
            log.warning(
                "warning: every line of %s holds a tab: if a line holds several references, give "
                "each as its own --ref",
                name,
            )
    for k, ref in enumerate(references):
        same = next((names[j] for j in range(k) if references[j] == ref), None)
        if same is not None:
            log.warning(
                "warning: %s and %s are the same text: that reference counts twice", same, names[k]
            )
