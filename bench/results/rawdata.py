"""A committed sweep's raw records in one compressed archive beside its published face.

``results/<sweep>/`` publishes what people read: README.md, report.md, the CSVs, summary.json,
manifest.json, sweep.json and the headline figures (forest.png and the section figures). What the
report was built from — ``runs/``, ``pairs/``, ``prime/`` and the call's ``smi.csv`` — goes into
``raw.tar.xz``, written reproducibly (members sorted, times, owners and modes fixed: the same
records give the same bytes), with its size, sha256 and members in ``raw.json``. The figures
``bench report`` draws from the raw records alone (RECORD_FIGURES) are left out of the face: they
come back with the records. ``unpack`` checks the archive against raw.json, refuses to write over
anything, and extracts; ``bench report`` then rebuilds every table and figure (`python -m bench raw
unpack DIR`, or `make raw SWEEP=DIR`).
"""

from __future__ import annotations

import hashlib
import io
import shutil
import tarfile
from pathlib import Path

from bench.errors import SweepError
from bench.fileio import atomic_write_bytes, atomic_write_json, read_json, writing

RAW = "raw.tar.xz"
RAW_JSON = "raw.json"
MEMBERS = ("runs", "pairs", "prime", "smi.csv")  # what a sweep's report is built from
RECORD_FIGURES = ("throughput.png", "vram_per_card.png", "loss_curves.png", "step_time_dist.png")
# What `bench report` writes besides figures, the published face's tables and text (a sweep holds
# those that apply to it): what a rebuild from the archive is compared on.
FACE = (
    "runs.csv", "summary.csv", "summary.json", "loss_parity.csv", "vram_per_card.csv", "contrasts.csv",
    "scaling.csv", "capacity.csv", "trainers.csv", "training_parity.csv", "manifest.json", "report.md",
)  # fmt: skip


def _add(tar: tarfile.TarFile, path: Path, name: str) -> int:
    """``path`` (a file or a directory, recursively, sorted) as ``name`` with fixed metadata; the files added."""
    info = tarfile.TarInfo(name)
    info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
    if path.is_symlink() or not (path.is_dir() or path.is_file()):
        raise SweepError(f"{path}: not a plain file or directory; the raw archive holds only those")
    if path.is_dir():
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
        return sum(_add(tar, child, f"{name}/{child.name}") for child in sorted(path.iterdir()))
    data = path.read_bytes()
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))
    return 1


def pack(sweep_dir: Path, commit: str | None = None) -> dict:
    """Move a sweep's raw records (MEMBERS) into raw.tar.xz and raw.json, and drop the figures
    drawn from them alone (RECORD_FIGURES); returns raw.json's object."""
    sweep_dir = Path(sweep_dir)
    present = [m for m in MEMBERS if (sweep_dir / m).exists() or (sweep_dir / m).is_symlink()]
    if "runs" not in present:
        raise SweepError(f"{sweep_dir}: no runs/ to pack (already packed: {RAW} is there)")
    if (sweep_dir / RAW).exists():
        raise SweepError(f"{sweep_dir}: {RAW} is there already and so is runs/; unpack or remove one first")
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz", preset=9) as tar:
        files = sum(_add(tar, sweep_dir / m, m) for m in present)
    data = buf.getvalue()
    doc = {
        "file": RAW,
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "members": present,
        "files": files,
        "packed_at_commit": commit,
    }
    with writing(sweep_dir):
        atomic_write_bytes(sweep_dir / RAW, data)
        atomic_write_json(sweep_dir / RAW_JSON, doc)
        for m in present:
            target = sweep_dir / m
            shutil.rmtree(target) if target.is_dir() else target.unlink()
        for fig in RECORD_FIGURES:
            (sweep_dir / fig).unlink(missing_ok=True)
    return doc


def unpack(sweep_dir: Path) -> list[str]:
    """Extract raw.tar.xz into its sweep directory after checking it against raw.json; the members
    extracted. Refuses (one line) a missing or damaged archive and a member already there."""
    sweep_dir = Path(sweep_dir)
    doc, path = read_json(sweep_dir / RAW_JSON), sweep_dir / RAW
    if not path.is_file() or not isinstance(doc, dict):
        raise SweepError(f"{sweep_dir}: no {RAW} with its {RAW_JSON}; nothing to unpack")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != doc.get("sha256") or len(data) != doc.get("bytes"):
        raise SweepError(
            f"{path}: not the archive {RAW_JSON} describes (size or sha256 differ): damaged or replaced"
        )
    members = [str(m) for m in doc.get("members") or []]
    there = [m for m in members if (sweep_dir / m).exists()]
    if there:
        raise SweepError(
            f"{sweep_dir}: {', '.join(there)} already there; nothing unpacked (remove it to unpack again)"
        )
    with writing(sweep_dir), tarfile.open(fileobj=io.BytesIO(data), mode="r:xz") as tar:
        _check_members(tar, path, doc, sweep_dir)
        tar.extractall(sweep_dir, filter="data")
    return members


def _check_members(tar: tarfile.TarFile, path: Path, doc: dict, sweep_dir: Path) -> None:
    """Before anything is extracted: every member passes tarfile's "data" filter (inside
    ``sweep_dir``: no absolute path, no path or link leading out, no device file), the archive holds
    a sweep's raw records only, and exactly the members and file count raw.json lists; else one line."""
    entries = tar.getmembers()
    for entry in entries:
        try:
            tarfile.data_filter(entry, str(sweep_dir))
        except tarfile.FilterError as e:
            raise SweepError(f"{path}: {e}; nothing unpacked") from None  # e names the member
    names = {e.name.split("/", 1)[0] for e in entries}
    if not names <= set(MEMBERS):
        raise SweepError(
            f"{path}: holds {', '.join(sorted(names - set(MEMBERS)))}, not a sweep's raw records"
        )
    listed, files = {str(m) for m in doc.get("members") or []}, sum(e.isfile() for e in entries)
    if names != listed or files != doc.get("files", files):
        raise SweepError(
            f"{path}: does not match {RAW_JSON} (the archive holds {', '.join(sorted(names)) or 'nothing'} "
            f"in {files} files; {RAW_JSON} lists {', '.join(sorted(listed)) or 'nothing'} in "
            f"{doc.get('files')} files); nothing unpacked"
        )


def unpacked_copy(sweep_dir: Path, dest: Path, sweep_json: bool = True) -> Path:
    """``dest`` holding a copy of a packed sweep's archive, raw.json and (``sweep_json``) its
    sweep.json, unpacked: what `bench report` rebuilds the sweep from, away from its published face."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in (RAW, RAW_JSON, *(("sweep.json",) if sweep_json else ())):
        if (Path(sweep_dir) / name).exists():
            shutil.copyfile(Path(sweep_dir) / name, dest / name)
    unpack(dest)
    return dest


def packed(sweep_dir: Path) -> bool:
    """Whether the sweep's raw records are in its archive (not unpacked)."""
    return (Path(sweep_dir) / RAW).is_file() and not (Path(sweep_dir) / "runs").exists()


def refuse_packed(sweep_dir: Path) -> None:
    """One line (SweepError) for `bench report` on a sweep whose records are still in their archive."""
    if packed(sweep_dir):
        raise SweepError(
            f"{sweep_dir}: its raw records are packed in {RAW}; `python -m bench raw unpack {sweep_dir}` first"
        )


def add_raw_parser(sub) -> None:
    p = sub.add_parser(
        "raw", help=f"pack a sweep's raw records into {RAW} (a committed sweep), or unpack them"
    )
    p.add_argument(
        "action", choices=["pack", "unpack"], help=f"pack: runs/ and the rest into {RAW}; unpack: back"
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="sweep output directories")


def run_raw(action: str, dirs: list[str], commit) -> int:
    """`bench raw pack|unpack DIR...`; ``commit``: a callable giving this checkout's commit (raw.json)."""
    for d in dirs:
        if action == "pack":
            doc = pack(Path(d), commit())
            print(f"{d}: {', '.join(doc['members'])} -> {RAW} ({doc['files']} files, {doc['bytes']} bytes)")
        else:
            print(f"{d}: unpacked {', '.join(unpack(Path(d)))}; `python -m bench report {d}` rebuilds it")
    return 0
