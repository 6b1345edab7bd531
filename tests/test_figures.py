"""What the report's figures draw (issue 20): the forest plot's points, CIs and labels, Δ labels
on the throughput and VRAM bars, CIs clipped at 0, legends only for arms with bars, the |Δ loss|
panel marking a failing arm, step-time axes that an outlier cannot stretch, compare's forest,
and the PR summary (Markdown and a console text no wider than 100 columns)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from bench.results import forest, plots, prsummary, runplots
from bench.results.records import load_runs
from bench.results.report import build_report
from tests.test_report import CPU_VRAM, GPU_CELL, vram, write_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def drawn(monkeypatch, plots_on):
    """The figures the plotting modules save, by file name (each still written)."""
    figures = {}
    for module in (plots, runplots, forest):
        real = module.save

        def keep(fig, path, *args, _real=real, **kw):
            figures[Path(path).name] = fig
            return _real(fig, path, *args, **kw)

        monkeypatch.setattr(module, "save", keep)
    return figures


def texts(ax) -> list[str]:
    return [t.get_text() for t in ax.texts]


def committed_summary(name: str) -> pd.DataFrame:
    return pd.read_csv(ROOT / "results" / name / "summary.csv")


def test_forest_rows_hold_every_arm_with_its_paired_ci_and_the_reason_when_there_is_none():
    rows = forest.sweep_forest_rows(committed_summary("h200-options"))
    rows = rows.set_index(rows["label"].str.split(" · ").str[1])
    assert list(rows.index) == ["adamw_foreach (8 pairs)", "liger (8 pairs)", "liger_compile", "liger_flce (8 pairs)",
                                "sdpa (8 pairs)"]  # fmt: skip
    liger = rows.loc["liger (8 pairs)"]
    assert liger.delta_text == "+16.0% [+15.3, +16.6]" and liger.verdict == "faster"
    assert liger.vram_text == "-5.21 GiB (-17.7%)"
    assert (liger.ci_low, liger.ci_high) == pytest.approx((15.2823, 16.6427))
    compile_ = rows.loc["liger_compile"]
    assert np.isnan(compile_.delta_pct) and compile_.delta_text == "n/a (no ok runs)"
    assert compile_.vram_text == "no VRAM data"


def test_forest_figure_draws_exactly_its_rows_and_marks_a_parity_failure(drawn, tmp_path):
    rows = forest.sweep_forest_rows(committed_summary("h200-compile"))
    forest.plot_forest(rows, tmp_path / "forest.png", "t", band_pct=1.0)
    left, right = drawn["forest.png"].axes
    ticks = dict(zip(left.get_yticks(), (t.get_text() for t in left.get_yticklabels())))
    assert sorted(ticks.values()) == sorted(rows["label"])
    assert texts(left) == ["+16.0% [+15.0, +17.0]", "+24.5% [+23.2, +25.8]  FAILS loss parity"]
    assert texts(right) == ["-5.21 GiB (-17.7%)", "-5.19 GiB (-17.6%)"]
    legend = [t.get_text() for t in left.get_legend().get_texts()]
    assert legend == ["±1% equivalence band", "fails loss parity"]
    points = [c for c in left.containers if hasattr(c, "lines")]
    assert [round(float(c.lines[0].get_xdata()[0]), 1) for c in points[:1]] == [16.0]


def test_an_aa_row_is_drawn_as_a_shaded_noise_floor(drawn, tmp_path):
    rows = forest.sweep_forest_rows(committed_summary("h200-noise"))
    assert list(rows["kind"]) == ["aa", "arm"]
    forest.plot_forest(rows, tmp_path / "f.png", "t")
    left = drawn["f.png"].axes[0]
    spans = [p for c in left.containers if c.get_label() == "A/A (noise floor)" for p in c.patches]
    aa = rows.iloc[0]
    assert len(spans) == 1 and spans[0].get_x() == pytest.approx(aa.ci_low)
    assert spans[0].get_width() == pytest.approx(aa.ci_high - aa.ci_low)


def small_sweep(tmp_path: Path, fail_parity: bool = False, outlier: float | None = None) -> Path:
    for rep in (0, 1):
        write_run(tmp_path, GPU_CELL, "baseline", rep, 0.4, order_index=2 * rep, vram=vram(35.0))
        write_run(tmp_path, GPU_CELL, "liger", rep, 0.32, order_index=2 * rep + 1, vram=vram(30.0),
                  loss_offset=0.5 if fail_parity else 0.0)  # fmt: skip
    if outlier is not None:
        m = tmp_path / "runs" / f"{GPU_CELL}_baseline_r0" / "metrics.jsonl"
        rows = [json.loads(line) for line in m.read_text().splitlines()]
        rows[-1]["step_time_s"] = outlier
        m.write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "sweep.json").write_text(
        json.dumps({"name": "figs", "command": ["python", "-m", "bench", "sweep", "c.yaml"]})
    )
    return tmp_path


def test_throughput_bars_carry_the_delta_clip_the_ci_at_zero_and_name_only_arms_with_bars(drawn, tmp_path):
    summary = committed_summary("h200-options")
    summary.loc[summary["arm"] == "sdpa", "samples_per_s_ci95_low"] = -55.0  # a two-run CI past zero
    bars = plots.throughput_bars(summary).set_index("arm")
    assert "liger_compile" not in bars.index
    assert bars.loc["sdpa", "err_low"] == pytest.approx(bars.loc["sdpa", "mean"])  # down to 0, not -55
    assert bars.loc["liger", "label"] == "+16.0% [+15.3, +16.6]" and bars.loc["baseline", "label"] == ""
    plots.plot_throughput(summary, tmp_path / "throughput.png")
    ax = drawn["throughput.png"].axes[0]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == [
        "baseline",
        "adamw_foreach",
        "liger",
        "liger_flce",
        "sdpa",
    ]
    assert "+16.0%\n[+15.3, +16.6]" in texts(ax) and "liger_compile: no ok run" in [
        t.strip() for t in texts(ax)
    ]
    assert ax.get_ylim()[0] == 0


def test_vram_bars_are_labelled_with_their_delta_per_card(drawn, tmp_path):
    out = build_report(small_sweep(tmp_path))
    labels = plots.vram_labels(out["vram_per_card"])
    assert labels[["card", "arm", "label"]].values.tolist() == [
        ["0", "liger", "-5.00"],
        ["1", "liger", "+0.00"],
    ]
    ax = drawn["vram_per_card.png"].axes[0]
    assert texts(ax) == ["-5.00 GiB", "+0.00 GiB"]
    assert "idle baseline" in [t.get_text() for t in ax.get_legend().get_texts()]


def test_the_loss_panel_shows_a_failing_arm_against_the_tolerance_on_a_log_scale(drawn, tmp_path):
    build_report(small_sweep(tmp_path, fail_parity=True))
    gaps = runplots.loss_gaps(load_runs(tmp_path))
    assert set(gaps["arm"]) == {"liger"} and not gaps["passed"].any()
    assert gaps["abs_delta"].to_numpy() == pytest.approx([0.5] * 16)
    right = drawn["loss_curves.png"].axes[1]
    assert right.get_yscale() == "log"
    legend = [t.get_text() for t in right.get_legend().get_texts()]
    assert legend == ["liger: FAILS parity", "tolerance 0.01"]
    assert any(line.get_ydata()[0] == pytest.approx(0.01) for line in right.get_lines())


def test_identical_losses_are_drawn_at_the_floor_and_pass(tmp_path):
    build_report(small_sweep(tmp_path))
    gaps = runplots.loss_gaps(load_runs(tmp_path))
    assert gaps["passed"].all() and (gaps["abs_delta"] == 0).all()


def test_one_outlier_step_does_not_stretch_the_step_time_axis(drawn, tmp_path):
    build_report(small_sweep(tmp_path, outlier=4.8))
    ax = drawn["step_time_dist.png"].axes[0]
    assert ax.get_ylim()[1] < 1.0  # the boxes at 0.32 and 0.4 s stay readable
    assert any(t.startswith("▲ 1 above\n(max 4.80 s)") for t in texts(ax))
    view = runplots.step_time_view({"a": np.array([1.0] * 9 + [4.8]), "b": np.array([0.9, 1.1] * 5)})
    assert view["above"] == {"a": [4.8], "b": []} and view["ylim"][1] < 2


def test_compare_figure_is_a_forest_of_b_vs_a_with_its_ci(drawn, tmp_path):
    df = pd.DataFrame([{
        "trainer": "embedded", "profile": "p", "mode": "offline", "batch_size": 2, "seq_len": 64, "gpus": 1, "arm": "liger",
        "present": "both", "samples_per_s_delta_pct": -3.0, "samples_per_s_delta_pct_ci95_low": -4.0,
        "samples_per_s_delta_pct_ci95_high": -2.0, "verdict": "B slower", "vram_over_idle_b_minus_a_gib": 1.0, "vram_over_idle_gib_a": 20.0,
    }, {
        "trainer": "embedded", "profile": "p", "mode": "offline", "batch_size": 2, "seq_len": 64, "gpus": 1,
        "arm": "sdpa", "present": "A only", "samples_per_s_delta_pct": np.nan, "samples_per_s_delta_pct_ci95_low": np.nan,
        "samples_per_s_delta_pct_ci95_high": np.nan, "verdict": None, "vram_over_idle_b_minus_a_gib": np.nan,
        "vram_over_idle_gib_a": 20.0,
    }])  # fmt: skip
    plots.plot_compare(df, tmp_path / "compare.png", "a.csv", "b.csv")
    left, right = drawn["compare.png"].axes
    assert texts(left) == ["-3.0% [-4.0, -2.0]"] and texts(right) == ["+1.00 GiB (+5.0%)"]


def test_pr_summary_is_the_seeds_table_and_delta_line():
    summary, runs = committed_summary("h200"), pd.read_csv(ROOT / "results/h200/runs.csv")
    sweep = json.loads((ROOT / "results/h200/sweep.json").read_text())
    lines = prsummary.pr_summary(summary, runs, sweep)
    commit = runs["git_commit"].iloc[0]
    assert lines[:3] == [
        "## Summary",
        "",
        f"NVIDIA H200 × 1, driver 580.159.04 · torch 2.11.0+cu130 · liger-kernel 0.8.5 · commit {commit}.",
    ]
    assert "**qwen3.5-4b-dflash offline bs2 s2048**" in lines
    r = summary[(summary["arm"] == "liger") & summary["cell_id"].str.startswith("qwen3.5")].iloc[0]
    ci = f"{r.delta_samples_per_s_pct:+.1f}% [{r.delta_samples_per_s_pct_ci95_low:+.1f}, {r.delta_samples_per_s_pct_ci95_high:+.1f}]"
    n = int(r.n_ok)
    row = f"| liger | {n}/{n} | {r.samples_per_s_mean:.2f} | {r.s_per_step_mean:.3f} | {r.peak_vram_gib:.2f} | {ci} | pass ({n}/{n}) |"
    assert row in lines
    # each Δ with its verdict's words (summary.csv: faster, leaner), as the console and the PR paste read
    head = f"liger vs baseline: {ci} throughput ({int(r.n_pairs)} pairs; faster), {r.delta_peak_vram_gib:+.2f} GiB [{r.delta_peak_vram_gib_ci95_low:+.2f}, {r.delta_peak_vram_gib_ci95_high:+.2f}] ({r.delta_peak_vram_pct:+.1f}%) peak VRAM (leaner), "
    energy = f"{r.delta_energy_per_sample_pct:+.1f}% [{r.delta_energy_per_sample_pct_ci95_low:+.1f}, {r.delta_energy_per_sample_pct_ci95_high:+.1f}] energy/sample"
    coverage = f" (energy counter, {2 * n} of {2 * n} runs)"  # where the energies come from, and how many
    assert f"{head}{energy}{coverage}, loss parity pass ({n}/{n})." in lines


def test_console_summary_fits_100_columns_with_long_names_and_many_arms():
    summary, runs = committed_summary("h200-options"), pd.read_csv(ROOT / "results/h200-options/runs.csv")
    summary["profile"] = "a-very-long-profile-name-that-users-do-write-" * 3
    lines = prsummary.console_summary(summary, runs, {})
    assert max(len(line) for line in lines) <= 100
    joined = " ".join(line.strip() for line in lines)
    assert "liger vs baseline: +16.0% [+15.3, +16.6] throughput (8 pairs; faster)" in joined
    assert "liger_compile vs baseline: n/a (no ok runs)" in joined


def test_a_cpu_sweep_without_vram_says_so_in_the_forest(drawn, tmp_path):
    for rep in (0, 1):
        write_run(tmp_path, GPU_CELL, "baseline", rep, 0.4, order_index=2 * rep, vram=CPU_VRAM)
        write_run(tmp_path, GPU_CELL, "aa", rep, 0.4, order_index=2 * rep + 1, vram=CPU_VRAM)
    build_report(tmp_path)
    right = drawn["forest.png"].axes[1]
    assert texts(right) == ["no VRAM data\n(CPU run / poller unavailable)"]
