"""The trainer's side of the run contract (docs/run-contract.md): run.json and metrics.jsonl.

Only rank 0 writes. run.json is replaced atomically (temp file, fsync, rename; the temp file
is removed on any failure); metrics.jsonl is appended one flushed line per optimizer step, so
a killed run leaves every finished step. Also the output-directory checks (a run directory,
a cache directory) every command makes before it writes anything. Standard library only:
``python -m specforge check`` imports this without torch.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import secrets
from pathlib import Path

from .config import ConfigError

RUN_FILES = ("run.json", "metrics.jsonl")


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new temporary sibling of ``path`` opened for writing, mode 0o666 less the umask (the
    kernel applies it: tempfile.mkstemp would make it 0o600, private on a shared machine)."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666
            ), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data``: a reader sees the old file or the new one, never half.
    The new file's mode honours the umask, like a file written in place."""
    path = Path(path)
    fd, tmp = _create_temp(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: Path, obj: dict) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n").encode())


# ---------------------------------------------------------------- output directories


def output_path(text: str | None, flag: str = "--output-dir") -> Path | None:
    """The path given on the command line (None when not given); an empty one is refused."""
    if text is None:
        return None
    if not text.strip():
        raise ConfigError(f"{flag}: empty path; expected a directory")
    return Path(text)


def _nearest_existing(path: Path) -> Path:
    p = Path(os.path.abspath(path))
    while not p.exists() and not p.is_symlink() and p != p.parent:
        p = p.parent
    return p


def check_writable(path: Path, flag: str = "--output-dir", shown: Path | None = None) -> None:
    """Refuse a path that is not, and cannot become, a writable directory; writes nothing.
    ``shown``: the path to name in the message (default: ``path``)."""
    shown = shown or path
    if path.exists() or path.is_symlink():
        if not path.is_dir():
            if shown != path:
                raise ConfigError(f"{flag}: {shown} cannot be created: {path} is not a directory")
            raise ConfigError(f"{flag}: {path} exists and is not a directory; expected a directory")
        probe = path
    else:
        probe = _nearest_existing(path)
        if not probe.is_dir():
            raise ConfigError(f"{flag}: {shown} cannot be created: {probe} is not a directory")
    read_only = False
    try:
        read_only = bool(os.statvfs(probe).f_flag & os.ST_RDONLY)
    except OSError:
        pass
    if read_only or not os.access(probe, os.W_OK | os.X_OK):
        where = "is on a read-only file system" if read_only else "is not writable"
        raise ConfigError(f"{flag}: {shown} cannot be written: {probe} {where}")


def check_train_output(out: Path, force: bool) -> None:
    """Before a training run writes anything: a writable place, and no run there unless --force."""
    check_writable(out)
    held = [name for name in RUN_FILES if (out / name).exists()]
    if held and not force:
        raise ConfigError(
            f"--output-dir: {out} already holds a run ({held[0]}; use --force to replace it, or another directory)"
        )


# The names a cache consists of (and leftovers of older versions' in-place meta.json writes).
CACHE_FILE = re.compile(r"meta\.json|head\.safetensors|sample_\d{6,}\.safetensors|\.meta\.json\..+\.tmp")


def check_cache_output(out_dir: Path, force: bool) -> bool:
    """Refuse an output directory prepare must not write; True when it holds a cache that
    --force replaces. Writes nothing."""
    full = Path(os.path.abspath(out_dir))
    if not full.name:
        raise ConfigError(f"--output-dir: {out_dir} cannot hold a cache; name a new or empty directory")
    if full.exists() and not full.is_dir():
        raise ConfigError(
            f"--output-dir: {out_dir} exists and is not a directory; expected a cache directory"
        )
    check_writable(full.parent, shown=out_dir)  # the cache is built beside it, then renamed
    if not full.exists():
        return False
    try:
        entries = list(full.iterdir())
    except OSError as e:
        raise ConfigError(f"--output-dir: cannot read {out_dir} ({e.strerror or e})") from None
    if not entries:
        return False
    if not (full / "meta.json").is_file():
        raise ConfigError(
            f"--output-dir: {out_dir} is not empty and is not a cache (no meta.json); "
            "name a new or empty directory"
        )
    if not force:
        raise ConfigError(f"--output-dir: {out_dir} already holds a cache (use --force to rebuild it)")
    foreign = sorted(e.name for e in entries if not (CACHE_FILE.fullmatch(e.name) and plain_file(e)))
    if foreign:
        raise ConfigError(
            f"--output-dir: {out_dir} holds {foreign[0]!r}, which is not part of a cache; --force "
            "replaces only a cache's own files, so move it away first"
        )
    return True


def plain_file(p: Path) -> bool:
    return p.is_file() and not p.is_symlink()


def _os_error(path: Path, e: OSError) -> ConfigError:
    return ConfigError(f"--output-dir: cannot write {path} ({e.strerror or e})")


class RunFiles:
    """run.json and metrics.jsonl of one run; remembers what it created so that a run refused
    after starting (exit 2: "nothing written") can take exactly that back."""

    def __init__(self, out_dir: Path, enabled: bool):
        self.dir, self.enabled = Path(out_dir), enabled
        self.record: dict = {}
        self._metrics = None
        self._created: list[tuple[Path, bool]] = []  # (path, is a directory), in creation order
        self._replaced: list[tuple[Path, Path]] = []  # (file, where --force set it aside)

    def clear(self) -> None:
        """What --force replaces: this directory's run.json and metrics.jsonl, nothing else.

        They are set aside (``.<name>.replaced``) rather than deleted, so that a run refused
        after starting can put them back (discard); a run that finishes deletes them."""
        if not self.enabled:
            return
        for name in RUN_FILES:
            src, aside = self.dir / name, self.dir / f".{name}.replaced"
            if src.exists():
                try:
                    os.replace(src, aside)
                except OSError as e:
                    raise _os_error(src, e) from None
                self._replaced.append((src, aside))

    def start(self, record: dict) -> None:
        self.record = {
            "status": "running",
            "reason": None,
            "start_time": now_iso(),
            "end_time": None,
            **record,
        }
        if not self.enabled:
            return
        try:
            missing = []
            p = Path(os.path.abspath(self.dir))
            while not p.exists():
                missing.append(p)
                p = p.parent
            for d in reversed(missing):
                d.mkdir()
                self._created.append((d, True))
            for name in RUN_FILES:
                if not (self.dir / name).exists():
                    self._created.append((self.dir / name, False))
            write_json_atomic(self.dir / "run.json", self.record)
            self._metrics = open(self.dir / "metrics.jsonl", "a")
        except OSError as e:
            self.discard()
            raise _os_error(self.dir, e) from None

    def update(self, **fields) -> None:
        self.record.update(fields)
        if self.enabled:
            write_json_atomic(self.dir / "run.json", self.record)

    def step(self, row: dict) -> None:
        if self._metrics is not None:
            self._metrics.write(json.dumps(row) + "\n")
            self._metrics.flush()

    def finish(self, status: str, reason: str | None = None, **fields) -> None:
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        self.update(status=status, reason=reason, end_time=now_iso(), **fields)
        for _, aside in self._replaced:  # this run's files stand now: the replaced ones go
            aside.unlink(missing_ok=True)
        self._replaced = []

    def discard(self) -> None:
        """Remove the files and (empty) directories this run created, and put back what
        --force set aside; never touch anything else."""
        if self._metrics is not None:
            self._metrics.close()
            self._metrics = None
        for p, is_dir in reversed(self._created):
            try:
                if is_dir:
                    p.rmdir()  # only when empty: another process may have put files there
                else:
                    p.unlink(missing_ok=True)
            except OSError:
                pass
        self._created = []
        for src, aside in self._replaced:
            with contextlib.suppress(OSError):
                os.replace(aside, src)
        self._replaced = []


def oom_reason(e: BaseException) -> str:
    """``CUDA out of memory. Tried to allocate 2.00 GiB`` (the allocator's first sentence), else one line."""
    m = re.search(r"(?:CUDA|HIP) out of memory\. Tried to allocate [\d.]+ [KMGTP]?i?B", str(e))
    return m.group(0) if m else one_line(e)


def one_line(e: BaseException) -> str:
    """An exception as run.json's reason: its type and message on one line, at most 500 characters."""
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text}"[:500]
