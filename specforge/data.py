"""Training data: token samples (synthetic or JSONL) and the offline hidden-state cache.

Synthetic samples are deterministic in (seed, index): a prompt (loss_mask 0) then a
response (loss_mask 1) then padding, with lengths drawn per sample. Tokens walk a fixed
random cycle over the vocabulary with random jumps, so the next tokens are predictable from
the current one and a draft's loss really falls; that keeps loss curves meaningful without
any model hub. ``source: markov`` is data a draft learns within a few hundred steps at any
vocabulary size (training parity): a fixed seeded chain over ``markov_states`` ids, each id
followed by one of ``markov_branching`` successors with probabilities ∝ 2^-k, so the loss falls
from about ln(vocab) towards the chain's entropy (≈1.1 nats a token with 4 successors).

The offline cache (``python -m specforge prepare``) is a directory of safetensors shards,
one sample per file (input_ids, loss_mask, hidden_states [S, K*H]), the target's frozen
embedding / LM head in ``head.safetensors``, and ``meta.json`` (written last) recording each
file's size and checksums; readers verify them before training (docs/run-contract.md).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save
from torch.utils.data import DataLoader, Dataset, Sampler

from .config import ConfigError, DataConfig, Profile

CACHE_FORMAT = 2  # 2: meta.json lists every file's size and checksums
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


@functools.lru_cache(maxsize=4)
def _markov_chain(avail: int, states: int, branching: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(the ids the chain visits [states], each state's successor states [states, branching])."""
    gen = torch.Generator().manual_seed(seed * 7919 + 17)
    ids = torch.randperm(avail, generator=gen)[:states]
    return ids, torch.randint(0, states, (states, branching), generator=gen)


def markov_sample(index: int, seq_len: int, vocab: int, reserved: int, data: DataConfig) -> dict:
    """input_ids [S] and loss_mask [S] for sample ``index`` of the seeded Markov chain (lengths and
    the prompt / response split drawn as ``synthetic_sample`` draws them)."""
    if data.markov_states > vocab - reserved:
        raise ConfigError(
            f"data.markov_states: {data.markov_states} is more than the {vocab - reserved} ids of the vocabulary"
        )
    base = synthetic_sample(index, seq_len, vocab, reserved, data.seed)  # its lengths and mask
    length = int(base["loss_mask"].nonzero().max()) + 1 if base["loss_mask"].any() else seq_len
    ids_of, succ = _markov_chain(vocab - reserved, data.markov_states, data.markov_branching, data.seed)
    gen = torch.Generator().manual_seed(data.seed * 1_000_003 + index + 1)
    probs = 2.0 ** -torch.arange(data.markov_branching, dtype=torch.float64)
    picks = torch.multinomial(probs, length, replacement=True, generator=gen).tolist()
    state = int(torch.randint(0, data.markov_states, (1,), generator=gen))
    states = []
    for k in picks:
        states.append(state)
        state = int(succ[state, k])
    ids = torch.zeros(seq_len, dtype=torch.int64)
    ids[:length] = ids_of[torch.tensor(states)]
    return {"input_ids": ids, "loss_mask": base["loss_mask"]}


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
            if self.cfg.source == "markov":
                return markov_sample(i, self.cfg.seq_len, self.vocab, 8, self.cfg)
            return synthetic_sample(i, self.cfg.seq_len, self.vocab, 8, self.cfg.seed)
        return self.records[i]


def _read_jsonl(data: DataConfig, vocab: int) -> list[dict]:
    path = Path(data.path)
    tokenizer: list = []  # loaded at the first text record
    records = []
    try:
        lines = path.read_text().splitlines()
    except OSError as e:
        raise ConfigError(f"data.path: cannot read {path} ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ConfigError(f"data.path: {path} is not a text file; expected JSON lines") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except ValueError:
            raise ConfigError(f"data.path: {path}:{n} is not valid JSON") from None
        ids, mask = _ids_and_mask(rec, f"{path}:{n}", data, tokenizer)
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


def _int_list(value, allowed: tuple[int, ...] | None = None) -> bool:
    """Whether ``value`` is a list of integers (not booleans), each in ``allowed`` when given."""
    return isinstance(value, list) and all(
        type(v) is int and (allowed is None or v in allowed) for v in value
    )


def _ids_and_mask(rec, where: str, data: DataConfig, tokenizer: list) -> tuple[list[int], list[int]]:
    """One JSONL record's token ids and loss mask: ``{"input_ids": [int], "loss_mask": [0|1]}``
    (the mask defaults to all ones) or ``{"prompt": str, "response": str}`` (tokenized; the mask
    is 1 on the response). ConfigError naming the line for a record of any other shape."""
    if not isinstance(rec, dict):
        kind = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}.get(
            type(rec), "a number"
        )
        raise ConfigError(
            f"data.path: {where} is {kind}; expected an object with input_ids or prompt+response"
        )
    if "input_ids" in rec:
        ids = rec["input_ids"]
        mask = rec.get("loss_mask", [1] * len(ids) if isinstance(ids, list) else None)
        if not _int_list(ids) or not _int_list(mask, (0, 1)):
            raise ConfigError(
                f"data.path: {where}: expected input_ids a list of integers and loss_mask a list of 0 and 1"
            )
        return ids, mask
    if "prompt" in rec and "response" in rec:
        if not isinstance(rec["prompt"], str) or not isinstance(rec["response"], str):
            raise ConfigError(f"data.path: {where}: expected prompt and response to be strings")
        if not tokenizer:
            tokenizer.append(_load_tokenizer(data))
        p = tokenizer[0](rec["prompt"], add_special_tokens=False)["input_ids"]
        r = tokenizer[0](rec["response"], add_special_tokens=False)["input_ids"]
        return p + r, [0] * len(p) + [1] * len(r)
    raise ConfigError(f"data.path: {where} needs input_ids or prompt+response")


def _load_tokenizer(data: DataConfig):
    from transformers import AutoTokenizer

    if not data.tokenizer:
        raise ConfigError("data.tokenizer: text records need a local tokenizer directory")
    try:
        return AutoTokenizer.from_pretrained(data.tokenizer, local_files_only=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"data.tokenizer: cannot load {data.tokenizer!r} ({e})") from None


# ---------------------------------------------------------------- offline cache

SHARD = "sample_{:06d}.safetensors"
HEAD = "head.safetensors"
QUICK_BYTES = 64 * 1024  # the quick checksum reads this much from each end of a file


class CacheDataset(Dataset):
    """Reads one prepared sample per item from disk (the IO path is part of what is measured).

    The cache is verified first (meta.json, every file's size and quick checksum), so a
    damaged cache is one line naming the file, before the run writes anything.
    """

    def __init__(
        self,
        cache_dir: str | Path,
        seq_len: int,
        feature_dim: int,
        vocab_size: int | None = None,
        hidden_size: int | None = None,
    ):
        self.dir = Path(cache_dir)
        meta = read_cache_meta(self.dir)
        if meta["seq_len"] != seq_len or meta["feature_dim"] != feature_dim:
            raise ConfigError(
                f"data.cache_dir: {self.dir} holds seq_len={meta['seq_len']}, feature_dim={meta['feature_dim']}; "
                f"this run needs seq_len={seq_len}, feature_dim={feature_dim}"
            )
        for key, want in (("vocab_size", vocab_size), ("hidden_size", hidden_size)):
            if want is not None and meta.get(key) != want:
                raise ConfigError(
                    f"data.cache_dir: {self.dir} holds the head of a target with {key}={meta.get(key)}; "
                    f"this run's profile has {key}={want}"
                )
        verify_cache(self.dir, meta)
        self.n = meta["num_samples"]

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        return load_file(self.dir / SHARD.format(i))


def cache_dataset(data: DataConfig, profile: Profile) -> CacheDataset:
    """The run's offline cache (``data.cache_dir``), checked against the run — its seq_len, and
    the feature width, vocabulary and hidden size of the profile's target — and verified."""
    t = profile.target
    feature_dim = len(t.capture_layer_ids) * t.hidden_size
    return CacheDataset(data.cache_dir, data.seq_len, feature_dim, t.vocab_size, t.hidden_size)


def _rebuild(cache_dir: Path) -> str:
    return (
        f"rebuild it with `python -m specforge prepare CONFIG --output-dir {cache_dir} --force` "
        f"or delete {cache_dir}"
    )


def read_cache_meta(cache_dir: Path) -> dict:
    """The cache's meta.json, checked for the fields this version writes (ConfigError if not)."""
    cache_dir = Path(cache_dir)
    meta_path = cache_dir / "meta.json"
    if not meta_path.is_file():
        raise ConfigError(
            f"data.cache_dir: {cache_dir} is not a complete cache (no meta.json); "
            f"prepare it with `python -m specforge prepare CONFIG --output-dir {cache_dir}`"
        )
    try:
        text = meta_path.read_text()
    except OSError as e:
        raise ConfigError(f"data.cache_dir: cannot read {meta_path} ({e.strerror or e})") from None
    except UnicodeDecodeError:
        text = ""  # not text: not valid JSON either
    try:
        meta = json.loads(text)
    except ValueError:
        raise ConfigError(
            f"data.cache_dir: {meta_path} is not valid JSON (a damaged cache); {_rebuild(cache_dir)}"
        ) from None
    fmt = meta.get("format") if isinstance(meta, dict) else None
    if isinstance(fmt, int) and not isinstance(fmt, bool) and fmt < CACHE_FORMAT:
        raise ConfigError(
            f"data.cache_dir: {cache_dir} is a cache from an older specforge (format {fmt}, without "
            f"file sizes and checksums); {_rebuild(cache_dir)}"
        )
    if fmt != CACHE_FORMAT:
        raise ConfigError(
            f"data.cache_dir: {meta_path} is not a format-{CACHE_FORMAT} cache's meta.json "
            f"(format {fmt!r}); {_rebuild(cache_dir)}"
        )
    ints = ("seq_len", "num_samples", "feature_dim")
    files = meta.get("files")
    bad = [k for k in ints if type(meta.get(k)) is not int or meta[k] < 1]
    if bad or not isinstance(files, dict) or not all(_entry_ok(v) for v in files.values()):
        what = f"'{bad[0]}'" if bad else "'files'"
        raise ConfigError(
            f"data.cache_dir: {meta_path} has a missing or malformed {what}; {_rebuild(cache_dir)}"
        )
    return meta


def _entry_ok(entry) -> bool:
    return (
        isinstance(entry, dict)
        and isinstance(entry.get("bytes"), int)
        and isinstance(entry.get("quick_blake2b"), str)
    )


def quick_checksum(size: int, start: bytes, end: bytes) -> str:
    """blake2b over the size, the first QUICK_BYTES and the last QUICK_BYTES (the whole file
    when it is at most 2 * QUICK_BYTES long): cheap enough to check every shard at start."""
    h = hashlib.blake2b(digest_size=32)
    h.update(str(size).encode())
    h.update(start)
    h.update(end)
    return h.hexdigest()


def _quick_of_bytes(data: bytes) -> str:
    n = len(data)
    return quick_checksum(n, data[:QUICK_BYTES], data[max(QUICK_BYTES, n - QUICK_BYTES) :])


def _quick_of_file(path: Path, size: int) -> str:
    with open(path, "rb") as f:
        start = f.read(QUICK_BYTES)
        f.seek(max(QUICK_BYTES, size - QUICK_BYTES))
        end = f.read()
    return quick_checksum(size, start, end)


def verify_cache(cache_dir: Path, meta: dict) -> None:
    """Every file the cache needs is listed in meta.json, exists, has the recorded size and
    the recorded quick checksum; ConfigError naming the first file that does not."""
    cache_dir = Path(cache_dir)
    files = meta["files"]
    needed = [HEAD] + [SHARD.format(i) for i in range(meta["num_samples"])]
    for name in needed:
        path = cache_dir / name
        entry = files.get(name)
        if entry is None:
            raise ConfigError(
                f"data.cache_dir: {cache_dir / 'meta.json'} does not list {name}; {_rebuild(cache_dir)}"
            )
        try:
            size = path.stat().st_size
            if size != entry["bytes"]:
                raise ConfigError(
                    f"data.cache_dir: {path} holds {size} bytes, meta.json records {entry['bytes']} "
                    f"(truncated or damaged); {_rebuild(cache_dir)}"
                )
            if _quick_of_file(path, size) != entry["quick_blake2b"]:
                raise ConfigError(
                    f"data.cache_dir: {path} does not match its checksum in meta.json (damaged); "
                    f"{_rebuild(cache_dir)}"
                )
        except FileNotFoundError:
            raise ConfigError(f"data.cache_dir: {path} is missing; {_rebuild(cache_dir)}") from None
        except OSError as e:
            raise ConfigError(f"data.cache_dir: cannot read {path} ({e.strerror or e})") from None


def write_shard(cache_dir: Path, name: str, tensors: dict[str, torch.Tensor]) -> dict:
    """Write one safetensors file (flushed to disk); its meta.json entry: size and checksums."""
    data = save({k: v.contiguous().cpu() for k, v in tensors.items()})
    with open(Path(cache_dir) / name, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return {
        "bytes": len(data),
        "blake2b": hashlib.blake2b(data).hexdigest(),  # the whole file, as `b2sum` prints it
        "quick_blake2b": _quick_of_bytes(data),
    }


def write_cache_sample(cache_dir: Path, i: int, input_ids, loss_mask, hidden) -> dict:
    tensors = {"input_ids": input_ids, "loss_mask": loss_mask, "hidden_states": hidden}
    return write_shard(cache_dir, SHARD.format(i), tensors)


def save_head(cache_dir: Path, embed: torch.Tensor, lm_head: torch.Tensor, tied: bool) -> dict:
    tensors = {"embed": embed}
    if not tied:
        tensors["lm_head"] = lm_head
    return write_shard(cache_dir, HEAD, tensors)


def load_head(cache_dir: Path, device) -> tuple[torch.Tensor, torch.Tensor]:
    t = load_file(str(Path(cache_dir) / HEAD), device=str(device))
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


def check_batch(n: int, batch_size: int, world: int) -> None:
    """Each rank must get at least one whole batch from the dataset."""
    if n // world < batch_size:
        raise ConfigError(
            f"training.batch_size: {batch_size} is more than the {n // world} samples per rank "
            f"({n} samples over {world} rank(s): data.num_samples, or the offline cache's size)"
        )


def make_loader(
    dataset: Dataset, batch_size: int, seed: int, num_workers: int, rank: int, world: int, pin: bool
):
    """An endless iterator over batches in a seeded order (the same in both arms)."""
    check_batch(len(dataset), batch_size, world)
    loader = DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=EndlessSampler(len(dataset), rank, world, seed),
        num_workers=num_workers,
        pin_memory=pin,
        prefetch_factor=4 if num_workers > 0 else None,
    )
    return iter(loader)
