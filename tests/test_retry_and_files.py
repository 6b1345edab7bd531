"""Numbers nobody can corrupt (issue 19): --retry-failed re-runs failed rounds whole, the staging
of an interrupted cache preparation is removed, and result files honour the umask."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bench.__main__ import main
from bench.config import plan
from bench.fileio import atomic_write_json, read_json
from bench.run import caches
from bench.run.sweepdir import cache_dir_for
from bench.trainers import load_config, plug_for
from specforge.runfiles import write_json_atomic
from tests.test_driver import fakes, statuses, sweep_file, train_configs  # noqa: F401

CELL = "tiny_online_bs1_s32"


def files_of(out: Path, run_ids: list[str]) -> dict[str, tuple[bytes, int]]:
    """Every file of these runs: (content, mtime in ns)."""
    return {
        str(p.relative_to(out)): (p.read_bytes(), p.stat().st_mtime_ns)
        for rid in run_ids
        for p in sorted((out / "runs" / rid).rglob("*"))
        if p.is_file()
    }


# ---------------------------------------------------------------- --retry-failed


@pytest.fixture
def failed_sweep(tmp_path, fakes, monkeypatch, capsys):  # noqa: F811
    """3 rounds of baseline, aa and liger (skipped here: no GPU); aa of round 2 crashed."""
    tc = train_configs(tmp_path)
    cells = [{"config": tc["online"], "batch_size": 1, "seq_len": 32}]
    cfg = sweep_file(tmp_path, cells, arms=["baseline", "aa", "liger"], repeats=3)
    out = tmp_path / "out"
    monkeypatch.setenv("FAKE_FAIL_RUNS", f"{CELL}_aa_r2")
    assert main(["sweep", str(cfg), "--out", str(out)]) == 1
    monkeypatch.delenv("FAKE_FAIL_RUNS")  # the failure was transient
    capsys.readouterr()
    return cfg, out


def test_resume_alone_cannot_recover_a_failed_run(failed_sweep, capsys):
    cfg, out = failed_sweep
    assert statuses(out)[f"{CELL}_aa_r2"]["status"] == "error"
    assert main(["sweep", str(cfg), "--out", str(out), "--resume"]) == 1
    out_text, err = capsys.readouterr()
    assert "9 of 9 runs already finished" in out_text
    assert statuses(out)[f"{CELL}_aa_r2"]["status"] == "error"
    # issue 27: the way out is named, on the first line and on the last
    assert "1 round(s) hold a run that failed: --retry-failed re-runs them" in out_text
    assert "re-run their rounds with --retry-failed" in err


def test_a_dry_run_resume_refuses_a_changed_config_like_the_real_one(failed_sweep, capsys):
    """Issue 27: --dry-run --resume marked every run finished where --resume refuses."""
    cfg, out = failed_sweep
    cfg.write_text(cfg.read_text().replace("repeats: 3", "repeats: 4"))
    for flags in (["--resume"], ["--resume", "--dry-run"]):
        assert main(["sweep", str(cfg), "--out", str(out), *flags]) == 2
        got, err = capsys.readouterr()
        assert err.startswith(f"error: --resume: {out} was run with a different config (repeats differ)"), err
        assert "finished" not in got


def test_retry_failed_reruns_the_failed_round_whole_and_keeps_the_rest(failed_sweep, capsys):
    cfg, out = failed_sweep
    kept = [f"{CELL}_{arm}_r{i}" for i in (1, 3) for arm in ("baseline", "aa", "liger")]
    before = files_of(out, kept)
    first_base_r2 = read_json(out / "runs" / f"{CELL}_baseline_r2" / "launch.json")["start_time"]
    # a dry run says what it would re-run and writes nothing
    assert main(["sweep", str(cfg), "--out", str(out), "--retry-failed", "--dry-run"]) == 0
    printed = capsys.readouterr().out
    assert "would re-run 1 round(s) whole, 3 runs" in printed and f"{CELL} r2 (aa error)" in printed
    assert statuses(out)[f"{CELL}_aa_r2"]["status"] == "error"

    assert main(["sweep", str(cfg), "--out", str(out), "--retry-failed"]) == 0
    printed = capsys.readouterr().out
    assert "re-running 1 round(s) whole, 3 runs" in printed and "6 of 9 runs already finished" in printed
    runs = statuses(out)
    assert len(runs) == 9
    assert {rid: d["status"] for rid, d in runs.items() if "_liger_" not in rid} == {
        rid: "ok" for rid in runs if "_liger_" not in rid
    }
    assert all(d["status"] == "skipped" for rid, d in runs.items() if "_liger_" in rid)  # never retried
    assert files_of(out, kept) == before  # the other rounds' runs: untouched, same bytes and mtimes
    # the whole round ran again, its arms back to back, after every kept run
    launches = {a: read_json(out / "runs" / f"{CELL}_{a}_r2" / "launch.json") for a in ("baseline", "aa")}
    assert launches["baseline"]["start_time"] >= first_base_r2
    last_kept = max(
        read_json(out / "runs" / rid / "launch.json")["end_time"] for rid in kept if "liger" not in rid
    )
    assert launches["baseline"]["start_time"] >= last_kept
    assert launches["aa"]["start_time"] >= launches["baseline"]["end_time"]
    lines = (out / "runs.csv").read_text().splitlines()[1:]
    assert len(lines) == 9 and all(ln.endswith((",ok", ",skipped")) for ln in lines)
    retried = read_json(out / "sweep.json")["resumes"][-1]["retried"]
    assert [(r["cell_id"], r["repeat"]) for r in retried] == [(CELL, 2)]
    assert retried[0]["runs"][f"{CELL}_aa_r2"]["status"] == "error"
    assert "FAKE_FAIL_RUNS" in retried[0]["runs"][f"{CELL}_aa_r2"]["reason"]
    # nothing failed any more: a second retry runs nothing
    assert main(["sweep", str(cfg), "--out", str(out), "--retry-failed"]) == 0
    assert "nothing to re-run" in capsys.readouterr().out


def test_retry_failed_refuses_force(failed_sweep, capsys):
    cfg, out = failed_sweep
    assert main(["sweep", str(cfg), "--out", str(out), "--retry-failed", "--force"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--retry-failed" in err
    assert statuses(out)[f"{CELL}_aa_r2"]["status"] == "error"
    with pytest.raises(SystemExit):  # the capacity search has no such flag: its OOMs are answers
        main(["capacity", str(cfg), "--out", str(out), "--retry-failed"])


# ---------------------------------------------------------------- staging of an interrupted prepare


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_stale_staging_goes_on_the_next_start_and_on_force(tmp_path, fakes, capsys):  # noqa: F811
    tc = train_configs(tmp_path)
    cfg_path = sweep_file(tmp_path, [{"config": tc["offline"], "batch_size": 1, "seq_len": 32}])
    out = tmp_path / "out"
    assert main(["sweep", str(cfg_path), "--out", str(out)]) == 0
    cdir = cache_dir_for(out, load_config(cfg_path).cells[0])
    assert (cdir / "meta.json").exists()
    root = cdir.parent

    def staging(pid: int, key: str = cdir.name) -> Path:
        d = root / f".{key}.prepare-{pid}-0123abcd"
        d.mkdir()
        (d / "shard-0.safetensors").write_bytes(b"\0" * 4096)  # GBs for a 4B cache
        return d

    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "prepare"])
    try:
        stale, other_key, running = staging(dead_pid()), staging(dead_pid(), "tiny_s64_x"), staging(live.pid)
        unrelated = root / ".notes.prepare-x"  # not a staging name: not ours to judge
        unrelated.mkdir()
        assert main(["sweep", str(cfg_path), "--out", str(out), "--resume"]) == 0
        printed = capsys.readouterr().out
        assert not stale.exists() and not other_key.exists() and "interrupted cache preparation" in printed
        assert running.exists() and f"process {live.pid}) is still running" in printed
        assert unrelated.exists() and (cdir / "meta.json").exists()
    finally:
        live.kill()
        live.wait()
    again = staging(dead_pid())
    assert main(["sweep", str(cfg_path), "--out", str(out), "--force"]) == 0
    assert not again.exists() and not running.exists()  # its process is gone now
    assert (cdir / "meta.json").exists()  # --force keeps the cache itself


def test_an_interrupted_prepare_leaves_no_staging(tmp_path, fakes, monkeypatch):  # noqa: F811
    """Ctrl-C while the prepare runs: the driver kills its group (it cannot clean up after itself)
    and removes the staging directory it named after its pid."""
    tc = train_configs(tmp_path)
    cfg = load_config(sweep_file(tmp_path, [{"config": tc["offline"], "batch_size": 1, "seq_len": 32}]))
    out = tmp_path / "out"
    cell = cfg.cells[0]
    cdir = cache_dir_for(out, cell)
    seen = []

    def interrupted(argv, log, launch, timeout_s):
        d = cdir.parent / f".{cdir.name}.prepare-{dead_pid()}-89abcdef"
        d.mkdir(parents=True)
        seen.append(d)
        raise KeyboardInterrupt

    monkeypatch.setattr(caches, "run_process", interrupted)
    with pytest.raises(KeyboardInterrupt):
        caches.prepare_caches(cfg, plug_for(cfg), out, plan(cfg))
    assert seen and not seen[0].exists() and not list(cdir.parent.glob(".*.prepare-*"))


# ---------------------------------------------------------------- file modes


@pytest.fixture
def umask():
    old = os.umask(0o022)
    yield os.umask
    os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(
    ("mask", "expected"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)], ids=["022", "077", "002"]
)
def test_atomic_writes_honour_the_umask(tmp_path, umask, mask, expected):
    umask(mask)
    atomic_write_json(tmp_path / "bench.json", {"a": 1})
    write_json_atomic(tmp_path / "trainer.json", {"a": 1})  # specforge's own writer
    atomic_write_json(tmp_path / "bench.json", {"a": 2})  # a replaced file too
    assert mode(tmp_path / "bench.json") == expected and mode(tmp_path / "trainer.json") == expected
    assert read_json(tmp_path / "bench.json") == {"a": 2}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bench.json", "trainer.json"]  # no temp left


def test_a_sweeps_files_are_readable_by_others_under_umask_022(tmp_path, fakes, umask):  # noqa: F811
    tc = train_configs(tmp_path)
    cfg = sweep_file(tmp_path, [{"config": tc["online"], "batch_size": 1, "seq_len": 32}])
    out = tmp_path / "out"
    assert main(["sweep", str(cfg), "--out", str(out)]) == 0
    rdir = out / "runs" / f"{CELL}_baseline_r1"
    for path in (out / "sweep.json", out / "report.md", rdir / "cell.json", rdir / "launch.json"):
        assert mode(path) == 0o644, path  # the driver's
    for path in (rdir / "run.json", rdir / "metrics.jsonl"):
        assert mode(path) & 0o044 == 0o044, path  # the trainer's: group and others may read
