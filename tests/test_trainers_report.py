"""Two trainer plugs in one sweep: the trainer column, and trainers.csv (the bridge: one trainer's
saving per step predicting the other's Δ samples/s) with its report section, on hand-made run
directories with known step times."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from bench.results.columns import TRAINERS_COLUMNS
from bench.results.compare import compare
from bench.results.crosstrainer import cell_pairs, predicted_pct
from bench.results.records import load_runs
from bench.results.report import build_report
from bench.results.tables import runs_table, summary_table
from tests.test_aggregate import CELL, write_run

CLI = "specforge-cli"
CLI_CELL = f"{CELL}_{CLI}"
STEPS = 4
# Per pair (3 rounds), the mean s/step of each run: baseline, and what each arm saves a step.
EMBEDDED_BASE = [1.00, 1.02, 0.98]
CLI_BASE = [1.98, 2.00, 2.02]
SAVED_S = {  # arm -> trainer -> seconds saved per step, per pair
    "liger": {"embedded": [0.19, 0.20, 0.21], CLI: [0.19, 0.20, 0.21]},  # carries over
    "rmsnorm": {"embedded": [0.19, 0.20, 0.21], CLI: [0.04, 0.05, 0.06]},  # does not
}


def two_trainer_sweep(sweep: Path, embedded_key: str | None = "embedded") -> Path:
    """One cell shape run by both trainers, arms baseline, liger and rmsnorm, 3 pairs each."""
    for trainer, cell_id, base in ((embedded_key, CELL, EMBEDDED_BASE), (CLI, CLI_CELL, CLI_BASE)):
        name = trainer or "embedded"
        for rep, b in enumerate(base):
            write_run(sweep, "baseline", rep, [b] * STEPS, cell_id=cell_id, trainer=trainer)
            for arm, saved in SAVED_S.items():
                write_run(sweep, arm, rep, [b - saved[name][rep]] * STEPS, cell_id=cell_id, trainer=trainer)
    return sweep


def saving_ms_ci(saved_s: list[float]) -> tuple[float, float, float]:
    ms = 1e3 * np.array(saved_s)
    lo, hi = stats.t.interval(0.95, len(ms) - 1, loc=ms.mean(), scale=stats.sem(ms))
    return ms.mean(), lo, hi


def measured_pct_ci(base: list[float], arm: list[float]) -> tuple[float, float, float]:
    """Δ samples/s of the arm, paired t on log-ratios (samples/s = 2 / s per step)."""
    lr = np.log(np.array(base) / np.array(arm))
    lo, hi = stats.t.interval(0.95, len(lr) - 1, loc=lr.mean(), scale=stats.sem(lr))
    return 100 * math.expm1(lr.mean()), 100 * math.expm1(lo), 100 * math.expm1(hi)


def expected_row(arm: str, source: str, target: str) -> dict[str, float]:
    base = {"embedded": EMBEDDED_BASE, CLI: CLI_BASE}
    t_base = float(np.mean(base[target]))
    saved, lo, hi = saving_ms_ci(SAVED_S[arm][source])
    arm_times = [b - s for b, s in zip(base[target], SAVED_S[arm][target], strict=True)]
    measured = measured_pct_ci(base[target], arm_times)
    return {
        "saved": saved,
        "saved_lo": lo,
        "saved_hi": hi,
        "t_base": t_base,
        "pred": 100 * (t_base / (t_base - saved / 1e3) - 1),
        "pred_lo": 100 * (t_base / (t_base - lo / 1e3) - 1),
        "pred_hi": 100 * (t_base / (t_base - hi / 1e3) - 1),
        "measured": measured[0],
        "measured_lo": measured[1],
        "measured_hi": measured[2],
    }


def with_ci(row: pd.Series, name: str) -> list[float]:
    return [row[name], row[f"{name}_ci95_low"], row[f"{name}_ci95_high"]]


def test_trainers_csv_predicts_each_trainers_delta_from_the_others_saving(tmp_path, no_plots):
    out = build_report(two_trainer_sweep(tmp_path))
    table = pd.read_csv(tmp_path / "trainers.csv")
    assert list(table.columns) == TRAINERS_COLUMNS and len(table) == 4  # 2 arms x 2 directions
    assert table[["source_trainer", "target_trainer", "arm"]].values.tolist() == [
        ["embedded", CLI, "liger"], ["embedded", CLI, "rmsnorm"],
        [CLI, "embedded", "liger"], [CLI, "embedded", "rmsnorm"],
    ]  # fmt: skip
    assert table[["source_cell_id", "target_cell_id"]].values.tolist()[:2] == [[CELL, CLI_CELL]] * 2
    assert table["measured_ci_contains_prediction"].tolist() == [True, False, True, False]
    rows = out["trainers"].set_index(["source_trainer", "arm"])  # full precision (the CSV has 6 digits)
    for (source, arm), target in ((("embedded", "liger"), CLI), (("embedded", "rmsnorm"), CLI),
                                  ((CLI, "liger"), "embedded"), ((CLI, "rmsnorm"), "embedded")):  # fmt: skip
        r, e = rows.loc[(source, arm)], expected_row(arm, source, target)
        assert (r.source_n_pairs, r.target_n_pairs, r.batch_size, r.seq_len) == (3, 3, 2, 64)
        assert with_ci(r, "source_saved_ms_per_step") == pytest.approx(
            [e["saved"], e["saved_lo"], e["saved_hi"]]
        )
        assert r.target_baseline_s_per_step == pytest.approx(e["t_base"])
        assert with_ci(r, "predicted_delta_samples_per_s_pct") == pytest.approx(
            [e["pred"], e["pred_lo"], e["pred_hi"]]
        )
        assert with_ci(r, "measured_delta_samples_per_s_pct") == pytest.approx(
            [e["measured"], e["measured_lo"], e["measured_hi"]]
        )
    # 200 ms saved: +25% of the embedded trainer's 1.0 s step, +11.1% of the CLI's 2.0 s step
    liger_to_cli, liger_to_embedded = rows.loc[("embedded", "liger")], rows.loc[(CLI, "liger")]
    assert liger_to_cli.predicted_delta_samples_per_s_pct == pytest.approx(100 * (2.0 / 1.8 - 1))
    assert liger_to_embedded.predicted_delta_samples_per_s_pct == pytest.approx(25.0)
    # the liger saving carried over (both measured CIs hold the prediction); rmsnorm's did not
    assert rows["measured_ci_contains_prediction"].tolist() == [True, False, True, False]


def test_the_report_section_shows_prediction_beside_measurement(tmp_path, no_plots):
    build_report(two_trainer_sweep(tmp_path))
    text = (tmp_path / "report.md").read_text()
    assert "## Two trainers, one cell" in text and "smaller share of a longer step" in text
    section = text.split("## Two trainers, one cell")[1].split("\n## ")[0]
    e = expected_row("liger", "embedded", CLI)
    row = (
        f"| p | offline | 2 | 64 | 1 | liger | embedded | {CLI} | "
        f"{e['saved']:.1f} [{e['saved_lo']:.1f}, {e['saved_hi']:.1f}] | {e['t_base']:.3f} | "
        f"{e['pred']:+.1f}% [{e['pred_lo']:+.1f}, {e['pred_hi']:+.1f}] | "
        f"{e['measured']:+.1f}% [{e['measured_lo']:+.1f}, {e['measured_hi']:+.1f}] | yes |"
    )
    assert row in section, section
    assert row == "| p | offline | 2 | 64 | 1 | liger | embedded | specforge-cli | 200.0 [175.2, 224.8] | 2.000 | " \
        "+11.1% [+9.6, +12.7] | +11.1% [+9.9, +12.3] | yes |"  # fmt: skip
    assert section.count("| no |") == 2  # rmsnorm, both ways
    # the main table names each row's trainer: the two cells have the same shape
    assert "| trainer | profile | mode |" in text
    assert f"| {CLI} | p | offline | 2 | 64 | 1 | liger |" in text


def test_one_trainer_gets_no_trainers_csv_and_no_section(tmp_path, no_plots):
    for rep in range(3):
        write_run(tmp_path, "baseline", rep, [1.0] * STEPS, trainer="embedded")
        write_run(tmp_path, "liger", rep, [0.8] * STEPS, trainer="embedded")
    (tmp_path / "trainers.csv").write_text("stale\n")  # an earlier build's
    out = build_report(tmp_path)
    assert not (tmp_path / "trainers.csv").exists() and out["trainers"].empty
    assert "trainers.csv" not in out["paths"]
    text = (tmp_path / "report.md").read_text()
    assert "Two trainers" not in text and "| trainer |" not in text
    # a CLI cell of another shape is no pair either
    for rep in range(3):
        for arm, t in (("baseline", 2.0), ("liger", 1.8)):
            write_run(tmp_path, arm, rep, [t] * STEPS, cell_id="q_offline_bs2_s64_" + CLI, trainer=CLI)
    runs = runs_table(load_runs(tmp_path))
    runs.loc[runs["cell_id"].str.startswith("q_"), "profile"] = "q"
    assert cell_pairs(summary_table(runs)) == []


def test_runs_without_a_trainer_key_read_as_the_embedded_trainer(tmp_path):
    for rep in range(2):
        write_run(tmp_path, "baseline", rep, [1.0] * STEPS)  # cell.json from before the key
        write_run(tmp_path, "liger", rep, [0.8] * STEPS)
    runs = runs_table(load_runs(tmp_path))
    assert runs["trainer"].tolist() == ["embedded"] * 4
    assert list(runs.columns[:3]) == ["run_id", "cell_id", "trainer"]
    summary = summary_table(runs)
    assert summary["trainer"].tolist() == ["embedded", "embedded"]
    # a runs table without the column at all (an old runs.csv) too
    assert summary_table(runs.drop(columns="trainer"))["trainer"].tolist() == ["embedded", "embedded"]


def test_old_keyless_runs_pair_with_a_cli_cell(tmp_path, no_plots):
    build_report(two_trainer_sweep(tmp_path, embedded_key=None))
    table = pd.read_csv(tmp_path / "trainers.csv")
    assert set(table["source_trainer"]) == {"embedded", CLI} and len(table) == 4


def test_an_old_summary_without_the_column_compares_with_a_new_one(tmp_path):
    two_trainer_sweep(tmp_path / "new")
    new = summary_table(runs_table(load_runs(tmp_path / "new")))
    new.to_csv(tmp_path / "new.csv", index=False)
    old = new[new["trainer"] == "embedded"].drop(columns="trainer")
    old.to_csv(tmp_path / "old.csv", index=False)
    df = compare(tmp_path / "old.csv", tmp_path / "new.csv")
    both = df[df["present"] == "both"]
    assert both["trainer"].tolist() == ["embedded"] * 3
    assert both["samples_per_s_ratio_b_over_a"].tolist() == pytest.approx([1.0] * 3)
    assert df[df["present"] == "B only"]["trainer"].tolist() == [CLI] * 3


def test_labelled_cells_pair_with_their_own_label():
    rows = [(CELL, "embedded"), (f"{CELL}_x", "embedded"), (CLI_CELL, CLI), (f"{CLI_CELL}_x", CLI)]
    summary = pd.DataFrame(
        [{"cell_id": c, "trainer": t, "profile": "p", "mode": "offline", "batch_size": 2, "seq_len": 64,
          "accumulation_steps": 1, "num_anchors": 8, "gpus": 1, "nodes": 1, "arm": "baseline"} for c, t in rows]
    )  # fmt: skip
    assert sorted(cell_pairs(summary)) == sorted(
        [(CELL, CLI_CELL), (CLI_CELL, CELL), (f"{CELL}_x", f"{CLI_CELL}_x"), (f"{CLI_CELL}_x", f"{CELL}_x")]
    )


def test_a_saving_as_long_as_the_step_predicts_nothing():
    assert predicted_pct(2.0, 200.0) == pytest.approx(100 * (2.0 / 1.8 - 1))
    assert math.isnan(predicted_pct(0.2, 200.0)) and math.isnan(predicted_pct(float("nan"), 1.0))
    assert predicted_pct(1.0, -250.0) == pytest.approx(-20.0)  # a slower arm: a negative Δ
