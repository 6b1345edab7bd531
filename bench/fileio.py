"""Crash-safe result files: atomic whole-file writes and flushed JSON-lines appends.

A sweep may be killed at any moment (even ``kill -9``): whole files are written to a
temporary sibling and renamed into place, so a reader sees the old file or the new one,
never half of one; the new file gets the mode a file written in place would (0o666 less the
umask: under umask 022 others on a shared machine can read the results). JSON-lines files
are appended a line at a time and flushed, and readers skip a torn last line. A write that
fails (a read-only filesystem, a full disk) raises :class:`WriteError` naming the file meant,
which the command line prints as one line (exit 1).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


class WriteError(OSError):
    """A file or directory of the suite's could not be written (read-only filesystem, full disk,
    no permission): ``filename`` is the path meant (not a temporary sibling), ``strerror`` why."""

    def __str__(self) -> str:
        return f"cannot write {self.filename}: {self.strerror}"

    __repr__ = __str__  # what a caller printing {e!r} shows too


@contextmanager
def writing(path: str | Path) -> Iterator[None]:
    """Turn an OSError raised inside the block into a WriteError naming ``path``."""
    try:
        yield
    except WriteError:
        raise
    except OSError as e:
        raise WriteError(e.errno, e.strerror or str(e), str(path)) from e


def _create_temp(path: Path) -> tuple[int, Path]:
    """A new temporary sibling of ``path``, opened for writing with mode 0o666 less the umask.

    Not tempfile.mkstemp: it creates 0o600, so every result would be private to its owner on a
    shared machine. O_CREAT|O_EXCL with 0o666 lets the kernel apply the process umask (and a
    directory's default ACL) as for any new file, with no need to read the umask (os.umask sets
    it to read it: process-wide, racy with the poller's thread)."""
    for _ in range(100):
        tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
        try:
            return os.open(
                tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666
            ), tmp
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name beside {path}")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` (temporary sibling, fsync, rename); the new file's mode
    honours the umask, like a file written in place."""
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
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


def atomic_write_text(path: str | Path, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | Path) -> Any | None:
    """The parsed file, or None when it is missing or unreadable."""
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None


def append_jsonl(path: str | Path, obj: Any) -> None:
    with writing(path), open(path, "a") as f:
        f.write(json.dumps(obj, default=str) + "\n")
        f.flush()


def read_jsonl(path: str | Path) -> list[dict]:
    """Every complete JSON object in the file; a torn or corrupt line is skipped (see read_jsonl_counted)."""
    return read_jsonl_counted(path)[0]


def read_jsonl_counted(path: str | Path) -> tuple[list[dict], int]:
    """(every complete JSON object in the file, how many non-empty lines could not be read)."""
    rows: list[dict] = []
    bad = 0
    try:
        with open(path, errors="replace") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    bad += 1
                    continue
                if isinstance(obj, dict):
                    rows.append(obj)
                else:
                    bad += 1
    except OSError:
        return [], 0
    return rows, bad
