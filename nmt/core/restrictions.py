"""What a search may generate, enforced on the log-probabilities of every step."""

from __future__ import annotations

import torch
from torch import Tensor

from ..config import DecodeConfig
from .beams import FRAGMENT_DONE, Beams, Steering
from .pieces import BOS, EOS, PAD, UNK, OutputRules


class Restrictions:
    """Forbids, in place, what no search may generate (Hugging Face calls these logits processors).

    * PAD and BOS always, UNK unless ``decode.allow_unk``, the pieces of ``rules.unwritable``
      (:class:`~nmt.tokenizer.OutputRules`: pieces that hold a line break or another control);
    * EOS before ``decode.min_len`` pieces;
    * byte pieces that would not spell valid UTF-8 (RFC 3629: no stray continuation byte, no
      overlong form, surrogate or code point above U+10FFFF) or would spell a character of
      :data:`~nmt.tokenizer.NEVER_OUTPUT` (C1 controls, U+2028, U+2029); while a character is
      incomplete only its continuation bytes may follow, not EOS or another piece;
    * what a sentence's :class:`~nmt.core.beams.Steering` says: during its prefix, only the prefix's
      pieces (this wins over every rule above but the limit: the user wrote them); after it, no
      banned phrase's last piece where the hypothesis ends with the rest of the phrase; and no
      EOS while a constraint is unmet;
    * at its length limit a hypothesis may only end (this wins over every rule: a character
      cut there is dropped when the output is decoded, see
      :meth:`nmt.tokenizer.Tokenizer.decode_tgt`, and an unmet constraint is reported).

    Everything but the length limit and the constraints depends only on the hypothesis' own
    tokens, so it follows the beams without state of its own; constraint progress lives in
    :class:`~nmt.core.beams.ConstraintProgress`, which the beams carry.
    """

    def __init__(
        self, decode: DecodeConfig, rules: OutputRules | None, vocab: int, device: torch.device
    ):
        self.min_len = decode.min_len
        banned = (
            [PAD, BOS]
            + ([] if decode.allow_unk else [UNK])
            + [i for i in (rules.unwritable if rules else ()) if i < vocab]
        )
        # column ids: filling them is cheaper than a (rows, vocab) mask
        self.banned = torch.tensor(sorted(set(banned)), device=device)
        self.byte_values = None
        if rules is not None and rules.byte_values:
            values = torch.tensor(rules.byte_values[:vocab], dtype=torch.long)
            # After a complete character: no continuation byte (0x80-0xBF) and no byte that never
            # starts one (0xC0, 0xC1, 0xF5-0xFF).
            self.not_a_start = (
                torch.nonzero(((values >= 0x80) & (values <= 0xC1)) | (values >= 0xF5))
                .squeeze(1)
                .to(device)
            )
            self.byte_values = values.to(device)
            self.may_start = torch.ones(len(values), dtype=torch.bool, device=device)
            self.may_start[self.not_a_start] = False

    def __call__(self, lprobs: Tensor, beams: Beams, step: int) -> None:
        """Restrict ``lprobs`` ``(rows, vocab)`` of the hypotheses ``beams`` at ``step`` (pieces so
        far)."""
        rows_per_sentence = lprobs.size(0) // len(beams)
        limit = beams.at_limit(step, rows_per_sentence, lprobs.device)  # (rows,) or None
        eos = lprobs[limit, EOS] if limit is not None else None
        forced = [
            i
            for i, s in enumerate(beams.steering)
            if step < len(s.prefix) or (s.fragment and step < len(s.prefix) + _longest(s))
        ]
        # before any rule
        written = {
            i: lprobs[i * rows_per_sentence : (i + 1) * rows_per_sentence].clone() for i in forced
        }
        lprobs.index_fill_(1, self.banned, float("-inf"))
        if step < self.min_len:
            lprobs[:, EOS] = float("-inf")
        if self.byte_values is not None:
            self._complete_characters(lprobs, beams.tokens[:, -3:])
        if beams.steering:
            self._steer(lprobs, beams, step, written)
        # the limit wins over every rule: a hypothesis there ends, so each sentence gets one
        if limit is not None:
            lprobs[limit] = float("-inf")
            lprobs[limit, EOS] = eos

    def fixed(self, lprobs: Tensor, tail: Tensor, step: Tensor, limit: Tensor) -> None:
        """The same rules for a search of fixed shapes (:mod:`nmt.core.device_search`), without
        steering: nothing is read on the host and no shape depends on a value, so a GPU can capture
        it in a CUDA graph. ``lprobs`` ``(rows, vocab)``; ``tail`` ``(rows, 3)`` each hypothesis'
        last three tokens (BOS repeated where it has fewer); ``step`` ``(1,)`` pieces so far, on the
        device; ``limit`` ``(rows,)`` whether the row's sentence is at its length limit."""
        eos = lprobs[:, EOS].clone()
        lprobs.index_fill_(1, self.banned, float("-inf"))
        lprobs[:, EOS] = torch.where(step < self.min_len, float("-inf"), lprobs[:, EOS])
        if self.byte_values is not None:
            self._complete_characters(lprobs, tail, masked=True)
        lprobs.masked_fill_(limit.unsqueeze(1), float("-inf"))
        lprobs[:, EOS] = torch.where(limit, eos, lprobs[:, EOS])

    @staticmethod
    def _steer(lprobs: Tensor, beams: Beams, step: int, written: dict[int, Tensor]) -> None:
        """Prefixes, banned phrases and unmet constraints (see the class docstring)."""
        k = lprobs.size(0) // len(beams)
        for i, steering in enumerate(beams.steering):
            rows = slice(i * k, (i + 1) * k)
            if i in written and step < len(steering.prefix):
                allowed = torch.tensor(steering.prefix[step], device=lprobs.device)
                lprobs[rows] = float("-inf")
                lprobs[rows, allowed] = written[i][:, allowed]
                continue
            if i in written:
                _follow_fragment(lprobs, beams.tokens, i * k, k, steering, written[i])
            for phrase in steering.bans:
                if len(phrase) == 1:
                    lprobs[rows, phrase[0]] = float("-inf")
                elif beams.tokens.size(1) > len(phrase) - 1:  # the tokens hold BOS too
                    ends_with = (
                        beams.tokens[rows, 1 - len(phrase) :]
                        == torch.tensor(phrase[:-1], device=lprobs.device)
                    ).all(1)
                    lprobs[rows][ends_with, phrase[-1]] = float("-inf")
        if beams.progress is not None:
            lprobs[
                beams.progress.unmet(torch.arange(lprobs.size(0), device=lprobs.device)) > 0, EOS
            ] = float("-inf")

    def _complete_characters(self, lprobs: Tensor, last: Tensor, masked: bool = False) -> None:
        """Byte pieces spell whole, valid characters: a new character starts only with a byte that
        can start one; in the middle of one, only the continuation bytes RFC 3629 allows there
        follow. ``last``: ``(rows, <=3)`` each hypothesis' last tokens. ``masked``: every row is
        computed and the pending ones chosen by a mask (fixed shapes, no host read), rather than the
        pending rows picked out."""
        tail = self.byte_values[last]  # (rows, <=3): byte values, -1 for other pieces
        if tail.size(1) < 3:
            tail = torch.cat([tail.new_full((tail.size(0), 3 - tail.size(1)), -1), tail], 1)
        # (rows,) where the last character starts
        lead_at = torch.where(tail[:, 2] >= 0xC0, 2, torch.where(tail[:, 1] >= 0xC0, 1, 0))
        lead = tail.gather(1, lead_at.unsqueeze(1)).squeeze(1)
        have, need = 3 - lead_at, 2 + (lead >= 0xE0).long() + (lead >= 0xF0).long()
        # (rows,) in the middle of a character
        pending = (tail[:, 2] >= 0x80) & (lead >= 0xC0) & (have < need)
        if masked:  # pending rows keep their continuations, the others what may start a character
            allowed = self._continuations(lead, have, tail[:, 2])
            lprobs.masked_fill_(
                ~torch.where(pending.unsqueeze(1), allowed, self.may_start), float("-inf")
            )
            return
        rows = pending.nonzero().squeeze(1) if bool(pending.any()) else None
        # (pending rows, vocab), before the next line
        middle = lprobs[rows] if rows is not None else None
        lprobs.index_fill_(1, self.not_a_start, float("-inf"))
        if rows is None:
            return
        allowed = self._continuations(lead[rows], have[rows], tail[rows, 2])
        lprobs[rows] = middle.masked_fill(~allowed, float("-inf"))

    def _continuations(self, lead: Tensor, have: Tensor, second: Tensor) -> Tensor:
        """``(rows, vocab)``: the pieces that may continue a character of lead byte ``lead`` of
        which ``have`` bytes are written, the last ``second`` (each ``(rows,)``)."""
        low, high = torch.full_like(lead, 0x80), torch.full_like(lead, 0xBF)
        # the byte after the lead: no overlong form, surrogate, code point over U+10FFFF, or C1
        # control
        first = have == 1
        low = torch.where(
            first & ((lead == 0xE0) | (lead == 0xC2)),
            0xA0,
            torch.where(first & (lead == 0xF0), 0x90, low),
        )
        high = torch.where(
            first & (lead == 0xED), 0x9F, torch.where(first & (lead == 0xF4), 0x8F, high)
        )
        values = self.byte_values.unsqueeze(0)  # (1, vocab)
        allowed = (values >= low.unsqueeze(1)) & (values <= high.unsqueeze(1))
        # E2 80 A8/A9: U+2028, U+2029
        separator = ((have == 2) & (lead == 0xE2) & (second == 0x80)).unsqueeze(1)
        return allowed & ~(separator & ((values == 0xA8) | (values == 0xA9)))


def _longest(steering: Steering) -> int:
    """The most pieces a fragment can take: one per state (each piece moves it on)."""
    return len(steering.fragment)


def _follow_fragment(
    lprobs: Tensor, tokens: Tensor, first: int, k: int, steering: Steering, written: Tensor
) -> None:
    """Rows ``first .. first+k-1`` of a sentence whose prefix is written: each row still spelling
    the fragment may only take the pieces its state allows, at the model's own scores (as a
    prefix's)."""
    # the pieces since the prefix
    after = tokens[first : first + k, 1 + len(steering.prefix) :].tolist()
    for row, pieces in enumerate(after):
        state = steering.fragment_state(pieces)
        if state != FRAGMENT_DONE:
            allowed = torch.tensor(
                [piece for piece, _ in steering.fragment[state]], device=lprobs.device
            )
            lprobs[first + row] = float("-inf")
            lprobs[first + row, allowed] = written[row, allowed]
