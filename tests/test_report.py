"""bench.results.report.build_report (and the plots it draws) on a hand-made sweep directory."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from bench.results import forest, plots, runplots
from bench.results.report import (
    LOSS_PARITY_COLUMNS,
    MAIN_TABLE_HEADER,
    RUNS_COLUMNS,
    SUMMARY_COLUMNS,
    VRAM_PER_CARD_COLUMNS,
    build_report,
)
from tests.helpers import census

GPU_CELL = "p_offline_bs2_s64"
CPU_CELL = "p_online_bs1_s32"
SKIP_REASON = "liger arm skipped: Liger's Triton kernels need a GPU"


def write_run(sweep: Path, cell_id: str, arm: str, repeat: int, step_time: float | None, **kw) -> None:
    """A run directory: ``step_time`` None writes no metrics; kw: status, reason, vram, order_index,
    loss_offset (added to every step's loss)."""
    run_id = f"{cell_id}_{arm}_r{repeat}"
    d = sweep / "runs" / run_id
    d.mkdir(parents=True)
    bs, seq = (2, 64) if cell_id == GPU_CELL else (1, 32)
    cell = {
        "run_id": run_id, "cell_id": cell_id, "profile": "p", "mode": cell_id.split("_")[1], "batch_size": bs,
        "seq_len": seq, "accumulation_steps": 2, "num_anchors": 8, "gpus": 1, "arm": arm, "repeat": repeat,
        "order_index": kw.get("order_index", 0), "steps": 8, "warmup_steps": 3, "loss_tolerance": 0.01,
    }  # fmt: skip
    (d / "cell.json").write_text(json.dumps(cell))
    prov = {"hostname": "node7", "gpu_names": ["NVIDIA H200"] * 2, "gpu_count": 2, "driver_version": "550.1",
            "torch": "2.13.0", "triton": "3.5", "transformers": "5.1", "liger_kernel": "0.6.2",
            "git_commit": "deadbee"}  # fmt: skip
    run = {"status": kw.get("status", "ok"), "reason": kw.get("reason"), "arm": arm, "provenance": prov}
    run["draft_module_types"] = census(arm)  # the arm proven in effect, as a trainer records it
    (d / "run.json").write_text(json.dumps(run))
    if step_time is not None:
        rows = [
            {"step": i, "loss": 7.0 - 0.1 * i + kw.get("loss_offset", 0.0), "accuracy": 0.1, "step_time_s": 9.0 if i <= 3 else step_time,
             "samples": 2 * bs, "tokens": 2 * bs * seq, "torch_peak_allocated_gib": 3.0, "torch_peak_reserved_gib": 4.0}
            for i in range(1, 9)
        ]  # fmt: skip
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if "vram" in kw:
        (d / "vram.json").write_text(json.dumps(kw["vram"]))


def vram(peak: float) -> dict:
    cards = [
        {
            "index": 0,
            "name": "NVIDIA H200",
            "total_gib": 140.0,
            "baseline_used_gib": 0.5,
            "peak_used_gib": peak,
        },
        {
            "index": 1,
            "name": "NVIDIA H200",
            "total_gib": 140.0,
            "baseline_used_gib": 0.5,
            "peak_used_gib": 0.5,
        },
    ]
    return {
        "backend": "nvml",
        "status": "ok",
        "interval_s": 0.1,
        "n_samples": 50,
        "errors": 0,
        "devices": cards,
    }


CPU_VRAM = {"backend": "none", "status": "unavailable", "reason": "no GPU", "interval_s": 0.1, "devices": []}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    for rep in (0, 1):  # interleaved A B A B; liger is 25% faster and 5 GiB leaner
        write_run(tmp_path, GPU_CELL, "baseline", rep, 0.4, order_index=2 * rep, vram=vram(35.0))
        write_run(tmp_path, GPU_CELL, "liger", rep, 0.32, order_index=2 * rep + 1, vram=vram(30.0))
    write_run(tmp_path, CPU_CELL, "baseline", 0, 0.5, order_index=4, vram=CPU_VRAM)
    write_run(tmp_path, CPU_CELL, "liger", 0, None, order_index=5, status="skipped", reason=SKIP_REASON)
    write_run(tmp_path, CPU_CELL, "baseline", 1, 0.5, order_index=6, status="timeout", reason="hung | killed")
    sweep_json = {"name": "h200-test", "config_path": "configs/h200.yaml", "order_mode": "interleaved",
                  "order_seed": 7, "command": ["python", "-m", "bench", "sweep", "configs/h200.yaml"]}  # fmt: skip
    (tmp_path / "sweep.json").write_text(json.dumps(sweep_json))
    return tmp_path


def test_build_report_writes_every_file(sweep, plots_on):
    out = build_report(sweep)
    names = ["runs.csv", "summary.csv", "loss_parity.csv", "vram_per_card.csv", "forest.png", "throughput.png",
             "vram_per_card.png", "loss_curves.png", "step_time_dist.png", "report.md", "manifest.json",
             "summary.json"]  # fmt: skip
    assert sorted(out["paths"]) == sorted(names)
    for name in names:
        assert (sweep / name).is_file() and out["paths"][name] == sweep / name
    for name in names:
        if name.endswith(".png"):
            assert (sweep / name).read_bytes().startswith(b"\x89PNG")
    assert not list(sweep.glob(".*.tmp"))
    for name, cols in (("runs.csv", RUNS_COLUMNS), ("summary.csv", SUMMARY_COLUMNS),
                       ("loss_parity.csv", LOSS_PARITY_COLUMNS), ("vram_per_card.csv", VRAM_PER_CARD_COLUMNS)):  # fmt: skip
        assert list(pd.read_csv(sweep / name).columns) == cols
    runs = pd.read_csv(sweep / "runs.csv")
    assert len(runs) == 7 and sorted(runs["status"].unique()) == ["ok", "skipped", "timeout"]
    summary = out["summary"].set_index(["cell_id", "arm"])
    liger = summary.loc[(GPU_CELL, "liger")]
    assert liger.delta_samples_per_s_pct == pytest.approx(25.0)
    # two pairs: the verdict shows them rather than a t-interval with one degree of freedom
    assert liger.verdict_speed == "too few pairs (2): +25.0%, +25.0%"
    assert liger.verdict_memory == "too few pairs (2): -5.00 GiB, -5.00 GiB"
    assert summary.loc[(CPU_CELL, "baseline"), "n_ok"] == 1


def first_table(md: str, after: str = "## Results") -> list[str]:
    """The lines of the first Markdown table of a document after the line ``after``."""
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|") and i > lines.index(after))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def test_build_report_returns_the_main_table_it_wrote(sweep):
    out = build_report(sweep)
    main = out["main_table"]
    assert isinstance(main, list) and all(isinstance(line, str) for line in main)
    assert main == first_table(out["paths"]["report.md"].read_text())
    assert main[0] == "| " + " | ".join(MAIN_TABLE_HEADER) + " |"
    assert len(main) == 2 + 4  # header, rule, one row per (cell, arm)


def test_report_md_reads_like_the_seeds(sweep, plots_on):
    build_report(sweep)
    md = (sweep / "report.md").read_text()
    assert md.startswith("# Benchmark report: h200-test")
    assert "| " + " | ".join(MAIN_TABLE_HEADER) + " |" in md
    assert "`python -m bench sweep configs/h200.yaml`" in md
    assert "node7" in md and "NVIDIA H200 × 2" in md and "deadbee" in md and "liger-kernel 0.6.2" in md
    assert "first 3 dropped as warm-up" in md and "every 100 ms" in md and "order seed 7" in md
    # baseline 4 samples / 0.4 s = 10.00/s; liger 12.50/s, +25.0%, 5 GiB leaner (-14.3%)
    assert "| 10.00 | 0.400 | 35.00 | 3.00 | 6.2000 |" in md
    assert "+25.0% [+25.0, +25.0]" in md and "-5.00 GiB [-5.00, -5.00] (-14.3%)" in md
    assert "speed: too few pairs (2): +25.0%, +25.0%; memory: too few pairs (2): -5.00 GiB, -5.00 GiB" in md
    assert SKIP_REASON in md and "hung \\| killed" in md  # reasons shown, pipes escaped
    assert "## Loss parity" in md and "pass" in md
    # the loss-parity table, like the main one, names the world size of each row
    assert "| profile | mode | batch | seq | gpus | arm | repeat | steps compared |" in md
    assert f"{CPU_CELL} repeat 0: liger has no losses (status skipped" in md
    for png in ("throughput.png", "vram_per_card.png", "loss_curves.png", "step_time_dist.png"):
        assert f"]({png})" in md


def test_provenance_counts_the_drivers_cards_not_what_a_rank_saw(sweep):
    # a rank of a two-node run on one machine sees one card; the machine has two
    info = json.loads((sweep / "sweep.json").read_text())
    info["hardware"] = {"gpu_count": 2, "gpu_names": ["NVIDIA H200"] * 2}
    (sweep / "sweep.json").write_text(json.dumps(info))
    for run_json in (sweep / "runs").glob("*/run.json"):
        run = json.loads(run_json.read_text())
        run.setdefault("provenance", {})["gpu_count"] = 1
        run_json.write_text(json.dumps(run))
    build_report(sweep)
    assert "NVIDIA H200 × 2 on the driver's machine" in (sweep / "report.md").read_text()


def test_contrasts_get_a_csv_and_a_section(sweep):
    for rep in (0, 1):  # a third arm, 0.4 / 0.36 = 1.111x the baseline; liger is 0.36 / 0.32 = 1.125x it
        write_run(sweep, GPU_CELL, "rmsnorm", rep, 0.36, order_index=10 + rep, vram=vram(32.0))
    info = json.loads((sweep / "sweep.json").read_text())
    info["config"] = {"contrasts": [["liger", "rmsnorm"]]}
    (sweep / "sweep.json").write_text(json.dumps(info))
    out = build_report(sweep)
    row = out["contrasts"].iloc[0]
    assert (row.arm, row.reference, row.n_pairs) == ("liger", "rmsnorm", 2)
    assert row.delta_samples_per_s_pct == pytest.approx(12.5)
    assert row.delta_peak_vram_gib == pytest.approx(-2.0)
    md = (sweep / "report.md").read_text()
    assert "## Arm against arm" in md and "| liger | rmsnorm | 2 | +12.5% [+12.5, +12.5] |" in md
    assert (sweep / "contrasts.csv").is_file()
    info["config"] = {}
    (sweep / "sweep.json").write_text(json.dumps(info))
    build_report(sweep)  # no contrasts asked: no file, no section
    assert (
        not (sweep / "contrasts.csv").exists()
        and "## Arm against arm" not in (sweep / "report.md").read_text()
    )


def test_an_arm_that_fails_loss_parity_is_flagged_beside_its_speed(sweep):
    # a faster arm that trains differently (its loss 0.3 off the baseline's, tolerance 0.01)
    for rep in (0, 1):
        write_run(
            sweep, GPU_CELL, "liger_compile", rep, 0.3, order_index=10 + rep, vram=vram(30.0), loss_offset=0.3
        )
    info = json.loads((sweep / "sweep.json").read_text())
    info["config"] = {"contrasts": [["liger_compile", "liger"]]}
    (sweep / "sweep.json").write_text(json.dumps(info))
    out = build_report(sweep)
    parity = out["summary"].set_index(["cell_id", "arm"])["loss_parity"]
    assert parity[(GPU_CELL, "liger")] == "pass (2/2)"
    assert parity[(GPU_CELL, "liger_compile")] == (
        "FAIL in 2 of 2 pairs (|Δ loss| at the last step up to 0.3, tolerance 0.01)"
    )
    assert pd.isna(parity[(GPU_CELL, "baseline")]) or parity[(GPU_CELL, "baseline")] == ""
    assert list(pd.read_csv(sweep / "summary.csv").columns) == SUMMARY_COLUMNS
    md = (sweep / "report.md").read_text()
    row = next(
        line for line in md.splitlines() if line.startswith("| p | offline") and "| liger_compile |" in line
    )
    assert "loss parity FAIL in 2 of 2 pairs" in row
    liger_row = next(
        line for line in md.splitlines() if line.startswith("| p | offline") and "| liger |" in line
    )
    assert "loss parity" not in liger_row
    contrast = next(line for line in md.splitlines() if "| liger_compile | liger |" in line)
    assert "liger_compile's loss parity against the baseline FAILED" in contrast


def test_report_without_sweep_json_or_vram(tmp_path, plots_on):
    write_run(tmp_path, CPU_CELL, "baseline", 0, 0.5)
    write_run(tmp_path, CPU_CELL, "liger", 0, None, status="skipped", reason=SKIP_REASON)
    out = build_report(tmp_path)
    md = out["paths"]["report.md"].read_text()
    assert md.startswith(f"# Benchmark report: {tmp_path.name}") and "Peak VRAM not polled" in md
    assert out["paths"]["vram_per_card.png"].read_bytes().startswith(b"\x89PNG")
    assert out["loss_parity"].empty and out["vram_per_card"].empty


def test_build_report_rejects_a_missing_or_empty_sweep(tmp_path):
    with pytest.raises(ValueError, match="no such sweep directory"):
        build_report(tmp_path / "nope")
    with pytest.raises(ValueError, match="no run directories"):
        build_report(tmp_path)


def test_plots_survive_empty_and_nan_inputs(tmp_path):
    empty_summary = pd.DataFrame(columns=SUMMARY_COLUMNS)
    empty_vram = pd.DataFrame(columns=VRAM_PER_CARD_COLUMNS)
    for path in (
        plots.plot_throughput(empty_summary, tmp_path / "t.png"),
        plots.plot_vram_per_card(empty_vram, tmp_path / "v.png"),
        runplots.plot_loss_curves([], tmp_path / "l.png"),
        runplots.plot_step_time_dist([], tmp_path / "s.png"),
        forest.plot_forest(forest.sweep_forest_rows(empty_summary), tmp_path / "f.png", "empty"),
    ):
        assert path.read_bytes().startswith(b"\x89PNG")


def test_vram_crosscheck_flags_a_missed_peak():
    import pandas as pd

    from bench.results.report import vram_crosscheck

    runs = pd.DataFrame(
        {
            "run_id": ["a", "b", "c"],
            "status": ["ok", "ok", "error"],
            "peak_vram_gib": [30.0, 20.0, 5.0],
            "torch_peak_reserved_gib": [28.5, 21.0, 9.0],
        }
    )
    text = " ".join(vram_crosscheck(runs))
    assert "**below** it on b" in text and "c" not in text.split("below")[1]
    assert vram_crosscheck(runs.iloc[:1]) == [
        "VRAM cross-check: the polled peak exceeds torch's reserved peak by 1.50 GiB (CUDA context and "
        "allocations outside PyTorch's allocator) on every ok run.",
        "",
    ]
    no_gpu = runs.assign(peak_vram_gib=float("nan"))
    assert vram_crosscheck(no_gpu) == []


def test_a_sweep_over_world_sizes_gets_a_scaling_table_and_plot(tmp_path, plots_on):
    two = f"{GPU_CELL}_g2"
    for cell_id, step_time in ((two, 0.21), (GPU_CELL, 0.4)):  # the 2-GPU runs first, then renamed
        for rep in (0, 1):
            write_run(tmp_path, GPU_CELL, "baseline", rep, step_time, vram=vram(35.0))
            d = tmp_path / "runs" / f"{GPU_CELL}_baseline_r{rep}"
            if cell_id == two:  # the same cell at 2 GPUs (8 samples per step over both)
                cell = json.loads((d / "cell.json").read_text())
                cell.update(cell_id=two, run_id=f"{two}_baseline_r{rep}", gpus=2)
                (d / "cell.json").write_text(json.dumps(cell))
                rows = [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]
                (d / "metrics.jsonl").write_text(
                    "".join(json.dumps({**r, "samples": 8}) + "\n" for r in rows)
                )
                d.rename(tmp_path / "runs" / f"{two}_baseline_r{rep}")
    out = build_report(tmp_path)
    assert (tmp_path / "scaling.csv").is_file() and (tmp_path / "scaling.png").read_bytes().startswith(
        b"\x89PNG"
    )
    eff = out["scaling"].set_index("world_size")["scaling_efficiency_pct"]
    assert eff[1] == pytest.approx(100.0) and eff[2] == pytest.approx(100 * (8 / 0.21 / 2) / (4 / 0.4))
    md = (tmp_path / "report.md").read_text()
    assert "## Scaling" in md and "efficiency %" in md and "Plot: scaling.png" in md


def test_an_arms_slow_first_run_is_flagged_as_hyperfine_flags_one_and_kept_in_the_statistics():
    from bench.results.firstrun import first_run_section, slow_first_runs

    def runs(times, arm="liger"):
        return pd.DataFrame(
            {
                "cell_id": "c",
                "arm": arm,
                "order_index": range(len(times)),
                "status": "ok",
                "samples_per_s": 1.0,
                "s_per_step_mean": times,
            }
        )

    # the cold H200 sweep's Liger runs (results/h200-specforge-verdict-precise): the first stands out
    cold = runs([1.1217, 1.112, 1.09, 1.0803, 1.0776, 1.0813, 1.0791, 1.0699, 1.0814, 1.0874])
    (found,) = slow_first_runs(cold)
    assert found["arm"] == "liger" and round(found["z"], 1) == 5.6 and found["n"] == 10
    lines = first_run_section(cold, {"config": {}})
    assert lines[0].startswith("**First runs slower.**") and "`prime_runs: 1`" in lines[0]
    assert "already ran 1 priming run(s)" in first_run_section(cold, {"config": {"prime_runs": 1}})[0]
    # its baseline: slowest first, but within the spread of the others (z 2.4): no warning
    assert (
        slow_first_runs(runs([1.2592, 1.2399, 1.2365, 1.2316, 1.2221, 1.2215, 1.2196, 1.214, 1.2146, 1.2354]))
        == []
    )
    # an outlier that is not the first run, or not the slowest, or too few runs: none either
    assert slow_first_runs(runs([1.08, 1.2, 1.08, 1.081, 1.079, 1.08])) == []
    assert slow_first_runs(runs([1.0, 1.2, 1.08, 1.081, 1.079, 1.08])) == []
    assert slow_first_runs(runs([1.3, 1.08, 1.081])) == []
    assert first_run_section(runs([]), {}) == []


def test_the_console_warns_of_a_slow_first_run_too(tmp_path):
    from tests.helpers import committed_sweep

    console = build_report(committed_sweep("h200-specforge-verdict-precise", tmp_path / "s"))[
        "console_summary"
    ]
    warning = [ln for ln in console if ln.startswith("warning: First runs slower.")]
    assert len(warning) == 1 and all(len(ln) <= 100 for ln in console)
