"""The search held on the device (nmt.core.device_search) against the host's beam search: the same
hypotheses, in the same order, with the same scores, for any scores a model could give."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from nmt.config import DecodeConfig
from nmt.core.device_search import DeviceBeams, device_beam_search
from nmt.core.pieces import OutputRules
from nmt.core.search import beam_search
from nmt.tokenizer import BOS, EOS, PAD, UNK


class GeneratedScorer:
    """Next-token log-probabilities drawn from a generator seeded by the sentence and the prefix,
    so that both searches see the same distribution for the same hypothesis whatever its row. The
    state is each row's sentence. ``grain`` rounds the logits (ties); ``eos`` favours ending;
    ``dead``: the share of impossible pieces; ``nan``: the chance that a row is NaN (a diverged
    model's)."""

    def __init__(
        self, seed: int, vocab: int, grain: float, eos: float, dead: float, nan: float = 0.0
    ):
        self.seed, self.vocab, self.grain, self.eos, self.dead, self.nan = (
            seed,
            vocab,
            grain,
            eos,
            dead,
            nan,
        )

    def step(self, prefix, state):
        rows = []
        for sentence, row in zip(state.tolist(), prefix.tolist()):
            assert row[0] == BOS
            g = torch.Generator().manual_seed(hash((self.seed, sentence, *row)) % 2**63)
            logits = torch.randn(self.vocab, generator=g) * 3
            if self.grain:
                logits = torch.round(logits / self.grain) * self.grain
            logits[EOS] += self.eos
            # some pieces impossible (-inf), as a shortlist or a rule leaves them
            logits[torch.rand(self.vocab, generator=g) < self.dead] = float("-inf")
            if torch.rand(1, generator=g).item() < self.nan:
                logits[0] = float("nan")
            rows.append(torch.log_softmax(logits, -1))
        return torch.stack(rows), state

    def reorder(self, state, index):
        return state.index_select(0, index)

    def keep_sentences(self, state, keep):
        beam = state.numel() // state.unique_consecutive().numel()
        rows = (keep.unsqueeze(1) * beam + torch.arange(beam)).view(-1)
        return state.index_select(0, rows)


def same(a, b):
    """Identical n-best lists: tokens, scores and log-probabilities to the bit (NaN equal to
    NaN)."""
    assert [[(h.tokens, repr(h.score), repr(h.log_prob)) for h in hyps] for hyps in a] == [
        [(h.tokens, repr(h.score), repr(h.log_prob)) for h in hyps] for hyps in b
    ]


@settings(max_examples=150, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    max_lens=st.lists(st.integers(0, 9), min_size=1, max_size=4),
    beam=st.integers(1, 5),
    n_best_share=st.floats(0, 1.5),
    alpha=st.sampled_from([0.0, 0.6, 1.0, 2.0, -0.5, -3.0]),
    normalization=st.sampled_from(["gnmt", "length", "none"]),
    min_len=st.integers(0, 4),
    allow_unk=st.booleans(),
    grain=st.sampled_from([0.0, 0.5, 2.0]),
    eos=st.floats(-2, 4),
    dead=st.sampled_from([0.0, 0.3, 0.9]),
    nan=st.sampled_from([0.0, 0.0, 0.2]),
)
def test_the_device_search_equals_the_host_search(
    seed,
    max_lens,
    beam,
    n_best_share,
    alpha,
    normalization,
    min_len,
    allow_unk,
    grain,
    eos,
    dead,
    nan,
):
    # past 1: more than beam_size, which the config refuses but translate_batch takes
    n_best = 1 + int(n_best_share * (beam - 1)) if n_best_share <= 1 else beam + 1
    decode = DecodeConfig(
        beam_size=beam,
        n_best=n_best,
        length_penalty=alpha,
        length_normalization=normalization,
        min_len=min_len,
        allow_unk=allow_unk,
    )
    scorer = GeneratedScorer(seed, 12, grain, eos, dead, nan)
    state = torch.arange(len(max_lens)).repeat_interleave(beam)
    limits = torch.tensor(max_lens)
    same(
        device_beam_search(scorer, state, limits, decode),
        beam_search(scorer, state, limits, decode),
    )


@pytest.fixture(scope="module")
def byte_rules():
    """Rules of a vocabulary with byte pieces: ids 8-263 stand for bytes 0-255, and 5 (a piece
    holding a line break) may never be written."""
    values = [-1] * 8 + list(range(256))
    return OutputRules(unwritable=(5, 8 + 0x0A), byte_values=tuple(values))


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31),
    max_lens=st.lists(st.integers(0, 8), min_size=1, max_size=3),
    beam=st.integers(1, 4),
    eos=st.floats(-2, 3),
)
def test_the_device_search_keeps_characters_whole_as_the_host_search(
    byte_rules, seed, max_lens, beam, eos
):
    """With byte pieces, the masked rule of whole characters (every row computed) restricts as the
    host's (the pending rows picked out)."""
    decode = DecodeConfig(beam_size=beam, n_best=beam, length_penalty=1.0)
    scorer = GeneratedScorer(seed, len(byte_rules.byte_values), 0.0, eos, 0.0)
    state = torch.arange(len(max_lens)).repeat_interleave(beam)
    limits = torch.tensor(max_lens)
    device = device_beam_search(scorer, state, limits, decode, byte_rules)
    same(device, beam_search(scorer, state, limits, decode, byte_rules))
    for hyps in device:
        for h in hyps:
            assert not {PAD, BOS, UNK, 5, 8 + 0x0A} & set(h.tokens)


def test_one_step_by_hand():
    """Beam 2, one sentence, vocabulary of 6 (ids 4 and 5 the pieces): step 0 keeps 4 (-0.1) and 5
    (-0.5); step 1 ends 4 with EOS (-0.1 - 0.2 = -0.3), continues 4 4 (-0.1 - 1.0) and 5 5
    (-0.5 - 0.7); the finished hypothesis scores -0.3 / 2**1 with length normalisation α 1."""
    decode = DecodeConfig(beam_size=2, n_best=1, length_penalty=1.0, length_normalization="length")
    beams = DeviceBeams.start(1, 4, decode, None, torch.device("cpu"))
    beams.reset_(torch.tensor([2]))
    inf = float("-inf")
    # columns: PAD, UNK, BOS, EOS, 4, 5
    assert (PAD, UNK, BOS, EOS) == (0, 1, 2, 3)
    first = torch.tensor([[inf, inf, inf, -3.0, -0.1, -0.5]] * 2)
    back, new = beams.update(first)
    assert new.tolist() == [4, 5] and beams.scores[0].tolist() == pytest.approx([-0.1, -0.5])
    second = torch.tensor([[inf, inf, inf, -0.2, -1.0, -3.0], [inf, inf, inf, -2.0, -4.0, -0.7]])
    back, new = beams.update(second)
    assert back.tolist() == [0, 1] and new.tolist() == [4, 5]
    assert beams.done.tolist() == [1] and beams.done_lengths[0, 0].item() == 1
    assert beams.scores[0].tolist() == pytest.approx([-1.1, -1.2])
    # settled by the bound: the best running hypothesis (-1.1) can reach at best -1.1 / 3 = -0.367
    # (|Y| = 3, EOS counted), below the finished one's -0.15
    assert beams.active.tolist() == [False]
    (best,) = beams.results(1)[0]
    assert (
        best.tokens == [4]
        and best.score == pytest.approx(-0.15)
        and best.log_prob == (pytest.approx(-0.3))
    )
