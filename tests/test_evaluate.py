import math

import pytest

from nmt.evaluate import EvaluationError, score


def test_perfect_and_signature():
    result = score(["the cat sat on the mat ."], [["the cat sat on the mat ."]])
    assert result["bleu"] == 100.0 and result["chrf"] == 100.0
    assert result["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp")


def test_hand_computed_bleu():
    # hyp "a b c d" vs ref "a b c e": precisions 3/4, 2/3, 1/2, 0/1 -> with exp smoothing
    # the 4-gram precision becomes 1/(2·1) = 0.5: BLEU = (3/4 · 2/3 · 1/2 · 1/2)^(1/4).
    result = score(["a b c d"], [["a b c e"]])
    assert result["bleu"] == pytest.approx(100 * (0.75 * (2 / 3) * 0.5 * 0.5) ** 0.25, abs=0.01)


def test_length_ratio_and_brevity_penalty():
    # A 5-token prefix of a 6-token reference: every n-gram precision is 1, so BLEU is the
    # brevity penalty exp(1 - 6/5) alone, at a length ratio of 5/6.
    result = score(["a b c d e"], [["a b c d e f"]])
    assert result["length_ratio"] == round(5 / 6, 3)
    assert result["bleu"] == pytest.approx(100 * math.exp(1 - 6 / 5), abs=0.01)


def test_several_references():
    one = score(["the dog runs to the park"], [["a dog runs to a park"]])
    two = score(["the dog runs to the park"], [["a dog runs to a park"], ["the dog runs to the park"]])
    assert two["bleu"] == 100.0 > one["bleu"]
    assert two["bleu_signature"].startswith("nrefs:2")


def test_line_count_mismatch_is_an_error():
    with pytest.raises(EvaluationError, match="ref.de has 1 lines but there are 2 hypotheses"):
        score(["a", "b"], [["a"]], names=("ref.de",))


def test_empty_input_is_an_error_not_a_crash():
    with pytest.raises(EvaluationError, match="nothing to score"):
        score([], [[]])
