"""bench.results.compare on hand-written summary.csv / runs.csv files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.results.compare import COMPARE_COLUMNS, compare
from tests.helpers import REPO


def summary_csv(path: Path, rows: list[tuple], gpu: str, commit: str) -> Path:
    """rows: (profile, batch_size, arm, samples/s, peak VRAM GiB, Δ% vs baseline)."""
    df = pd.DataFrame(
        [
            {"profile": p, "mode": "offline", "batch_size": bs, "seq_len": 2048, "gpus": 1, "arm": arm,
             "samples_per_s_mean": sps, "s_per_step_mean": 8 / sps, "peak_vram_gib": vram,
             "delta_samples_per_s_pct": delta, "gpu_name": gpu, "git_commit": commit}
            for p, bs, arm, sps, vram, delta in rows
        ]
    )  # fmt: skip
    df.to_csv(path, index=False)
    return path


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    a = summary_csv(
        tmp_path / "a.csv",
        [("m4b", 2, "baseline", 10.0, 35.0, None), ("m4b", 2, "liger", 12.0, 30.0, 20.0),
         ("m1b", 4, "baseline", 5.0, 10.0, None)],
        "NVIDIA A100", "aaa111",
    )  # fmt: skip
    b = summary_csv(
        tmp_path / "b.csv",
        [("m4b", 2, "liger", 30.0, 29.0, 50.0), ("m4b", 2, "baseline", 20.0, 36.0, None),
         ("m8b", 1, "baseline", 3.0, 70.0, None)],
        "NVIDIA H200", "bbb222",
    )  # fmt: skip
    return a, b


def test_compare_ratios_and_one_sided_rows(pair, tmp_path, capsys):
    df = compare(*pair, out_dir=tmp_path / "out")
    assert list(df.columns) == COMPARE_COLUMNS
    both = df[df["present"] == "both"].set_index("arm")
    assert both.loc["baseline", "samples_per_s_ratio_b_over_a"] == pytest.approx(2.0)
    assert both.loc["liger", "samples_per_s_ratio_b_over_a"] == pytest.approx(2.5)
    assert both.loc["liger", "samples_per_s_delta_pct"] == pytest.approx(150.0)
    assert both.loc["baseline", "peak_vram_b_minus_a_gib"] == pytest.approx(1.0)
    assert both.loc["liger", ["delta_samples_per_s_pct_a", "delta_samples_per_s_pct_b"]].tolist() == [
        20.0,
        50.0,
    ]
    assert both.loc["liger", ["s_per_step_a", "s_per_step_b"]].tolist() == pytest.approx([8 / 12, 8 / 30])
    assert df.set_index("profile").loc["m1b", "present"] == "A only"
    assert df.set_index("profile").loc["m8b", "present"] == "B only"
    out = capsys.readouterr().out
    assert "NVIDIA A100" in out and "aaa111" in out and "NVIDIA H200" in out and "bbb222" in out
    assert "Only in A:\n  m1b offline bs4 seq2048 gpus1 arm baseline" in out
    assert "Only in B:\n  m8b offline bs1 seq2048 gpus1 arm baseline" in out
    assert "+150.0% point estimate" in out  # summaries alone: labelled, with no CI
    assert "A: point estimates (a summary.csv without its runs.csv) — no CI and no gate verdict" in out
    assert list(pd.read_csv(tmp_path / "out" / "compare.csv").columns) == COMPARE_COLUMNS
    assert (tmp_path / "out" / "compare.png").read_bytes().startswith(b"\x89PNG")


def test_compare_accepts_runs_csv(pair, tmp_path):
    runs = pd.DataFrame(
        [
            {"run_id": f"c_{arm}_r{i}", "cell_id": "c", "profile": "m4b", "mode": "offline", "batch_size": 2,
             "seq_len": 2048, "gpus": 1, "arm": arm, "repeat": i, "status": status, "samples_per_s": sps,
             "s_per_step_mean": 8 / sps, "peak_vram_gib": 35.0}
            for arm, i, status, sps in [("baseline", 0, "ok", 9.0), ("baseline", 1, "ok", 11.0),
                                        ("baseline", 2, "oom", 99.0), ("liger", 0, "ok", 12.0)]
        ]
    )  # fmt: skip
    runs.to_csv(tmp_path / "runs.csv", index=False)
    df = compare(tmp_path / "runs.csv", pair[1]).query("present == 'both'").set_index("arm")
    assert df.loc["baseline", "samples_per_s_a"] == pytest.approx(10.0)  # the oom run is left out
    assert df.loc["baseline", "samples_per_s_ratio_b_over_a"] == pytest.approx(2.0)
    # paired with the baseline run of the same repeat (r0: 9.0), not with the mean of all baselines
    assert df.loc["liger", "delta_samples_per_s_pct_a"] == pytest.approx(100 * (12.0 / 9.0 - 1))


def test_bad_inputs_raise_one_line_value_errors(pair, tmp_path):
    with pytest.raises(ValueError, match=r"missing\.csv: no such file"):
        compare(tmp_path / "missing.csv", pair[1])
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"profile": ["x"], "arm": ["baseline"]}).to_csv(bad, index=False)
    with pytest.raises(ValueError) as err:
        compare(pair[0], bad)
    msg = str(err.value)
    assert "bad.csv" in msg and "samples_per_s_mean" in msg and "batch_size" in msg and "\n" not in msg
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match=r"empty\.csv: not a readable CSV"):
        compare(empty, pair[1])


def _runs_csv(path: Path, values: dict[str, list[float]]) -> Path:
    rows = [
        {"run_id": f"c_{arm}_r{i}", "cell_id": "c", "profile": "m4b", "mode": "offline", "batch_size": 2,
         "seq_len": 2048, "gpus": 1, "arm": arm, "repeat": i, "status": "ok", "samples_per_s": v,
         "s_per_step_mean": 8 / v, "peak_vram_gib": 30.0, "arm_in_effect": "yes"}
        for arm, vs in values.items() for i, v in enumerate(vs, 1)
    ]  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def test_compare_gives_each_row_a_welch_interval_and_a_verdict(tmp_path):
    from scipy import stats as st

    a_base, b_base = [8.70, 8.75, 8.68, 8.72], [9.10, 9.18, 9.05, 9.12]
    a = _runs_csv(tmp_path / "a" / "runs.csv", {"baseline": a_base, "liger": [10.1, 10.12, 10.08]})
    b = _runs_csv(tmp_path / "b" / "runs.csv", {"baseline": b_base, "liger": [10.09, 10.13]})
    df = compare(a, b).set_index("arm")
    base = df.loc["baseline"]
    ci = st.ttest_ind(np.log(b_base), np.log(a_base), equal_var=False).confidence_interval(0.95)
    assert (base.samples_per_s_delta_pct_ci95_low, base.samples_per_s_delta_pct_ci95_high) == pytest.approx(
        (100 * np.expm1(ci.low), 100 * np.expm1(ci.high))
    )
    assert base.verdict == "B faster" and (base.n_runs_a, base.n_runs_b) == (4, 4)
    assert df.loc["liger", "verdict"].startswith("too few runs (3 vs 2)")
    # a summary.csv finds the runs.csv written beside it
    summary = tmp_path / "a" / "summary.csv"
    from bench.results.tables import summary_table

    summary_table(pd.read_csv(a)).to_csv(summary, index=False)
    assert compare(summary, b).set_index("arm").loc["baseline", "verdict"] == "B faster"


# ------------------------------------------------------------------ bad input: one line, exit 2


def _summary_of(tmp_path: Path) -> Path:
    """A sweep's summary.csv with the runs.csv beside it (4 runs a side, both arms)."""
    from bench.results.tables import summary_table

    runs = _runs_csv(
        tmp_path / "ok" / "runs.csv", {"baseline": [8.7, 8.8, 8.6, 8.7], "liger": [10.1, 10.2, 10.0, 10.1]}
    )
    summary_table(pd.read_csv(runs)).to_csv(tmp_path / "ok" / "summary.csv", index=False)
    return tmp_path / "ok" / "summary.csv"


def _edited(src: Path, dst: Path, row: int, column: str, value) -> Path:
    df = pd.read_csv(src).astype(object)
    df.loc[row, column] = value
    df.to_csv(dst, index=False)
    return dst


# name -> (the good sweep's file it edits, row, column, new value, what the error line says)
_EDITS = {
    "text for a number": ("summary.csv", 1, "samples_per_s_mean", "fast", "line 3: samples_per_s_mean 'fast' is not a finite number"),
    "infinite": ("summary.csv", 0, "peak_vram_gib", "inf", "line 2: peak_vram_gib 'inf' is not a finite number"),
    "not > 0": ("summary.csv", 0, "samples_per_s_mean", -3, "line 2: samples_per_s_mean -3 is not > 0"),
    "no batch size": ("summary.csv", 1, "batch_size", None, "line 3: no batch_size; it must be a number"),
    "no arm": ("summary.csv", 0, "arm", " ", "line 2: no arm; every row of a summary.csv names its arm"),
    "runs.csv: text samples/s": ("runs.csv", 2, "samples_per_s", "n/a?", "line 4: samples_per_s 'n/a?' is not a finite number"),
    "runs.csv: no status": ("runs.csv", 0, "status", None, "line 2: no status; every row of a runs.csv names its status"),
}  # fmt: skip


def _bad_input(tmp_path: Path, good: Path, case: str) -> tuple[Path, str]:
    """The bad file of ``case`` and what its one error line says after the path."""
    from bench.results.columns import LOSS_PARITY_COLUMNS

    if case in _EDITS:
        src, row, column, value, says = _EDITS[case]
        return _edited(good.parent / src, tmp_path / "bad.csv", row, column, value), says
    bad = tmp_path / "bad.csv"
    expected = "expected the summary.csv (or runs.csv) of a sweep's output directory"
    if case == "binary":
        bad.write_bytes(b"PK\x03\x04\x00\x00\x08\x00" + bytes(range(256)))
        return bad, f"a binary file, not a CSV; {expected}"
    if case == "not utf-8":
        bad.write_bytes("profile,arm\nm\xe9,baseline\n".encode("latin-1"))
        return bad, "not a readable CSV ('utf-8' codec can't decode byte 0xe9"
    if case == "empty":
        bad.write_text("")
        return bad, f"not a readable CSV (No columns to parse from file); {expected}"
    if case == "header only":
        bad.write_text(",".join(pd.read_csv(good).columns) + "\n")
        return bad, f"no rows (a header only); {expected}"
    if case == "ragged":
        bad.write_text('a,b\n1,2\n3,"4\n')
        return bad, "not a readable CSV ("
    if case == "directory":
        (tmp_path / "a_dir").mkdir()
        return tmp_path / "a_dir", "is a directory; expected a summary.csv or runs.csv (e.g. "
    if case == "another CSV":
        pd.DataFrame([dict.fromkeys(LOSS_PARITY_COLUMNS, 1)]).to_csv(bad, index=False)
        return bad, f"by its columns a loss_parity.csv, not a summary.csv; {expected}"
    if case == "wrong shape":
        pd.DataFrame({"profile": ["x"], "arm": ["baseline"]}).to_csv(bad, index=False)
        return (
            bad,
            "not a usable summary.csv; missing columns: mode, batch_size, seq_len, gpus, samples_per_s_mean",
        )
    assert case == "runs.csv short of a column"
    pd.read_csv(good.parent / "runs.csv").drop(columns=["samples_per_s"]).to_csv(bad, index=False)
    return bad, "not a usable runs.csv; missing columns: samples_per_s;"


BAD = [
    "binary", "not utf-8", "empty", "header only", "ragged", "directory", "another CSV", "wrong shape",
    "runs.csv short of a column", *_EDITS, "compare.csv",
]  # fmt: skip


@pytest.mark.parametrize("case", BAD)
def test_every_bad_input_is_one_error_line_and_exit_2(tmp_path, capsys, case):
    from bench.__main__ import main

    good = _summary_of(tmp_path)
    if case == "compare.csv":  # a comparison's own output given back as an input
        compare(good, good).to_csv(tmp_path / "compare.csv", index=False)
        path, says = (
            tmp_path / "compare.csv",
            "by its columns a compare.csv (`bench compare`'s output), not a summary.csv",
        )
    else:
        path, says = _bad_input(tmp_path, good, case)
    capsys.readouterr()
    for argv in (
        ["compare", str(path), str(good)],
        ["compare", str(good), str(path), "--fail-if-slower", "5"],
    ):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert err.startswith(f"error: {path}: {says}") and err.count("\n") == 1, err
        assert out == ""  # nothing printed (nor written) before the error


def test_out_naming_a_file_is_refused_before_anything_is_read(tmp_path, capsys):
    from bench.__main__ import main

    (tmp_path / "f").write_text("x")
    assert (
        main(
            [
                "compare",
                str(tmp_path / "missing.csv"),
                str(tmp_path / "missing.csv"),
                "--out",
                str(tmp_path / "f"),
            ]
        )
        == 2
    )
    assert (
        capsys.readouterr().err
        == f"error: --out {tmp_path / 'f'}: is a file; expected a directory for compare.csv and compare.png\n"
    )


DAMAGED_BESIDE = {
    "binary": "a binary file, not a CSV",
    "empty": "not a readable CSV",
    "a directory": "is a directory",
    "no samples/s column": "not a usable runs.csv; missing columns: samples_per_s",
    "text samples/s": "line 2: samples_per_s 'oops' is not a finite number",
}


@pytest.mark.parametrize("damage", [*DAMAGED_BESIDE, "another sweep's"])
def test_a_damaged_or_foreign_runs_csv_beside_a_summary_is_refused_naming_both_files(
    tmp_path, capsys, damage
):
    """Per-run data decides: a summary whose runs.csv beside it is damaged, or is another sweep's
    (here one run short, as when the two files are fetched from two commits), is refused in one
    line naming both files (issue 27: it used to be ignored, or compared with the wrong runs)."""
    from bench.__main__ import main

    good = _summary_of(tmp_path)
    runs = good.parent / "runs.csv"
    other = tmp_path / "other"
    other.mkdir()
    (other / "summary.csv").write_bytes(good.read_bytes())
    beside = other / "runs.csv"
    if damage == "binary":
        beside.write_bytes(b"\x00\x01\x02" * 50)
    elif damage == "empty":
        beside.write_text("")
    elif damage == "a directory":
        beside.mkdir()
    elif damage == "no samples/s column":
        pd.read_csv(runs).drop(columns=["samples_per_s"]).to_csv(beside, index=False)
    elif damage == "text samples/s":
        _edited(runs, beside, 0, "samples_per_s", "oops")
    else:  # a runs.csv of other runs: its ok runs are not the ones the summary counts
        pd.read_csv(runs).iloc[:-1].to_csv(beside, index=False)
    assert main(["compare", str(good), str(other / "summary.csv"), "--fail-if-slower", "5"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and str(beside) in err and str(other / "summary.csv") in err, (
        err
    )
    if damage in DAMAGED_BESIDE:
        assert err.startswith(f"error: {beside}: {DAMAGED_BESIDE[damage]}")
    else:
        assert err.startswith(f"error: {other / 'summary.csv'}: line 3: n_runs 4, where {beside} gives 3: ")


def test_blank_measurements_are_what_an_arm_without_ok_runs_has_not_an_error(tmp_path):
    """Missing values are refused in the key columns only: a summary's arm with no ok run (all
    OOM), a CPU sweep without VRAM, a baseline without Δ leave their cells blank."""
    good = _summary_of(tmp_path)
    df = pd.read_csv(good)
    df.loc[df["arm"] == "liger", ["samples_per_s_mean", "s_per_step_mean"]] = None
    df["peak_vram_gib"] = None
    df.to_csv(tmp_path / "b.csv", index=False)
    out = compare(good, tmp_path / "b.csv").set_index("arm")
    assert np.isnan(out.loc["liger", "samples_per_s_b"]) and np.isnan(out.loc["baseline", "peak_vram_gib_b"])
    assert out.loc["baseline", "samples_per_s_ratio_b_over_a"] == pytest.approx(1.0)


def test_compare_csv_carries_each_rows_ci_and_each_sides_liger_delta_with_its_ci(tmp_path):
    good = _summary_of(tmp_path)
    df = compare(good, good).set_index("arm")
    summary = pd.read_csv(good).set_index("arm")
    for side in ("a", "b"):
        for col in (
            "delta_samples_per_s_pct",
            "delta_samples_per_s_pct_ci95_low",
            "delta_samples_per_s_pct_ci95_high",
        ):
            assert df.loc["liger", f"{col}_{side}"] == pytest.approx(summary.loc["liger", col])
    lo, hi = df.loc["liger", ["samples_per_s_delta_pct_ci95_low", "samples_per_s_delta_pct_ci95_high"]]
    assert lo < 0 < hi and df.loc["liger", "samples_per_s_delta_pct"] == pytest.approx(0.0)
    assert df["gate"].isna().all()  # no gate asked for


@pytest.mark.parametrize("sweep", ["h200-options", "h200-specforge", "h200-specforge-verdict-learn"])
def test_the_console_fits_100_columns_and_a_sweep_with_unrun_rows_compares(sweep, capsys):
    """The console table was 276 columns wide; a committed runs.csv with a planned run that never
    ran (its row names no profile) was refused ("no profile")."""
    from bench.__main__ import main

    runs = REPO / "results" / sweep / "runs.csv"
    assert main(["compare", str(runs), str(runs)]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    table = lines[next(i for i, ln in enumerate(lines) if ln.endswith("(samples/s)")) :]  # not the paths
    assert max(len(line) for line in table) <= 100, max(table, key=len)
    assert "Δ B vs A (95% CI)" in out and "parity A/B" in out
