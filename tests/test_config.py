import typing
from dataclasses import fields, replace

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from nmt.config import (
    SECTIONS,
    Config,
    ConfigError,
    DecodeConfig,
    config_from_dict,
    config_to_dict,
    config_to_yaml,
    load_config,
    validate,
)
from nmt.errors import Key
from nmt.fields import PathText, looks_like_test_data


def test_defaults_follow_the_paper():
    cfg = config_from_dict({})
    assert (cfg.model.d_model, cfg.model.d_ff, cfg.model.n_heads, cfg.model.n_encoder_layers) == (
        512,
        2048,
        8,
        6,
    )
    assert (cfg.model.norm_position, cfg.model.activation, cfg.model.dropout) == (
        "post",
        "relu",
        0.1,
    )
    assert (
        cfg.train.adam_betas,
        cfg.train.adam_eps,
        cfg.train.label_smoothing,
        cfg.train.schedule,
    ) == ((0.9, 0.98), 1e-9, 0.1, "noam")


def test_preset_then_explicit_keys():
    cfg = config_from_dict({"model": {"preset": "big", "dropout": 0.2}})
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.dropout) == (1024, 16, 0.2)


def test_unknown_keys_are_errors():
    with pytest.raises(
        ConfigError, match=r"^unknown key train.max_step; did you mean train.max_steps\?$"
    ):
        config_from_dict({"train": {"max_step": 10}})
    with pytest.raises(ConfigError, match=r"^unknown section trian; did you mean train\?$"):
        config_from_dict({"trian": {}})
    with pytest.raises(
        ConfigError, match="^model.preset must be base, big, small, tiny or null, got 'huge'$"
    ):
        config_from_dict({"model": {"preset": "huge"}})


def test_typed_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  max_steps: 5\n")
    cfg = load_config(
        path,
        [
            "train.max_steps=70",
            "train.adam_betas=[0.9, 0.997]",
            "model.norm_position=pre",
            "data.dir=some/where",
            "tokenizer.joint=false",
        ],
    )
    assert cfg.train.max_steps == 70 and cfg.train.adam_betas == (0.9, 0.997)
    assert (
        cfg.model.norm_position == "pre"
        and cfg.data.dir == "some/where"
        and cfg.tokenizer.joint is False
    )
    with pytest.raises(ConfigError, match="^train.max_steps must be an integer >= 1, got 'lots'$"):
        load_config(path, ["train.max_steps=lots"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(path, ["max_steps=3"])


def test_inconsistent_values_rejected():
    with pytest.raises(ConfigError, match="divisible"):
        config_from_dict({"model": {"d_model": 100, "n_heads": 8}})
    with pytest.raises(ConfigError, match="activation"):
        config_from_dict({"model": {"activation": "tanh"}})


def test_round_trip_through_dict():
    cfg = config_from_dict({"model": {"preset": "small"}, "train": {"adam_betas": [0.9, 0.99]}})
    assert config_from_dict(config_to_dict(cfg)) == cfg


def test_missing_config_file(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "none.yaml")


@pytest.mark.parametrize(
    "raw,message",
    [
        ({"model": 5}, r"section \[model\] must be a mapping"),
        ([1, 2], "expected a mapping of sections"),
        ({"model": {1: 2}}, "non-text key"),
        ({"model": {"n_heads": 0}}, "model.n_heads must be >= 1, got 0"),
        ({"model": {"dropout": 1.5}}, r"model.dropout must be in \[0, 1\), got 1.5"),
        ({"train": {"validate_every": 0}}, "train.validate_every must be >= 1, got 0"),
        ({"train": {"adam_betas": [2, 3]}}, r"adam_betas\[0\]"),
        ({"train": {"device": "foo"}}, "train.device must be"),
        ({"decode": {"max_len_a": -5}}, r"decode.max_len_a must be in \[0, 100\], got -5"),
        # once a 30 TB cache
        (
            {"decode": {"max_len_a": 1e12}},
            r"decode.max_len_a must be in \[0, 100\], got 1000000000000\.0",
        ),
        (
            {"decode": {"max_len_b": 1000000000}},
            r"decode.max_len_b must be in \[0, 10000\], got 1000000000",
        ),
        (
            {"decode": {"length_penalty": float("nan")}},
            r"decode.length_penalty must be in \[-10, 10\], got nan",
        ),
        (
            {"decode": {"length_normalization": "average"}},
            "decode.length_normalization must be gnmt, length or none, got 'average'",
        ),
        ({"data": {"train_src": "a.en"}}, "data.train_src and data.train_tgt go together"),
        ({"data": {"valid_tgt": "b.de"}}, "data.valid_src and data.valid_tgt go together"),
        (
            {"tokenizer": {"src_model": "s.model", "tgt_model": "t.model"}},
            "^tokenizer.src_model needs tokenizer.joint=false",
        ),
        ({"tokenizer": {"joint": False, "src_model": "s.model"}}, "go together"),
        ({"tokenizer": {"joint": False, "model": "j.model"}}, "tokenizer.model is a joint model"),
        ({"data": {"workers": -1}}, "data.workers must be >= 0, got -1"),
        # the examples: each once accepted or a traceback after files were written
        ({"train": {"seed": -1}}, r"train.seed must be in \[0, 4294967295\], got -1"),
        ({"train": {"seed": 2**32}}, r"train.seed must be in \[0, 4294967295\], got 4294967296"),
        (
            {"tokenizer": {"input_sentence_size": -5}},
            "tokenizer.input_sentence_size must be >= 1, got -5",
        ),
        ({"train": {"lr_scale": -1}}, "train.lr_scale must be >= 0, got -1"),
        ({"train": {"lr": -5e-4}}, "train.lr must be >= 0, got -0.0005"),
        ({"train": {"adam_eps": 0}}, "train.adam_eps must be > 0, got 0"),
        ({"train": {"max_steps": -1}}, "train.max_steps must be >= 1, got -1"),
        ({"train": {"max_epochs": 0}}, "train.max_epochs must be >= 1, got 0"),
        ({"train": {"threads": -1}}, r"train.threads must be in \[0, 1024\], got -1"),
        ({"train": {"max_time_s": -1}}, "train.max_time_s must be >= 0 or inf, got -1"),
        ({"train": {"max_time_s": float("nan")}}, "train.max_time_s must be >= 0 or inf, got nan"),
        (
            {"train": {"max_time_s": float("-inf")}},
            "train.max_time_s must be >= 0 or inf, got -inf",
        ),
        ({"train": {"warmup_steps": float("inf")}}, "train.warmup_steps must be"),
        ({"train": {"lr": float("inf")}}, "train.lr must be >= 0, got inf"),
        (
            {"train": {"adam_betas": [0.9, 1.0]}},
            r"train.adam_betas\[1\] must be in \[0, 1\), got 1.0",
        ),
        ({"data": {"max_len_ratio": 0.5}}, "data.max_len_ratio must be >= 1, got 0.5"),
        ({"data": {"valid_max_sentences": 0}}, "data.valid_max_sentences must be >= 1, got 0"),
        (
            {"tokenizer": {"character_coverage": 0}},
            r"tokenizer.character_coverage must be auto or a number in \(0, 1\], got 0.0",
        ),
        ({"tokenizer": {"vocab_size": 4}}, "tokenizer.vocab_size must be >= 5, got 4"),
        ({"decode": {"beam_size": 2, "n_best": 3}}, "decode.n_best must be <= decode.beam_size"),
        (
            # 5 × 0.5 rounds as CTranslate2 rounds it, half away from zero: 3
            {"decode": {"beam_size": 5, "n_best": 4, "patience": 0.5}},
            "decode.n_best 4 is above the 3 finished hypotheses after which decode.patience ends",
        ),
        ({"decode": {"patience": -1}}, r"decode.patience must be in \[0, 100\], got -1"),
        (
            {"tokenizer": {"joint": False}, "model": {"share_embeddings": True}},
            "model.share_embeddings needs tokenizer.joint=true",
        ),
    ],
)
def test_malformed_or_out_of_range_values_are_config_errors(raw, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)


def test_patience_zero_is_the_exact_rule_and_the_cap_rounds_as_ctranslate2_does():
    assert config_from_dict({"decode": {"patience": 0}}).decode.patience is None
    cap = lambda beam, p: DecodeConfig(beam_size=beam, patience=p).finished_cap()
    # in float32, halves away from zero (std::round): 2.5 -> 3; 0.9f * 5 is 4.5f -> 5
    assert [cap(5, 0.5), cap(5, 0.9), cap(4, 0.625), cap(2, 1.25), cap(5, 1.0)] == [3, 5, 3, 3, 5]
    assert cap(5, 0.01) == 1 and cap(5, None) is None


def test_every_field_has_help_and_every_number_a_range():
    for section, cls in SECTIONS.items():
        hints = typing.get_type_hints(cls)
        for f in fields(cls):
            members = set(typing.get_args(hints[f.name])) | {hints[f.name]}
            numeric = bool(members & {int, float}) or typing.get_origin(hints[f.name]) is tuple
            assert f.metadata["help"], f"{section}.{f.name} has no help"
            assert (f.metadata["range"] is not None) == numeric, f"{section}.{f.name}"


def test_range_errors_are_one_line_and_happen_before_any_file_is_written(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"train.run_dir={tmp_path / 'run'}", "train.seed=-1"])
    assert "\n" not in str(err.value) and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "text,key,value",
    [
        ("5e-4", "train.lr", 5e-4),  # YAML 1.1 reads this as a string
        ("1e-9", "train.adam_eps", 1e-9),  # the README's own default
        ("1E-9", "train.adam_eps", 1e-9),
        ("+2.5e+1", "train.clip_norm", 25.0),
        (".5", "train.clip_norm", 0.5),
        ("5.", "train.clip_norm", 5.0),
        ("3", "train.clip_norm", 3.0),
        ("1_000", "train.max_steps", 1000),
        ("2e4", "train.max_steps", 20000),  # an integral float is an int
        ("1.0E3", "train.max_steps", 1000),
        ("0x10", "train.log_every", 16),
        ("1_0.5", "train.max_time_s", 10.5),
        ("inf", "train.max_time_s", float("inf")),  # no limit, as 0 is
    ],
)
def test_numbers_in_python_or_json_notation(tmp_path, text, key, value):
    section, name = key.split(".")
    from_set = getattr(getattr(load_config(None, [f"{key}={text}"]), section), name)
    path = tmp_path / "c.yaml"
    path.write_text(f"{section}:\n  {name}: {text}\n")
    from_yaml = getattr(getattr(load_config(path), section), name)
    assert from_set == from_yaml == value and type(from_set) is type(value)


def test_numbers_inside_lists_and_bad_numbers():
    assert load_config(None, ["train.adam_betas=[9e-1, 9.8e-1]"]).train.adam_betas == (0.9, 0.98)
    for bad, message in (
        ("train.max_steps=1.5", "train.max_steps must be an integer >= 1, got '1.5'"),
        ("train.lr=true", "train.lr must be a number >= 0, got 'true'"),
        ("train.lr=5e", "train.lr must be a number >= 0, got '5e'"),
    ):
        with pytest.raises(ConfigError) as err:
            load_config(None, [bad])
        assert str(err.value) == message


def test_cache_dir_naming_a_file_is_a_config_error(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="data.cache_dir .*f is a file; name a directory"):
        load_config(None, [f"data.cache_dir={tmp_path / 'f'}"])
    assert load_config(None, [f"data.cache_dir={tmp_path / 'new'}"]).data.cache_dir == str(
        tmp_path / "new"
    )


def test_share_embeddings_defaults_to_joint():
    assert config_from_dict({}).model.share_embeddings is True
    assert config_from_dict({"tokenizer": {"joint": False}}).model.share_embeddings is False
    assert config_from_dict({"model": {"share_embeddings": False}}).model.share_embeddings is False


def test_yaml_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  max_steps: 3\n  lr: [1, 2\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:\d+: not valid YAML"):
        load_config(bad)
    latin = tmp_path / "latin.yaml"
    latin.write_bytes(b"# caf\xe9\ntrain: {}\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_config(latin)
    assert (
        str(load_error(None, ["train.adam_betas=[0.9"]))
        == "--set train.adam_betas=[0.9: not valid YAML (expected ',' or ']', but got '<stream "
        "end>')"
    )


def load_error(path, overrides=()) -> ConfigError:
    """The error load_config raises for ``path`` and ``overrides``."""
    with pytest.raises(ConfigError) as err:
        load_config(path, list(overrides))
    return err.value


def write(tmp_path, text: str, name: str = "c.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "key,text,value",
    [
        ("data.tgt_lang", "no", "no"),  # Norwegian, not YAML 1.1's false
        ("data.src_lang", "on", "on"),
        ("train.progress_bar", "off", False),
        ("train.progress_bar", "Yes", True),
        ("train.compile", "1", True),
        ("train.log_every", "010", 10),  # YAML 1.1 reads 8
        ("train.log_every", "0o10", 8),
        ("data.dir", "null", None),
        ("data.dir", "~", None),
        ("data.dir", "", None),
        ("data.dir", '"null"', "null"),  # quotes make it text
        ("data.train_split", "'010'", "010"),
        ("eval.tokenize", "none", "none"),  # sacreBLEU's tokenizer called none, not null
        ("tokenizer.character_coverage", "auto", "auto"),
        ("tokenizer.character_coverage", "1", 1.0),
        ("tokenizer.byte_fallback", "false", False),
        ("data.valid_max_sentences", "null", None),
        (
            "data.hf_data_files",
            "{train: a.json, validation: b.json}",
            {"train": "a.json", "validation": "b.json"},
        ),
    ],
)
def test_a_value_reads_the_same_in_a_file_and_with_set(tmp_path, key, text, value):
    section, name = key.split(".")
    from_yaml = getattr(
        getattr(load_config(write(tmp_path, f"{section}:\n  {name}: {text}\n")), section), name
    )
    from_set = getattr(getattr(load_config(None, [f"{key}={text}"]), section), name)
    assert from_yaml == from_set == value and type(from_yaml) is type(from_set) is type(value)


def test_duplicate_sections_and_keys_are_refused_with_both_lines(tmp_path):
    path = write(
        tmp_path, "train:\n  warmup_steps: 50\nmodel:\n  preset: tiny\ntrain:\n  max_steps: 10\n"
    )
    assert (
        str(load_error(path))
        == f"{path}:5: duplicate section train (first at line 1); write each once"
    )
    path = write(tmp_path, "train:\n  warmup_steps: 50\n  max_steps: 3\n  warmup_steps: 4000\n")
    err = load_error(path)
    assert (
        str(err) == f"{path}:4: duplicate key train.warmup_steps (first at line 2); write each once"
        and err.key == "train.warmup_steps"
    )
    with pytest.raises(
        ConfigError,
        match=r"^--set data.hf_data_files=\{train: a, train: b\}: duplicate key "
        r"data.hf_data_files.train; write each once$",
    ):
        load_config(None, ["data.hf_data_files={train: a, train: b}"])


def test_errors_name_the_key_and_the_file_and_line_it_is_on(tmp_path):
    path = write(tmp_path, "model:\n  preset: tiny\n\ntrain:\n  max_steps: lots\n")
    err = load_error(path)
    assert str(err) == f"{path}:5: train.max_steps must be an integer >= 1, got 'lots'" and (
        err.key,
        err.path,
        err.line,
    ) == ("train.max_steps", path, 5)
    # the override replaces the file's value, and its line
    assert str(load_error(path, ["train.max_steps=0"])) == "train.max_steps must be >= 1, got 0"
    path = write(tmp_path, "decode:\n  beam_size: 2\n  n_best: 3\n")
    assert (
        str(load_error(path)) == f"{path}:3: decode.n_best must be <= decode.beam_size (got 3 > 2)"
    )
    path = write(tmp_path, "data:\n  src_lang: en\n  tgt_lang:\n")
    assert str(load_error(path)) == f"{path}:3: data.tgt_lang must be text, got nothing"
    assert (
        str(load_error(None, ["train.run_dir=null"]))
        == "train.run_dir must be text, got null; write 'null' in quotes to mean the text"
    )


def test_misspelt_keys_sections_and_choices_get_a_suggestion(tmp_path):
    path = write(tmp_path, "train:\n  max_steps: 3\n  warmup_step: 10\n")
    assert (
        str(load_error(path))
        == f"{path}:3: unknown key train.warmup_step; did you mean train.warmup_steps?"
    )
    # the key of another section
    with pytest.raises(
        ConfigError, match=r"^unknown key train.beam_size; did you mean decode.beam_size\?$"
    ):
        load_config(None, ["train.beam_size=4"])
    with pytest.raises(
        ConfigError,
        match=r"^unknown key train.zzz; the keys of \[train\] are adam_betas, adam_eps, clip_norm, "
        r".* warmup_steps, weight_decay$",
    ):
        load_config(None, ["train.zzz=4"])
    with pytest.raises(ConfigError, match=r"^unknown section decoding; did you mean decode\?$"):
        load_config(None, ["decoding.beam_size=4"])
    with pytest.raises(
        ConfigError,
        match=r"^train.schedule must be noam, inverse_sqrt, constant or linear, got "
        r"'inverse-sqrt'; did you mean inverse_sqrt\?$",
    ):
        load_config(None, ["train.schedule=inverse-sqrt"])
    with pytest.raises(
        ConfigError,
        match=r"^eval.tokenize must be auto, none, zh, .*, got 'mecab'; did you mean ja-mecab or "
        r"ko-mecab\?$",
    ):
        load_config(None, ["eval.tokenize=mecab"])


def test_sections_check_their_own_fields_whenever_they_are_built():
    with pytest.raises(ConfigError) as err:
        replace(DecodeConfig(), beam_size=0)
    assert (
        str(err.value) == "decode.beam_size must be in [1, 1024], got 0"
        and err.value.key == "decode.beam_size"
    )
    assert (
        err.value.render({"decode.beam_size": "--beam-size"}.get)
        == "--beam-size must be in [1, 1024], got 0"
    )
    with pytest.raises(
        ConfigError,
        match="^decode.length_normalization must be gnmt, length or none, got 'average'$",
    ):
        DecodeConfig(length_normalization="average")
    # n_best <= beam_size relates fields: validate's rule
    assert replace(DecodeConfig(), beam_size=3, n_best=3).n_best == 3


def test_error_keys_are_data_so_naming_a_flag_never_rewrites_a_path():
    err = ConfigError(Key("train.run_dir"), " /data/train.run_dir/run_dir is a file")
    assert (
        err.render({"train.run_dir": "--run-dir"}.get)
        == "--run-dir /data/train.run_dir/run_dir is a file"
    )
    assert str(err) == "train.run_dir /data/train.run_dir/run_dir is a file"


def test_a_config_as_checkpoints_stored_it_still_loads():
    """Checkpoints hold config_to_dict's plain values; the keys and their types are unchanged."""
    stored = config_to_dict(config_from_dict({}))
    stored["model"].update(
        preset="tiny", d_model=64, d_ff=256, n_heads=4, n_encoder_layers=2, n_decoder_layers=2
    )
    stored["tokenizer"].update(character_coverage=0.9995, byte_fallback=True)
    stored["data"].update(hf_data_files={"train": "t.jsonl"}, valid_max_sentences=50)
    del stored["decode"]["min_len"]  # written before the key existed
    again = config_to_dict(config_from_dict(stored))
    types = lambda d: {
        (s, k): type(v) for s, values in d.items() for k, v in values.items() if k in stored[s]
    }
    assert types(stored) == types(again)
    assert (
        again["decode"]["min_len"] == 0
        and again["tokenizer"]["character_coverage"] == 0.9995
        and again["train"]["adam_betas"] == [0.9, 0.98]
    )


def _one_line_naming_its_key(err: ConfigError, where: str = "") -> None:
    message = str(err)
    assert "\n" not in message and message.startswith(where)
    if err.key is not None:
        # an unprintable key is shown quoted, escaped
        assert err.key in message or not err.key.isprintable()


KEYS = [f"{section}.{f.name}" for section, cls in SECTIONS.items() for f in fields(cls)]
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**40), 2**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=12),
    st.sampled_from(["auto", "no", "off", "null", "~", "010", "5e-4", "1_000"]),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=6,
)
SECTION_NAMES = st.sampled_from([*SECTIONS, "trian"])
KEY_NAMES = st.sampled_from(KEYS).map(lambda k: k.split(".")[1]) | st.text(max_size=8)
DOCUMENTS = st.dictionaries(
    SECTION_NAMES, st.none() | st.dictionaries(KEY_NAMES, VALUES, max_size=4), max_size=4
)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(DOCUMENTS)
# found by Hypothesis: a key holding a line break broke the one-line message
@example({"model": {"\n": None}})
def test_any_yaml_document_gives_a_config_or_one_line_naming_the_key(tmp_path, document):
    path = write(tmp_path, yaml.safe_dump(document, allow_unicode=True))
    try:
        load_config(path)
    except ConfigError as err:
        _one_line_naming_its_key(err)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.text(st.characters(blacklist_categories=("Cs",)), max_size=40))
@example("train:\n  lr: [1, 2\n")
@example("train: 5\n")
@example("- a\n- b\n")
@example("? [a]\n: b\n")
@example("train:\n  <<: {lr: 1}\n")
@example("\x1f")  # found by Hypothesis: PyYAML's message for a control character spans two lines
@example("\U00010737:")  # found by Hypothesis: an unprintable section name is shown escaped
def test_any_text_as_a_config_file_gives_a_config_or_one_line(tmp_path, text):
    path = write(tmp_path, text)
    try:
        load_config(path)
    except ConfigError as err:
        _one_line_naming_its_key(err)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(KEYS), st.text(st.characters(blacklist_categories=("Cs",)), max_size=20))
@example("train.adam_betas", "[0.9")
@example("data.hf_data_files", "{a: [1]}")
@example("train.max_steps", "1e400")
@example("decode.length_penalty", "nan")
@example("train.seed", "٣")
def test_any_set_value_gives_a_config_or_one_line_naming_the_key(key, text):
    try:
        load_config(None, [f"{key}={text}"])
    except ConfigError as err:
        _one_line_naming_its_key(err)
        assert (
            err.key is None or err.key.startswith(key) or key in str(err) or "--set" in str(err)
        ), str(err)


def _valid_value(f, tp):
    """A strategy for values of field ``f`` (type ``tp``) within its choices and range."""
    allowed = f.metadata["range"]
    low = None if allowed is None or allowed.low == float("-inf") else allowed.low
    high = None if allowed is None or allowed.high == float("inf") else allowed.high
    options = []
    for member in (
        typing.get_args(tp)
        if typing.get_origin(tp) in (typing.Union, __import__("types").UnionType)
        else (tp,)
    ):
        if typing.get_origin(member) is typing.Literal:
            options.append(st.sampled_from(typing.get_args(member)))
        elif member is bool:
            options.append(st.booleans())
        elif member is int:
            options.append(
                st.integers(
                    int(low) if low is not None else -(10**6),
                    int(high) if high is not None else 10**6,
                )
            )
        elif member is float:
            low, high = low if low is not None else -1e6, high if high is not None else 1e6
            options.append(
                st.floats(low, high, exclude_min=allowed.low_open, exclude_max=allowed.high_open)
            )
        elif member is str and f.metadata["pattern"]:
            options.append(st.from_regex(f.metadata["pattern"][0], fullmatch=True))
        elif member in (str, PathText):
            # PyYAML writes U+0085 so that it reads back as a space; text is never blank (a config
            # error)
            options.append(
                st.text(
                    st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=10
                ).filter(str.strip)
            )
        elif member is type(None):
            options.append(st.none())
        # data.directions: distinct pairs of two languages
        elif typing.get_origin(member) is tuple and typing.get_args(member)[-1] is Ellipsis:
            pairs = (
                st.tuples(*[st.from_regex(r"[a-z]{2}(_[A-Z]{2})?", fullmatch=True)] * 2)
                .filter(lambda p: p[0] != p[1])
                .map("-".join)
            )
            options.append(st.lists(pairs, min_size=1, max_size=3, unique=True).map(tuple))
        elif typing.get_origin(member) is tuple:
            options.append(st.tuples(*[st.floats(0, 1, exclude_max=True)] * 2))
        elif typing.get_origin(member) is dict:
            options.append(st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2))
    return st.one_of(options)


def _valid_sections(draw):
    """Sections of random valid values for random keys, made to obey validate's rules that relate
    keys."""
    raw = {
        name: {
            f.name: draw(_valid_value(f, typing.get_type_hints(cls)[f.name]))
            for f in fields(cls)
            if draw(st.booleans())
        }
        for name, cls in SECTIONS.items()
    }
    model, data, tokenizer, decode = raw["model"], raw["data"], raw["tokenizer"], raw["decode"]
    if {"d_model", "n_heads"} & set(model):
        model["n_heads"] = draw(st.integers(1, 16))
        model["d_model"] = model["n_heads"] * 2 * draw(st.integers(1, 64))
    if not tokenizer.get("joint", True):
        model.pop("share_embeddings", None)
        tokenizer.pop("model", None)
        tokenizer["src_model"] = tokenizer["tgt_model"] = tokenizer.get(
            "src_model"
        ) or tokenizer.get("tgt_model")
    else:
        tokenizer.pop("src_model", None), tokenizer.pop("tgt_model", None)
    for a, b in (("train_src", "train_tgt"), ("valid_src", "valid_tgt")):
        data[a] = data[b] = data.get(a) or data.get(b)
    # they replace src_lang and tgt_lang; several need one vocabulary and no one-direction files
    if data.get("directions"):
        data.pop("src_lang", None), data.pop("tgt_lang", None)
        if len(data["directions"]) > 1:
            for key in ("train_src", "train_tgt", "valid_src", "valid_tgt"):
                data.pop(key, None)
            tokenizer["joint"] = True
            tokenizer.pop("src_model", None), tokenizer.pop("tgt_model", None)
    if (
        data.get("src_lang", "en") == data.get("tgt_lang", "de")
        and not data.get("directions")
        and not (data.get("train_src") and data.get("valid_src"))
    ):
        # two languages, or each split's one file would be both sides
        data["tgt_lang"] = data.get("src_lang", "en") + "x"
    if not data.get("allow_test_names"):
        for key in ("valid_split", "valid_src", "valid_tgt"):
            if data.get(key) and looks_like_test_data(data[key]):
                data[key] = "dev"
    decode["n_best"] = min(decode.get("n_best", 1), decode.get("beam_size", 5))
    # nor above the finished hypotheses after which decode.patience ends a beam search
    search = DecodeConfig(**{k: decode[k] for k in ("beam_size", "patience") if k in decode})
    if search.beam_size > 1:
        decode["n_best"] = min(decode["n_best"], search.finished_cap() or decode["n_best"])
    # an output limit of max_len_b alone must leave room, above min_len
    if decode.get("max_len_a", 1.5) == 0:
        decode["max_len_b"] = max(decode.get("max_len_b", 10), 1)
        decode["min_len"] = min(decode.get("min_len", 0), decode["max_len_b"])
    if decode.get("alignment_layer") is not None:
        decode["alignment_layer"] = 1  # within any model's decoder
    return raw


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.composite(lambda draw: _valid_sections(draw))())
# a $ left in a path (written $$, or given to --run-dir) is the text $ (written $$ for the reader)
@example({"data": {"dir": "a$HOME$$", "hf_dataset": "x", "hf_data_files": {"t": "${X}"}}})
def test_a_config_written_as_yaml_reads_back_the_same(tmp_path, raw):
    """The run directory's config.yaml (config_to_yaml) must read back as cfg, and each value must
    read the same through --set. (Written with allow_unicode, a key of U+0085 read back as a
    space.)"""
    cfg = config_from_dict(raw)
    stored = config_to_dict(cfg)
    assert load_config(write(tmp_path, config_to_yaml(cfg))) == cfg
    assert config_from_dict(stored) == cfg


def test_config_yaml_keeps_yaml_line_breaks_in_keys_and_values(tmp_path):
    """Hypothesis found it: written with allow_unicode, a key of U+0085 (a YAML line break) read
    back as a space."""
    cfg = config_from_dict(
        {"data": {"hf_dataset": "x", "hf_data_files": {"\x85": "a\u2028b"}, "cache_dir": "c\x85d"}}
    )
    assert load_config(write(tmp_path, config_to_yaml(cfg))) == cfg


@settings(max_examples=60, deadline=None)
@given(a=st.sampled_from([0.0, 0.5, 1.5]), b=st.integers(0, 12), min_len=st.integers(0, 15))
def test_length_settings_that_can_only_give_empty_or_cut_output_are_refused(a, b, min_len):
    """max_len_b 0 (with max_len_a 0) gave empty translations, and min_len above the limit cut every
    one, without a word."""
    cfg = Config(decode=DecodeConfig(max_len_a=a, max_len_b=b, min_len=min_len))
    impossible = a == 0 and (b == 0 or min_len > b)
    if impossible:
        with pytest.raises(ConfigError, match="every translation would be (empty|cut there)"):
            validate(cfg)
    else:
        validate(cfg)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(
        [
            "val",
            "valid",
            "dev",
            "latest",
            "test",
            "Test",
            "test_2016_flickr",
            "newstest2014",
            "dev_test",
            "tst",
        ]
    ),
    where=st.sampled_from(["split", "files"]),
    allowed=st.booleans(),
)
def test_validating_on_a_test_set_is_refused_by_the_rule_tune_decode_uses(name, where, allowed):
    """The test split given as data.valid_split was accepted, while tune-decode refused test
    files."""
    from nmt.config import DataConfig
    from nmt.fields import looks_like_test_data

    data = (
        DataConfig(valid_split=name)
        if where == "split"
        else DataConfig(
            train_src="t.en", train_tgt="t.de", valid_src=f"{name}.en", valid_tgt=f"{name}.de"
        )
    )
    cfg = Config(data=replace(data, allow_test_names=allowed))
    if looks_like_test_data(name) and not allowed:
        with pytest.raises(
            ConfigError, match="names test data: choosing checkpoints on it overstates its score"
        ):
            validate(cfg)
    else:
        validate(cfg)


@settings(max_examples=40, deadline=None)
@given(
    src=st.sampled_from(["en", "de", "fr"]),
    tgt=st.sampled_from(["en", "de", "fr"]),
    files=st.booleans(),
)
def test_one_language_on_both_sides_of_a_split_directory_is_refused(src, tgt, files):
    """The same language on both sides read one file for both (a model that learns to copy)."""
    from nmt.config import DataConfig

    data = DataConfig(src_lang=src, tgt_lang=tgt)
    if files:
        data = replace(
            data, train_src="a.txt", train_tgt="b.txt", valid_src="c.txt", valid_tgt="d.txt"
        )
    if src == tgt and not files:
        with pytest.raises(
            ConfigError,
            match=f"are both {src}: each split's one file would be read as source and target",
        ):
            validate(Config(data=data))
    else:
        validate(Config(data=data))


def _path_keys() -> list[str]:
    """Every config key whose value names a file or directory (a PathText, or a mapping to them),
    read from the sections' types."""
    from nmt.fields import _members, hints

    found = []
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            members = _members(hints(cls)[f.name])
            if PathText in members or any(
                typing.get_origin(m) is dict and typing.get_args(m)[1] is PathText for m in members
            ):
                found.append(f"{section}.{f.name}")
    return found


def _home_of(user: str) -> str:
    import pwd

    return pwd.getpwnam(user).pw_dir


def _read_path(tmp_path, key: str, text: str, how: str):
    """The value of the path ``key`` written as ``text`` (in quotes where ``how`` says), in a config
    file (``how`` ends with yaml) or in ``--set``; keys that go together are given the same path.

    """
    written = f'"{text}"' if how.startswith("quoted") else text
    if key == "data.hf_data_files":  # in quotes where a flow mapping would read {} or , otherwise
        written = f"{{train: {repr(text) if set('{},') & set(written) else written}}}"
    values = {key: written}
    for pair in (
        ("data.train_src", "data.train_tgt"),
        ("data.valid_src", "data.valid_tgt"),
        ("tokenizer.src_model", "tokenizer.tgt_model"),
    ):
        if key in pair:  # keys that go together, given the same path
            values |= dict.fromkeys(pair, written) | (
                {"tokenizer.joint": "false", "model.share_embeddings": "false"}
                if "tokenizer" in key
                else {}
            )
    if how.endswith("yaml"):
        sections: dict[str, list[str]] = {}
        for k, v in values.items():
            sections.setdefault(k.split(".")[0], []).append(f"  {k.split('.')[1]}: {v}")
        text = "".join(f"{s}:\n" + "\n".join(lines) + "\n" for s, lines in sections.items())
        cfg = load_config(write(tmp_path, text))
    else:
        cfg = load_config(None, [f"{k}={v}" for k, v in values.items()])
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    key=st.sampled_from(_path_keys()),
    start=st.sampled_from(["~", "~USER", "~no_such_user_here", "./~", "a/~"]),
    rest=st.sampled_from(["", "/", "/runs/x", "/dir with spaces/é.de"]),
    how=st.sampled_from(["yaml", "quoted yaml", "set", "quoted set"]),
)
def test_a_leading_tilde_in_any_path_setting_is_the_home_directory_as_a_shell_reads_it(
    tmp_path, key, start, rest, how
):
    """`run_dir: ~/runs/x` made ./~/runs/x. A leading ~ or ~user is the home directory, in the file
    and in --set, quoted or not; ~ of no such user, and ~ that does not lead, stay as written (as in
    a shell)."""
    import getpass

    start = start.replace("USER", getpass.getuser())
    if start + rest == "~" and how in ("yaml", "set"):  # unquoted ~ alone is YAML's null
        rest = "/"
    text = start + rest
    home = {"~": "/home/of/a/user", f"~{getpass.getuser()}": _home_of(getpass.getuser())}.get(start)
    expected = home + rest if home is not None else text
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", "/home/of/a/user")
        value = _read_path(tmp_path, key, text, how)
    assert value == ({"train": expected} if key == "data.hf_data_files" else expected)
    assert len(_path_keys()) == 11 and "train.run_dir" in _path_keys()


# Pieces of a path as written and what each means: text, $$ (a $), a $ before what no name starts
# with, and variables: set (a value with $ and ~ in it, expanded once, as a shell does), unset,
# empty, or a form only a shell fills (None: refused).
_PIECES = {
    "runs": "runs",
    "a b": "a b",
    "é.de": "é.de",
    "/": "/",
    "$$": "$",
    "$.": "$.",
    "$/": "$/",
    "$NMT_TEST_DIR/": "/data/set one/",
    "${NMT_TEST_DIR}": "/data/set one",
    "${NMT_TEST_ODD}": "x$HOME~y",
    "$NMT_TEST_UNSET/": None,
    "${NMT_TEST_UNSET}": None,
    "${NMT_TEST_EMPTY}": None,
    "${NMT_TEST_DIR:-x}": None,
    "$1": None,
}


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    key=st.sampled_from(_path_keys()),
    start=st.sampled_from(["", "~", "~no_such_user_here", "./~", "$HOME", "${HOME}"]),
    pieces=st.lists(st.sampled_from(list(_PIECES)), min_size=1, max_size=5),
    how=st.sampled_from(["yaml", "quoted yaml", "set", "quoted set"]),
)
def test_environment_variables_in_any_path_setting_are_expanded_as_a_shell_expands_them(
    tmp_path, key, start, pieces, how
):
    """`run_dir: $HOME/runs/r2` and `--set 'train.run_dir=${HOME}/runs/r'` trained into
    ./$HOME/runs, exit 0. $NAME and ${NAME} are expanded, in the file and in --set, quoted or not,
    after a leading ~ and with it, their values as they are; an unset or empty variable, or a form
    only a shell can fill ($1, ${X:-y}), is one line naming the key (and the file and line it is
    on); $$ is a $."""
    text = (start + "/" if start else "") + "".join(pieces)
    meanings = [_PIECES[p] for p in pieces]
    home = {"~": "/home/of/a/user", "$HOME": "/home/of/a/user", "${HOME}": "/home/of/a/user"}
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", "/home/of/a/user")
        patch.setenv("NMT_TEST_DIR", "/data/set one")
        patch.setenv("NMT_TEST_ODD", "x$HOME~y")
        patch.setenv("NMT_TEST_EMPTY", "")
        patch.delenv("NMT_TEST_UNSET", raising=False)
        if None in meanings:
            with pytest.raises(ConfigError) as refused:
                _read_path(tmp_path, key, text, how)
        else:
            value = _read_path(tmp_path, key, text, how)
    if None not in meanings:
        expected = (home.get(start, start) + "/" if start else "") + "".join(meanings)
        assert value == ({"train": expected} if key == "data.hf_data_files" else expected)
        return
    # the first piece refused is named, with the key, the file and the key's line
    bad = next(p for p in pieces if _PIECES[p] is None)
    exc = refused.value
    assert exc.key.startswith(key) and "\n" not in str(exc) and repr(text) in str(exc)
    assert bad.strip("/") in str(exc) and (
        "not set" in str(exc) or "empty" in str(exc) or "not a variable nmt expands" in str(exc)
    )
    if how.endswith("yaml"):
        text_lines = exc.path.read_text().splitlines()
        assert text_lines[exc.line - 1].lstrip().startswith(exc.key.split(".")[1] + ":")
    else:
        assert exc.path is None and exc.line is None
