"""``python -m specforge prepare``: write an offline hidden-state cache.

Hidden states come from a target model run over the token data (random weights built on
the device, or a local pretrained directory) or, with ``--hidden-states random``, are
synthesised (seeded Gaussian features; no target needed). The target's frozen embedding /
LM head go into the cache too, so offline training needs no target at all. ``meta.json``
is written last: a cache without it is incomplete and is refused by training.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from . import data as data_mod
from . import target as target_mod
from .config import ConfigError, Profile, TrainConfig
from .runfiles import now_iso, write_json_atomic


def prepare(cfg: TrainConfig, profile: Profile, out_dir: Path, hidden_source: str, force: bool) -> int:
    meta_path = out_dir / "meta.json"
    if meta_path.exists() and not force:
        raise ConfigError(
            f"--output-dir: {out_dir} already holds a complete cache (use --force to rebuild it)"
        )
    want = cfg.training.device
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError("training.device: cuda requested but no CUDA or ROCm GPU is visible")
    device = torch.device("cuda" if want != "cpu" and torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
    tokens = data_mod.TokenDataset(cfg.data, profile)
    arch = profile.target
    out_dir.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    seed = cfg.training.seed
    if hidden_source == "target":
        model = target_mod.build_target(arch, cfg.target, device, dtype, seed, cfg.data.seq_len + 64)
        head = target_mod.head_of(model)
    else:
        model = None
        head = target_mod.random_head(arch, device, dtype, seed)
    data_mod.save_head(
        out_dir, head.embed, head.lm_head, tied=head.embed.data_ptr() == head.lm_head.data_ptr()
    )
    feature_dim = len(arch.capture_layer_ids) * arch.hidden_size
    gen = torch.Generator(device=device).manual_seed(seed + 1)
    n = len(tokens)
    for i in range(n):
        sample = tokens[i]
        ids = sample["input_ids"]
        if model is not None:
            hidden = target_mod.capture_hidden(model, ids[None].to(device), arch.capture_layer_ids)[0]
        else:
            hidden = torch.randn(ids.shape[0], feature_dim, generator=gen, device=device).to(dtype)
        data_mod.write_cache_sample(out_dir, i, ids, sample["loss_mask"], hidden)
        if (i + 1) % max(1, n // 10) == 0 or i + 1 == n:
            print(f"[prepare] {i + 1}/{n} samples ({time.perf_counter() - t0:.1f}s)", flush=True)
    meta = {
        "format": data_mod.CACHE_FORMAT,
        "profile": profile.name,
        "seq_len": cfg.data.seq_len,
        "num_samples": n,
        "feature_dim": feature_dim,
        "capture_layer_ids": arch.capture_layer_ids,
        "hidden_states": hidden_source,
        "target_init": cfg.target.init,
        "dtype": cfg.model.dtype,
        "data": cfg.to_dict()["data"],
        "created": now_iso(),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    write_json_atomic(meta_path, meta)
    print(
        f"[prepare] wrote {n} samples to {out_dir}: {json.dumps({k: meta[k] for k in ('seq_len', 'feature_dim')})}"
    )
    return 0
