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


@pytest.mark.parametrize(
    "override",
    [
        "training.lr=nan",
        "training.lr=.nan",
        "training.lr=inf",
        "training.lr=.inf",
        "training.lr=1e400",  # overflows to inf
        "training.lr=" + "9" * 400,  # an integer too large for a float
        "training.max_grad_norm=nan",
        "training.max_grad_norm=.inf",  # "no clipping" is 0, not inf
        "training.weight_decay=-.inf",
        "training.min_lr_ratio=nan",
        "training.loss_decay_gamma=inf",
        "training.peak_tflops=nan",
    ],
)
def test_non_finite_floats_are_refused(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=f"^{key}: expected a finite number"):
        load_config(TINY, [override])


@pytest.mark.parametrize(
    "override",
    ["training.steps=1e29", "training.steps=2.5", "training.steps=60.0", "training.batch_size=1.5e3"],
)
def test_float_for_an_int_key_is_a_type_error(override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=f"^{key}: expected an integer"):
        load_config(TINY, [override])


@pytest.mark.parametrize(
    "override, needle",
    [
        ("training.steps=" + "1" + "0" * 29, "training.steps: must be at most 10000000"),
        ("training.batch_size=100000", "training.batch_size: must be at most 65536"),
        ("training.accumulation_steps=1000000", "training.accumulation_steps: must be at most 65536"),
        ("training.num_anchors=2000000", "training.num_anchors: must be at most 1048576"),
        ("data.seq_len=2000000", "data.seq_len: must be at most 1048576"),
        ("data.num_samples=1000000000", "data.num_samples: must be at most 100000000"),
        ("data.num_workers=1000", "data.num_workers: must be at most 256"),
        ("model.loss_chunk_size=2000000", "model.loss_chunk_size: must be at most 1048576"),
        ("training.lr_warmup_steps=100000000", "training.lr_warmup_steps: must be at most"),
        ("training.lr=50", "training.lr: must be at most 10"),
        ("training.seed=-1", "training.seed: must be >= 0"),
        ("data.seed=4294967296", "data.seed: must be at most 4294967295"),
        ("training.lr=0", "training.lr: must be positive"),
    ],
)
def test_absurd_values_are_refused_with_the_bound(override, needle):
    with pytest.raises(ConfigError, match="^" + needle):
        load_config(TINY, [override])


def test_bounds_admit_real_runs():
    cfg, _ = load_config(
        TINY,
        [
            "training.steps=100000",
            "training.batch_size=64",
            "training.accumulation_steps=64",
            "data.seq_len=131072",
            "training.num_anchors=4096",
            "data.num_samples=1000000",
            "training.max_grad_norm=0",
            "training.seed=4294967295",
        ],
    )
    assert cfg.data.seq_len == 131072 and cfg.training.max_grad_norm == 0.0


def test_yaml_file_numbers_are_checked_like_overrides(tmp_path):
    base = "profile: tiny\nmode: online\n"
    for text, needle in (
        ("training: {lr: .nan}", "training.lr: expected a finite number"),
        ("training: {steps: 1e29}", "training.steps: expected an integer"),  # YAML 1.1: a string
        ("training: {steps: 1.0e+29}", "training.steps: expected an integer"),  # a float
        ("training: {steps: 100000000000000000000000000000}", "training.steps: must be at most"),
    ):
        path = tmp_path / "c.yaml"
        path.write_text(base + text + "\n")
        with pytest.raises(ConfigError, match=needle):
            load_config(path)


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("rope_theta", ".inf", "draft.rope_theta: expected a finite number"),
        ("rms_norm_eps", ".nan", "draft.rms_norm_eps: expected a finite number"),
        ("vocab_size", "100000000000", "draft.vocab_size must be at most 16777216"),
    ],
)
def test_profile_numbers_are_checked(tmp_path, key, value, needle):
    import yaml

    prof = yaml.safe_load((CONFIGS / "profiles/tiny.yaml").read_text())
    prof["draft"][key] = yaml.safe_load(value)
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(prof))
    with pytest.raises(ConfigError, match=needle):
        load_config(TINY, [f"profile={path}"])


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


def test_cli_missing_file_and_cpu_only_options(tmp_path, tiny_cache, capsys):
    from specforge.__main__ import main

    r = run_cli("specforge", "train", str(tmp_path / "none.yaml"))
    assert r.returncode == 2 and "cannot read config" in r.stderr
    out = tmp_path / "run"
    cache = ["--set", f"data.cache_dir={tiny_cache}", "--set", "training.device=cpu"]
    for extra, needle in (
        (["--use-liger-kernel"], "need a CUDA or ROCm GPU"),
        (["--set", "model.attention_backend=flex_attention"], "no backward on the CPU"),
        (["--set", "training.device=cuda"], "no CUDA or ROCm GPU is visible"),
    ):
        assert main(["train", TINY, *cache, *extra, "--output-dir", str(out)]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1 and not out.exists()
    assert main(["train", TINY, "--set", f"data.cache_dir={tmp_path}", "--output-dir", str(out)]) == 2
    assert "not a complete cache" in capsys.readouterr().err and not out.exists()


def test_liger_with_no_kernel_is_refused():

    cfg, _ = load_config(
        CONFIGS / "train/tiny-online.yaml", ["model.use_liger_kernel=true", "model.liger_swiglu=false"]
    )
    assert (cfg.model.liger_rms_norm, cfg.model.liger_swiglu) == (True, False)
    with pytest.raises(ConfigError, match="liger_rms_norm and liger_swiglu are both false"):
        load_config(
            CONFIGS / "train/tiny-online.yaml",
            ["model.use_liger_kernel=true", "model.liger_swiglu=false", "model.liger_rms_norm=false"],
        )
