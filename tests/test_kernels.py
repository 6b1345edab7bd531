"""Kernel attribution (python -m bench kernels): the arithmetic, the shapes, the command on the CPU."""

import json
import math
from collections import Counter

import pandas as pd
import pytest

from bench.__main__ import main
from bench.kernels import roofline
from bench.kernels.cell import KERNEL_COLUMNS
from bench.kernels.predict import predictions, swapped_kinds
from bench.kernels.shapes import draft_shapes, loss_site, module_sites, site_cost
from specforge.config import load_profile
from tests.helpers import CONFIGS, run_cli

NO_GPU = "Liger's Triton kernels need a CUDA or ROCm GPU; this machine has none"
CPU_CELLS = ["tiny_offline_bs2_s128"]
SITES = ["rmsnorm_block", "rmsnorm_context", "rmsnorm_q", "rmsnorm_k", "swiglu_mlp"]


# ---------------------------------------------------------------- arithmetic, by hand


def test_rmsnorm_bytes_and_flops():
    # 8 rows of 4 in bf16: e (5 E + 3 dim) = 2 (5*32 + 3*4) = 344 bytes; 13 E = 416 FLOPs
    assert roofline.rmsnorm_bytes(8, 4, 2) == 344
    assert roofline.rmsnorm_flops(8, 4) == 416


def test_mlp_bytes_and_flops():
    # T=2, H=3, I=5 in bf16: 18 T H I = 540 FLOPs; 2 (8*6 + 9*15 + 17*10) = 2 * 353 = 706 bytes
    assert roofline.mlp_flops(2, 3, 5) == 540
    assert roofline.mlp_bytes(2, 3, 5, 2) == 706


def test_roofline_memory_bound():
    # 344 bytes at 1 GB/s take 344 ns; 416 FLOPs at 1 TFLOP/s 0.416 ns: memory-bound, floor 344 ns
    r = roofline.roofline(416, 344, 688e-9, 1e9, 1e12)
    assert r.bound == "memory"
    assert r.floor_s == pytest.approx(344e-9)
    assert r.fraction == pytest.approx(0.5)  # measured 688 ns = twice the floor
    assert r.achieved_bytes_per_s == pytest.approx(0.5e9)
    assert r.achieved_flops_per_s == pytest.approx(416 / 688e-9)
    assert r.intensity == pytest.approx(416 / 344)


def test_roofline_compute_bound_and_untimed():
    # 540 FLOPs at 1 GFLOP/s = 540 ns > 706 bytes at 1 TB/s = 0.706 ns: compute-bound
    r = roofline.roofline(540, 706, 1.08e-6, 1e12, 1e9)
    assert (r.bound, r.fraction) == ("compute", pytest.approx(0.5))
    assert r.floor_s == pytest.approx(540e-9)
    untimed = roofline.roofline(540, 706, None, 1e12, 1e9)
    assert untimed.bound == "compute" and math.isnan(untimed.fraction)
    with pytest.raises(ValueError):
        roofline.roofline(1, 1, 1.0, 0.0, 1.0)


def test_step_saving_and_throughput_delta():
    # 2 ms saved per call, 11 calls per micro-batch, 4 micro-batches: 88 ms per step
    assert roofline.step_saving_s(3e-3, 1e-3, 11, 4) == pytest.approx(0.088)
    assert roofline.step_saving_s(1e-3, 2e-3, 1, 2) == pytest.approx(-2e-3)  # Liger slower
    # a 1 s step 0.2 s shorter: 1 / 0.8 = 1.25 -> +25% samples/s
    assert roofline.samples_per_s_delta_pct(1.0, 0.2) == pytest.approx(25.0)
    assert math.isnan(roofline.samples_per_s_delta_pct(float("nan"), 0.2))


def test_4b_cell_shapes_and_costs():
    """The 4B cell of configs/h200.yaml: b 2, S 2048, N 512, B 16, H 2560, I 9728, 5 layers, bf16."""
    s = draft_shapes(load_profile("qwen3.5-4b-dflash").draft, 2, 2048, 512)
    assert (s.block_tokens, s.context_tokens, s.kv_tokens) == (16384, 4096, 20480)
    sites = {x.name: x for x in module_sites(s)}
    assert list(sites) == SITES
    assert {n: x.per_micro_batch for n, x in sites.items()} == {
        "rmsnorm_block": 11,  # 2 per layer + the final norm
        "rmsnorm_context": 1,
        "rmsnorm_q": 5,
        "rmsnorm_k": 5,
        "swiglu_mlp": 5,
    }
    assert sites["rmsnorm_q"].rows == 16384 * 32 and sites["rmsnorm_q"].dim == 128
    assert sites["rmsnorm_k"].rows == 20480 * 8
    # RMSNorm over 16384 x 2560 in bf16: 2 (5 * 41943040 + 3 * 2560) bytes, 13 * 41943040 FLOPs
    assert site_cost(sites["rmsnorm_block"], s, 2) == (545_259_520, 419_445_760)
    # MLP: 18 * 16384 * 2560 * 9728 FLOPs; 2 (335544320 + 224133120 + 2709520384) bytes
    flops, nbytes = site_cost(sites["swiglu_mlp"], s, 2)
    assert (flops, nbytes) == (7_344_394_076_160, 6_538_395_648)
    # ~1123 FLOP/B: compute-bound on any GPU whose ridge is below that; RMSNorm ~1.3 FLOP/B
    assert roofline.roofline(flops, nbytes, None, 4e12, 700e12).bound == "compute"
    assert roofline.roofline(*site_cost(sites["rmsnorm_block"], s, 2), None, 4e12, 700e12).bound == "memory"
    # the loss: 2 * 512 * 15 scored positions against the 4B vocabulary, 4 T H V FLOPs, compute-bound
    loss = loss_site(s)
    assert loss.shape == (15360, 2560) and loss.per_micro_batch == 1 and s.vocab > 100_000
    lf, lb = site_cost(loss, s, 2)
    assert lf == 4 * 15360 * 2560 * s.vocab and lb == 2 * (2 * s.vocab * 2560 + 2 * 15360 * 2560) + 12 * 15360
    assert roofline.roofline(lf, lb, None, 4e12, 700e12).bound == "compute"


def test_swapped_kinds_follow_the_arms():
    assert swapped_kinds("liger") == ("rmsnorm", "swiglu")
    assert swapped_kinds("rmsnorm") == ("rmsnorm",)
    assert swapped_kinds("swiglu") == ("swiglu",)
    assert swapped_kinds("baseline") == ()
    assert swapped_kinds("liger_compile") == ()  # also compiles the layers: not the modules' Δ alone
    assert swapped_kinds("liger_flce") == ("rmsnorm", "swiglu", "loss")


# ---------------------------------------------------------------- the shapes against the real draft


@pytest.mark.parametrize("seq_len,num_anchors", [(16, 3), (16, 40)])  # 40 > S - 1: padded blocks
def test_sites_are_the_draft_real_calls(seq_len, num_anchors):
    """Every RMSNorm and MLP call of DFlashDraft.forward, with its input shape, is a site, as often."""
    import torch
    from transformers.models.qwen3 import modeling_qwen3

    from specforge import objective
    from specforge.draft import DFlashDraft

    profile = load_profile("tiny")
    d, t = profile.draft, profile.target
    b = 2
    draft = DFlashDraft(d, len(t.capture_layer_ids), t.hidden_size, seq_len + d.block_size + 1)
    seen = Counter()

    def hook(module, args):
        kind = "rmsnorm" if isinstance(module, modeling_qwen3.Qwen3RMSNorm) else "swiglu"
        seen[(kind, tuple(args[0].shape))] += 1

    for m in draft.modules():
        if isinstance(m, (modeling_qwen3.Qwen3RMSNorm, modeling_qwen3.Qwen3MLP)):
            m.register_forward_pre_hook(hook)
    gen = torch.Generator().manual_seed(0)
    mask = torch.ones(b, seq_len, dtype=torch.uint8)
    anchors, keep = objective.sample_anchors(mask, num_anchors, gen)
    hidden = torch.randn(b, seq_len, len(t.capture_layer_ids) * t.hidden_size, generator=gen)
    noise = torch.randn(b, anchors.shape[1] * d.block_size, d.hidden_size, generator=gen)
    with torch.no_grad():
        draft(hidden, noise, anchors, keep, "sdpa")
    expected = Counter()
    for site in module_sites(draft_shapes(d, b, seq_len, num_anchors)):
        expected[(site.kind, site.shape)] += site.per_micro_batch
    assert seen == expected


# ---------------------------------------------------------------- predicted vs measured


def test_predictions_sum_the_swapped_modules_beside_the_sweep():
    rows = pd.DataFrame(
        [
            {"cell_id": "c", "impl": "liger", "kind": "rmsnorm", "status": "ok", "saving_per_step_ms": 100.0},
            {"cell_id": "c", "impl": "liger", "kind": "rmsnorm", "status": "ok", "saving_per_step_ms": 50.0},
            {"cell_id": "c", "impl": "liger", "kind": "swiglu", "status": "ok", "saving_per_step_ms": 30.0},
            {"cell_id": "c", "impl": "stock", "kind": "swiglu", "status": "ok", "saving_per_step_ms": None},
            {"cell_id": "d", "impl": "liger", "kind": "swiglu", "status": "ok", "saving_per_step_ms": 999.0},
        ]
    )
    summary = pd.DataFrame(
        [
            {"cell_id": "c", "arm": "baseline", "s_per_step_median": 1.0},
            {
                "cell_id": "c",
                "arm": "liger",
                "s_per_step_median": 0.8,
                "delta_samples_per_s_pct": 25.0,
                "delta_samples_per_s_pct_ci95_low": 20.0,
                "delta_samples_per_s_pct_ci95_high": 30.0,
            },
        ]
    )
    by_arm = {p["arm"]: p for p in predictions(rows, "c", summary)}
    liger = by_arm["liger"]
    assert liger["predicted_saving_ms"] == pytest.approx(180.0)
    assert liger["predicted_delta_samples_per_s_pct"] == pytest.approx((1 / 0.82 - 1) * 100)
    assert liger["measured_saving_ms"] == pytest.approx(200.0)
    assert (liger["measured_delta_samples_per_s_pct"], liger["in_sweep"]) == (25.0, True)
    assert by_arm["rmsnorm"]["predicted_saving_ms"] == pytest.approx(150.0)
    assert not by_arm["rmsnorm"]["in_sweep"] and math.isnan(by_arm["rmsnorm"]["measured_saving_ms"])
    assert by_arm["swiglu"]["predicted_saving_ms"] == pytest.approx(30.0)
    # no summary: predictions only
    assert predictions(rows, "c", None)[0]["predicted_saving_ms"] == pytest.approx(180.0)
    # a skipped Liger module: no prediction, and the reason says why
    skipped = rows.assign(status="skipped", reason="no GPU", saving_per_step_ms=None)
    p = predictions(skipped, "c", summary)[0]
    assert math.isnan(p["predicted_saving_ms"]) and p["not_predicted"] == "no GPU"


# ---------------------------------------------------------------- the command


@pytest.mark.slow
def test_kernels_on_the_cpu_end_to_end(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("checks the CPU path (Liger rows skipped)")
    sweep = tmp_path / "sweep"
    sweep.mkdir()
    pd.DataFrame(
        [
            {"cell_id": CPU_CELLS[0], "arm": "baseline", "s_per_step_median": 0.5},
            {
                "cell_id": CPU_CELLS[0],
                "arm": "liger",
                "s_per_step_median": 0.45,
                "delta_samples_per_s_pct": 12.0,
                "delta_samples_per_s_pct_ci95_low": 10.0,
                "delta_samples_per_s_pct_ci95_high": 14.0,
            },
        ]
    ).to_csv(sweep / "summary.csv", index=False)
    out = tmp_path / "k"
    r = run_cli(
        "bench", "kernels", str(CONFIGS / "cpu.yaml"), "--out", str(out), "--sweep-dir", str(sweep),
        "--reps", "5", "--warmup", "1",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    df = pd.read_csv(out / "kernels.csv")
    assert list(df.columns) == KERNEL_COLUMNS
    assert len(df) == len(CPU_CELLS) * (len(SITES) + 1) * 2  # + the LM head + CE
    assert sorted(df["cell_id"].unique()) == CPU_CELLS
    stock, liger = df[df["impl"] == "stock"], df[df["impl"] == "liger"]
    assert (stock["status"] == "ok").all() and (stock["time_median_ms"] > 0).all()
    assert (stock["time_p20_ms"] <= stock["time_median_ms"]).all()
    assert (stock["time_median_ms"] <= stock["time_p80_ms"]).all()
    assert stock["peak_mem_delta_mib"].isna().all()  # None on the CPU
    assert set(stock["module_class"]) == {"Qwen3RMSNorm", "Qwen3MLP", "ChunkedLinearCE"}
    assert (liger["status"] == "skipped").all() and (liger["reason"] == NO_GPU).all()
    assert liger["time_median_ms"].isna().all()
    assert (df["copy_gb_per_s"] > 0).all() and (df["matmul_tflops"] > 0).all()
    assert (stock["roofline_fraction"] > 0).all()
    assert set(df["timer"]) == {"time.perf_counter (CPU)"}
    assert (df["dtype"] == "float32").all() and (df["device"] == "cpu").all()
    # the tiny cells' shapes: b 2, S 128, N 8, B 4, H 64 -> 64 block tokens, 320 keys/values
    first = df[(df["cell_id"] == CPU_CELLS[0]) & (df["impl"] == "stock")].set_index("module")
    assert first.loc["rmsnorm_block", "input_shape"] == "2x32x64"
    assert first.loc["rmsnorm_k", "input_shape"] == "2x160x2x16"
    assert first.loc["rmsnorm_block", "bytes"] == roofline.rmsnorm_bytes(64, 64, 4)
    # the loss over b N (B - 1) = 2 * 8 * 3 scored positions, the tiny vocab's head frozen
    vocab = load_profile("tiny").draft.vocab_size
    assert (
        first.loc["lm_head_ce", "input_shape"] == "48x64" and first.loc["lm_head_ce", "vocab_size"] == vocab
    )
    assert first.loc["lm_head_ce", "flops"] == roofline.linear_ce_flops(48, 64, vocab)
    assert (out / "kernels.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    md = (out / "kernels.md").read_text()
    assert "## Kernel attribution: cpu" in md
    assert all(f"### {c}" in md for c in CPU_CELLS)
    assert "keys/values b·(S + N·B) = 320" in md
    assert "+12.0% [+10.0, +14.0]" in md  # the sweep's measured Δ beside the (skipped) prediction
    assert "+50 |" in md  # measured saving: 500 - 450 ms
    assert f"not predicted: {NO_GPU}" in md

    # --rebuild: the sweep finished later (liger now +15%), and one arm had a profile; nothing is
    # measured again, kernels.csv stays as it was
    summary = pd.read_csv(sweep / "summary.csv")
    summary.loc[summary["arm"] == "liger", "delta_samples_per_s_pct"] = 15.0
    summary.to_csv(sweep / "summary.csv", index=False)
    csv_before = (out / "kernels.csv").read_bytes()
    prof = {"device": "cpu", "time_kind": "cpu", "steps": [2, 3],
            "buckets": [{"bucket": "GEMM", "ms_per_step": 3.0, "share_pct": 100.0}]}  # fmt: skip
    (out / "profiles" / f"{CPU_CELLS[0]}_baseline").mkdir(parents=True)
    (out / "profiles" / f"{CPU_CELLS[0]}_baseline" / "profile.json").write_text(json.dumps(prof))
    argv = ["kernels", str(CONFIGS / "cpu.yaml"), "--rebuild", "--out", str(out), "--sweep-dir", str(sweep)]
    assert main(argv) == 0
    assert (out / "kernels.csv").read_bytes() == csv_before
    md = (out / "kernels.md").read_text()
    assert "+15.0% [+10.0, +14.0]" in md and "+12.0%" not in md
    assert "--rebuild" in md and "rebuilt" in md and "(the timings)" in md
    assert "keys/values b·(S + N·B) = 320" in md  # the shapes, from the config as before
    buckets = pd.read_csv(out / "kernel_buckets.csv")
    base = buckets[(buckets["cell_id"] == CPU_CELLS[0]) & (buckets["arm"] == "baseline")]
    assert base.loc[base["bucket"] == "GEMM", "device_ms_per_step"].iloc[0] == pytest.approx(3.0)
    liger = buckets[(buckets["cell_id"] == CPU_CELLS[0]) & (buckets["arm"] == "liger")]
    assert (liger["status"] == "skipped").all()


def test_rebuild_without_a_measured_run_is_one_line(capsys, tmp_path):
    err = _one_line_error(capsys, ["kernels", str(CONFIGS / "cpu.yaml"), "--rebuild", "--out", str(tmp_path)])
    assert "--rebuild: no" in err and "kernels.csv" in err
    assert not list(tmp_path.iterdir())


def test_rebuild_refuses_the_measuring_options(capsys, tmp_path):
    argv = [
        "kernels",
        str(CONFIGS / "cpu.yaml"),
        "--rebuild",
        "--out",
        str(tmp_path),
        "--profile",
        "--reps",
        "5",
    ]
    err = _one_line_error(capsys, argv)
    assert "--rebuild measures nothing, so --reps, --profile cannot apply" in err
    assert not list(tmp_path.iterdir())


def _one_line_error(capsys, argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


def test_unknown_cell_is_one_line(capsys, tmp_path):
    err = _one_line_error(
        capsys, ["kernels", str(CONFIGS / "cpu.yaml"), "--cell", "nope", "--out", str(tmp_path)]
    )
    assert "--cell nope: no such cell" in err and CPU_CELLS[0] in err
    assert not list(tmp_path.iterdir())


def test_bad_reps_is_one_line(capsys, tmp_path):
    assert "--reps" in _one_line_error(capsys, ["kernels", str(CONFIGS / "cpu.yaml"), "--reps", "1"])


def test_gpu_config_on_a_cpu_machine_is_refused(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("BENCH_HARDWARE", "cpu")
    err = _one_line_error(capsys, ["kernels", str(CONFIGS / "h200.yaml"), "--out", str(tmp_path / "k")])
    assert "h200" in err
    assert not (tmp_path / "k").exists()


def test_missing_config_is_one_line_from_the_cli(tmp_path):
    r = run_cli("bench", "kernels", str(tmp_path / "missing.yaml"))
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no such sweep config file" in lines[0]


def test_the_loss_site_times_the_trainers_two_losses(monkeypatch):
    """kernels' loss site builds the trainer's chunked LM head + CE and, for the liger_flce arm,
    objective.liger_linear_ce (a stand-in for Liger's kernel on the CPU): same loss, same gradient."""
    import torch

    from bench.kernels import modules, shapes
    from bench.trainers import load_config
    from specforge import liger

    functional = pytest.importorskip("liger_kernel.transformers.functional")

    def fake_flce(input, weight, target, reduction="mean", return_token_accuracy=False, **_):
        logits = (input @ weight.T).float()
        loss = torch.nn.functional.cross_entropy(logits, target, reduction=reduction)
        acc = (logits.argmax(-1) == target).float()
        return functional.CrossEntropyOutput(
            loss=loss, token_accuracy=acc if reduction == "none" else acc.mean()
        )

    monkeypatch.setattr(functional, "liger_fused_linear_cross_entropy", fake_flce)
    monkeypatch.setattr(liger, "fused_linear_ce_fn", lambda: fake_flce)
    cfg = load_config(CONFIGS / "cpu.yaml")
    plan = modules.plan_cell(cfg, cfg.cells[0], "cpu")
    site = shapes.loss_site(plan.shapes)
    x = torch.randn(site.shape, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    grads, losses = [], []
    for use_liger in (False, True):
        head = modules.loss_head(plan, site, use_liger)
        loss = head(x)
        loss.backward()
        grads.append(x.grad.clone())
        losses.append(float(loss.detach()))
        x.grad = None
    assert type(modules.loss_head(plan, site, False)).__name__ == "ChunkedLinearCE"
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-6)
