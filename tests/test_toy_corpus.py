"""Tests for scripts/make_toy_corpus.py and the shipped data/toy corpus."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "make_toy_corpus.py"
DATA = ROOT / "data" / "toy"
FILES = [f"{split}.{lang}" for split in ("train", "valid", "test") for lang in ("en", "de")]


def _load():
    spec = importlib.util.spec_from_file_location("make_toy_corpus", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up while the class is built
    spec.loader.exec_module(module)
    return module


tc = _load()
NP, PP, Clause, Sentence, render = tc.NP, tc.PP, tc.Clause, tc.Sentence, tc.render


def simple(subj, verb, obj, pp=None, **kw):
    return render(Sentence(Clause(subj, verb, obj, pp), **kw))


@pytest.mark.parametrize(
    "subj, obj, en, de",
    [
        (
            NP("dog", "the", "big"),
            NP("cat", "a", "small"),
            "the big dog sees a small cat.",
            "der große Hund sieht eine kleine Katze.",
        ),
        (
            NP("woman"),
            NP("dog", "the", "big"),
            "the woman sees the big dog.",
            "die Frau sieht den großen Hund.",
        ),
        (
            NP("dog", "a", "big"),
            NP("dog", "a", "big"),
            "a big dog sees a big dog.",
            "ein großer Hund sieht einen großen Hund.",
        ),
        (
            NP("child", "a", "old"),
            NP("house", "a", "red"),
            "an old child sees a red house.",
            "ein altes Kind sieht ein rotes Haus.",
        ),
        (
            NP("girl"),
            NP("house", "the", "red"),
            "the girl sees the red house.",
            "das Mädchen sieht das rote Haus.",
        ),
        (
            NP("dog", plural=True),
            NP("cat", "two"),
            "the dogs see two cats.",
            "die Hunde sehen zwei Katzen.",
        ),
        (
            NP("dog", "three", "big"),
            NP("apple", "the", "red", plural=True),
            "three big dogs see the red apples.",
            "drei große Hunde sehen die roten Äpfel.",
        ),
        (NP("mouse", "a"), NP("egg", "a"), "a mouse sees an egg.", "eine Maus sieht ein Ei."),
    ],
)
def test_agreement_case_and_adjective_endings(subj, obj, en, de):
    assert simple(subj, "see", obj) == (en, de)


@pytest.mark.parametrize(
    "np, de",
    [
        (NP("dog"), "mit dem Hund"),
        (NP("cat"), "mit der Katze"),
        (NP("dog", "a"), "mit einem Hund"),
        (NP("cat", "a", "small"), "mit einer kleinen Katze"),
        (NP("house", "a", "old"), "mit einem alten Haus"),
        (NP("dog", "the", "big", plural=True), "mit den großen Hunden"),
        (NP("dog", "two", "big"), "mit zwei großen Hunden"),
        (NP("car", plural=True), "mit den Autos"),
    ],
)
def test_dative_prepositional_phrases(np, de):
    assert " ".join(PP("with", np).de()) == de


def test_in_dem_contracts_to_im():
    assert " ".join(PP("in", NP("house", "the", "big")).de()) == "im großen Haus"
    assert " ".join(PP("in", NP("city")).de()) == "in der Stadt"
    assert " ".join(PP("in", NP("house", "a")).de()) == "in einem Haus"


def test_fronted_adverb_gives_verb_second():
    assert simple(NP("man"), "see", NP("dog"), adverb="today") == (
        "today the man sees the dog.",
        "heute sieht der Mann den Hund.",
    )


def test_subordinate_clause_is_verb_final():
    s = Sentence(
        Clause(NP("woman"), "like", NP("cat", "a")),
        conj="because",
        other=Clause(NP("man"), "see", NP("dog"), PP("in", NP("house"))),
    )
    assert render(s) == (
        "the woman likes a cat because the man sees the dog in the house.",
        "die Frau mag eine Katze, weil der Mann den Hund im Haus sieht.",
    )


def test_fronted_subordinate_clause_gives_verb_first_main_clause():
    s = Sentence(
        Clause(NP("woman"), "see", NP("cat")),
        conj="although",
        other=Clause(NP("man", plural=True), "see", NP("dog")),
        fronted=True,
    )
    assert render(s) == (
        "although the men see the dog, the woman sees the cat.",
        "obwohl die Männer den Hund sehen, sieht die Frau die Katze.",
    )


def test_coordination_keeps_main_clause_order():
    first, second = Clause(NP("man"), "see", NP("dog")), Clause(NP("woman"), "buy", NP("book", "a"))
    assert render(Sentence(first, conj="and", other=second))[1] == (
        "der Mann sieht den Hund und die Frau kauft ein Buch."
    )
    assert render(Sentence(first, conj="but", other=second))[1] == (
        "der Mann sieht den Hund, aber die Frau kauft ein Buch."
    )


def test_reported_speech_and_know_disambiguation():
    s = Sentence(
        Clause(NP("teacher"), "know"),
        conj="that",
        other=Clause(NP("child"), "know", NP("man", "a")),
    )
    assert render(s) == (
        "the teacher knows that the child knows a man.",
        "der Lehrer weiß, dass das Kind einen Mann kennt.",
    )


def test_indefinite_plural_is_rejected():
    with pytest.raises(ValueError):
        NP("dog", "a", plural=True)


def test_generation_is_deterministic_and_seeded():
    a = tc.generate_corpus(seed=7, train=200, valid=20, test=20)
    assert a == tc.generate_corpus(seed=7, train=200, valid=20, test=20)
    assert a != tc.generate_corpus(seed=8, train=200, valid=20, test=20)
    # test/valid are drawn first, so they do not depend on the train size
    b = tc.generate_corpus(seed=7, train=50, valid=20, test=20)
    assert a["test"] == b["test"] and a["valid"] == b["valid"]


def test_shipped_data_matches_regeneration_with_defaults(tmp_path):
    tc.main(["--out", str(tmp_path)])
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), name


def test_shipped_data_is_well_formed():
    lines = {name: (DATA / name).read_text(encoding="utf-8").split("\n") for name in FILES}
    for name, ls in lines.items():
        assert ls[-1] == "" and "" not in ls[:-1], f"{name}: empty line or missing final newline"
    sources = {}
    for split, n in (("train", 12000), ("valid", 500), ("test", 500)):
        en, de = lines[f"{split}.en"][:-1], lines[f"{split}.de"][:-1]
        assert len(en) == len(de) == n
        for e, d in zip(en, de):
            assert e.endswith(".") and d.endswith(".") and "  " not in e + d
            assert tc.MIN_WORDS <= tc.n_words(e) <= tc.MAX_WORDS
            assert e == e.lower()
        sources[split] = set(en)
    assert not sources["test"] & sources["train"]
    assert not sources["valid"] & sources["train"]
    assert not sources["test"] & sources["valid"]
    assert sum((DATA / name).stat().st_size for name in FILES) < 2_000_000
