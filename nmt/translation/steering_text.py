"""Steering as a user writes it: a prefix, constraints and banned phrases given as text, read into
the target pieces the search is steered by (:class:`~nmt.decode.steering.Steering`), with the
text a model cannot write refused in one line (:class:`UnwritableText`)."""

from __future__ import annotations

import bisect
import functools
from collections.abc import Iterable

from nmt.data.corpus import DataError
from nmt.data.tokenizer import EOS, UNK, Tokenizer
from nmt.decode.steering import FRAGMENT_DONE, Steering


class UnwritableText(DataError):
    """A prefix or constraint the model cannot write; ``field`` says which (``prefix``,
    ``constraint``)."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def steering(
    tokenizer: Tokenizer,
    prefix: str = "",
    constraints: Iterable[str] = (),
    bans: Iterable[str] = (),
) -> Steering:
    """What one line's translation must start with, hold and avoid, from text
    (:class:`~nmt.decode.steering.Steering`).

    Each text is segmented with the target tokenizer, as the model writes it (a word that
    starts a phrase gets its word-initial piece, ``▁Hund``), so a constraint or ban matches the
    output's own pieces; an empty phrase is ignored. A prefix's whole words are forced, piece by
    piece. When it ends inside a word (no trailing space), that last word is a fragment the
    search must spell but may spell in any pieces and finish as it likes
    (:func:`fragment_automaton`:
    ``zwei Lehr``, cut ``▁L ehr``, may become ``▁Lehrer``), rather than as the typed fragment was
    cut (what CTranslate2 calls a prefix "in the middle of a word"). After a prefix that ends with
    a space, the next piece starts a word (or the translation ends there).

    Raises:
        UnwritableText: the prefix or a constraint has characters the target vocabulary lacks
            (forcing UNK would write ⁇, not the text), or a constraint holds a banned phrase.
    """

    def pieces(text: str, field: str | None = None) -> tuple[int, ...]:
        ids = tuple(tokenizer.encode_tgt([text])[0]) if text.strip() else ()
        if field is not None and UNK in ids:  # it could only be written as ⁇, not as given
            missing = "".join(
                dict.fromkeys(
                    c for c in text if not c.isspace() and UNK in tokenizer.encode_tgt([c])[0]
                )
            )
            raise UnwritableText(
                field,
                f"{field} {text!r} has characters the target vocabulary lacks ({missing}); remove "
                "or replace them",
            )
        return ids

    steps: list[tuple[int, ...]] = [(i,) for i in pieces(prefix, "prefix")]
    texts, fragment = tokenizer.tgt_pieces, ()
    if steps and prefix[-1:].isspace():
        steps.append(tuple(i for i, t in enumerate(texts) if t.startswith("\u2581")) + (EOS,))
    elif steps:  # the last word is a fragment: it is spelt by whatever pieces the model chooses
        start = max((k for k, (i,) in enumerate(steps) if texts[i].startswith("\u2581")), default=0)
        fragment = fragment_automaton(
            "".join(texts[i] for (i,) in steps[start:]), texts, tokenizer.tgt.is_control
        )
        steps = steps[:start]
    wanted = [(c, p) for c in constraints if (p := pieces(c, "constraint"))]
    # a ban with UNK bans what is never written anyway
    banned = [(b, p) for b in bans if (p := pieces(b))]
    for c, need in wanted:
        clash = next(
            (
                b
                for b, ban in banned
                if any(need[i : i + len(ban)] == ban for i in range(len(need) - len(ban) + 1))
            ),
            None,
        )
        if clash is not None:
            raise UnwritableText(
                "constraint",
                f"constraint {c!r} holds the banned phrase {clash!r}: no translation can meet "
                "both; drop one",
            )
    return Steering(
        tuple(steps), tuple(p for _, p in wanted), tuple(p for _, p in banned), fragment
    )


def fragment_automaton(
    fragment: str, texts: tuple[str, ...], is_control
) -> tuple[tuple[tuple[int, int], ...], ...]:
    """The automaton by which a search spells ``fragment`` (piece text, ``▁Lehr``) in any pieces of
    ``texts`` (the target vocabulary's, by id), finishing the word as it likes: state ``s`` has
    spelt ``fragment[:n_s]``; a piece that spells more of it moves to that state, a piece that
    spells the rest (and maybe more: ``▁Lehrer``) to :data:`~nmt.decode.steering.FRAGMENT_DONE`.
    Only states a piece reaches are made.
    """
    ordered, by_text = _piece_index(texts, tuple(i for i in range(len(texts)) if is_control(i)))
    states, index, table = [0], {0: 0}, []
    for done in states:  # grows as states are found
        rest, moves = fragment[done:], []
        at = bisect.bisect_left(ordered, (rest, -1))
        # spells the rest of the word, and maybe more
        while at < len(ordered) and ordered[at][0].startswith(rest):
            moves.append((ordered[at][1], FRAGMENT_DONE))
            at += 1
        for end in range(1, len(rest)):  # spells a beginning of the rest: a state further on
            for piece in by_text.get(rest[:end], ()):
                if done + end not in index:
                    index[done + end] = len(states)
                    states.append(done + end)
                moves.append((piece, index[done + end]))
        table.append(tuple(sorted(moves)))
    return tuple(table)


@functools.lru_cache(maxsize=4)
def _piece_index(
    texts: tuple[str, ...], controls: tuple[int, ...]
) -> tuple[list[tuple[str, int]], dict[str, list[int]]]:
    """The pieces that may spell text (not controls, not empty), sorted by text, and by text."""
    skip = set(controls)
    ordered = sorted(
        (text, piece) for piece, text in enumerate(texts) if text and piece not in skip
    )
    by_text: dict[str, list[int]] = {}
    for text, piece in ordered:
        by_text.setdefault(text, []).append(piece)
    return ordered, by_text
