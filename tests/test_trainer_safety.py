"""The trainer's promise on bad input: one line on stderr (``error: ...``), exit status 2, no
traceback, and nothing written or deleted. Also the offline cache's integrity (sizes and
checksums in meta.json), crash-safe cache and run.json writes, and ``check``.

In-process calls of ``specforge.__main__.main`` keep this fast; the tiny profile on the CPU.
"""

import hashlib
import json
import os
import shutil
import subprocess
import sys

import pytest

from specforge import data as data_mod
from specforge import runfiles
from specforge import target as target_mod
from specforge.__main__ import main
from tests.helpers import CONFIGS, REPO

OFFLINE = str(CONFIGS / "train/tiny-offline.yaml")
ONLINE = str(CONFIGS / "train/tiny-online.yaml")
QUICK = ["--set", "training.steps=1"]


def snapshot(root) -> dict:
    """Every file under root (names included) and its bytes: equal snapshots = nothing touched."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))
    }


def refused(capsys, needle: str, *argv: str) -> str:
    """Run the CLI in process; assert exit 2 with exactly one ``error:`` line containing needle."""
    rc = main(list(argv))
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
    assert needle in lines[0], lines[0]
    return lines[0]


def finished_run(path):
    path.mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({"status": "ok"}) + "\n")
    (path / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": 1.0}) + "\n")
    (path / "cell.json").write_text("{}\n")  # the driver's, next to the trainer's files


def copy_cache(src, dst):
    shutil.copytree(src, dst)
    return dst


# ---------------------------------------------------------------- 1. validate before --force deletes


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--use-liger-kernel"], "model.use_liger_kernel: Liger's Triton kernels need a CUDA or ROCm GPU"),
        (["--set", "model.attention_backend=flex_attention"], "model.attention_backend: flex_attention"),
        (["--set", "training.device=cuda"], "training.device: cuda requested"),
        (
            ["--set", "model.compile_layers=true"],
            "model.compile_layers: compiling the draft's layers is a GPU arm",
        ),
        (
            ["--set", "model.liger_fused_linear_ce=true"],
            "model.liger_fused_linear_ce: Liger's fused linear cross-entropy is a Triton kernel",
        ),
        (["--set", "training.lr=nan"], "training.lr: expected a finite number"),
        (["--set", "training.batch_size=64"], "training.batch_size: 64 is more than the 32 samples"),
        (["--set", "data.seq_len=64"], "holds seq_len=128"),
    ],
)
def test_force_keeps_the_finished_run_when_refused(tmp_path, tiny_cache, capsys, extra, needle):
    out = tmp_path / "run"
    finished_run(out)
    before = snapshot(out)
    sets = ["--set", f"data.cache_dir={tiny_cache}", "--set", "training.device=cpu"]
    refused(capsys, needle, "train", OFFLINE, *sets, *extra, "--output-dir", str(out), "--force")
    assert snapshot(out) == before


def test_force_keeps_the_finished_run_when_the_cache_is_bad(tmp_path, tiny_cache, capsys):
    out = tmp_path / "run"
    finished_run(out)
    before = snapshot(out)
    bad = copy_cache(tiny_cache, tmp_path / "cache")
    (bad / "meta.json").write_text("{not json")
    refused(
        capsys,
        "meta.json is not valid JSON",
        "train",
        OFFLINE,
        "--set",
        f"data.cache_dir={bad}",
        "--output-dir",
        str(out),
        "--force",
    )
    assert snapshot(out) == before


def test_force_replaces_only_the_run_files(tmp_path, tiny_cache, capsys):
    out = tmp_path / "run"
    finished_run(out)
    args = ["train", OFFLINE, *QUICK, "--set", f"data.cache_dir={tiny_cache}", "--output-dir", str(out)]
    refused(capsys, "already holds a run (run.json", *args)
    assert main([*args, "--force"]) == 0
    capsys.readouterr()
    assert (out / "cell.json").read_text() == "{}\n"
    assert json.loads((out / "run.json").read_text())["status"] == "ok"
    assert [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()] == [1]
    names = sorted(p.name for p in out.iterdir())
    assert names == ["cell.json", "metrics.jsonl", "run.json"]  # nothing left set aside


# ---------------------------------------------------------------- 2. refusals before the run files exist


@pytest.mark.parametrize(
    "config, extra, needle",
    [
        (OFFLINE, ["training.batch_size=100000"], "training.batch_size: must be at most 65536"),
        (OFFLINE, ["training.batch_size=33"], "training.batch_size: 33 is more than the 32 samples per rank"),
        (ONLINE, ["training.batch_size=33"], "training.batch_size: 33 is more than the 32 samples"),
        (ONLINE, ["data.num_samples=1"], "training.batch_size: 2 is more than the 1 samples"),
        (OFFLINE, ["training.steps=" + "9" * 30], "training.steps: must be at most"),
    ],
)
def test_refused_before_any_file_exists(tmp_path, tiny_cache, capsys, monkeypatch, config, extra, needle):
    started = []
    monkeypatch.setattr(runfiles.RunFiles, "start", lambda self, record: started.append(self))
    out = tmp_path / "new" / "run"
    sets = [a for s in [f"data.cache_dir={tiny_cache}", *extra] for a in ("--set", s)]
    refused(capsys, needle, "train", config, *sets, "--output-dir", str(out))
    assert not started and not (tmp_path / "new").exists()  # refused, not written and taken back


def test_refusal_found_while_running_takes_back_only_its_own_files(tmp_path, capsys, monkeypatch):
    """A ConfigError raised after run.json exists (a pretrained target that fails to load):
    the files this run created go, the directory's other files stay."""

    def fails(*a, **k):
        raise target_mod.ConfigError("target.path: cannot load a model from 'x' (broken)")

    monkeypatch.setattr(target_mod, "build_target", fails)
    out = tmp_path / "run"
    out.mkdir()
    (out / "cell.json").write_text("{}\n")
    refused(capsys, "target.path: cannot load", "train", ONLINE, *QUICK, "--output-dir", str(out))
    assert sorted(p.name for p in out.iterdir()) == ["cell.json"]
    fresh = tmp_path / "a" / "b"
    refused(capsys, "target.path: cannot load", "train", ONLINE, *QUICK, "--output-dir", str(fresh))
    assert not (tmp_path / "a").exists()  # the directories it made are gone too
    done = tmp_path / "done"
    finished_run(done)
    before = snapshot(done)
    refused(capsys, "target.path: cannot load", "train", ONLINE, *QUICK, "--output-dir", str(done), "--force")
    assert snapshot(done) == before  # what --force set aside is back


# ---------------------------------------------------------------- 3. prepare's output directory

PREP = ["--set", "data.num_samples=4", "--hidden-states", "random"]


def prepare(out, *extra):
    return main(["prepare", OFFLINE, *PREP, *extra, "--output-dir", str(out)])


def test_prepare_refuses_a_directory_that_is_not_a_cache(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    (out / "head.safetensors").write_text("not ours either")
    before = snapshot(tmp_path)
    for force in ([], ["--force"]):
        assert prepare(out, *force) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is not empty and is not a cache (no meta.json)" in err
        assert snapshot(tmp_path) == before


def test_prepare_force_replaces_only_a_cache(tmp_path, capsys):
    out = tmp_path / "cache"
    assert (
        main(
            [
                "prepare",
                OFFLINE,
                "--set",
                "data.num_samples=6",
                "--hidden-states",
                "random",
                "--output-dir",
                str(out),
            ]
        )
        == 0
    )
    refused(capsys, "already holds a cache (use --force", "prepare", OFFLINE, *PREP, "--output-dir", str(out))
    old_meta = json.loads((out / "meta.json").read_text())
    assert prepare(out, "--set", "data.seed=1", "--force") == 0
    meta = json.loads((out / "meta.json").read_text())
    assert meta["num_samples"] == 4 and meta["files"] != old_meta["files"]
    names = sorted(p.name for p in out.iterdir())
    assert names == ["head.safetensors", "meta.json"] + [f"sample_{i:06d}.safetensors" for i in range(4)]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache"]  # no temporary siblings left
    (out / "notes.txt").write_text("not the cache's")
    before = snapshot(tmp_path)
    line = refused(
        capsys,
        "holds 'notes.txt', which is not part of a cache",
        "prepare",
        OFFLINE,
        *PREP,
        "--output-dir",
        str(out),
        "--force",
    )
    assert "move it away" in line and snapshot(tmp_path) == before


def test_prepare_into_an_empty_directory(tmp_path, capsys):
    out = tmp_path / "empty"
    out.mkdir()
    assert prepare(out) == 0
    assert (out / "meta.json").is_file()


def test_killed_prepare_leaves_no_cache_that_looks_finished(tmp_path, capsys, monkeypatch):
    out = tmp_path / "cache"
    real = data_mod.write_cache_sample

    def dies(cache_dir, i, *a):
        assert not out.exists()  # written beside the target, never into it
        if i == 2:
            raise KeyboardInterrupt
        return real(cache_dir, i, *a)

    monkeypatch.setattr(data_mod, "write_cache_sample", dies)
    with pytest.raises(KeyboardInterrupt):
        prepare(out)
    assert list(tmp_path.iterdir()) == []  # neither the cache nor its temporary directory


def test_prepare_force_rebuilds_a_damaged_cache(tmp_path, capsys):
    out = tmp_path / "cache"
    assert prepare(out) == 0
    (out / "meta.json").write_text("{")
    (out / "sample_000001.safetensors").unlink()
    assert prepare(out, "--force") == 0
    data_mod.verify_cache(out, data_mod.read_cache_meta(out))


# ---------------------------------------------------------------- 4. output paths


@pytest.mark.parametrize("command", ["train", "prepare"])
def test_bad_output_paths(tmp_path, tiny_cache, capsys, command, monkeypatch):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    sets = ["--set", f"data.cache_dir={tiny_cache}"] if command == "train" else PREP
    before = snapshot(tmp_path)
    for path, needle in (
        ("", "--output-dir: empty path"),
        ("  ", "--output-dir: empty path"),
        (str(a_file), f"--output-dir: {a_file} exists and is not a directory"),
        (str(a_file / "sub"), f"cannot be created: {a_file} is not a directory"),
    ):
        refused(capsys, needle, command, OFFLINE, *sets, "--output-dir", path)
    assert snapshot(tmp_path) == before
    real_access = os.access
    ro = tmp_path / "ro"
    ro.mkdir()
    monkeypatch.setattr(runfiles.os, "access", lambda p, m: False if str(p) == str(ro) else real_access(p, m))
    refused(
        capsys,
        f"cannot be written: {ro} is not writable",
        command,
        OFFLINE,
        *sets,
        "--output-dir",
        str(ro / "out"),
    )
    assert list(ro.iterdir()) == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_unwritable_directory_for_real(tmp_path, tiny_cache, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        refused(
            capsys,
            "is not writable",
            "train",
            OFFLINE,
            "--set",
            f"data.cache_dir={tiny_cache}",
            "--output-dir",
            str(ro / "run"),
        )
        refused(capsys, "is not writable", "prepare", OFFLINE, *PREP, "--output-dir", str(ro / "c"))
    finally:
        ro.chmod(0o755)


def test_write_failure_at_creation_is_one_line(tmp_path, tiny_cache, capsys, monkeypatch):
    """A place that passes the checks but fails when written (a race, a full disk): still one
    line, exit 2, and what this run created is removed."""

    def denied(path, obj):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(runfiles, "write_json_atomic", denied)
    out = tmp_path / "new" / "run"
    refused(
        capsys,
        "cannot write",
        "train",
        OFFLINE,
        *QUICK,
        "--set",
        f"data.cache_dir={tiny_cache}",
        "--output-dir",
        str(out),
    )
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- 5. numbers, end to end


def test_nan_lr_is_refused_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "run"
    for bad in ("training.lr=nan", "training.lr=.inf", "training.max_grad_norm=nan"):
        refused(capsys, "expected a finite number", "train", ONLINE, "--set", bad, "--output-dir", str(out))
        refused(capsys, "expected a finite number", "check", ONLINE, "--set", bad)
    assert not out.exists()


# ---------------------------------------------------------------- 6. cache integrity


def test_prepare_records_sizes_and_checksums(tiny_cache):
    meta = json.loads((tiny_cache / "meta.json").read_text())
    assert meta["format"] == data_mod.CACHE_FORMAT
    names = {p.name for p in tiny_cache.iterdir()} - {"meta.json"}
    assert set(meta["files"]) == names
    for name, entry in meta["files"].items():
        data = (tiny_cache / name).read_bytes()
        assert entry["bytes"] == len(data)
        assert entry["blake2b"] == hashlib.blake2b(data).hexdigest()


def _truncate(p):
    p.write_bytes(p.read_bytes()[:-100])


def _flip_middle(p):
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))


def _meta(edit):
    def apply(cache):
        meta = json.loads((cache / "meta.json").read_text())
        edit(meta)
        (cache / "meta.json").write_text(json.dumps(meta))

    return apply


@pytest.mark.parametrize(
    "damage, needle",
    [
        (lambda c: _truncate(c / "sample_000003.safetensors"), "sample_000003.safetensors holds"),
        (lambda c: _truncate(c / "head.safetensors"), "head.safetensors holds"),
        (lambda c: _flip_middle(c / "sample_000007.safetensors"), "sample_000007.safetensors does not match"),
        (lambda c: (c / "sample_000010.safetensors").unlink(), "sample_000010.safetensors is missing"),
        (lambda c: (c / "meta.json").write_text("{"), "meta.json is not valid JSON"),
        (lambda c: (c / "meta.json").write_text("[]"), "meta.json is not a format-2 cache's meta.json"),
        (_meta(lambda m: m.update(format=1) or m.pop("files")), "a cache from an older specforge (format 1"),
        (_meta(lambda m: m.pop("files")), "meta.json has a missing or malformed 'files'"),
        (_meta(lambda m: m["files"].pop("sample_000004.safetensors")), "does not list sample_000004"),
        (_meta(lambda m: m.update(vocab_size=1000)), "vocab_size=1000"),
    ],
)
def test_damaged_cache_is_one_line_naming_the_file(tmp_path, tiny_cache, capsys, damage, needle):
    cache = copy_cache(tiny_cache, tmp_path / "cache")
    damage(cache)
    out = tmp_path / "run"
    line = refused(
        capsys, needle, "train", OFFLINE, "--set", f"data.cache_dir={cache}", "--output-dir", str(out)
    )
    assert not out.exists()
    if "vocab_size" not in needle:
        assert f"--output-dir {cache} --force" in line and f"delete {cache}" in line


# ---------------------------------------------------------------- 7. check


def test_check_is_silent_and_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for argv in (
        ["check", OFFLINE, "--set", "data.cache_dir=not/prepared/yet"],  # the cache comes later
        ["check", OFFLINE, "--mode", "prepare"],
        ["check", ONLINE, "--use-liger-kernel", "--set", "model.attention_backend=flex_attention"],
        [
            "check",
            OFFLINE,
            "--set",
            "data.cache_dir=x",
            "--set",
            "training.batch_size=64",
        ],  # cache size unknown
    ):
        assert main(argv) == 0, capsys.readouterr().err
        assert capsys.readouterr() == ("", "")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["check", OFFLINE], "data.cache_dir: offline training needs a prepared cache"),
        (["check", ONLINE, "--set", "training.bogus=1"], "training.bogus: unknown key"),
        (["check", ONLINE, "--set", "training.steps=2.5"], "training.steps: expected an integer"),
        (["check", ONLINE, "--set", "training.batch_size=33"], "training.batch_size: 33 is more than"),
        (["check", ONLINE, "--set", "profile=nope"], "profile: unknown profile"),
        (
            ["check", ONLINE, "--set", "data.source=jsonl", "--set", "data.path=/no/such.jsonl"],
            "data.path: /no/such.jsonl does not exist",
        ),
        (
            ["check", OFFLINE, "--mode", "prepare", "--set", "data.source=jsonl", "--set", "data.path=/no/x"],
            "data.path: /no/x does not exist",
        ),
        (
            ["check", ONLINE, "--set", "target.init=pretrained", "--set", "target.path=/no/model"],
            "target.path: /no/model does not exist",
        ),
    ],
)
def test_check_refuses_like_train(tmp_path, capsys, monkeypatch, argv, needle):
    monkeypatch.chdir(tmp_path)
    refused(capsys, needle, *argv)
    assert list(tmp_path.iterdir()) == []


def test_check_verifies_an_existing_cache(tmp_path, tiny_cache, capsys):
    """With an existing cache as data.cache_dir, check also verifies it (the driver uses this to
    prepare a damaged or outdated cache again instead of failing every run)."""
    good = copy_cache(tiny_cache, tmp_path / "good")
    assert main(["check", OFFLINE, "--set", f"data.cache_dir={good}"]) == 0
    bad = copy_cache(tiny_cache, tmp_path / "bad")
    shard = bad / "sample_000001.safetensors"
    shard.write_bytes(shard.read_bytes()[:100])
    refused(capsys, f"{shard} holds 100 bytes", "check", OFFLINE, "--set", f"data.cache_dir={bad}")


@pytest.mark.parametrize(
    "argv",
    [
        ["check"],
        ["check", ONLINE, "--bogus"],
        ["train", ONLINE, "--set"],
        ["prepare", ONLINE, "--hidden-states", "x"],
    ],
)
def test_usage_errors_are_one_line(capsys, argv):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: ")


def test_check_imports_no_torch():
    argv = [sys.executable, "-X", "importtime", "-m", "specforge", "check", ONLINE]
    r = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout == ""
    modules = {line.split("|")[-1].strip().split(".")[0] for line in r.stderr.splitlines() if "|" in line}
    assert "specforge" in modules and not modules & {"torch", "numpy", "transformers", "safetensors"}


# ---------------------------------------------------------------- 8. run.json writes


def test_run_json_write_is_synced_and_leaves_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "run.json"
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(runfiles.os, "fsync", lambda fd: synced.append(fd) or real_fsync(fd))
    runfiles.write_json_atomic(path, {"status": "running"})
    assert synced and json.loads(path.read_text()) == {"status": "running"}

    def fail(*a):
        raise OSError(28, "No space left on device")

    for name in ("fsync", "replace"):
        monkeypatch.setattr(runfiles.os, name, fail)
        with pytest.raises(OSError):
            runfiles.write_json_atomic(path, {"status": "ok"})
        monkeypatch.undo()
        assert [p.name for p in tmp_path.iterdir()] == ["run.json"]  # the temp file is gone
        assert json.loads(path.read_text()) == {"status": "running"}  # the old file is intact
