"""Training configuration: YAML -> typed, validated dataclasses.

Every key is declared here with its type and, where it matters, its allowed values; an
unknown key, a wrong type or an impossible value raises ConfigError with one line naming
the key. ``--set a.b=value`` overrides are parsed as YAML scalars and applied before
validation, so they are checked exactly like the file. Every float must be finite (nan and
inf are refused in the type check, for every key); a float for an integer key is a type
error; sizes have upper bounds no real run reaches (MAX_* below, named in the error).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
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
    source: Literal["synthetic", "markov", "jsonl"] = "synthetic"  # markov: a low-entropy chain to learn
    path: str | None = None  # jsonl file (source: jsonl)
    tokenizer: str | None = None  # local tokenizer directory for text records
    seq_len: int = 2048
    seed: int = 0
    num_samples: int = 256  # synthetic dataset size; also the offline cache size
    markov_states: int = 1024  # source markov: the ids the chain visits (a seeded subset)
    markov_branching: int = 4  # source markov: successors per id, with probabilities 2^-k (normalised)
    cache_dir: str | None = None  # offline hidden-state cache (python -m specforge prepare)
    num_workers: int = 2


@dataclass
class ModelConfig:
    use_liger_kernel: bool = False
    liger_scope: Literal["draft", "all"] = "draft"
    liger_rms_norm: bool = True  # with use_liger_kernel: Liger's RMSNorm (false: the stock one)
    liger_swiglu: bool = True  # with use_liger_kernel: Liger's SwiGLU MLP (false: the stock one)
    attention_backend: Literal["flex_attention", "sdpa"] = "flex_attention"
    compile_layers: bool = False  # torch.compile each draft decoder layer (on a GPU)
    init_perturb_ulp: bool = False  # move every weight by one ulp after its seeded init (aa_eps)
    # Liger's fused linear cross-entropy for the LM head + decayed CE (on a GPU; objective.py)
    liger_fused_linear_ce: bool = False
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
    lr_scale: float = 1.0  # the learning rate used is lr x lr_scale (the lr_off negative control: 1.01)
    lr_warmup_steps: int = 10
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    loss_decay_gamma: float = 7.0
    seed: int = 42
    device: Literal["auto", "cuda", "cpu"] = "auto"
    fused_adamw: bool = True  # on a GPU, torch's fused AdamW kernel; false: foreach (the CPU: always foreach)
    foreach_adamw: bool = True  # where AdamW is not fused: foreach (multi-tensor); false: the plain loop
    peak_tflops: float | None = None  # per device, for MFU; None = from the device name
    log_every: int = 1
    # 1-based steps to run under torch.profiler (profile.json); [] = none. Not for timing.
    profile_steps: list[int] = field(default_factory=list)


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
    if tp is int:  # a float (2.5, 1e29, even 60.0) is a type error, not rounded
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return value
    if tp is float:  # every float in a config or profile: nan and inf never make sense
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:  # an integer too large for a float
            number = math.inf
        if not math.isfinite(number):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return number
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


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's floats (``6e-4`` is a number, not YAML 1.1's string)
    and duplicate keys refused (PyYAML keeps the last silently). The driver reads configs the
    same way (bench/config/yamlio.py; the trainer imports nothing of the driver)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# YAML 1.2's float (1e3, 3e-3, .5, .inf, .nan), tried after the int resolver as PyYAML orders them.
_FLOAT_RE = re.compile(
    r"^(?:[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?(?:[eE][-+]?[0-9]+)?|[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?"
    r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"
)
_FLOAT_TAG = "tag:yaml.org,2002:float"
_Loader.yaml_implicit_resolvers = {
    c: [r for r in rs if r[0] != _FLOAT_TAG] + ([(_FLOAT_TAG, _FLOAT_RE)] if c in "-+0123456789." else [])
    for c, rs in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


def load_yaml(path: str | Path) -> dict:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not a text file; expected a YAML config") from None
    try:
        data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None)
        what = problem if problem and problem.startswith("duplicate key") else "malformed YAML"
        raise ConfigError(f"{path}: {what}{at}") from None
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


# Upper bounds no real model or run reaches: past one, the value is a typo (an extra zero, a
# 1e29), and refusing it here beats an out-of-memory error or a run that never ends.
MAX_ARCH = 2**24  # any integer in a profile (vocab 152k-248k, hidden <= 16k, layers < 200)
MAX_STEPS = 10_000_000
MAX_BATCH = 65_536  # samples per device per micro-batch, and micro-batches per step
MAX_SEQ = 1_048_576  # tokens per sample (1M)
MAX_SAMPLES = 100_000_000
MAX_WORKERS = 256
MAX_SEED = 2**32 - 1
MAX_LR = 10.0
MAX_PROFILE_STEPS = 4  # a profile of a few steady steps is enough; each one is slow and its trace large


def _validate_profile(p: Profile, path: Path) -> None:
    d, t = p.draft, p.target
    for section, arch in (("draft", d), ("target", t)):
        for key, v in dataclasses.asdict(arch).items():
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                continue
            if v <= 0:
                raise ConfigError(f"{path}: {section}.{key} must be positive, got {v}")
            if isinstance(v, int) and v > MAX_ARCH:
                raise ConfigError(
                    f"{path}: {section}.{key} must be at most {MAX_ARCH} (no real model is larger), got {v}"
                )
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


def _fmt(x: float) -> str:
    return str(x) if isinstance(x, int) else f"{x:g}"


def _in_range(key: str, v: float, lo: float, hi: float | None, lo_open: bool) -> None:
    if v < lo or (lo_open and v == lo):
        if lo_open and lo == 0:
            raise ConfigError(f"{key}: must be positive, got {_fmt(v)}")
        raise ConfigError(f"{key}: must be >= {_fmt(lo)}, got {_fmt(v)}")
    if hi is not None and v > hi:
        raise ConfigError(f"{key}: must be at most {_fmt(hi)} (no real run needs more), got {_fmt(v)}")


def validate(cfg: TrainConfig) -> None:
    """Checks of the config on its own (floats are already finite: see _check_value)."""
    tr, data, model = cfg.training, cfg.data, cfg.model
    # key: (value, lowest, highest or None, lowest excluded)
    ranges: dict[str, tuple[float, float, float | None, bool]] = {
        "training.steps": (tr.steps, 0, MAX_STEPS, True),
        "training.batch_size": (tr.batch_size, 0, MAX_BATCH, True),
        "training.accumulation_steps": (tr.accumulation_steps, 0, MAX_BATCH, True),
        "training.num_anchors": (tr.num_anchors, 0, MAX_SEQ, True),
        "training.lr": (tr.lr, 0, MAX_LR, True),
        "training.lr_scale": (tr.lr_scale, 0, 10.0, True),
        "training.loss_decay_gamma": (tr.loss_decay_gamma, 0, None, True),
        "training.log_every": (tr.log_every, 0, MAX_STEPS, True),
        "training.lr_warmup_steps": (tr.lr_warmup_steps, 0, MAX_STEPS, False),
        "training.weight_decay": (tr.weight_decay, 0, None, False),
        "training.max_grad_norm": (tr.max_grad_norm, 0, None, False),
        "training.seed": (tr.seed, 0, MAX_SEED, False),
        "data.seq_len": (data.seq_len, 0, MAX_SEQ, True),
        "data.num_samples": (data.num_samples, 0, MAX_SAMPLES, True),
        "data.seed": (data.seed, 0, MAX_SEED, False),
        "data.num_workers": (data.num_workers, 0, MAX_WORKERS, False),
        "data.markov_states": (data.markov_states, 0, None, True),
        "data.markov_branching": (data.markov_branching, 0, data.markov_states, True),
        "model.loss_chunk_size": (model.loss_chunk_size, 0, MAX_SEQ, True),
    }
    for key, (v, lo, hi, lo_open) in ranges.items():
        _in_range(key, v, lo, hi, lo_open)
    if not 0.0 <= tr.min_lr_ratio <= 1.0:
        raise ConfigError(f"training.min_lr_ratio: must lie in [0, 1], got {tr.min_lr_ratio}")
    if model.use_liger_kernel and not (model.liger_rms_norm or model.liger_swiglu):
        raise ConfigError(
            "model.use_liger_kernel: liger_rms_norm and liger_swiglu are both false, so nothing would be "
            "patched; enable one, or leave use_liger_kernel false for the baseline"
        )
    _validate_profile_steps(tr)
    if tr.peak_tflops is not None and tr.peak_tflops <= 0:
        raise ConfigError(f"training.peak_tflops: must be positive, got {tr.peak_tflops}")
    if data.seq_len < 4:
        raise ConfigError(f"data.seq_len: must be at least 4, got {data.seq_len}")
    if data.source == "jsonl" and not data.path:
        raise ConfigError("data.path: required when data.source is jsonl")
    if cfg.target.init == "pretrained" and not cfg.target.path:
        raise ConfigError("target.path: required when target.init is pretrained")


def _validate_profile_steps(tr: TrainingConfig) -> None:
    steps = tr.profile_steps
    if len(steps) > MAX_PROFILE_STEPS:
        raise ConfigError(
            f"training.profile_steps: at most {MAX_PROFILE_STEPS} steps (two steady steps are enough), "
            f"got {len(steps)}"
        )
    if len(set(steps)) != len(steps):
        raise ConfigError(f"training.profile_steps: a step is listed twice in {steps}")
    for s in steps:
        if not 1 <= s <= tr.steps:
            raise ConfigError(
                f"training.profile_steps: step {s} is not a step of the run (1-based, 1 to training.steps "
                f"= {tr.steps})"
            )


def _need_path(key: str, value: str, kind: Literal["file", "dir"]) -> None:
    p = Path(value)
    if not p.exists():
        raise ConfigError(f"{key}: {value} does not exist")
    if not (p.is_file() if kind == "file" else p.is_dir()):
        raise ConfigError(f"{key}: {value} is not a {'file' if kind == 'file' else 'directory'}")
    if not os.access(p, os.R_OK | (os.X_OK if kind == "dir" else 0)):
        raise ConfigError(f"{key}: {value} is not readable")


def validate_for(
    cfg: TrainConfig, command: Literal["train", "prepare"], hidden_states: str = "target"
) -> None:
    """What ``train`` or ``prepare`` needs beyond the config itself, short of the offline cache
    (which a sweep prepares later) and the hardware: the inputs it reads must exist, and a
    synthetic dataset must hold one batch. Cheap, writes nothing, imports no torch: this is
    also what ``python -m specforge check`` runs."""
    data, tr = cfg.data, cfg.training
    reads_tokens = command == "prepare" or cfg.mode == "online"
    if command == "train":
        if cfg.mode == "offline" and not data.cache_dir:
            raise ConfigError(
                "data.cache_dir: offline training needs a prepared cache (python -m specforge prepare)"
            )
        if reads_tokens and data.source != "jsonl" and data.num_samples < tr.batch_size:
            raise ConfigError(
                f"training.batch_size: {tr.batch_size} is more than the {data.num_samples} samples of "
                "data.num_samples (one batch must fit)"
            )
    if reads_tokens and data.source == "jsonl":
        _need_path("data.path", data.path or "", "file")
        if data.tokenizer:
            _need_path("data.tokenizer", data.tokenizer, "dir")
    uses_target = cfg.mode == "online" if command == "train" else hidden_states == "target"
    if uses_target and cfg.target.init == "pretrained":
        _need_path("target.path", cfg.target.path or "", "dir")


def load_config(path: str | Path, overrides: list[str] | None = None) -> tuple[TrainConfig, Profile]:
    raw = apply_overrides(load_yaml(path), list(overrides or []))
    cfg = _build(TrainConfig, raw, "")
    validate(cfg)
    return cfg, load_profile(cfg.profile)


def resolved_values(cfg: TrainConfig, keys: list[str]) -> dict[str, dict[str, Any]]:
    """Each dotted key -> ``{"config": value}``: what the validated config holds for it (run.json's
    ``set_resolved``: whether the keys an arm set took effect)."""
    out: dict[str, dict[str, Any]] = {}
    whole = cfg.to_dict()
    for key in dict.fromkeys(keys):
        value: Any = whole
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        out[key] = {"config": value}
    return out
