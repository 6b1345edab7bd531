"""Torn or forged inputs refused in one line, never read silently: a summary.csv cut short (its
manifest.json disagrees) is skipped by `bench history` with its reason and refused by `bench
export`; `bench raw unpack` refuses an archive raw.json does not describe (other members, another
file count) and one with a member that would land outside the sweep directory, writing nothing;
`bench ab --out` and `bench sweep --out` with a control character are refused like a sweep's or an arm's name.

Each input is a committed sweep under results/ (copied) or a tiny hand-made one
(tests/test_record_integrity.py's write_sweep, as tests/test_export.py builds it), then damaged.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from bench.__main__ import main
from tests.helpers import CONFIGS, REPO


@pytest.fixture(autouse=True)
def _no_plots(no_plots):
    """Tables only (conftest's no_plots)."""


def cli(capsys, *args: str) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def one_line(err: str) -> str:
    """stderr's only line (the test fails naming what stderr held otherwise)."""
    lines = err.splitlines()
    assert len(lines) == 1, f"expected one line on stderr, got {lines!r}"
    return lines[0]


def files_under(path: Path) -> list[Path]:
    return sorted(p.relative_to(path) for p in path.rglob("*"))


def cut_last_row(path: Path, keep: int = 200) -> None:
    """The file's last row cut to its first ``keep`` characters (its newline gone with the rest)."""
    text = path.read_text()
    start = text.rstrip("\n").rfind("\n") + 1
    path.write_text(text[: start + keep])


def manifest_bytes(sweep: Path, name: str = "summary.csv") -> int:
    return json.loads((sweep / "manifest.json").read_text())["files"][name]["bytes"]


# --- bench history ---------------------------------------------------------------------------


@pytest.mark.parametrize("json_torn", [False, True], ids=["csv", "csv-and-json"])
def test_history_skips_a_sweep_whose_summary_csv_is_cut_short(tmp_path, capsys, json_torn):
    """A copy of results/h200 whose last summary.csv row is cut short: skipped with one line naming
    the file and its manifest's size, beside an intact sweep whose series are still shown."""
    torn = tmp_path / "h200"
    shutil.copytree(REPO / "results" / "h200", torn)
    whole = REPO / "results" / "h200-compile"
    assert (torn / "summary.csv").stat().st_size == manifest_bytes(torn)  # intact before the cut
    cut_last_row(torn / "summary.csv")
    if json_torn:
        (torn / "summary.json").write_text("{")
    size = (torn / "summary.csv").stat().st_size
    rc, out, err = cli(capsys, "history", torn, whole, "--format", "json")
    assert rc == 0, err
    line = one_line(err)
    assert line.startswith(f"skipped {torn / 'summary.csv'}: "), line
    assert f"{size} bytes, the manifest {manifest_bytes(torn)}" in line and "cut short" in line
    sweeps = {p["sweep"] for s in json.loads(out)["series"] for p in s["points"]}
    assert sweeps == {str(whole)}
    # alone, nothing is left to read: exit 2 and the same reason as the error line
    rc, out, err = cli(capsys, "history", torn)
    assert rc == 2 and out == ""
    line = one_line(err)
    assert line.startswith(f"error: {torn / 'summary.csv'}: ") and line.endswith("; no sweep left to read")


# --- bench export ----------------------------------------------------------------------------


def test_export_refuses_a_summary_csv_that_lost_its_end(tmp_path, capsys):
    """A reported sweep whose summary.csv lost its last 30 characters: exit 2, one line naming the
    file and its manifest's size, no tracker folder written."""
    from bench.results.report import build_report
    from tests.test_record_integrity import write_sweep

    sweep = write_sweep(tmp_path / "s", "liger", rounds=3)
    build_report(sweep)
    summary = sweep / "summary.csv"
    whole = summary.read_bytes()
    assert len(whole) == manifest_bytes(sweep)
    summary.write_bytes(whole[:-30])
    before = files_under(tmp_path)
    out_dir = tmp_path / "tb"
    rc, out, err = cli(capsys, "export", sweep, "--to", "tensorboard", "--out", out_dir)
    assert rc == 2 and out == ""
    line = one_line(err)
    assert line.startswith(f"error: {summary}: ") and "cut short" in line
    assert f"{len(whole) - 30} bytes, the manifest {len(whole)}" in line
    assert files_under(tmp_path) == before


# --- bench raw unpack ------------------------------------------------------------------------

PACKED = REPO / "results" / "h200-parity"  # an archive of runs/ alone: raw.json lists ["runs"]


def packed_copy(dst: Path) -> Path:
    dst.mkdir(parents=True)
    for name in ("raw.tar.xz", "raw.json"):
        shutil.copyfile(PACKED / name, dst / name)
    return dst


def edit_raw_json(sweep: Path, **keys) -> None:
    doc = json.loads((sweep / "raw.json").read_text())
    (sweep / "raw.json").write_text(json.dumps({**doc, **keys}))


@pytest.mark.parametrize(
    "keys",
    [{"members": ["runs", "pairs"]}, {"files": "one more"}],
    ids=["a-member-not-held", "another-file-count"],
)
def test_raw_unpack_refuses_an_archive_raw_json_does_not_describe(tmp_path, capsys, keys):
    """raw.json's sha256 and size match the archive, but not its members or file count: one line,
    exit 2, nothing unpacked. The same archive with raw.json as committed unpacks."""
    with tarfile.open(PACKED / "raw.tar.xz") as tar:  # what the archive holds, read here
        entries = tar.getmembers()
    held = sorted({e.name.split("/", 1)[0] for e in entries})
    files = sum(e.isfile() for e in entries)
    assert held == ["runs"]
    intact = packed_copy(tmp_path / "intact")
    rc, out, err = cli(capsys, "raw", "unpack", intact)
    assert rc == 0 and out.startswith(f"{intact}: unpacked runs;"), err
    assert sum(p.is_file() for p in (intact / "runs").rglob("*")) == files

    sweep = packed_copy(tmp_path / "forged")
    edit_raw_json(sweep, **{k: (files + 1 if v == "one more" else v) for k, v in keys.items()})
    rc, out, err = cli(capsys, "raw", "unpack", sweep)
    assert rc == 2 and out == ""
    line = one_line(err)
    assert line.startswith(f"error: {sweep / 'raw.tar.xz'}: does not match raw.json"), line
    assert files_under(sweep) == [Path("raw.json"), Path("raw.tar.xz")]


def test_raw_unpack_refuses_a_member_outside_the_sweep_and_writes_nothing(tmp_path, capsys):
    """An archive whose raw.json matches it (sha256, size, members, files) holding a plain member
    first and then ``runs/../../escaped.txt``: one line naming that member, exit 2, not even the
    plain member written."""
    evil = "runs/../../escaped.txt"
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, data in (("runs/r1/run.json", b"{}"), (evil, b"pwned")):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    sweep = packed_copy(tmp_path / "a" / "sweep")
    (sweep / "raw.tar.xz").write_bytes(data)
    edit_raw_json(sweep, bytes=len(data), sha256=hashlib.sha256(data).hexdigest(), members=["runs"], files=2)
    before = files_under(tmp_path)
    rc, out, err = cli(capsys, "raw", "unpack", sweep)
    assert rc == 2 and out == ""
    line = one_line(err)
    assert line.startswith(f"error: {sweep / 'raw.tar.xz'}: ") and repr(evil) in line, line
    assert files_under(tmp_path) == before  # neither escaped.txt nor runs/r1


# --- bench ab --out --------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["ab", "sweep"])
@pytest.mark.parametrize("name", ["x\n", "a\tb"], ids=["newline", "tab"])
def test_ab_and_sweep_refuse_an_out_with_a_control_character(tmp_path, capsys, name, command):
    """`bench ab|sweep --dry-run --out DIR` where DIR holds a control character: refused in one line
    naming --out and the path as typed (its escapes shown), exit 2, nothing written."""
    out = str(tmp_path / name)
    given = ["-c", CONFIGS / "train" / "tiny-offline.yaml"] if command == "ab" else [CONFIGS / "cpu.yaml"]
    rc, stdout, err = cli(capsys, command, *given, "--dry-run", "--out", out)
    assert rc == 2 and stdout == ""
    line = one_line(err)
    assert line.startswith(f"error: --out {out!r}: ") and "control character" in line, line
    assert files_under(tmp_path) == []
