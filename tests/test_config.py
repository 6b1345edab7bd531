"""Bad configs give one clear line and exit 2; overrides are typed and validated."""

import pytest

from specforge.config import ConfigError, apply_overrides, load_config
from tests.helpers import CONFIGS, run_cli

TINY = str(CONFIGS / "train/tiny-offline.yaml")


def test_overrides_are_typed():
    cfg, profile = load_config(
        TINY, ["training.lr=1e-3", "training.steps=5", "model.attention_backend=flex_attention"]
    )
    assert cfg.training.lr == pytest.approx(1e-3) and cfg.training.steps == 5
    assert cfg.model.attention_backend == "flex_attention"
    assert profile.draft.hidden_size == 64


def test_all_profiles_load():
    for name in ("tiny", "qwen3.5-4b-dflash", "qwen3-8b-dflash"):
        cfg, profile = load_config(TINY, [f"profile={name}"])
        assert profile.name == name
        assert len(profile.target.capture_layer_ids) == profile.draft.num_hidden_layers


@pytest.mark.parametrize(
    "override, needle",
    [
        ("training.bogus=1", "training.bogus: unknown key"),
        ("training.steps=abc", "training.steps: expected an integer"),
        ("training.steps=0", "training.steps: must be positive"),
        ("training.use=1", "training.use: unknown key"),
        ("model.attention_backend=flash", "model.attention_backend: expected one of flex_attention, sdpa"),
        ("mode=both", "mode: expected one of offline, online"),
        ("profile=nope", "profile: unknown profile 'nope'"),
        ("training.min_lr_ratio=2", "training.min_lr_ratio"),
        ("model.use_liger_kernel=maybe", "model.use_liger_kernel: expected true or false"),
    ],
)
def test_bad_values_name_the_key(override, needle):
    with pytest.raises(ConfigError, match=needle.replace("(", r"\(")):
        load_config(TINY, [override])


def test_override_syntax():
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["training.steps"])


@pytest.mark.parametrize(
    "text, needle",
    [
        ("profile: tiny\ntraining: {steps: [1,\n", "malformed YAML"),
        ("- a\n- b\n", "expected a mapping"),
        ("profile: tiny\nwhatever: 3\n", "whatever: unknown key"),
        ("mode: offline\n", "profile: required key is missing"),
    ],
)
def test_cli_bad_config_exit_2_one_line(tmp_path, text, needle):
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    out = tmp_path / "run"
    r = run_cli("specforge", "train", str(cfg), "--output-dir", str(out))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in r.stderr
    assert not out.exists()


def test_cli_missing_file_and_cpu_only_options(tmp_path):
    r = run_cli("specforge", "train", str(tmp_path / "none.yaml"))
    assert r.returncode == 2 and "cannot read config" in r.stderr
    out = tmp_path / "run"
    r = run_cli(
        "specforge",
        "train",
        TINY,
        "--use-liger-kernel",
        "--set",
        "training.device=cpu",
        "--output-dir",
        str(out),
    )
    assert r.returncode == 2 and "need a CUDA or ROCm GPU" in r.stderr and not out.exists()
    r = run_cli(
        "specforge",
        "train",
        TINY,
        "--set",
        "model.attention_backend=flex_attention",
        "--set",
        "training.device=cpu",
        "--output-dir",
        str(out),
    )
    assert r.returncode == 2 and "no backward on the CPU" in r.stderr and not out.exists()
    r = run_cli(
        "specforge", "train", TINY, "--set", "data.cache_dir=" + str(tmp_path), "--output-dir", str(out)
    )
    assert r.returncode == 2 and "not a complete cache" in r.stderr and not out.exists()
