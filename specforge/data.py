"""Training data: token samples (synthetic or JSONL) and the offline hidden-state cache.

Synthetic samples are deterministic in (seed, index): a prompt (loss_mask 0) then a
response (loss_mask 1) then padding, with lengths drawn per sample. Tokens walk a fixed
random cycle over the vocabulary with random jumps, so the next tokens are predictable from
the current one and a draft's loss really falls; that keeps loss curves meaningful without
any model hub.

The offline cache (``python -m specforge prepare``) is a directory of safetensors shards,
one sample per file (input_ids, loss_mask, hidden_states [S, K*H]), the target's frozen
embedding / LM head in ``head.safetensors``, and ``meta.json`` written last.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch.utils.data import DataLoader, Dataset, Sampler

from .config import ConfigError, DataConfig, Profile

CACHE_FORMAT = 1
MEAN_RUN = 32  # mean length of a predictable run between random jumps


@functools.lru_cache(maxsize=4)
def _token_cycle(n: int, seed: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed))


def synthetic_sample(index: int, seq_len: int, vocab: int, reserved: int, seed: int) -> dict:
    """input_ids [S] int64 and loss_mask [S] uint8 for sample ``index``."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + index)
    cycle = _token_cycle(vocab - reserved, seed)
    length = int(torch.randint(seq_len // 2, seq_len + 1, (1,), generator=gen))
    prompt = int(torch.randint(max(1, length // 10), max(2, (2 * length) // 5), (1,), generator=gen))
    jumps = torch.rand(length, generator=gen) < 1.0 / MEAN_RUN
    jumps[0] = True
    starts = torch.randint(0, vocab - reserved, (length,), generator=gen)
    t = torch.arange(length)
    seg_start = torch.cummax(torch.where(jumps, t, torch.zeros_like(t)), dim=0).values
    pos = (starts[seg_start] + (t - seg_start)) % (vocab - reserved)
    ids = torch.zeros(seq_len, dtype=torch.int64)
    ids[:length] = cycle[pos]
    mask = torch.zeros(seq_len, dtype=torch.uint8)
    mask[prompt:length] = 1
    return {"input_ids": ids, "loss_mask": mask}


class TokenDataset(Dataset):
    """Token samples: synthetic, or a local JSONL of {"input_ids", "loss_mask"} records or
    {"prompt", "response"} text records tokenised with a local tokenizer."""

    def __init__(self, data: DataConfig, profile: Profile):
        self.cfg, self.vocab = data, profile.draft.vocab_size
        self.records: list[dict] | None = None
        if data.source == "jsonl":
            self.records = _read_jsonl(data, self.vocab)

    def __len__(self) -> int:
        return len(self.records) if self.records is not None else self.cfg.num_samples

    def __getitem__(self, i: int) -> dict:
        if self.records is None:
            # Reserve the top 8 ids (mask token and friends) so they never appear as data.
            return synthetic_sample(i, self.cfg.seq_len, self.vocab, 8, self.cfg.seed)
        return self.records[i]


def _read_jsonl(data: DataConfig, vocab: int) -> list[dict]:
    path = Path(data.path)
    tokenizer = None
    records = []
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"data.path: cannot read {path} ({e.strerror or e})") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            raise ConfigError(f"data.path: {path}:{n} is not valid JSON") from None
        if "input_ids" in rec:
            ids = list(rec["input_ids"])
            mask = list(rec.get("loss_mask", [1] * len(ids)))
        elif "prompt" in rec and "response" in rec:
            if tokenizer is None:
                tokenizer = _load_tokenizer(data)
            p = tokenizer(rec["prompt"], add_special_tokens=False)["input_ids"]
            r = tokenizer(rec["response"], add_special_tokens=False)["input_ids"]
            ids, mask = p + r, [0] * len(p) + [1] * len(r)
        else:
            raise ConfigError(f"data.path: {path}:{n} needs input_ids or prompt+response")
        if len(ids) != len(mask) or any(not 0 <= t < vocab for t in ids):
            raise ConfigError(f"data.path: {path}:{n} has token ids outside [0, {vocab}) or a bad loss_mask")
        ids, mask = ids[: data.seq_len], mask[: data.seq_len]
        pad = data.seq_len - len(ids)
        records.append(
            {
                "input_ids": torch.tensor(ids + [0] * pad, dtype=torch.int64),
                "loss_mask": torch.tensor(mask + [0] * pad, dtype=torch.uint8),
            }
        )
    if not records:
        raise ConfigError(f"data.path: {path} holds no records")
    return records


def _load_tokenizer(data: DataConfig):
    from transformers import AutoTokenizer

    if not data.tokenizer:
        raise ConfigError("data.tokenizer: text records need a local tokenizer directory")
    try:
        return AutoTokenizer.from_pretrained(data.tokenizer, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"data.tokenizer: cannot load {data.tokenizer!r} ({e})") from None


# ---------------------------------------------------------------- offline cache


class CacheDataset(Dataset):
    """Reads one prepared sample per item from disk (the IO path is part of what is measured)."""

    def __init__(self, cache_dir: str | Path, seq_len: int, feature_dim: int):
        self.dir = Path(cache_dir)
        meta = read_cache_meta(self.dir)
        if meta["seq_len"] != seq_len or meta["feature_dim"] != feature_dim:
            raise ConfigError(
                f"data.cache_dir: {self.dir} holds seq_len={meta['seq_len']}, feature_dim={meta['feature_dim']}; "
                f"this run needs seq_len={seq_len}, feature_dim={feature_dim}"
            )
        self.n = meta["num_samples"]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return load_file(self.dir / f"sample_{i:06d}.safetensors")


def read_cache_meta(cache_dir: Path) -> dict:
    meta_path = Path(cache_dir) / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError):
        raise ConfigError(
            f"data.cache_dir: {cache_dir} is not a complete cache (no meta.json); run python -m specforge prepare"
        ) from None
    if meta.get("format") != CACHE_FORMAT:
        raise ConfigError(
            f"data.cache_dir: {cache_dir} has cache format {meta.get('format')}, need {CACHE_FORMAT}"
        )
    return meta


def write_cache_sample(cache_dir: Path, i: int, input_ids, loss_mask, hidden) -> None:
    tensors = {
        "input_ids": input_ids.contiguous(),
        "loss_mask": loss_mask.contiguous(),
        "hidden_states": hidden,
    }
    save_file(
        {k: v.contiguous().cpu() for k, v in tensors.items()}, str(cache_dir / f"sample_{i:06d}.safetensors")
    )


def save_head(cache_dir: Path, embed: torch.Tensor, lm_head: torch.Tensor, tied: bool) -> None:
    tensors = {"embed": embed.contiguous().cpu()}
    if not tied:
        tensors["lm_head"] = lm_head.contiguous().cpu()
    save_file(tensors, str(cache_dir / "head.safetensors"))


def load_head(cache_dir: Path, device) -> tuple[torch.Tensor, torch.Tensor]:
    t = load_file(str(Path(cache_dir) / "head.safetensors"), device=str(device))
    return t["embed"], t.get("lm_head", t["embed"])


class EndlessSampler(Sampler):
    """Seeded permutations of the dataset, epoch after epoch, this rank's share of each.

    One iterator runs forever, so the DataLoader never stops and restarts its workers at an
    epoch boundary (a restart stalls the step that crosses it).
    """

    def __init__(self, n: int, rank: int, world: int, seed: int):
        self.n, self.rank, self.world, self.seed = n, rank, world, seed

    def __iter__(self):
        usable = self.n - self.n % self.world
        epoch = 0
        while True:
            perm = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + epoch)).tolist()
            yield from perm[self.rank : usable : self.world]
            epoch += 1


def make_loader(
    dataset: Dataset, batch_size: int, seed: int, num_workers: int, rank: int, world: int, pin: bool
):
    """An endless iterator over batches in a seeded order (the same in both arms)."""
    if len(dataset) // world < batch_size:
        raise ConfigError(
            f"data.num_samples: {len(dataset)} samples over {world} rank(s) is fewer than one batch of {batch_size}"
        )
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=EndlessSampler(len(dataset), rank, world, seed),
        num_workers=num_workers,
        pin_memory=pin,
        prefetch_factor=4 if num_workers > 0 else None,
    )
    return iter(loader)
