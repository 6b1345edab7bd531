"""Training configuration: YAML -> typed, validated dataclasses.

Every key is declared here with its type and, where it matters, its allowed values; an
unknown key, a wrong type or an impossible value raises ConfigError with one line naming
the key. ``--set a.b=value`` overrides are parsed as YAML scalars and applied before
validation, so they are checked exactly like the file.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import yaml

CONFIG_ROOT = Path(__file__).resolve().parent.parent / "configs"


class ConfigError(ValueError):
    """Bad user input: the CLI prints it as one line and exits with status 2."""


@dataclass
class DraftArch:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    block_size: int
    mask_token_id: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6


@dataclass
class TargetArch:
    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    capture_layer_ids: list[int]
    model_type: str = "qwen3"
    tie_word_embeddings: bool = False
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1e6
    initializer_range: float = 0.02  # std of random weights (init: random)


def hf_arch_kwargs(arch: DraftArch | TargetArch, max_positions: int) -> dict[str, Any]:
    """Hugging Face config arguments shared by the draft's and the target's Qwen3 configs."""
    return {
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "intermediate_size": arch.intermediate_size,
        "num_hidden_layers": arch.num_hidden_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads,
        "head_dim": arch.head_dim,
        "rms_norm_eps": arch.rms_norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": arch.rope_theta},
        "max_position_embeddings": max_positions,
    }


@dataclass
class Profile:
    name: str
    draft: DraftArch
    target: TargetArch


@dataclass
class DataConfig:
    source: Literal["synthetic", "jsonl"] = "synthetic"
    path: str | None = None  # jsonl file (source: jsonl)
    tokenizer: str | None = None  # local tokenizer directory for text records
    seq_len: int = 2048
    seed: int = 0
    num_samples: int = 256  # synthetic dataset size; also the offline cache size
    cache_dir: str | None = None  # offline hidden-state cache (python -m specforge prepare)
    num_workers: int = 2


@dataclass
class ModelConfig:
    use_liger_kernel: bool = False
    liger_scope: Literal["draft", "all"] = "draft"
    attention_backend: Literal["flex_attention", "sdpa"] = "flex_attention"
    loss_chunk_size: int = 1024  # scored positions per LM-head chunk (padded to whole chunks)
    dtype: Literal["bfloat16", "float32"] = "bfloat16"


@dataclass
class TargetConfig:
    init: Literal["random", "pretrained"] = "random"
    path: str | None = None  # local Hugging Face directory (init: pretrained)


@dataclass
class TrainingConfig:
    steps: int = 60
    batch_size: int = 2
    accumulation_steps: int = 4
    num_anchors: int = 512
    lr: float = 6e-4
    lr_warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    loss_decay_gamma: float = 7.0
    seed: int = 42
    device: Literal["auto", "cuda", "cpu"] = "auto"
    peak_tflops: float | None = None  # per device, for MFU; None = from the device name
    log_every: int = 1


@dataclass
class TrainConfig:
    profile: str
    mode: Literal["offline", "online"] = "offline"
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    target: TargetConfig = field(default_factory=TargetConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ---------------------------------------------------------------- generic typed parsing


def _check_value(key: str, tp: Any, value: Any) -> Any:
    origin = get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        args = get_args(tp)
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _check_value(key, inner, value)
    if origin is Literal:
        choices = get_args(tp)
        if value not in choices:
            raise ConfigError(f"{key}: expected one of {', '.join(map(str, choices))}, got {value!r}")
        return value
    if origin is list:
        (inner,) = get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_check_value(f"{key}[{i}]", inner, v) for i, v in enumerate(value)]
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, key)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{key}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    raise TypeError(f"unsupported config type {tp} for {key}")


def _build(cls: type, raw: Any, prefix: str = "") -> Any:
    where = prefix or "config"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where}: expected a mapping, got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        name = f"{prefix}.{unknown[0]}" if prefix else unknown[0]
        raise ConfigError(f"{name}: unknown key (known keys in {where}: {', '.join(fields)})")
    kwargs = {}
    for name, f in fields.items():
        key = f"{prefix}.{name}" if prefix else name
        if name in raw:
            kwargs[name] = _check_value(key, hints[name], raw[name])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{key}: required key is missing")
    return cls(**kwargs)


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config ({e.strerror or e})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}: malformed YAML{at}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping of keys at the top level")
    return data


def apply_overrides(raw: dict, overrides: list[str]) -> dict:
    """Apply ``a.b=value`` strings (value parsed as YAML) to a raw config mapping."""
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"--set {item}: expected key=value")
        key, text = item.split("=", 1)
        parts = key.strip().split(".")
        if not all(parts):
            raise ConfigError(f"--set {item}: malformed key")
        try:
            value = yaml.safe_load(text) if text != "" else None
        except yaml.YAMLError:
            value = text
        if isinstance(value, str):  # YAML 1.1 reads 1e-3 as a string; the user meant a number
            try:
                value = float(value)
            except ValueError:
                pass
        node = raw
        for p in parts[:-1]:
            child = node.setdefault(p, {})
            if not isinstance(child, dict):
                raise ConfigError(f"--set {key}: {p} is not a section")
            node = child
        node[parts[-1]] = value
    return raw


# ---------------------------------------------------------------- profiles and validation


def profile_path(name: str) -> Path:
    p = Path(name)
    if p.suffix in (".yaml", ".yml") and p.exists():
        return p
    p = CONFIG_ROOT / "profiles" / f"{name}.yaml"
    if not p.exists():
        known = sorted(q.stem for q in (CONFIG_ROOT / "profiles").glob("*.yaml"))
        raise ConfigError(f"profile: unknown profile {name!r} (known: {', '.join(known)})")
    return p


def load_profile(name: str) -> Profile:
    path = profile_path(name)
    prof = _build(Profile, load_yaml(path), "")
    _validate_profile(prof, path)
    return prof


def _validate_profile(p: Profile, path: Path) -> None:
    d, t = p.draft, p.target
    for key, v in dataclasses.asdict(d).items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v <= 0:
            raise ConfigError(f"{path}: draft.{key} must be positive, got {v}")
    if d.num_attention_heads % d.num_key_value_heads:
        raise ConfigError(f"{path}: draft.num_attention_heads must be a multiple of num_key_value_heads")
    if not 0 <= d.mask_token_id < d.vocab_size:
        raise ConfigError(f"{path}: draft.mask_token_id must lie in [0, vocab_size)")
    if d.hidden_size != t.hidden_size:
        raise ConfigError(
            f"{path}: draft.hidden_size ({d.hidden_size}) must equal target.hidden_size "
            f"({t.hidden_size}): noise tokens use the target's embedding"
        )
    if d.vocab_size != t.vocab_size:
        raise ConfigError(f"{path}: draft.vocab_size must equal target.vocab_size")
    if not t.capture_layer_ids:
        raise ConfigError(f"{path}: target.capture_layer_ids must not be empty")
    bad = [i for i in t.capture_layer_ids if not 0 <= i < t.num_hidden_layers]
    if bad:
        raise ConfigError(f"{path}: target.capture_layer_ids {bad} outside [0, {t.num_hidden_layers})")


def validate(cfg: TrainConfig) -> None:
    tr, data, model = cfg.training, cfg.data, cfg.model
    positive = {
        "training.steps": tr.steps,
        "training.batch_size": tr.batch_size,
        "training.accumulation_steps": tr.accumulation_steps,
        "training.num_anchors": tr.num_anchors,
        "training.lr": tr.lr,
        "training.loss_decay_gamma": tr.loss_decay_gamma,
        "training.log_every": tr.log_every,
        "data.seq_len": data.seq_len,
        "data.num_samples": data.num_samples,
        "model.loss_chunk_size": model.loss_chunk_size,
    }
    for key, v in positive.items():
        if v <= 0:
            raise ConfigError(f"{key}: must be positive, got {v}")
    non_negative = {
        "training.lr_warmup_steps": tr.lr_warmup_steps,
        "training.weight_decay": tr.weight_decay,
        "training.max_grad_norm": tr.max_grad_norm,
        "data.num_workers": data.num_workers,
    }
    for key, v in non_negative.items():
        if v < 0:
            raise ConfigError(f"{key}: must be >= 0, got {v}")
    if not 0.0 <= tr.min_lr_ratio <= 1.0:
        raise ConfigError(f"training.min_lr_ratio: must lie in [0, 1], got {tr.min_lr_ratio}")
    if tr.peak_tflops is not None and tr.peak_tflops <= 0:
        raise ConfigError(f"training.peak_tflops: must be positive, got {tr.peak_tflops}")
    if data.seq_len < 4:
        raise ConfigError(f"data.seq_len: must be at least 4, got {data.seq_len}")
    if data.source == "jsonl" and not data.path:
        raise ConfigError("data.path: required when data.source is jsonl")
    if cfg.target.init == "pretrained" and not cfg.target.path:
        raise ConfigError("target.path: required when target.init is pretrained")
    if cfg.mode == "offline" and data.source == "jsonl" and not data.cache_dir:
        raise ConfigError("data.cache_dir: offline training on jsonl data needs a prepared cache")


def load_config(path: str | Path, overrides: list[str] | None = None) -> tuple[TrainConfig, Profile]:
    raw = apply_overrides(load_yaml(path), list(overrides or []))
    cfg = _build(TrainConfig, raw, "")
    validate(cfg)
    return cfg, load_profile(cfg.profile)
