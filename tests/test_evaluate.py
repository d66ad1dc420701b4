import unicodedata

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


def test_differing_unicode_normalisation_is_warned_about(caplog):
    nfc = "Das Café ist schön ."
    nfd = unicodedata.normalize("NFD", nfc)  # é and ö as a letter plus a combining accent
    assert nfd != nfc and len(nfd) == len(nfc) + 2
    # sacreBLEU compares code points: of 5 words, Café and schön differ, so unigrams match 3/5 and no
    # bigram (each holds a differing word), trigram or 4-gram does. exp smoothing makes the k-th zero
    # precision 1/(2^k · n-grams): 1/8, 1/12, 1/16. BLEU = (3/5 · 1/8 · 1/12 · 1/16)^(1/4) = 14.06.
    assert score([nfc], [[nfd]], ("ref.de",))["bleu"] == 14.06 and score([nfc], [[nfc]])["bleu"] == 100.0
    assert "hypotheses are in NFC but ref.de is in NFD" in caplog.text
    caplog.clear()
    score([nfd], [[nfd]])
    score(["Das Haus ist alt ."], [[nfd]])  # ASCII is in both forms
    assert caplog.text == ""
    score([nfc, nfd], [[nfc, nfc]], ("ref.de",))
    assert "hypotheses are in a mix of forms but ref.de is in NFC" in caplog.text
