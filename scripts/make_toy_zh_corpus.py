#!/usr/bin/env python3
r"""Generate a tiny, seeded, synthetic English->Chinese parallel corpus from a grammar.

It exists for tests of everything that depends on the target script: Chinese is written
without spaces, so BLEU needs sacreBLEU's ``zh`` tokenizer, and the tokenizer sees a
large character set. The grammar is small enough that a tiny model learns it in a few
hundred steps on a CPU, and the two languages differ in word order:

* English: subject, verb (agreeing: he drinks / they drink), object, [place], [time] .
* Chinese: subject, [time], [在 place], verb, object 。   (他今天在家喝茶。)
* "likes to" + verb phrase → 喜欢 + verb phrase; "does not" / "do not" → 不.

English is written with ordinary punctuation (a space before the final "." like data/toy);
Chinese with full-width "。" and no spaces.

Usage (the defaults reproduce data/toy_zh byte for byte):
    python scripts/make_toy_zh_corpus.py --out data/toy_zh --seed 1 --train 2000 --valid 100 \
        --test 100
The test split is drawn first, then valid, then train, and every English sentence is
unique across the whole corpus.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

# (English, Chinese, third person singular)
SUBJECTS = [
    ("I", "我", False),
    ("you", "你", False),
    ("he", "他", True),
    ("she", "她", True),
    ("we", "我们", False),
    ("they", "他们", False),
    ("the teacher", "老师", True),
    ("my friend", "我的朋友", True),
    ("the doctor", "医生", True),
    ("the children", "孩子们", False),
]
TIMES = [
    ("", ""),
    ("today", "今天"),
    ("tomorrow", "明天"),
    ("every day", "每天"),
    ("every morning", "每天早上"),
    ("on sunday", "星期天"),
]
PLACES = [
    ("", ""),
    ("at home", "家"),
    ("in the park", "公园"),
    ("at school", "学校"),
    ("in the library", "图书馆"),
]
# (English verb, its -s form, Chinese verb, [(English object, Chinese object)])
VERBS = [
    ("read", "reads", "看", [("books", "书"), ("the newspaper", "报纸")]),
    ("drink", "drinks", "喝", [("tea", "茶"), ("coffee", "咖啡"), ("water", "水")]),
    ("eat", "eats", "吃", [("rice", "米饭"), ("noodles", "面条"), ("apples", "苹果")]),
    ("watch", "watches", "看", [("films", "电影"), ("television", "电视")]),
    ("write", "writes", "写", [("letters", "信"), ("stories", "故事")]),
    ("study", "studies", "学习", [("chinese", "中文"), ("mathematics", "数学")]),
]


def sentence(rng: random.Random) -> tuple[str, str]:
    """One random (English, Chinese) pair."""
    en_subj, zh_subj, singular = rng.choice(SUBJECTS)
    en_time, zh_time = rng.choice(TIMES)
    en_place, zh_place = rng.choice(PLACES)
    verb, verb_s, zh_verb, objects = rng.choice(VERBS)
    en_obj, zh_obj = rng.choice(objects)
    mode = rng.choice(["plain", "plain", "likes", "not"])
    if mode == "likes":
        en_vp, zh_vp = (
            f"{'likes' if singular else 'like'} to {verb} {en_obj}",
            f"喜欢{zh_verb}{zh_obj}",
        )
    elif mode == "not":
        en_vp, zh_vp = f"{'does' if singular else 'do'} not {verb} {en_obj}", f"不{zh_verb}{zh_obj}"
    else:
        en_vp, zh_vp = f"{verb_s if singular else verb} {en_obj}", f"{zh_verb}{zh_obj}"
    en = " ".join(w for w in (en_subj, en_vp, en_place, en_time) if w) + " ."
    zh = zh_subj + zh_time + (f"在{zh_place}" if zh_place else "") + zh_vp + "。"
    return en[0].upper() + en[1:], zh


def make_corpus(seed: int, sizes: dict[str, int]) -> dict[str, list[tuple[str, str]]]:
    """Splits of unique English sentences, drawn in the order of ``sizes``."""
    rng = random.Random(seed)
    seen: set[str] = set()
    corpus = {}
    for split, n in sizes.items():
        pairs = []
        while len(pairs) < n:
            en, zh = sentence(rng)
            if en not in seen:
                seen.add(en)
                pairs.append((en, zh))
        corpus[split] = pairs
    return corpus


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parents[1] / "data" / "toy_zh"
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--valid", type=int, default=100)
    parser.add_argument("--test", type=int, default=100)
    args = parser.parse_args(argv)
    corpus = make_corpus(args.seed, {"test": args.test, "valid": args.valid, "train": args.train})
    args.out.mkdir(parents=True, exist_ok=True)
    for split, pairs in corpus.items():
        for i, lang in enumerate(("en", "zh")):
            (args.out / f"{split}.{lang}").write_text(
                "".join(pair[i] + "\n" for pair in pairs), encoding="utf-8", newline="\n"
            )


if __name__ == "__main__":
    main()
