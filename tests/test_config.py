import pytest

from nmt.config import ConfigError, config_from_dict, config_to_dict, load_config


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
        ({"model": {"n_heads": 0}}, "model.n_heads must be positive"),
        ({"model": {"dropout": 1.5}}, r"model.dropout must be in \[0, 1\)"),
        ({"train": {"validate_every": 0}}, "train.validate_every must be positive"),
        ({"train": {"adam_betas": [2, 3]}}, r"adam_betas\[0\]"),
        ({"train": {"device": "foo"}}, "train.device must be"),
        ({"decode": {"max_len_a": -5}}, "decode.max_len_a must be >= 0"),
        ({"decode": {"length_penalty": float("nan")}}, "finite"),
        ({"decode": {"length_normalization": "average"}}, "decode.length_normalization must be gnmt, length or none, got 'average'"),
        ({"data": {"train_src": "a.en"}}, "data.train_src and data.train_tgt go together"),
        ({"data": {"valid_tgt": "b.de"}}, "data.valid_src and data.valid_tgt go together"),
        ({"tokenizer": {"src_model": "s.model", "tgt_model": "t.model"}}, "need tokenizer.joint=false"),
        ({"tokenizer": {"joint": False, "src_model": "s.model"}}, "go together"),
        ({"tokenizer": {"joint": False, "model": "j.model"}}, "tokenizer.model is a joint model"),
        ({"data": {"workers": -1}}, "data.workers must be >= 0"),
    ],
)
def test_malformed_or_out_of_range_values_are_config_errors(raw, message):
    with pytest.raises(ConfigError, match=message):
        config_from_dict(raw)


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
