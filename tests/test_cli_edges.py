"""Edges of the command line that used to fail without a word or with a traceback: a value
that is not YAML, a flag that would be ignored, and a terminal whose encoding lacks the
report's characters (Δ, →, ±)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.helpers import REPO, committed_sweep, run_cli

TINY = "configs/train/tiny-offline.yaml"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["training.lr=[1, 2"], "error: key=value: 'training.lr=[1, 2': the value is not YAML"),
        (["--set-sweep", "steps=[1"], "error: --set-sweep: 'steps=[1': the value is not YAML"),
        (["--python", "/some/python"], "error: --python /some/python: only --trainer specforge-cli runs in"),
        (["--out", ""], "error: --out: empty path; expected a directory"),
        (["--steps", "1"], "error: --steps 1: sequential pairs drop 1 warm-up step(s) by default"),
        (
            ["--trainer", "specforge-cli", "--steps", "3"],
            "error: --steps 3: lockstep pairs drop 3 warm-up step(s) by default, which leaves none",
        ),
        (
            ["--pairing", "sequential", "--set-sweep", "pairing=lockstep"],
            "error: --pairing sequential and --set-sweep pairing=lockstep disagree",
        ),
    ],
)
def test_bench_ab_refuses_in_one_line_what_it_cannot_use(args, says, tmp_path):
    out = [] if "--out" in args else ["--out", str(tmp_path / "o")]  # an --out given once
    r = run_cli("bench", "ab", "-c", TINY, *out, "--dry-run", *args, timeout=120)
    assert r.returncode == 2 and r.stderr.startswith(says) and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "o").exists()


def ab_doc(*argv: str) -> dict:
    import argparse

    from bench.run.ab import add_ab_parser, sweep_doc

    parser = argparse.ArgumentParser()
    add_ab_parser(parser.add_subparsers())
    return sweep_doc(parser.parse_args(["ab", "-c", TINY, *argv]))


@pytest.mark.parametrize(
    ("argv", "expected"),
    [  # docs/reference.md, bench ab: the pairing follows the trainer, what the user typed wins
        ([], {"pairing": None, "trainer_gc_freeze": None, "warmup_steps": 1}),
        (
            ["--trainer", "specforge-cli"],
            {"pairing": "lockstep", "trainer_gc_freeze": True, "warmup_steps": 3},
        ),
        (
            ["--trainer", "specforge-cli", "--pairing", "sequential"],
            {"pairing": "sequential", "trainer_gc_freeze": None, "warmup_steps": 1},
        ),
        (
            ["--trainer", "specforge-cli", "--warmup-steps", "2", "--set-sweep", "trainer_gc_freeze=false"],
            {"pairing": "lockstep", "trainer_gc_freeze": False, "warmup_steps": 2},
        ),
        (
            ["--trainer", "specforge-cli", "--set-sweep", "pairing=sequential"],
            {"pairing": "sequential", "trainer_gc_freeze": None, "warmup_steps": 1},
        ),
    ],
)
def test_bench_ab_pairs_in_lockstep_by_default_only_where_the_trainer_takes_turns(argv, expected):
    doc = ab_doc(*argv)
    assert {key: doc.get(key) for key in expected} == expected


def test_a_terminal_that_cannot_print_delta_gets_the_report_not_a_traceback(tmp_path):
    # its console prints "|Δ loss|" (loss parity fails there); read only: rebuilt in a copy
    sweep = committed_sweep("h200-specforge-verdict", tmp_path / "verdict")
    env = {**os.environ, "PYTHONIOENCODING": "latin-1"}
    r = subprocess.run(
        [sys.executable, "-m", "bench", "report", str(sweep)],
        cwd=REPO, env=env, capture_output=True, encoding="latin-1", timeout=300,
    )  # fmt: skip
    assert r.returncode == 4, r.stderr[-2000:]  # exit 4: its Liger arm fails loss parity
    assert "Traceback" not in r.stderr and "liger vs baseline: +9.3%" in r.stdout
    assert "(|? loss| at the last step up to 0.287" in r.stdout  # Δ, replaced


def test_usage_names_the_command_the_user_typed(tmp_path):
    """`bench` (the console script) says `usage: bench`, `python -m bench` says that."""
    bench = shutil.which("bench", path=os.path.dirname(sys.executable))
    assert bench, "the console script is installed beside this interpreter (make install)"
    r = subprocess.run([bench, "--help"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("usage: bench [-h]"), r.stdout[:200]
    r = run_cli("bench", "--help", timeout=120)
    assert r.stdout.startswith("usage: python -m bench [-h]"), r.stdout[:200]


def test_bench_ab_of_a_config_with_a_non_ascii_file_name_runs(tmp_path):
    """Its sweep name came from the file's stem and broke the name rule the user never wrote."""
    config = tmp_path / "débit-é.yaml"
    shutil.copyfile(REPO / TINY, config)
    r = run_cli("bench", "ab", "-c", str(config), "--out", str(tmp_path / "o"), "--dry-run", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "ab-d-bit-" in r.stdout + r.stderr


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--steps", "1", "--warmup-steps", "1"],
            "error: --warmup-steps: 1 leaves no steady-state steps; expected less than --steps (1)",
        ),
        (["--batch-size", "0"], "error: --batch-size: expected a value >= 1, got 0"),
        (["--min-pairs", "1"], "error: --min-pairs: expected a value >= 3, got 1"),
    ],
)
def test_bench_ab_errors_name_the_flag_typed_not_the_generated_file(args, says, tmp_path):
    """They named a temporary ab.yaml and its sweep keys (cells[0].batch_size), which the user never wrote."""
    r = run_cli("bench", "ab", "-c", TINY, "--out", str(tmp_path / "o"), "--dry-run", *args, timeout=120)
    assert r.returncode == 2 and r.stderr.strip() == says, r.stderr


@pytest.mark.parametrize("sweep_json", [None, '{"name": "x"}', "[1, 2]"])
def test_a_report_without_the_sweeps_config_says_what_it_cannot_know(sweep_json, tmp_path):
    """A missing or damaged sweep.json dropped the precision target from the verdict without a word."""
    sweep = committed_sweep("h200-specforge-verdict-learn", tmp_path / "s", sweep_json=False)
    if sweep_json is not None:
        (sweep / "sweep.json").write_text(sweep_json)
    r = subprocess.run(
        [sys.executable, "-m", "bench", "report", str(sweep)], cwd=REPO, capture_output=True, text=True,
        env={**os.environ, "BENCH_NO_PLOTS": "1"}, timeout=300,
    )  # fmt: skip
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "sweep.json: missing or holds no config" in r.stderr and "no precision targets" in r.stderr
