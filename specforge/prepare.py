"""``python -m specforge prepare``: write an offline hidden-state cache.

Hidden states come from a target model run over the token data (random weights built on
the device, or a local pretrained directory) or, with ``--hidden-states random``, are
synthesised (seeded Gaussian features; no target needed). The target's frozen embedding /
LM head go into the cache too, so offline training needs no target at all.

The cache is written into a temporary sibling directory (``.<name>.prepare-*``), each file
flushed to disk, ``meta.json`` (every file's size and checksums) last, and only then renamed
into place: a killed prepare never leaves a half cache under the requested name. The output
directory must be new, empty, or (with ``--force``) a cache this command wrote; --force
replaces only the files a cache consists of.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
from pathlib import Path

import torch

from . import data as data_mod
from . import target as target_mod
from .config import ConfigError, Profile, TrainConfig
from .runfiles import CACHE_FILE, check_cache_output, now_iso, plain_file, write_json_atomic


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_cache(path: Path) -> None:
    """Delete a replaced cache: only the files a cache consists of, then the directory if empty."""
    for entry in path.iterdir():
        if CACHE_FILE.fullmatch(entry.name) and plain_file(entry):
            entry.unlink()
    try:
        path.rmdir()
    except OSError:
        print(f"[prepare] left {path}: it holds files that are not part of a cache", file=sys.stderr)


def prepare(cfg: TrainConfig, profile: Profile, out_dir: Path, hidden_source: str, force: bool) -> int:
    replace = check_cache_output(out_dir, force)
    want = cfg.training.device
    if want == "cuda" and not torch.cuda.is_available():
        raise ConfigError("training.device: cuda requested but no CUDA or ROCm GPU is visible")
    device = torch.device("cuda" if want != "cpu" and torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if cfg.model.dtype == "bfloat16" else torch.float32
    tokens = data_mod.TokenDataset(cfg.data, profile)  # bad data: refused before anything is written
    full = Path(os.path.abspath(out_dir))
    tmp = full.parent / f".{full.name}.prepare-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        full.parent.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    except OSError as e:
        raise ConfigError(f"--output-dir: cannot create {tmp} ({e.strerror or e})") from None
    try:
        meta = _write(cfg, profile, tmp, hidden_source, tokens, device, dtype)
        _fsync_dir(tmp)
        if replace:
            old = full.parent / f".{full.name}.old-{os.getpid()}-{secrets.token_hex(4)}"
            os.rename(full, old)
            try:
                os.rename(tmp, full)
            except BaseException:
                os.rename(old, full)
                raise
            _remove_cache(old)
        else:
            try:
                os.rename(tmp, full)  # onto a missing or an empty directory
            except OSError as e:
                raise ConfigError(
                    f"--output-dir: cannot move the cache to {out_dir} ({e.strerror or e})"
                ) from None
        _fsync_dir(full.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    n = meta["num_samples"]
    print(
        f"[prepare] wrote {n} samples to {out_dir}: {json.dumps({k: meta[k] for k in ('seq_len', 'feature_dim')})}"
    )
    return 0


def _write(cfg: TrainConfig, profile: Profile, out: Path, hidden_source: str, tokens, device, dtype) -> dict:
    """Write the cache's files into ``out`` (meta.json last); returns the meta record."""
    arch = profile.target
    t0 = time.perf_counter()
    seed = cfg.training.seed
    if hidden_source == "target":
        model = target_mod.build_target(arch, cfg.target, device, dtype, seed, cfg.data.seq_len + 64)
        head = target_mod.head_of(model)
    else:
        model = None
        head = target_mod.random_head(arch, device, dtype, seed)
    files = {
        data_mod.HEAD: data_mod.save_head(
            out, head.embed, head.lm_head, tied=head.embed.data_ptr() == head.lm_head.data_ptr()
        )
    }
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
        files[data_mod.SHARD.format(i)] = data_mod.write_cache_sample(
            out, i, ids, sample["loss_mask"], hidden
        )
        if (i + 1) % max(1, n // 10) == 0 or i + 1 == n:
            print(f"[prepare] {i + 1}/{n} samples ({time.perf_counter() - t0:.1f}s)", flush=True)
    meta = {
        "format": data_mod.CACHE_FORMAT,
        "profile": profile.name,
        "seq_len": cfg.data.seq_len,
        "num_samples": n,
        "feature_dim": feature_dim,
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "capture_layer_ids": arch.capture_layer_ids,
        "hidden_states": hidden_source,
        "target_init": cfg.target.init,
        "dtype": cfg.model.dtype,
        "data": cfg.to_dict()["data"],
        "files": files,
        "created": now_iso(),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    write_json_atomic(out / "meta.json", meta)
    return meta
