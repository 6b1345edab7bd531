"""Files cut short or edited by hand, detected before a table is read: ``manifest.json``, which
`bench report` writes beside the CSVs it wrote (each one's size in bytes and sha256), and, for
a CSV without one (e.g. fetched with `git show`), its shape: every row as many fields as the
header, and the last line ended (the suite writes every CSV whole, its last line ended).
``check_whole`` raises a one-line ValueError naming the file (and the manifest that disagrees)."""

from __future__ import annotations

import csv
import hashlib
import io
from pathlib import Path

from bench.fileio import atomic_write_json, read_json

MANIFEST = "manifest.json"


def file_facts(path: Path) -> dict:
    data = path.read_bytes()
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def write_manifest(sweep_dir: Path, paths: list[Path]) -> Path:
    """manifest.json: size and sha256 of each file (CSV) the report just wrote."""
    doc = {"files": {p.name: file_facts(p) for p in sorted(paths, key=lambda p: p.name)}}
    atomic_write_json(sweep_dir / MANIFEST, doc)
    return sweep_dir / MANIFEST


def _manifest_problem(path: Path) -> str | None:
    doc = read_json(path.parent / MANIFEST)
    entry = ((doc or {}).get("files") or {}).get(path.name) if isinstance(doc, dict) else None
    if not isinstance(entry, dict):
        return None
    have = file_facts(path)
    if have == {"bytes": entry.get("bytes"), "sha256": entry.get("sha256")}:
        return None
    size = (
        f"{have['bytes']} bytes, the manifest {entry.get('bytes')}"
        if have["bytes"] != entry.get("bytes")
        else f"its sha256 {have['sha256'][:12]}…, the manifest {str(entry.get('sha256'))[:12]}…"
    )
    return (
        f"not the file `bench report` wrote ({size}: {path.parent / MANIFEST}): cut short or edited "
        "since; rebuild it with `python -m bench report` on its sweep directory"
    )


def _shape_problem(path: Path) -> str | None:
    text = path.read_text(errors="replace")
    if text and not text.endswith("\n"):
        return "its last line is not ended: the file was cut short (a sweep's CSVs end with a newline)"
    rows = csv.reader(io.StringIO(text))
    header = next(rows, None)
    if header is None:
        return None
    for n, row in enumerate(rows, 2):
        if row and len(row) != len(header):
            return f"line {n} has {len(row)} of the header's {len(header)} fields: the file was cut short or edited"
    return None


def check_whole(path: Path) -> None:
    """ValueError (one line) when ``path`` is not whole: its manifest disagrees, or its shape does."""
    try:
        problem = _manifest_problem(path) or _shape_problem(path)
    except (OSError, csv.Error):
        return  # an unreadable file is read_csv's to name
    if problem:
        raise ValueError(f"{path}: {problem}")
