"""Guards on decoding's hot path: no decoding path records autograd, and none keeps memory between
calls.

A decode that records autograd is still correct, so correctness tests cannot see it: it was
2.4x slower and its memory grew with every batch (the decoder cache's in-place writes under
autograd form a reference cycle that keeps each step's graph alive, see nmt.core.cache.RECORDING).
These tests run every way into decoding with a model whose parameters require gradients, as a
model in training does, and watch every torch call.
"""

import gc
from collections import Counter
from dataclasses import replace

import pytest
import torch
from conftest import cached_tokenizer, tiny_config, translate_lines
from starlette.testclient import TestClient
from torch.overrides import TorchFunctionMode

from nmt.config import Config, DataConfig, DecodeConfig, TrainConfig
from nmt.core.model import Transformer
from nmt.data.encoded import EncodedCorpus
from nmt.decode.search import Sampling
from nmt.decode.steering import Steering
from nmt.serve.app import Limits, Translator, create_app
from nmt.training.validation import ValidationSet, validate
from nmt.translation.inference import Inference
from nmt.translation.shortlist import Shortlist
from nmt.translation.steering_text import steering

LINES = [
    "the dog sees a cat .",
    "a man .",
    "the old teacher gives the child a red book .",
    "the small house .",
]


class Recorded(TorchFunctionMode):
    """Counts the torch calls whose result records autograd (has a ``grad_fn``), by function
    name."""

    def __init__(self):
        super().__init__()
        self.calls = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                self.calls[getattr(func, "__name__", str(func))] += 1
        return out


def live_tensors() -> tuple[int, int]:
    """Tensors alive in this process, and how many of them record autograd."""
    gc.collect()
    tensors = [o for o in gc.get_objects() if isinstance(o, torch.Tensor)]
    return len(tensors), sum(t.grad_fn is not None for t in tensors)


@pytest.fixture(scope="module")
def setup():
    tokenizer = cached_tokenizer(300, 3000, german=True)
    torch.manual_seed(0)
    model = Transformer(
        tiny_config(src_vocab_size=300, tgt_vocab_size=300, n_decoder_layers=3)
    ).eval()
    # as in training: what would let a decode record
    assert all(p.requires_grad for p in model.parameters())
    torch.manual_seed(1)
    other = Transformer(tiny_config(src_vocab_size=300, tgt_vocab_size=300)).eval()
    return model, other, tokenizer


def paths(setup) -> dict:
    """Every way into decoding, each a call of no arguments."""
    model, other, tokenizer = setup
    decode = DecodeConfig(beam_size=3, n_best=2, max_len_a=1.0, max_len_b=3)
    cpu = torch.device("cpu")
    steer = [steering(tokenizer, prefix="der", constraints=["hund"], bans=["katze"])] + [
        Steering()
    ] * (len(LINES) - 1)
    shortlist = Shortlist(always=tuple(range(4, 60)), by_source={})
    src, tgt = (
        tokenizer.encode_src(LINES),
        tokenizer.encode_tgt(["der hund", "ein mann", "der lehrer", "das haus"]),
    )
    valid = ValidationSet(
        EncodedCorpus.from_lists(src, tgt),
        LINES,
        ["der hund", "ein mann", "der lehrer", "das haus"],
    )
    cfg = Config(
        model=model.cfg,
        data=DataConfig(src_lang="en", tgt_lang="de"),
        decode=decode,
        train=TrainConfig(valid_beam_size=2),
    )
    translator = Translator(Inference([model], tokenizer, cpu, cfg))

    def served():
        result = translator.translate(LINES, decode, alignment=True)
        translator.attention(LINES[0], result[0][0])

    return {
        "beam search": lambda: translate_lines(model, tokenizer, LINES, decode, cpu),
        "greedy": lambda: translate_lines(model, tokenizer, LINES, DecodeConfig(beam_size=1), cpu),
        # the search held on the device, run eagerly on a CPU (a GPU replays it as CUDA graphs)
        "static beam search": lambda: translate_lines(
            model, tokenizer, LINES, replace(decode, cache="static"), cpu
        ),
        "sampling": lambda: translate_lines(
            model, tokenizer, LINES, decode, cpu, sampling=Sampling(top_p=0.9, seed=3)
        ),
        "ensemble": lambda: translate_lines([model, other], tokenizer, LINES, decode, cpu),
        "steering": lambda: translate_lines(model, tokenizer, LINES, decode, cpu, steering=steer),
        "alignments": lambda: translate_lines(model, tokenizer, LINES, decode, cpu, alignment=True),
        "shortlist": lambda: translate_lines(
            model, tokenizer, LINES, decode, cpu, shortlist=shortlist
        ),
        "server": served,
        "validation": lambda: validate(model, tokenizer, [valid], cfg, cpu),
    }


@pytest.mark.parametrize(
    "path",
    [
        "beam search",
        "greedy",
        "static beam search",
        "sampling",
        "ensemble",
        "steering",
        "alignments",
        "shortlist",
        "server",
        "validation",
    ],
)
def test_no_decoding_path_records_autograd_or_keeps_memory(setup, path):
    run = paths(setup)[path]
    start = live_tensors()  # what earlier tests of this process left: not this test's to judge
    with Recorded() as recorded:
        run()
    # validation's loss pass is a forward pass under no_grad; its search is checked below
    if path != "validation":
        assert recorded.calls == Counter()
    run()  # the first call may allocate what later calls reuse (the position table, packed weights)
    before = live_tensors()
    for _ in range(20):
        run()
    assert live_tensors() == before
    assert before[1] == start[1]  # nothing recording autograd outlives a call


def test_the_cache_refuses_autograd_instead_of_leaking_it(setup):
    model, _, tokenizer = setup
    src = torch.tensor([tokenizer.encode_src(LINES[:1])[0] + [2]])
    memory, mask = model.encode(src)  # records: the parameters require gradients
    cache = model.start_decoding(memory, mask, beam=1)
    with pytest.raises(RuntimeError, match="decode under torch.inference_mode"):
        model.decode_step(torch.tensor([1]), cache)


def test_the_server_answers_300_requests_with_memory_flat(setup):
    model, _, tokenizer = setup
    cfg = Config(
        model=model.cfg,
        data=DataConfig(src_lang="en", tgt_lang="de"),
        decode=DecodeConfig(beam_size=3, max_len_a=1.0, max_len_b=3),
    )
    app = create_app(
        Translator(Inference([model], tokenizer, torch.device("cpu"), cfg)),
        Limits(max_lines=8, max_input_pieces=40, max_beam_size=6, max_wait_ms=1.0),
    )
    with TestClient(app) as client:
        for i in range(20):  # the allocator's and the server's own first allocations
            assert (
                client.post("/translate", json={"text": LINES[i % len(LINES)]}).status_code == 200
            )
        before = live_tensors()
        for i in range(300):
            assert (
                client.post("/translate", json={"text": LINES[i % len(LINES)]}).status_code == 200
            )
        after = live_tensors()
    # Bound: no tensor more (a leaked step graph is hundreds of tensors a request).
    assert after == before
