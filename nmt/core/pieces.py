"""The special pieces every nmt vocabulary reserves, and what a target vocabulary may never
generate.

Every model nmt trains reserves the same four ids, so that a model and any code that
builds batches agree without looking them up:

=====  ===  ==============================================
PAD     0   padding; never predicted, ignored by the loss
UNK     1   unknown piece
BOS     2   begins every decoder input
EOS     3   ends every source and every target
=====  ===  ==============================================
"""

from __future__ import annotations

from dataclasses import dataclass

PAD, UNK, BOS, EOS = 0, 1, 2, 3


@dataclass(frozen=True)
class OutputRules:
    """What a target vocabulary may never generate (enforced by
    :class:`nmt.decode.restrictions.Restrictions`).

    ``unwritable``: ids of pieces whose text holds a character no translation may contain
    (:data:`nmt.data.tokenizer.NEVER_OUTPUT`), the byte pieces of such single bytes among them.
    ``byte_values``: per id, the byte a byte piece stands for (``<0x41>`` → 65), -1 for other
    pieces; empty without byte fallback.
    """

    unwritable: tuple[int, ...] = ()
    byte_values: tuple[int, ...] = ()
