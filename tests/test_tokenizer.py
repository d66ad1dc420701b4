import subprocess
import sys
from collections import Counter

from nmt.tokenizer import reservoir_sample

from conftest import ROOT, TOY


def test_reservoir_keeps_a_short_stream_whole_and_in_order():
    assert reservoir_sample(iter(["a", "b", "c"]), 3, seed=7) == ["a", "b", "c"]
    assert reservoir_sample(iter(["a", "b"]), 5, seed=7) == ["a", "b"]


def test_reservoir_sample_is_uniform_and_fixed_by_the_seed():
    n, k, draws = 10, 3, 4000
    counts = Counter()
    for seed in range(draws):
        sample = reservoir_sample(iter(range(n)), k, seed)
        assert len(sample) == k == len(set(sample)) and set(sample) <= set(range(n))
        counts.update(sample)
    # Each item is kept with probability k/n = 0.3; over 4,000 draws the standard error is 0.0072.
    assert all(abs(counts[i] / draws - 0.3) < 0.03 for i in range(n)), counts
    big = reservoir_sample(iter(range(100_000)), 1_000, seed=3)
    assert big == reservoir_sample(iter(range(100_000)), 1_000, seed=3) != reservoir_sample(iter(range(100_000)), 1_000, seed=4)
    assert abs(sum(big) / len(big) - 50_000) < 3_000  # mean of a uniform sample; standard error 913


TRAIN = """
import hashlib, sys
from nmt.config import TokenizerConfig
from nmt.corpus import read_parallel
from nmt.tokenizer import train_tokenizer
src, tgt = read_parallel(sys.argv[1] + "/train.en", sys.argv[1] + "/train.de")
for joint in (True, False):
    tok = train_tokenizer(src, tgt, TokenizerConfig(vocab_size=300, joint=joint, input_sentence_size=5000), seed=int(sys.argv[2]))
    print(*(hashlib.sha1(p).hexdigest() for p in tok.protos().values()))
"""


def _train_in_a_new_process(seed: int) -> str:
    return subprocess.run([sys.executable, "-c", TRAIN, str(TOY), str(seed)], capture_output=True, text=True, check=True, cwd=ROOT, timeout=300).stdout


def test_sampled_tokenizer_is_the_same_in_every_process_for_one_seed():
    # 24,000 toy sentences, 5,000 sampled: SentencePiece's own sampling gave another model per process.
    first = _train_in_a_new_process(1)
    assert len(first.split()) == 3
    assert _train_in_a_new_process(1) == first
    assert _train_in_a_new_process(2) != first
