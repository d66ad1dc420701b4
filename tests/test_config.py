import typing
from dataclasses import fields

import pytest

from nmt.config import _SECTIONS, RANGES, ConfigError, config_from_dict, config_to_dict, load_config


def test_defaults_follow_the_paper():
    cfg = config_from_dict({})
    assert (cfg.model.d_model, cfg.model.d_ff, cfg.model.n_heads, cfg.model.n_encoder_layers) == (512, 2048, 8, 6)
    assert (cfg.model.norm_position, cfg.model.activation, cfg.model.dropout) == ("post", "relu", 0.1)
    assert (cfg.train.adam_betas, cfg.train.adam_eps, cfg.train.label_smoothing, cfg.train.schedule) == ((0.9, 0.98), 1e-9, 0.1, "noam")


def test_preset_then_explicit_keys():
    cfg = config_from_dict({"model": {"preset": "big", "dropout": 0.2}})
    assert (cfg.model.d_model, cfg.model.n_heads, cfg.model.dropout) == (1024, 16, 0.2)


def test_unknown_keys_are_errors():
    with pytest.raises(ConfigError, match=r"unknown key\(s\) in \[train\]: max_step"):
        config_from_dict({"train": {"max_step": 10}})
    with pytest.raises(ConfigError, match="unknown section"):
        config_from_dict({"trian": {}})
    with pytest.raises(ConfigError, match="unknown preset"):
        config_from_dict({"model": {"preset": "huge"}})


def test_typed_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  max_steps: 5\n")
    cfg = load_config(path, ["train.max_steps=70", "train.adam_betas=[0.9, 0.997]", "model.norm_position=pre", "data.dir=some/where", "tokenizer.joint=false"])
    assert cfg.train.max_steps == 70 and cfg.train.adam_betas == (0.9, 0.997)
    assert cfg.model.norm_position == "pre" and cfg.data.dir == "some/where" and cfg.tokenizer.joint is False
    with pytest.raises(ConfigError, match="train.max_steps: expected int"):
        load_config(path, ["train.max_steps=lots"])
    with pytest.raises(ConfigError, match="section.key=value"):
        load_config(path, ["max_steps=3"])


def test_inconsistent_values_rejected():
    with pytest.raises(ConfigError, match="divisible"):
        config_from_dict({"model": {"d_model": 100, "n_heads": 8}})
    with pytest.raises(ConfigError, match="activation"):
        config_from_dict({"model": {"activation": "swish"}})


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
        ({"decode": {"max_len_a": -5}}, "decode.max_len_a must be >= 0, got -5"),
        ({"decode": {"length_penalty": float("nan")}}, "decode.length_penalty must be a finite number, got nan"),
        ({"decode": {"length_normalization": "average"}}, "decode.length_normalization must be gnmt, length or none, got 'average'"),
        ({"data": {"train_src": "a.en"}}, "data.train_src and data.train_tgt go together"),
        ({"data": {"valid_tgt": "b.de"}}, "data.valid_src and data.valid_tgt go together"),
        ({"tokenizer": {"src_model": "s.model", "tgt_model": "t.model"}}, "need tokenizer.joint=false"),
        ({"tokenizer": {"joint": False, "src_model": "s.model"}}, "go together"),
        ({"tokenizer": {"joint": False, "model": "j.model"}}, "tokenizer.model is a joint model"),
        ({"data": {"workers": -1}}, "data.workers must be >= 0, got -1"),
        # the examples: each once accepted or a traceback after files were written
        ({"train": {"seed": -1}}, r"train.seed must be in \[0, 4294967295\], got -1"),
        ({"train": {"seed": 2**32}}, r"train.seed must be in \[0, 4294967295\], got 4294967296"),
        ({"tokenizer": {"input_sentence_size": -5}}, "tokenizer.input_sentence_size must be >= 1, got -5"),
        ({"train": {"lr_scale": -1}}, "train.lr_scale must be >= 0, got -1"),
        ({"train": {"lr": -5e-4}}, "train.lr must be >= 0, got -0.0005"),
        ({"train": {"adam_eps": 0}}, "train.adam_eps must be > 0, got 0"),
        ({"train": {"max_steps": -1}}, "train.max_steps must be >= 1, got -1"),
        ({"train": {"max_epochs": 0}}, "train.max_epochs must be >= 1, got 0"),
        ({"train": {"threads": -1}}, "train.threads must be >= 0, got -1"),
        ({"train": {"max_time_s": float("inf")}}, "train.max_time_s must be >= 0, got inf"),
        ({"train": {"adam_betas": [0.9, 1.0]}}, r"train.adam_betas\[1\] must be in \[0, 1\), got 1.0"),
        ({"data": {"max_len_ratio": 0.5}}, "data.max_len_ratio must be >= 1, got 0.5"),
        ({"data": {"valid_max_sentences": 0}}, "data.valid_max_sentences must be >= 1, got 0"),
        ({"tokenizer": {"character_coverage": 0}}, r"tokenizer.character_coverage must be auto or a number in \(0, 1\], got 0.0"),
        ({"tokenizer": {"vocab_size": 4}}, "tokenizer.vocab_size must be >= 5, got 4"),
        ({"decode": {"beam_size": 2, "n_best": 3}}, "decode.n_best must be <= decode.beam_size"),
        ({"tokenizer": {"joint": False}, "model": {"share_embeddings": True}}, "model.share_embeddings needs tokenizer.joint=true"),
    ],
)
def test_malformed_or_out_of_range_values_are_config_errors(raw, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)


def test_every_number_has_a_range_and_every_range_names_a_number():
    numeric = {f"{section}.{f.name}" for section, cls in _SECTIONS.items() for f in fields(cls) if {int, float} & set(typing.get_args(typing.get_type_hints(cls)[f.name])) | ({typing.get_type_hints(cls)[f.name]} & {int, float})}
    assert numeric == set(RANGES)


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
    for bad, message in (("train.max_steps=1.5", "train.max_steps: expected int, got 1.5"), ("train.lr=true", "train.lr: expected float, got 'true'"), ("train.lr=5e", "train.lr: expected float, got '5e'")):
        with pytest.raises(ConfigError, match=message):
            load_config(None, [bad])


def test_cache_dir_naming_a_file_is_a_config_error(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match="data.cache_dir .*f is a file; name a directory"):
        load_config(None, [f"data.cache_dir={tmp_path / 'f'}"])
    assert load_config(None, [f"data.cache_dir={tmp_path / 'new'}"]).data.cache_dir == str(tmp_path / "new")


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
    with pytest.raises(ConfigError, match="cannot parse"):
        load_config(None, ["train.adam_betas=[0.9"])
