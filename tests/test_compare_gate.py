"""The regression gate, `bench compare A B --fail-if-slower PCT`, on small sweeps written here:
its exit statuses (passed 0, failed 3, inconclusive 0, nothing decidable 2), its lines, its
column in compare.csv, and the threshold's edges taken from the very CI it judges."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from bench.__main__ import main
from bench.results.compare import compare
from bench.results.gate import EXIT_FAILED
from bench.results.tables import summary_table
from tests.helpers import run_cli

REF = {"baseline": [10.0, 10.1, 9.9, 10.0], "liger": [11.6, 11.7, 11.5, 11.6]}
NAME = "m4b offline bs2 seq2048 gpus1 arm"


def sweep(path: Path, values: dict[str, list[float | None]], runs_csv: bool = True) -> Path:
    """A sweep's summary.csv (and the runs.csv beside it): runs of one cell, per arm its samples/s
    in repeat order (None: a run that ran out of memory)."""
    rows = [
        {"run_id": f"c_{arm}_r{i}", "cell_id": "c", "profile": "m4b", "mode": "offline", "batch_size": 2,
         "seq_len": 2048, "gpus": 1, "arm": arm, "repeat": i, "status": "ok" if v else "oom",
         "samples_per_s": v, "s_per_step_mean": 2 / v if v else None, "peak_vram_gib": 30.0 if v else None,
         "arm_in_effect": "yes" if v else None}
        for arm, vs in values.items() for i, v in enumerate(vs, 1)
    ]  # fmt: skip
    path.mkdir(parents=True, exist_ok=True)
    runs = pd.DataFrame(rows)
    if runs_csv:
        runs.to_csv(path / "runs.csv", index=False)
    summary_table(runs).to_csv(path / "summary.csv", index=False)
    return path / "summary.csv"


def gate(capsys, a: Path, b: Path, *flags: str) -> tuple[int, list[str], str]:
    """main's exit status, the gate's lines on stdout (heading on), and stderr."""
    rc = main(["compare", str(a), str(b), *flags])
    out, err = capsys.readouterr()
    lines = out.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("Gate (")), len(lines))
    return rc, lines[start:], err


def test_b_as_fast_as_a_passes(tmp_path, capsys):
    a = sweep(tmp_path / "a", REF)
    b = sweep(tmp_path / "b", {"baseline": [9.9, 10.0, 10.1, 9.95], "liger": [11.7, 11.6, 11.5, 11.65]})
    rc, lines, err = gate(capsys, a, b, "--fail-if-slower", "5")
    assert rc == 0 and err == ""
    assert lines[0].startswith(
        "Gate (--fail-if-slower 5): a row fails when B is slower than A by more than 5%"
    )
    assert [line.split()[0] for line in lines[1:3]] == ["pass", "pass"]
    assert f"{NAME} baseline: " in lines[1] and "CI above -5%" in lines[1]
    assert lines[-1] == "gate: passed (2 rows within -5%)"


def test_b_slower_beyond_the_threshold_fails_with_exit_3(tmp_path, capsys):
    a = sweep(tmp_path / "a", REF)
    b = sweep(tmp_path / "b", {"baseline": [9.9, 10.0, 10.1, 9.95], "liger": [10.4, 10.5, 10.45, 10.4]})
    rc, lines, _ = gate(capsys, a, b, "--fail-if-slower", "5", "--out", str(tmp_path / "out"))
    assert rc == EXIT_FAILED == 3
    df = pd.read_csv(tmp_path / "out" / "compare.csv").set_index("arm")
    liger = df.loc["liger"]
    assert liger.samples_per_s_delta_pct_ci95_high < -5
    ci = f"[{liger.samples_per_s_delta_pct_ci95_low:+.1f}, {liger.samples_per_s_delta_pct_ci95_high:+.1f}]"
    assert lines[-1] == f"gate: FAILED: {NAME} liger B slower by {-liger.samples_per_s_delta_pct:.1f}% {ci}"
    assert lines[2].split()[0] == "FAILED" and lines[1].split()[0] == "pass"
    assert df["gate"].tolist() == ["pass", "fail"]  # the outcome per row, for plots and CI logs


def test_a_ci_across_the_threshold_is_inconclusive_and_does_not_fail(tmp_path, capsys):
    a = sweep(tmp_path / "a", REF)
    b = sweep(tmp_path / "b", {"baseline": [9.0, 10.0, 9.5, 9.5], "liger": [11.6, 11.7, 11.5, 11.6]})
    rc, lines, _ = gate(capsys, a, b, "--fail-if-slower", "5")
    assert rc == 0
    (row,) = [line for line in lines if f"{NAME} baseline" in line]
    assert row.split()[0] == "inconclusive" and row.endswith("the CI straddles -5%")
    assert lines[-1] == "gate: passed (1 row within -5%; 1 inconclusive)"
    rc, lines, _ = gate(capsys, a, b, "--fail-if-slower", "5", "--fail-if-inconclusive")
    assert rc == EXIT_FAILED and lines[-1] == "gate: FAILED (--fail-if-inconclusive): 1 inconclusive"


def test_the_threshold_is_judged_on_the_ci_itself(tmp_path, capsys):
    """One slower row, three thresholds read off its own CI [lo, hi]: below -hi fails, between
    the ends is inconclusive, past -lo passes."""
    a = sweep(tmp_path / "a", {"baseline": REF["baseline"]})
    b = sweep(tmp_path / "b", {"baseline": [9.2, 9.5, 9.0, 9.4]})
    row = compare(a, b).iloc[0]
    lo, hi = row.samples_per_s_delta_pct_ci95_low, row.samples_per_s_delta_pct_ci95_high
    assert lo < hi < 0
    for pct, rc, outcome in (
        (-hi - 0.2, 3, "FAILED"),
        (-(lo + hi) / 2, 0, "inconclusive"),
        (-lo + 0.2, 0, "pass"),
    ):
        got, lines, _ = gate(capsys, a, b, "--fail-if-slower", f"{pct:.3f}")
        assert (got, lines[1].split()[0]) == (rc, outcome), pct


def test_without_per_run_values_the_gate_cannot_decide(tmp_path, capsys):
    a = sweep(tmp_path / "a", REF)
    b = sweep(tmp_path / "b", {"baseline": [5.0, 5.0, 5.0], "liger": [5.0, 5.1, 5.0]}, runs_csv=False)
    rc, lines, err = gate(capsys, a, b, "--fail-if-slower", "5")
    assert rc == 2  # not a pass: the inputs cannot answer (even though B's means are half of A's)
    assert [line.split()[:2] for line in lines[1:]] == [["not", "decided"]] * 2
    assert "point estimate only: no per-run data for B (a summary.csv without its runs.csv)" in lines[1]
    assert (
        err.startswith(
            "error: gate: --fail-if-slower 5: cannot decide any row (2 not decided, e.g. m4b offline"
        )
        and err.count("\n") == 1
    )


def test_rows_the_gate_cannot_decide_are_listed_and_not_counted_as_passed(tmp_path, capsys):
    a = sweep(tmp_path / "a", {**REF, "liger": [11.6, 11.7]})  # two liger runs: too few for a CI
    b = sweep(tmp_path / "b", {"baseline": [10.0, 10.05, 9.95, 10.0], "liger": [11.6, 11.6, 11.7, 11.6]})
    rc, lines, _ = gate(capsys, a, b, "--fail-if-slower", "2")
    assert rc == 0 and lines[-1] == "gate: passed (1 row within -2%; 1 not decided)"
    assert lines[2].endswith(f"{NAME} liger: too few runs for a CI (2 vs 4; 3 a side)")
    rc, lines, _ = gate(capsys, a, b, "--fail-if-slower", "2", "--fail-if-inconclusive")
    assert rc == EXIT_FAILED and lines[-1] == "gate: FAILED (--fail-if-inconclusive): 1 not decided"


@pytest.mark.parametrize(
    ("flag", "limit", "why"),
    [
        ("--fail-if-slower", "5", "B has no ok run (A: 11.60 samples/s)"),
        ("--fail-if-gain-drops", "2", "B has no ok run of the arm (its gain in A: +16.0%)"),
    ],
)
def test_an_arm_that_b_no_longer_runs_fails_either_gate(tmp_path, capsys, flag, limit, why):
    """A measured Liger; B's Liger runs all ran out of memory: its speed and its gain are gone, not
    'not decided' beside a passing baseline."""
    a = sweep(tmp_path / "a", REF)
    b = sweep(tmp_path / "b", {"baseline": [10.0, 10.05, 9.95, 10.0], "liger": [None, None, None, None]})
    rc, lines, _ = gate(capsys, a, b, flag, limit)
    assert rc == EXIT_FAILED
    assert lines[-1] == f"gate: FAILED: {NAME} liger {why}"


def test_a_row_missing_from_b_is_not_decided_and_a_new_row_in_b_is_not_held(tmp_path, capsys):
    a = sweep(tmp_path / "a", REF)
    b = sweep(tmp_path / "b", {"baseline": [10.0, 10.05, 9.95, 10.0], "rmsnorm": [10.5, 10.6, 10.5, 10.4]})
    rc, lines, _ = gate(capsys, a, b, "--fail-if-slower", "5")
    assert rc == 0 and lines[-1] == "gate: passed (1 row within -5%; 1 not decided)"
    assert lines[2].endswith(f"{NAME} liger: only in A: B has no such row")
    assert not any("rmsnorm" in line for line in lines)


@pytest.mark.parametrize("value", ["abc", "-1", "100", "nan", "inf"])
def test_a_bad_threshold_is_one_line(tmp_path, capsys, value):
    a = sweep(tmp_path / "a", REF)
    rc, lines, err = gate(capsys, a, a, f"--fail-if-slower={value}")
    assert rc == 2 and lines == []
    assert (
        err
        == f"error: --fail-if-slower: {value!r} is not a percentage in [0, 100) (5 fails a row whose B is slower than A by more than 5%)\n"
    )


def test_fail_if_inconclusive_needs_a_threshold(tmp_path, capsys):
    a = sweep(tmp_path / "a", REF)
    rc, _, err = gate(capsys, a, a, "--fail-if-inconclusive")
    assert rc == 2 and err == (
        "error: --fail-if-inconclusive: needs --fail-if-slower PCT or --fail-if-gain-drops POINTS\n"
    )


def test_the_exit_status_reaches_the_shell(tmp_path):
    """Through `python -m bench`, as a CI job runs it: 3 on a regression."""
    a = sweep(tmp_path / "a", REF)
    b = sweep(tmp_path / "b", {"baseline": [8.0, 8.1, 7.9, 8.0], "liger": [11.6, 11.7, 11.5, 11.6]})
    failed = run_cli("bench", "compare", str(a), str(b), "--fail-if-slower", "5", timeout=120)
    assert failed.returncode == 3, failed.stderr
    assert failed.stdout.splitlines()[-1].startswith(f"gate: FAILED: {NAME} baseline B slower by 20.0% [")


def test_an_arm_that_fails_parity_fails_both_gates_however_fast_and_compare_csv_says_why(tmp_path, capsys):
    """B's Liger is as fast as A's but its training parity failed (a training_parity.csv beside its
    summary, as a parity sweep writes): no gate may pass it, and compare.csv carries each side's
    parity."""
    a = sweep(tmp_path / "a", REF)
    b = sweep(tmp_path / "b", {"baseline": [9.9, 10.0, 10.1, 9.95], "liger": [11.7, 11.6, 11.5, 11.65]})
    verdicts = {"loss": "not equivalent: steps 21-40, RMS |Δ| 0.3 > 0.01 allowed", "accuracy": "equivalent"}
    pd.DataFrame(
        [{"cell_id": "c", "arm": "liger", "metric": m, "verdict": v} for m, v in verdicts.items()]
    ).to_csv(tmp_path / "b" / "training_parity.csv", index=False)
    rc, lines, _ = gate(
        capsys, a, b, "--fail-if-slower", "5", "--fail-if-gain-drops", "2", "--out", str(tmp_path / "o")
    )
    assert rc == EXIT_FAILED
    failed = [line for line in lines if line.lstrip().startswith("FAILED")]
    assert len(failed) == 2 and all(
        f"{NAME} liger: B's arm fails parity (training parity" in x for x in failed
    )
    assert any(line.lstrip().startswith("pass") and f"{NAME} baseline" in line for line in lines)
    assert lines[-1].startswith(f"gate: FAILED: {NAME} liger B's arm fails parity")
    out = pd.read_csv(tmp_path / "o" / "compare.csv").set_index("arm")
    assert out.loc["liger", "parity_b"] == "FAIL: training parity not equivalent on loss"
    assert pd.isna(out.loc["liger", "parity_a"]) and pd.isna(out.loc["baseline", "parity_b"])


def test_the_floor_arms_are_yardsticks_not_arms_under_test():
    """aa_eps is made to drift (one ulp, carried by training): its loss parity failing is its job,
    not a finding that fails the sweep; a Liger arm failing it is one."""
    from bench.results.parity_gate import failures

    summary = pd.DataFrame(
        [
            {"cell_id": "c", "arm": "aa", "loss_parity": "FAIL in 1 of 1 pairs"},
            {"cell_id": "c", "arm": "aa_eps", "loss_parity": "FAIL in 1 of 1 pairs"},
            {"cell_id": "c", "arm": "liger", "loss_parity": "pass (1/1)"},
        ]
    )
    assert failures(summary) == {}
    summary.loc[2, "loss_parity"] = "FAIL in 1 of 1 pairs"
    assert list(failures(summary)) == [("c", "liger")]


def test_a_run_listed_twice_in_runs_csv_is_refused_in_one_line(tmp_path, capsys):
    """A repeated row would count a run twice: a narrower CI, perhaps a flipped gate."""
    a = sweep(tmp_path / "a", REF)
    sweep(tmp_path / "b", REF)
    runs = pd.read_csv(tmp_path / "b" / "runs.csv")
    pd.concat([runs, runs.iloc[[5]]]).to_csv(tmp_path / "b" / "runs.csv", index=False)
    rc = main(["compare", str(a), str(tmp_path / "b" / "runs.csv"), "--fail-if-slower", "5"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1
    assert err.startswith(f"error: {tmp_path / 'b' / 'runs.csv'}: line 10: run c_liger_r2 is listed again")
