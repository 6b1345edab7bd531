"""SpecForge's offline inputs, made from one of our training configs with random weights.

For a ``specforge-cli`` cell whose config is ours (a profile, ``mode: offline``) the plug
prepares, once per cache (``python -m bench.trainers.specforge_cli.inputs``), everything
SpecForge's offline path loads, and nothing more:

- ``target/``: a Qwen3.5-shaped ``config.json`` (``Qwen3_5ForConditionalGeneration`` with a
  ``text_config`` of the profile's target) and one safetensors file holding the embedding
  ``model.language_model.embed_tokens.weight`` (and ``lm_head.weight`` when untied): offline,
  SpecForge reads only these from the target;
- ``draft.json``: the DFlash draft config (the profile's draft; ``mask_token_id`` in it, so no
  tokenizer is needed);
- ``features/NNNNNN.ckpt``: ``torch.save({"input_ids": [S], "loss_mask": [S], "hidden_states":
  [1, S, K*H]})``, K the captured target layers; each run links the samples it trains on. Random
  tokens and features (nothing to learn: a throughput run) unless the config's ``data.source`` is
  one a draft can learn (``markov``, ``jsonl``): then the samples and the target's embedding are
  those of our trainer's own offline cache of the same config (``python -m specforge prepare``:
  the random-weight target run over those tokens), so both trainers learn the same data
  (training parity);
- ``run.yaml``: the SpecForge run config (``run_config``), and ``meta.json``, written last.

``run_config`` is pure (no torch): the plug's check validates it with SpecForge before a cache
exists. Facts checked against SpecForge 0.2.0 (PyPI; upstream a6b6b023).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

import bench.config.yamlio as yamlio
from bench.distribution import OUR_TRAINER_MODULE as OUR_TRAINER
from bench.distribution import PROFILES  # the checkout's configs/profiles, or the shipped ones
from bench.fileio import atomic_write_json
from bench.trainers.specforge_cli.facts import NAME

FORMAT = 2  # 2: learnable sources read from our trainer's cache, meta.json's "samples"
LEARNABLE_SOURCES = ("markov", "jsonl")  # token data a draft learns: the target's features over it
PACKAGES = ("torch", "safetensors")  # what preparing the inputs imports (the train extra)
EMBED_KEY = "model.language_model.embed_tokens.weight"
DTYPES = {"bfloat16": "bfloat16", "float16": "float16", "float32": "float32", "bf16": "bfloat16"}


def load_profile(train: dict) -> dict:
    """The profile our training config names (configs/profiles/<name>.yaml, shipped with the suite)."""
    path = PROFILES / f"{train['profile']}.yaml"
    if not path.is_file():
        known = ", ".join(sorted(p.stem for p in PROFILES.glob("*.yaml")))
        raise ValueError(f"unknown profile {train['profile']!r} (known: {known})")
    return yamlio.load(path.read_text())


def _dtype(train: dict) -> str:
    dtype = str((train.get("model") or {}).get("dtype") or "bfloat16")
    if dtype not in DTYPES:
        raise ValueError(f"model.dtype {dtype!r}: SpecForge trains in bfloat16, float16 or float32")
    return DTYPES[dtype]


OUR_DEFAULT_LR = 6e-4  # our trainer's training.lr when a config leaves it out (specforge/config.py)


def learning_rate(train: dict) -> float:
    """The learning rate SpecForge's run.yaml gets from one of our training configs."""
    return float((train.get("training") or {}).get("lr", OUR_DEFAULT_LR))


def run_config(train: dict, seq_len: int, cache_dir: Path) -> dict[str, Any]:
    """SpecForge's run config for our training config at ``seq_len``, its paths in ``cache_dir``.
    The keys follow upstream's offline DFlash example; the driver sets each run's own keys
    (steps, batch, arm, run_id, output_dir, the features it reads) as overrides."""
    t, data = train.get("training") or {}, train.get("data") or {}
    tied = bool(load_profile(train)["target"].get("tie_word_embeddings", True))
    return {
        "model": {
            "target_model_path": str(cache_dir / "target"),
            "draft_model_config": str(cache_dir / "draft.json"),
            "embedding_key": EMBED_KEY,
            **({} if tied else {"lm_head_key": "lm_head.weight"}),
            "torch_dtype": _dtype(train),
            "use_liger_kernel": False,
        },
        "data": {
            "hidden_states_path": str(cache_dir / "features"),
            "max_length": seq_len,
            "dataloader_num_workers": int(data.get("num_workers", 4)),
        },
        "training": {
            "strategy": "dflash",
            "num_epochs": 1,
            "batch_size": int(t.get("batch_size", 1)),
            "accumulation_steps": int(t.get("accumulation_steps", 1)),
            "learning_rate": learning_rate(train),
            "max_grad_norm": float(t.get("max_grad_norm", 1.0)),
            "attention_backend": str((train.get("model") or {}).get("attention_backend", "flex_attention")),
            "num_anchors": int(t.get("num_anchors", 512)),
            "loss_decay_gamma": 7.0,
            "save_interval": 0,
            "log_interval": 1,
            "seed": int(t.get("seed", 42)),
        },
        "tracking": {"report_to": "none"},
        "deployment": {"mode": "local_colocated"},
        "run_id": "bench",
        "output_dir": str(cache_dir / "unused-output"),
    }


def draft_config(profile: dict, dtype: str) -> dict[str, Any]:
    """The DFlash draft config SpecForge builds its draft from (upstream's qwen3.5-4b-dflash.json's keys)."""
    d, t = profile["draft"], profile["target"]
    layers = int(d["num_hidden_layers"])
    return {
        "architectures": ["DFlashDraftModel"],
        "model_type": "qwen3",
        "block_size": int(d["block_size"]),
        "dflash_config": {
            "mask_token_id": int(d["mask_token_id"]),
            "target_layer_ids": list(t["capture_layer_ids"]),
        },
        "num_target_layers": int(t["num_hidden_layers"]),
        **{
            k: d[k]
            for k in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads")
        },
        "num_hidden_layers": layers,
        "head_dim": int(d["head_dim"]),
        "rms_norm_eps": float(d["rms_norm_eps"]),
        "rope_theta": float(d["rope_theta"]),
        "rope_scaling": None,
        "vocab_size": int(d["vocab_size"]),
        "hidden_act": "silu",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": 0.02,
        "max_position_embeddings": 262144,
        "layer_types": ["full_attention"] * layers,
        "max_window_layers": layers,
        "use_sliding_window": False,
        "sliding_window": None,
        "tie_word_embeddings": bool(t.get("tie_word_embeddings", True)),
        "dtype": dtype,
    }


def target_config(profile: dict) -> dict[str, Any]:
    """A Qwen3.5-shaped target config: SpecForge reads the text config's sizes and the tying."""
    t = profile["target"]
    tied = bool(t.get("tie_word_embeddings", True))
    keys = ("hidden_size", "vocab_size", "num_hidden_layers", "intermediate_size", "num_attention_heads")
    text = {k: int(t[k]) for k in keys}
    text.update(num_key_value_heads=int(t["num_key_value_heads"]), head_dim=int(t["head_dim"]))
    return {
        "architectures": ["Qwen3_5ForConditionalGeneration"],
        "model_type": "qwen3_5",
        "tie_word_embeddings": tied,
        "text_config": {"model_type": "qwen3_5_text", **text, "tie_word_embeddings": tied},
    }


def learnable_samples(train_path: Path, seq_len: int, out: Path, feats: Path, dtype) -> tuple:
    """SpecForge's samples from our trainer's offline cache of the same config at ``seq_len``
    (``python -m specforge prepare`` into ``out/ours``, its format in docs/run-contract.md; removed
    once converted): (embedding, LM head or None when tied, the number of samples)."""
    import torch
    from safetensors.torch import load_file

    cache = out / "ours"
    shutil.rmtree(cache, ignore_errors=True)
    prepare = [
        sys.executable,
        "-m",
        OUR_TRAINER,
        "prepare",
        str(train_path),
        "--set",
        f"data.seq_len={seq_len}",
    ]
    if subprocess.run([*prepare, "--output-dir", str(cache)], stdin=subprocess.DEVNULL).returncode != 0:
        raise ValueError(f"our trainer's prepare of {train_path} failed (its output is above)")
    n = int(json.loads((cache / "meta.json").read_text())["num_samples"])
    for i in range(n):
        shard = load_file(str(cache / f"sample_{i:06d}.safetensors"))
        sample = {
            "input_ids": shard["input_ids"].to(torch.long),
            "loss_mask": shard["loss_mask"].to(torch.long),
            "hidden_states": shard["hidden_states"][None].to(dtype),
        }
        torch.save(sample, feats / f"{i:06d}.ckpt")
    head = load_file(str(cache / "head.safetensors"))
    shutil.rmtree(cache)
    return head["embed"].to(dtype), (head["lm_head"].to(dtype) if "lm_head" in head else None), n


def write_inputs(train: dict, seq_len: int, out: Path, train_path: Path | None = None) -> dict:
    """Write the target, draft, features and run config into ``out``; meta.json last. Returns it."""
    import torch
    from safetensors.torch import save_file

    profile = load_profile(train)
    dtype = _dtype(train)
    tdt = getattr(torch, dtype)
    t, data = profile["target"], train.get("data") or {}
    hidden, vocab = int(t["hidden_size"]), int(t["vocab_size"])
    width = len(t["capture_layer_ids"]) * hidden
    gen = torch.Generator().manual_seed(int(data.get("seed", 0)))
    (out / "target").mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "target" / "config.json", target_config(profile))
    feats = out / "features"
    feats.mkdir(exist_ok=True)
    tied = bool(t.get("tie_word_embeddings", True))
    if data.get("source") in LEARNABLE_SOURCES:
        if train_path is None:
            raise ValueError(f"data.source {data['source']!r}: the training config's path is needed")
        embed, lm_head, n = learnable_samples(train_path, seq_len, out, feats, tdt)
        source = f"{data['source']}, the target's hidden states (our trainer's prepare)"
    else:
        std = float(t.get("initializer_range", 0.02))
        embed = (torch.randn(vocab, hidden, generator=gen) * std).to(tdt)
        lm_head = None if tied else (torch.randn(vocab, hidden, generator=gen) * std).to(tdt)
        n = int(data.get("num_samples", 64))
        mask = int(profile["draft"]["mask_token_id"])
        for i in range(n):
            sample = {
                "input_ids": torch.randint(0, min(vocab, mask), (seq_len,), generator=gen),
                "loss_mask": torch.ones(seq_len, dtype=torch.long),
                "hidden_states": torch.randn(1, seq_len, width, generator=gen).to(tdt),
            }
            torch.save(sample, feats / f"{i:06d}.ckpt")
        source = "random tokens and features"
    tensors = {EMBED_KEY: embed}
    if not tied:
        tensors["lm_head.weight"] = lm_head if lm_head is not None else embed.clone()
    save_file(tensors, str(out / "target" / "model.safetensors"))
    atomic_write_json(out / "draft.json", draft_config(profile, dtype))
    (out / "run.yaml").write_text(yaml.safe_dump(run_config(train, seq_len, out), sort_keys=False))
    files = sorted(p for p in out.rglob("*") if p.is_file())
    meta = {
        "format": FORMAT,
        "trainer": NAME,
        "profile": train["profile"],
        "seq_len": seq_len,
        "num_samples": n,
        "samples": source,
        "files": {str(p.relative_to(out)): p.stat().st_size for p in files},
    }
    atomic_write_json(out / "meta.json", meta)
    return meta


def cache_problem(cdir: Path, seq_len: int) -> str | None:
    """Why a prepared cache cannot be used (an older format, another length, a file missing or
    of another size), or None."""
    try:
        meta = json.loads((cdir / "meta.json").read_text())
    except (OSError, ValueError) as e:
        return f"meta.json unreadable ({e})"
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("trainer") != NAME:
        return "meta.json is not a SpecForge input cache of this version"
    if meta.get("seq_len") != seq_len:
        return f"prepared for seq_len {meta.get('seq_len')}, not {seq_len}"
    for rel, size in (meta.get("files") or {}).items():
        p = cdir / rel
        if not p.is_file() or p.stat().st_size != size:
            return f"{rel} is missing or truncated"
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.trainers.specforge_cli.inputs", description=__doc__)
    ap.add_argument("train_config")
    ap.add_argument("--seq-len", type=int, required=True)
    ap.add_argument("--output-dir", required=True)
    args = ap.parse_args(argv)
    try:
        train = yamlio.load(Path(args.train_config).read_text())
        meta = write_inputs(train, args.seq_len, Path(args.output_dir), Path(args.train_config))
    except (OSError, ValueError, KeyError, yaml.YAMLError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {len(meta['files'])} files ({meta['num_samples']} samples) into {args.output_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
