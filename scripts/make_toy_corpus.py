#!/usr/bin/env python3
"""Generate a small, seeded, synthetic English->German parallel corpus from a grammar.

Why a grammar: if the target were a word-for-word substitution of the source, BLEU would
only measure dictionary look-up. Here the German side differs from the English side in
systematic ways that a model has to learn from the data:

* gender and article agreement: the -> der/die/das, a -> ein/eine/ein
* case: subjects are nominative, objects accusative (der -> den, ein -> einen for
  masculine nouns), objects of prepositions dative (mit dem Hund, mit einer Katze, im Haus)
* adjective inflection: weak after the definite article (der große Hund, den großen Hund,
  die kleine Katze), mixed after "ein" (ein großer Hund, einen großen Hund, ein rotes Haus),
  strong after a numeral (zwei große Hunde, mit zwei großen Hunden)
* number: plural nouns (die Hunde, drei Katzen, dative plural -n: mit den Hunden) and
  subject-verb agreement (sieht / sehen)
* word order: verb-second after a fronted adverb (heute sieht der Mann den Hund),
  verb-final in subordinate clauses (..., weil der Mann den Hund sieht), verb-first main
  clause after a fronted subordinate clause (weil ... sieht, sieht die Frau ...);
  "and"/"und" and "but"/"aber" keep main-clause order
* lexical choice by context: "knows" + noun -> "kennt", "knows that" -> "weiß , dass"
* punctuation: German has a comma before subordinate clauses and "aber", English does not

Grammar (S sentence, C clause, [..] optional):
    S  -> [ADV] C .  |  C COORD C .  |  [ADV] C SUBORD C .  |  SUBORD C , C .
        |  [ADV] NP_human SAY that C .
    C  -> NP_animate VERB NP [PP]
    NP -> the [ADJ] N  |  a [ADJ] N  |  the [ADJ] N_plural  |  two/three [ADJ] N_plural
    PP -> PREP NP                      (German: dative, "in dem" contracts to "im")

Sentences are small data structures (NP, PP, Clause, Sentence); `render` turns one into
both languages, so each German sentence is built by rule. Output is tokenised: tokens
separated by single spaces, "," and the final "." are tokens of their own, everything is
lowercase except German nouns.

Usage (these are the defaults, so running without arguments reproduces data/toy):
    python scripts/make_toy_corpus.py --out data/toy --seed 1 --train 12000 --valid 500 --test 500
The test split is drawn first, then valid, then train (so test/valid do not change when
--train changes), and every English sentence is unique across the whole corpus.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

# english singular: (english plural, german singular, german plural, gender, kind)
NOUNS = {
    "man": ("men", "Mann", "Männer", "m", "human"),
    "teacher": ("teachers", "Lehrer", "Lehrer", "m", "human"),
    "friend": ("friends", "Freund", "Freunde", "m", "human"),
    "dog": ("dogs", "Hund", "Hunde", "m", "animal"),
    "bird": ("birds", "Vogel", "Vögel", "m", "animal"),
    "apple": ("apples", "Apfel", "Äpfel", "m", "thing"),
    "tree": ("trees", "Baum", "Bäume", "m", "thing"),
    "ball": ("balls", "Ball", "Bälle", "m", "thing"),
    "table": ("tables", "Tisch", "Tische", "m", "thing"),
    "key": ("keys", "Schlüssel", "Schlüssel", "m", "thing"),
    "woman": ("women", "Frau", "Frauen", "f", "human"),
    "mother": ("mothers", "Mutter", "Mütter", "f", "human"),
    "cat": ("cats", "Katze", "Katzen", "f", "animal"),
    "mouse": ("mice", "Maus", "Mäuse", "f", "animal"),
    "door": ("doors", "Tür", "Türen", "f", "thing"),
    "lamp": ("lamps", "Lampe", "Lampen", "f", "thing"),
    "flower": ("flowers", "Blume", "Blumen", "f", "thing"),
    "city": ("cities", "Stadt", "Städte", "f", "thing"),
    "bottle": ("bottles", "Flasche", "Flaschen", "f", "thing"),
    "child": ("children", "Kind", "Kinder", "n", "human"),
    "girl": ("girls", "Mädchen", "Mädchen", "n", "human"),
    "horse": ("horses", "Pferd", "Pferde", "n", "animal"),
    "house": ("houses", "Haus", "Häuser", "n", "thing"),
    "book": ("books", "Buch", "Bücher", "n", "thing"),
    "car": ("cars", "Auto", "Autos", "n", "thing"),
    "window": ("windows", "Fenster", "Fenster", "n", "thing"),
    "picture": ("pictures", "Bild", "Bilder", "n", "thing"),
    "egg": ("eggs", "Ei", "Eier", "n", "thing"),
}
ADJECTIVES = {  # english: german stem (all take regular endings)
    "big": "groß",
    "small": "klein",
    "old": "alt",
    "young": "jung",
    "new": "neu",
    "red": "rot",
    "blue": "blau",
    "green": "grün",
    "fast": "schnell",
    "beautiful": "schön",
    "clever": "klug",
    "hungry": "hungrig",
}
# english base: (english 3sg, german 3sg, german 3pl); all take an accusative object
VERBS = {
    "see": ("sees", "sieht", "sehen"),
    "find": ("finds", "findet", "finden"),
    "like": ("likes", "mag", "mögen"),
    "buy": ("buys", "kauft", "kaufen"),
    "carry": ("carries", "trägt", "tragen"),
    "hear": ("hears", "hört", "hören"),
    "wash": ("washes", "wäscht", "waschen"),
    "paint": ("paints", "malt", "malen"),
    "visit": ("visits", "besucht", "besuchen"),
    "catch": ("catches", "fängt", "fangen"),
    "hold": ("holds", "hält", "halten"),
    "need": ("needs", "braucht", "brauchen"),
    "love": ("loves", "liebt", "lieben"),
    "know": ("knows", "kennt", "kennen"),
    "look for": ("looks for", "sucht", "suchen"),
}
REPORT_VERBS = {  # take a "that"/"dass" clause instead of an object
    "say": ("says", "sagt", "sagen"),
    "think": ("thinks", "denkt", "denken"),
    "know": ("knows", "weiß", "wissen"),
    "believe": ("believes", "glaubt", "glauben"),
}
ADVERBS = {
    "today": "heute",
    "now": "jetzt",
    "often": "oft",
    "sometimes": "manchmal",
    "tomorrow": "morgen",
    "every day": "jeden Tag",
}
PREPS = {"with": "mit", "in": "in", "behind": "hinter", "under": "unter", "next to": "neben"}
NUMERALS = {"two": "zwei", "three": "drei"}
COORD = {"and": "und", "but": "aber"}
SUBORD = {"because": "weil", "while": "während", "although": "obwohl", "if": "wenn", "that": "dass"}

DEF_ARTICLE = {
    "nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
    "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
    "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"},
}
INDEF_ARTICLE = {
    "nom": {"m": "ein", "f": "eine", "n": "ein"},
    "acc": {"m": "einen", "f": "eine", "n": "ein"},
    "dat": {"m": "einem", "f": "einer", "n": "einem"},
}
WEAK_ENDINGS = {  # after der/die/das
    "nom": {"m": "e", "f": "e", "n": "e", "pl": "en"},
    "acc": {"m": "en", "f": "e", "n": "e", "pl": "en"},
    "dat": {"m": "en", "f": "en", "n": "en", "pl": "en"},
}
MIXED_ENDINGS = {  # after ein/eine/ein
    "nom": {"m": "er", "f": "e", "n": "es"},
    "acc": {"m": "en", "f": "e", "n": "es"},
    "dat": {"m": "en", "f": "en", "n": "en"},
}
STRONG_PLURAL_ENDINGS = {"nom": "e", "acc": "e", "dat": "en"}  # after zwei/drei

HUMAN = [n for n, v in NOUNS.items() if v[4] == "human"]
ANIMATE = [n for n, v in NOUNS.items() if v[4] in ("human", "animal")]
MIN_WORDS, MAX_WORDS = 4, 25


@dataclass(frozen=True)
class NP:
    noun: str
    det: str = "the"  # "the", "a", "two", "three"
    adj: str | None = None
    plural: bool = False  # only meaningful with "the"; numerals are always plural

    def __post_init__(self):
        if self.det == "a" and self.plural:
            raise ValueError("indefinite article with a plural noun")

    @property
    def is_plural(self) -> bool:
        return self.plural or self.det in NUMERALS

    @property
    def gender(self) -> str:
        return "pl" if self.is_plural else NOUNS[self.noun][3]

    def en(self) -> list[str]:
        words = ([self.adj] if self.adj else []) + [
            NOUNS[self.noun][0] if self.is_plural else self.noun
        ]
        det = self.det
        if det == "a" and words[0][0] in "aeiou":
            det = "an"
        return [det, *words]

    def de(self, case: str) -> list[str]:
        _, sg, pl, _, _ = NOUNS[self.noun]
        g = self.gender
        if self.det == "the":
            article, ending = DEF_ARTICLE[case][g], WEAK_ENDINGS[case][g]
        elif self.det == "a":
            article, ending = INDEF_ARTICLE[case][g], MIXED_ENDINGS[case][g]
        else:
            article, ending = NUMERALS[self.det], STRONG_PLURAL_ENDINGS[case]
        noun = pl if self.is_plural else sg
        if self.is_plural and case == "dat" and not noun.endswith(("n", "s")):
            noun += "n"  # dative plural: den Hunden, den Kindern (but den Autos, den Katzen)
        return [article] + ([ADJECTIVES[self.adj] + ending] if self.adj else []) + [noun]


@dataclass(frozen=True)
class PP:
    prep: str
    np: NP

    def en(self) -> list[str]:
        return [self.prep, *self.np.en()]

    def de(self) -> list[str]:
        words = self.np.de("dat")
        if self.prep == "in" and words[0] == "dem":
            return ["im", *words[1:]]  # in dem Haus -> im Haus
        return [PREPS[self.prep], *words]


@dataclass(frozen=True)
class Clause:
    subj: NP
    verb: str
    obj: NP | None = None  # None: reporting verb ("says"), followed by a "that" clause
    pp: PP | None = None

    def _forms(self) -> tuple[str, str]:
        en3, de3, de_pl = (VERBS if self.obj else REPORT_VERBS)[self.verb]
        return (self.verb, de_pl) if self.subj.is_plural else (en3, de3)

    def en(self) -> list[str]:
        rest = (self.obj.en() if self.obj else []) + (self.pp.en() if self.pp else [])
        return self.subj.en() + [self._forms()[0]] + rest

    def de(self, order: str = "main") -> list[str]:
        """order: "main" (S V O), "inverted" (V S O, after a fronted element), "final" (S O V)."""
        subj, verb = self.subj.de("nom"), [self._forms()[1]]
        rest = (self.obj.de("acc") if self.obj else []) + (self.pp.de() if self.pp else [])
        return {
            "main": subj + verb + rest,
            "inverted": verb + subj + rest,
            "final": subj + rest + verb,
        }[order]


@dataclass(frozen=True)
class Sentence:
    main: Clause
    adverb: str | None = None  # fronted adverbial, e.g. "today"
    conj: str | None = None  # a key of COORD or SUBORD
    other: Clause | None = None  # second clause joined by conj
    fronted: bool = False  # subordinate clause before the main clause


def detokenize(tokens: list[str]) -> str:
    """Join words with spaces, attaching commas and the final period to the word before,
    as in ordinary (detokenized) text, which is what sacreBLEU expects."""
    return " ".join(tokens).replace(" ,", ",").replace(" .", ".")


def render(s: Sentence) -> tuple[str, str]:
    """Render a sentence structure as an (english, german) pair of detokenized sentences."""
    if s.fronted:  # because C1 , C2 .  ->  weil C1(verb-final) , C2(verb-first) .
        assert s.conj in SUBORD and s.conj != "that" and s.other and not s.adverb
        en = [s.conj, *s.other.en(), ",", *s.main.en()]
        de = [SUBORD[s.conj], *s.other.de("final"), ",", *s.main.de("inverted")]
        return detokenize(en + ["."]), detokenize(de + ["."])
    en = ([s.adverb] if s.adverb else []) + s.main.en()
    de = ([ADVERBS[s.adverb]] if s.adverb else []) + s.main.de("inverted" if s.adverb else "main")
    if s.conj in COORD:
        en += [s.conj, *s.other.en()]
        de += ([","] if s.conj == "but" else []) + [COORD[s.conj], *s.other.de("main")]
    elif s.conj in SUBORD:
        en += [s.conj, *s.other.en()]
        de += [",", SUBORD[s.conj], *s.other.de("final")]
    return detokenize(en + ["."]), detokenize(de + ["."])


def random_np(rng: random.Random, nouns: list[str], avoid: str | None = None) -> NP:
    noun = rng.choice([n for n in nouns if n != avoid])
    adj = rng.choice(list(ADJECTIVES)) if rng.random() < 0.3 else None
    r = rng.random()
    if r < 0.45:
        return NP(noun, "the", adj)
    if r < 0.75:
        return NP(noun, "a", adj)
    if r < 0.9:
        return NP(noun, "the", adj, plural=True)
    return NP(noun, rng.choice(list(NUMERALS)), adj)


def random_clause(rng: random.Random, pp_prob: float = 0.25) -> Clause:
    subj = random_np(rng, ANIMATE)
    obj = random_np(rng, list(NOUNS), avoid=subj.noun)
    pp = (
        PP(rng.choice(list(PREPS)), random_np(rng, list(NOUNS))) if rng.random() < pp_prob else None
    )
    return Clause(subj, rng.choice(list(VERBS)), obj, pp)


def random_sentence(rng: random.Random) -> Sentence:
    r = rng.random()
    if r < 0.25:  # simple
        return Sentence(random_clause(rng, 0.4))
    if r < 0.45:  # fronted adverbial, verb-second
        return Sentence(random_clause(rng, 0.4), adverb=rng.choice(list(ADVERBS)))
    if r < 0.60:  # coordination keeps main-clause order
        return Sentence(random_clause(rng), conj=rng.choice(list(COORD)), other=random_clause(rng))
    sub_conjs = [c for c in SUBORD if c != "that"]
    if r < 0.78:  # main clause + subordinate clause (verb-final)
        adverb = rng.choice(list(ADVERBS)) if rng.random() < 0.3 else None
        return Sentence(random_clause(rng), adverb, rng.choice(sub_conjs), random_clause(rng))
    if r < 0.88:  # fronted subordinate clause, then verb-first main clause
        return Sentence(
            random_clause(rng), None, rng.choice(sub_conjs), random_clause(rng), fronted=True
        )
    adverb = rng.choice(list(ADVERBS)) if rng.random() < 0.25 else None  # reported speech
    main = Clause(random_np(rng, HUMAN), rng.choice(list(REPORT_VERBS)))
    return Sentence(main, adverb, "that", random_clause(rng))


def n_words(sentence: str) -> int:
    return sum(tok not in (",", ".") for tok in sentence.split())


def generate_corpus(
    seed: int = 1, train: int = 12000, valid: int = 500, test: int = 500
) -> dict[str, list[tuple[str, str]]]:
    """Return {split: [(en, de), ...]}; English sentences are unique across all splits."""
    rng = random.Random(seed)
    seen: set[str] = set()
    corpus: dict[str, list[tuple[str, str]]] = {}
    for split, size in (("test", test), ("valid", valid), ("train", train)):
        pairs: list[tuple[str, str]] = []
        attempts = 0
        while len(pairs) < size:
            attempts += 1
            if attempts > 100 * size + 1000:
                raise RuntimeError(f"could not draw {size} unique sentences for {split}")
            en, de = render(random_sentence(rng))
            if en in seen or not MIN_WORDS <= n_words(en) <= MAX_WORDS:
                continue
            seen.add(en)
            pairs.append((en, de))
        corpus[split] = pairs
    return {split: corpus[split] for split in ("train", "valid", "test")}


def write_corpus(corpus: dict[str, list[tuple[str, str]]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for split, pairs in corpus.items():
        for i, lang in enumerate(("en", "de")):
            text = "".join(pair[i] + "\n" for pair in pairs)
            (out / f"{split}.{lang}").write_text(text, encoding="utf-8", newline="\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/toy"), help="output directory")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--train", type=int, default=12000, help="training pairs")
    parser.add_argument("--valid", type=int, default=500, help="validation pairs")
    parser.add_argument("--test", type=int, default=500, help="test pairs")
    args = parser.parse_args(argv)
    corpus = generate_corpus(args.seed, args.train, args.valid, args.test)
    write_corpus(corpus, args.out)
    for split, pairs in corpus.items():
        print(f"{split}: {len(pairs)} pairs -> {args.out}/{split}.{{en,de}}")


if __name__ == "__main__":
    main()
