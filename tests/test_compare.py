"""bench.results.compare on hand-written summary.csv / runs.csv files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.results.compare import COMPARE_COLUMNS, compare


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
    assert both.loc["baseline", "peak_vram_delta_gib"] == pytest.approx(1.0)
    assert both.loc["liger", ["delta_samples_per_s_pct_a", "delta_samples_per_s_pct_b"]].tolist() == [
        20.0,
        50.0,
    ]
    assert both.loc["liger", ["s_per_step_a", "s_per_step_b"]].tolist() == pytest.approx([8 / 12, 8 / 30])
    assert df.set_index("profile").loc["m1b", "present"] == "A only"
    assert df.set_index("profile").loc["m8b", "present"] == "B only"
    out = capsys.readouterr().out
    assert "NVIDIA A100" in out and "aaa111" in out and "NVIDIA H200" in out and "bbb222" in out
    assert "Only in A:\n  m1b offline bs4 seq2048 gpus1 baseline" in out
    assert "Only in B:\n  m8b offline bs1 seq2048 gpus1 baseline" in out
    assert "+150.0" in out and "2.500" in out
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
         "s_per_step_mean": 8 / v, "peak_vram_gib": 30.0}
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
    from bench.results.aggregate import summary_table

    summary_table(pd.read_csv(a)).to_csv(summary, index=False)
    assert compare(summary, b).set_index("arm").loc["baseline", "verdict"] == "B faster"
