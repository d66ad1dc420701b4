"""What a search may generate, enforced on the log-probabilities of every step."""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.config import DecodeConfig
from nmt.core.pieces import BOS, EOS, PAD, UNK, OutputRules

from .beams import none_set


class Restrictions:
    """Forbids, in place, what no search may generate (Hugging Face calls these logits processors).

    * PAD and BOS always, UNK unless ``decode.allow_unk``, the pieces of ``rules.unwritable``
      (:class:`~nmt.core.pieces.OutputRules`: pieces that hold a line break or another control);
    * EOS before ``decode.min_len`` pieces;
    * byte pieces that would not spell valid UTF-8 (RFC 3629: no stray continuation byte, no
      overlong form, surrogate or code point above U+10FFFF) or would spell a character of
      :data:`~nmt.data.tokenizer.NEVER_OUTPUT` (C1 controls, U+2028, U+2029); while a character is
      incomplete only its continuation bytes may follow, not EOS or another piece;
    * what a sentence's :class:`~nmt.decode.steering.Steering` says, through the search's
      :class:`~nmt.decode.steering.Steer` (only when a sentence has any): during its prefix only
      the prefix's pieces (this wins over every rule above but the limit: the user wrote them);
      after it, no banned phrase and no EOS while a constraint is unmet;
    * at its length limit a hypothesis may only end (this wins over every rule: a character
      cut there is dropped when the output is decoded, see
      :meth:`nmt.data.tokenizer.Tokenizer.decode_tgt`, and an unmet constraint is reported).

    Everything but steering depends only on each hypothesis' last tokens and the step, read on the
    device, and no shape depends on a value: a GPU can capture it in a CUDA graph.
    """

    def __init__(
        self,
        decode: DecodeConfig,
        rules: OutputRules | None,
        device: torch.device,
        vocab: int | None = None,
    ):
        self.decode, self.rules, self.device = decode, rules, device
        self.banned = None
        if vocab is not None:
            self._build(vocab)

    def _build(self, vocab: int) -> None:
        """The rules' columns for a vocabulary of ``vocab`` pieces (on the first call, when not
        given up front: a step captured as a CUDA graph must not make them)."""
        rules, device = self.rules, self.device
        banned = (
            [PAD, BOS]
            + ([] if self.decode.allow_unk else [UNK])
            + [i for i in (rules.unwritable if rules else ()) if i < vocab]
        )
        # column ids: filling them is cheaper than a (rows, vocab) mask
        self.banned = torch.tensor(sorted(set(banned)), device=device)
        self.byte_values = None
        if rules is not None and rules.byte_values:
            values = torch.tensor(rules.byte_values[:vocab], dtype=torch.long)
            self.byte_values = values.to(device)  # (vocab,): -1 for other pieces
            self.byte_ids = torch.nonzero(values >= 0).squeeze(1).to(device)  # (bytes,)
            self.bytes = self.byte_values[self.byte_ids]  # (bytes,) their values
            # After a complete character: no continuation byte (0x80-0xBF) and no byte that never
            # starts one (0xC0, 0xC1, 0xF5-0xFF).
            self.not_a_start = self.byte_ids[
                ((self.bytes >= 0x80) & (self.bytes <= 0xC1)) | (self.bytes >= 0xF5)
            ]

    def __call__(self, lprobs: Tensor, beams, steer=None, step: int = 0) -> None:
        """Restrict ``lprobs`` ``(rows, vocab)`` of the hypotheses of ``beams`` (a
        :class:`~nmt.decode.beams.Beams`); ``steer`` (None: no sentence is steered) and ``step``,
        the pieces so far, for it."""
        if self.banned is None:
            self._build(lprobs.size(-1))
        limit = beams.at_limit(step)
        eos = None if limit is None or none_set(limit) else lprobs[:, EOS].clone()
        written = steer.unrestricted(lprobs, step) if steer is not None else None
        lprobs.index_fill_(1, self.banned, float("-inf"))
        if self.decode.min_len and lprobs.is_cuda:  # a captured step reads no host value
            lprobs[:, EOS] = torch.where(
                beams.step < self.decode.min_len, float("-inf"), lprobs[:, EOS]
            )
        elif step < self.decode.min_len:
            lprobs[:, EOS] = float("-inf")
        if self.byte_values is not None:
            self._complete_characters(lprobs, beams.tail())
        if steer is not None:
            steer.restrict(lprobs, beams.tokens[:, : step + 1], step, written)
        # the limit wins over every rule: a hypothesis there ends, so each sentence gets one
        if eos is not None:
            lprobs.masked_fill_(limit.unsqueeze(1), float("-inf"))
            lprobs[:, EOS] = torch.where(limit, eos, lprobs[:, EOS])

    def _complete_characters(self, lprobs: Tensor, tail: Tensor) -> None:
        """Byte pieces spell whole, valid characters: a new character starts only with a byte that
        can start one; in the middle of one, only the continuation bytes RFC 3629 allows there
        follow. ``tail``: ``(rows, 3)`` each hypothesis' last tokens. Pending rows are chosen by a
        mask, not picked out (fixed shapes, no host read); only the byte columns are compared."""
        tail = self.byte_values[tail]  # (rows, 3): byte values, -1 for other pieces
        # (rows,) where the last character starts
        lead_at = torch.where(tail[:, 2] >= 0xC0, 2, torch.where(tail[:, 1] >= 0xC0, 1, 0))
        lead = tail.gather(1, lead_at.unsqueeze(1)).squeeze(1)
        have, need = 3 - lead_at, 2 + (lead >= 0xE0).long() + (lead >= 0xF0).long()
        # (rows,) in the middle of a character
        pending = (tail[:, 2] >= 0x80) & (lead >= 0xC0) & (have < need)
        # (rows, bytes): what the pending rows may write, at the scores they had
        kept = pending.unsqueeze(1) & self._continuations(lead, have, tail[:, 2])
        middle = lprobs.index_select(1, self.byte_ids)
        lprobs.index_fill_(1, self.not_a_start, float("-inf"))
        lprobs.masked_fill_(pending.unsqueeze(1), float("-inf"))
        bytes_now = lprobs.index_select(1, self.byte_ids)
        lprobs.index_copy_(1, self.byte_ids, torch.where(kept, middle, bytes_now))

    def _continuations(self, lead: Tensor, have: Tensor, second: Tensor) -> Tensor:
        """``(rows, bytes)``: the byte pieces that may continue a character of lead byte ``lead`` of
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
        values = self.bytes.unsqueeze(0)  # (1, bytes)
        allowed = (values >= low.unsqueeze(1)) & (values <= high.unsqueeze(1))
        # E2 80 A8/A9: U+2028, U+2029
        separator = ((have == 2) & (lead == 0xE2) & (second == 0x80)).unsqueeze(1)
        return allowed & ~(separator & ((values == 0xA8) | (values == 0xA9)))
