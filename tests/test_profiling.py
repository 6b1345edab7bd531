"""Step profiles (training.profile_steps, profile.json) and their kernel buckets, on the CPU."""

import json
import math

import pandas as pd
import pytest

from bench.kernels.buckets import BUCKET_COLUMNS, bucket_rows, profile_argv, profile_steps
from specforge.config import ConfigError, load_config
from specforge.profiling import BUCKET_NAMES, bucket_of, bucket_times, summarize
from tests.helpers import CONFIGS

ONLINE = str(CONFIGS / "train/tiny-online.yaml")


@pytest.mark.parametrize(
    "name,bucket",
    [
        ("_rms_norm_forward_kernel", "norm"),  # Liger's RMSNorm (Triton)
        ("_rms_norm_backward_kernel", "norm"),
        ("aten::mm", "GEMM"),
        ("aten::addmm", "GEMM"),
        ("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_64x4_tn_align8>", "GEMM"),
        ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "GEMM"),
        ("fmha_cutlassF_bf16_aligned_64x64_rf_sm80", "attention"),  # CUTLASS-built, still attention
        ("aten::_scaled_dot_product_flash_attention_for_cpu_backward", "attention"),
        ("triton_tem_fused_flex_attention_0", "attention"),
        ("_swiglu_forward_kernel", "activation"),  # Liger's SwiGLU
        ("aten::silu", "activation"),
        ("aten::log_softmax", "loss"),
        ("void at::native::(anonymous namespace)::fused_adam_kernel", "optimizer"),
        ("aten::_foreach_norm", "optimizer"),  # gradient clipping: optimizer before norm
        (
            "void at::native::multi_tensor_apply_kernel<BinaryOpScalarFunctor<float>, std::multiplies<float>>",
            "optimizer",
        ),
        ("void cunn_SoftMaxForward<4, float, float, float, LogSoftMaxForwardEpilogue>", "loss"),
        ("aten::copy_", "copies"),
        ("Memcpy HtoD (Pageable -> Device)", "copies"),
        ("aten::cat", "copies"),
        ("aten::scatter_add_", "other"),  # 'cat' only as a word
        ("aten::argmax", "other"),
        ("some_unknown_kernel", "other"),
    ],
)
def test_bucket_of_known_names(name, bucket):
    assert bucket_of(name) == bucket


def test_bucket_times_and_summary_add_up():
    items = [("aten::mm", 30.0), ("aten::mm", 10.0), ("aten::copy_", 20.0), ("mystery", 40.0)]
    assert bucket_times(items) == {
        **dict.fromkeys(BUCKET_NAMES, 0.0),
        "GEMM": 40.0,
        "copies": 20.0,
        "other": 40.0,
    }
    assert list(bucket_times([])) == list(BUCKET_NAMES)
    s = summarize(items, [3, 4], "cpu", "CPU self time", top=2)
    assert s["total_ms"] == pytest.approx(0.1) and s["total_ms_per_step"] == pytest.approx(0.05)
    by = {b["bucket"]: b for b in s["buckets"]}
    assert by["GEMM"]["ms_per_step"] == pytest.approx(0.02) and by["GEMM"]["share_pct"] == pytest.approx(40.0)
    assert sum(b["share_pct"] for b in s["buckets"]) == pytest.approx(100.0)
    assert [(t["name"], t["calls"], t["bucket"]) for t in s["top"]] == [
        ("aten::mm", 2, "GEMM"),
        ("mystery", 1, "other"),
    ]


@pytest.mark.parametrize(
    "value,needle",
    [
        ("[0]", "step 0 is not a step of the run"),
        ("[31]", "step 31 is not a step of the run (1-based, 1 to training.steps = 30)"),
        ("[1,2,3,4,5]", "at most 4 steps"),
        ("[2,2]", "listed twice"),
        ("[1.5]", "training.profile_steps[0]: expected an integer"),
        ("3", "expected a list"),
    ],
)
def test_profile_steps_validation_is_one_line(value, needle):
    with pytest.raises(ConfigError, match="^training.profile_steps") as e:
        load_config(ONLINE, [f"training.profile_steps={value}"])
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_profile_steps_default_and_valid():
    cfg, _ = load_config(ONLINE)
    assert cfg.training.profile_steps == []
    cfg, _ = load_config(ONLINE, ["training.profile_steps=[29, 30]"])
    assert cfg.training.profile_steps == [29, 30]


def test_profiled_training_run_writes_profile_json(tmp_path, capsys):
    from specforge.__main__ import main

    out = tmp_path / "run"
    sets = [
        "training.device=cpu", "model.attention_backend=sdpa", "training.steps=3",
        "training.accumulation_steps=1", "training.profile_steps=[2,3]",
    ]  # fmt: skip
    assert main(["train", ONLINE, "--output-dir", str(out), *(a for s in sets for a in ("--set", s))]) == 0
    capsys.readouterr()
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [row.get("profiled", False) for row in rows] == [False, True, True]
    assert "profiled" not in rows[0]  # an unprofiled step's row is as it always was
    prof = json.loads((out / "profile.json").read_text())
    assert (
        prof["steps"] == [2, 3] and prof["device"] == "cpu" and prof["time_kind"].startswith("CPU self time")
    )
    assert [b["bucket"] for b in prof["buckets"]] == list(BUCKET_NAMES)
    assert sum(b["ms"] for b in prof["buckets"]) == pytest.approx(prof["total_ms"])
    assert sum(b["share_pct"] for b in prof["buckets"]) == pytest.approx(100.0)
    assert prof["total_ms"] > 0 and 0 < len(prof["top"]) <= 20
    by = {b["bucket"]: b for b in prof["buckets"]}
    assert by["GEMM"]["ms"] > 0 and by["attention"]["ms"] > 0  # aten::mm, sdpa on the CPU
    assert all(t["bucket"] == bucket_of(t["name"]) for t in prof["top"])
    assert json.loads((out / "run.json").read_text())["status"] == "ok"


def test_profile_command_is_the_sweeps_with_the_steps_set_last(tmp_path):
    from bench.config import Run
    from bench.trainers import load_config as load_sweep

    cfg = load_sweep(CONFIGS / "cpu.yaml")
    cell = cfg.cells[0]
    assert profile_steps(4) == (6, [5, 6])
    argv = profile_argv(cfg, Run("x", cell, "liger", 1, 0), tmp_path / "r", tmp_path / "c")
    assert argv[-2:] == ["--output-dir", str(tmp_path / "r")]
    sets = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    assert f"data.cache_dir={tmp_path / 'c'}" in sets and f"data.seq_len={cell.seq_len}" in sets
    assert sets[0] == f"training.steps={cell.warmup_steps + 2}"  # the cell's steps, cut
    assert f"training.profile_steps={profile_steps(cell.warmup_steps)[1]}" in sets
    assert "--use-liger-kernel" in argv


def test_bucket_rows_difference_vs_baseline():
    def prof(gemm, other):
        return {
            "device": "cuda",
            "time_kind": "device",
            "steps": [5, 6],
            "buckets": [
                {"bucket": "GEMM", "ms_per_step": gemm, "share_pct": 100 * gemm / (gemm + other)},
                {"bucket": "other", "ms_per_step": other, "share_pct": 100 * other / (gemm + other)},
            ],
        }

    records = [
        {"cell_id": "c", "arm": "baseline", "status": "ok", "reason": None, "profile": prof(30.0, 10.0)},
        {"cell_id": "c", "arm": "liger", "status": "ok", "reason": None, "profile": prof(30.0, 5.0)},
        {"cell_id": "c", "arm": "swiglu", "status": "skipped", "reason": "no GPU", "profile": None},
    ]
    df = bucket_rows(records)
    assert list(df.columns) == BUCKET_COLUMNS and len(df) == 3 * len(BUCKET_NAMES)
    row = df[(df["arm"] == "liger") & (df["bucket"] == "other")].iloc[0]
    assert row["delta_ms_vs_baseline"] == pytest.approx(-5.0)
    assert row["delta_share_pct_vs_baseline"] == pytest.approx(100 * 5 / 35 - 25.0)
    assert row["profiled_steps"] == "5 6"
    skipped = df[df["arm"] == "swiglu"]
    assert (skipped["status"] == "skipped").all() and skipped["device_ms_per_step"].isna().all()
    assert math.isnan(df[(df["arm"] == "liger") & (df["bucket"] == "norm")]["device_ms_per_step"].iloc[0])
    assert isinstance(df, pd.DataFrame)
