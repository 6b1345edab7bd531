"""Column declarations (registry: bench/results/columns.py): the groups several tables share (a
cell's columns, the provenance), runs.csv (one row per run), vram_per_card.csv and loss_parity.csv."""

from __future__ import annotations

from bench.results.columns_spec import BOOL, FLOAT, INT, TEXT, Column, Table

# ---------------------------------------------------------------- shared by several tables

RUN_ID = Column("run_id", TEXT, "", "the run's directory under runs/: `<cell_id>_<arm>_r<repeat>`")
CELL_ID = Column(
    "cell_id", TEXT, "",
    "the cell: `<profile>_<mode>_bs<batch_size>_s<seq_len>`, plus `_g<gpus>` and `_n<nodes>` above 1, "
    "`_<trainer>` for a trainer other than ours and `_<label>` for a labelled cell",
)  # fmt: skip
TRAINER = Column(
    "trainer", TEXT, "",
    "the trainer plug that ran it: `embedded`, ours, or `specforge-cli`; cell.json's `trainer`, and "
    "`embedded` for a run recorded before there was that key",
)  # fmt: skip
# The cell columns: with `trainer`, what a sweep's cell fixes.
CELL = (
    TRAINER,
    Column("profile", TEXT, "", "the model profile (configs/profiles/: `tiny`, `qwen3.5-4b-dflash`, ...)"),
    Column(
        "mode", TEXT, "",
        "`offline` (a cache of target hidden states) or `online` (the target in the loop)",
    ),
    Column("batch_size", INT, "samples", "samples per micro-batch per GPU"),
    Column("seq_len", INT, "tokens", "tokens per sample"),
    Column("accumulation_steps", INT, "", "micro-batches per optimizer step"),
    Column("num_anchors", INT, "", "blocks per sample (`training.num_anchors`)"),
    Column("gpus", INT, "", "GPUs per node the run trained on"),
    Column("nodes", INT, "", "nodes the run trained on (1 but for a multi-node run)"),
)  # fmt: skip
WORKLOAD_DIGEST = Column(
    "workload_digest", TEXT, "",
    "12 hex digits of the sha256 of the cell's training config file and its `set:` overrides: with the "
    "cell columns and the arm, the workload identity (what `bench compare` pairs rows on)",
)  # fmt: skip
ARM = Column(
    "arm", TEXT, "",
    "the arm (`baseline`, `liger`, `aa`, ...: the sweep's `arms`); in a comparison table, the arm compared",
)  # fmt: skip
REPEAT = Column(
    "repeat", INT, "",
    "the pair (round) the run belongs to: one run of each arm of the cell, from 1",
)  # fmt: skip
# What the run's machine was (run.json's provenance); summary.csv joins each one's distinct values.
PROVENANCE = (
    Column("hostname", TEXT, "", "the machine's host name"),
    Column("gpu_name", TEXT, "", "the GPUs' names, each distinct one once"),
    Column("gpu_count", INT, "", "the GPUs the trainer's process saw"),
    Column(
        "driver_version", TEXT, "",
        "the GPU driver's version (the ROCm version on AMD; else the poller's reading)",
    ),
    Column("cuda_version", TEXT, "", "`CUDA 13.0`, or `HIP …` on ROCm"),
    Column("torch_version", TEXT, "", "torch's version"),
    Column("triton_version", TEXT, "", "Triton's version"),
    Column("transformers_version", TEXT, "", "transformers' version"),
    Column("liger_version", TEXT, "", "liger-kernel's version"),
    Column(
        "git_commit", TEXT, "",
        "`git describe --always --dirty` of the suite's checkout (12 hex digits), or `$BENCH_GIT_COMMIT`",
    ),
    Column(
        "code_versions", TEXT, "",
        "the versions the run imported, read from inside its process (run.json's `code`): specforge, "
        "liger-kernel, torch, triton, transformers, each `NAME VERSION`, a checkout's `checkout COMMIT` "
        "and `(dirty DIGEST)` (12 hex digits of its diff), joined by ` · `; empty for a run that "
        "recorded none (a trainer or a sweep from before the record)",
    ),
)  # fmt: skip

# ---------------------------------------------------------------- runs.csv

_STATUS = (
    "the trainer's (run.json: `ok`, `oom`, `error`, `timeout`, `skipped`, `lost`, ...) except for two cases."
    " `error`: the run's identity cannot be confirmed. Its directory name (`<cell_id>_<arm>_r<repeat>`) is "
    "missing from sweep.json's planned `order`, or its cell.json is missing, unreadable, not an object, "
    "lacks one of `run_id, cell_id, arm, repeat, warmup_steps` or names another run; the reason says which. "
    "Also `error`: a cell.json that is not the workload sweep.json planned for its cell (its `cells`: every "
    "cell column, `set`, `train_config`, `steps`, `warmup_steps`), or, for a sweep.json from before it "
    "recorded `cells`, whose workload differs from most runs of its cell: a run copied in from another "
    'sweep, or edited; the reason names each key that differs ("a run of another workload, not counted"). '
    "The row keeps the directory's cell, arm and repeat, leaves the warm-up count blank and stays out of the"
    " statistics. `not run`: sweep.json planned the run, other runs of its round (cell and repeat) have a "
    "directory, and it has none. A round with no directory at all gets no rows: the sweep has not reached it"
    " yet, or it was removed whole"
)  # fmt: skip
_NOTE = (
    "why an ok run stays out of the statistics, and warnings. Either it logged too few steps, or "
    "metrics.jsonl contradicts the run's own facts: a value a throughput is computed from (`step_time_s, "
    "samples, tokens, samples_per_s, tokens_per_s`) that is neither null nor a finite number ≥ 0 (a step "
    "time must be > 0); a step's `samples` other than the cell fixes (batch × accumulation × GPUs × nodes); "
    "a steady step time outside 1/50 to 1000× the run's median; a step number repeated, out of order or "
    "missing, or beyond the cell's `steps`. The note names the line and the value, e.g. `metrics.jsonl line "
    "4 (step 4): samples = 400, where the cell fixes 4 a step (…)`. Warnings beside it: another process "
    "held memory on the cards; and, for a run in the statistics, the allocator retried allocations, or a "
    "steady step took over 1.5× the run's median (`unstable: …`); the run's pair spans Slurm allocations"
)  # fmt: skip
_STATE = (
    ("sm_clock_mhz", "MHz", "SM clock"),
    ("mem_clock_mhz", "MHz", "memory clock"),
    ("temperature_c", "°C", "temperature"),
    ("power_w", "W", "power draw"),
)  # fmt: skip
STATE_FIELDS = tuple(field for field, _, _ in _STATE)
# The busiest card's state over state_window (the poller reads it once a second, read only).
STATE = tuple(
    Column(f"{field}_{stat}", FLOAT, unit, f"the {stat} of the busiest card's {what} over `state_window`")
    for field, unit, what in _STATE
    for stat in ("min", "median", "max")
) + (
    Column(
        "state_window", TEXT, "",
        "where the machine-state columns come from: the busiest card (the one whose memory rose most), "
        "read only, over the run's measured steps — `measured steps` — or, for a trainer that writes no "
        "step times, over the whole run, start included — `whole run`",
    ),
)  # fmt: skip
STARTUP = (
    Column("startup_s", FLOAT, "s", "process start, or fork, → step 1 (run.json's `startup_s`)"),
    Column(
        "imports_s", FLOAT, "s",
        "of startup_s, the trainer's imports (0 when forked from the warm server)",
    ),
    Column(
        "imports_preloaded", BOOL, "",
        "true: forked from the warm server, imports done before it started",
    ),
    Column(
        "first_step_s", FLOAT, "s",
        "step 1's time (a warm-up step: compilation and autotuning fall here)",
    ),
    Column(
        "to_first_measured_step_s", FLOAT, "s",
        "process start → the end of the last warm-up step (metrics' `elapsed_s` there; startup_s when "
        "there is no warm-up)",
    ),
    Column(
        "compile_cache_warm", BOOL, "",
        "true when the compile cache the runs share (`cache/compile/`) held a file as the run started",
    ),
    Column("exit_s", FLOAT, "s", "after the last step to the exit: the specforge-cli wrapper's measurement"),
    Column("run_wall_s", FLOAT, "s", "the run's whole wall time, same source"),
)  # fmt: skip
ENERGY = (
    Column("energy_j", FLOAT, "J", "the joules of the run's cards over its measured steps"),
    Column("energy_j_per_sample", FLOAT, "J/sample", "energy_j per sample of those steps"),
    Column(
        "energy_source", TEXT, "",
        "`energy counter`: the cards' energy counters, read every 0.25 s, their values at the window's ends "
        "interpolated; `power integral`: the trapezoid integral of their power, its ends interpolated — "
        "cards without a counter, or runs recorded before the poller read it, from the 1-s state rows; "
        "`n/a (why)` when the readings do not cover the window, fewer than 5 fall inside it or two are more "
        "than a fifth of it apart, and on the CPU or with the poller off: NaN, never 0",
    ),
    Column("energy_cards", INT, "", "the cell's `gpus` cards per node whose memory rose most"),
    Column("power_interval_s", FLOAT, "s", "the median interval between the readings used: the resolution"),
)  # fmt: skip
RUNS_TABLE = Table(
    "runs.csv",
    "one row per run, whatever its status (a planned run that did not run: `not run`); `trainer` to "
    "`nodes` are the cell columns",
    (
        RUN_ID, CELL_ID, *CELL, WORKLOAD_DIGEST, ARM, REPEAT,
        Column("order_index", INT, "", "the run's 0-based position in the sweep's planned run order"),
        Column("status", TEXT, "", _STATUS),
        Column("reason", TEXT, "", "why the status, in one line (run.json's, or the check's that set it)"),
        Column("note", TEXT, "", _NOTE),
        Column("steps_total", INT, "", "the optimizer steps metrics.jsonl logged"),
        Column(
            "warmup_steps", INT, "",
            "the first steps left out of the timing (cell.json's; blank when unconfirmed)",
        ),
        Column("steps_measured", INT, "", "the steady steps: after the warm-up, with a step time"),
        Column("s_per_step_mean", FLOAT, "s", "the steady steps' mean step time"),
        Column("s_per_step_median", FLOAT, "s", "their median step time"),
        Column("s_per_step_std", FLOAT, "s", "their step times' sample standard deviation"),
        Column("s_per_step_p10", FLOAT, "s", "their step times' 10th percentile"),
        Column("s_per_step_p90", FLOAT, "s", "their step times' 90th percentile"),
        Column(
            "samples_per_s", FLOAT, "samples/s",
            "throughput: total samples over total steady-state time, not a mean of ratios; blank for a run "
            "outside the statistics",
        ),
        Column("tokens_per_s", FLOAT, "tokens/s", "the same in tokens"),
        Column(
            "mfu", FLOAT, "",
            "model FLOPs utilisation, the steady steps' mean: model FLOP/s over the GPUs' peak (0.41 = 41%)",
        ),
        Column("peak_vram_gib", FLOAT, "GiB", "busiest card, polled, used memory"),
        Column("peak_vram_sum_gib", FLOAT, "GiB", "all cards"),
        Column("peak_vram_delta_gib", FLOAT, "GiB", "busiest card above its idle baseline"),
        Column(
            "vram_status", TEXT, "",
            "vram.json's status (`ok`, `partial`, `unavailable`), `missing` without one",
        ),
        Column(
            "torch_peak_allocated_gib", FLOAT, "GiB",
            "allocator peak allocated, max over steps and ranks",
        ),
        Column("torch_peak_reserved_gib", FLOAT, "GiB", "allocator peak reserved, max over steps and ranks"),
        Column("loss_last", FLOAT, "", "the last logged step's loss (ok runs)"),
        Column("accuracy_last", FLOAT, "", "the last logged step's accuracy (ok runs)"),
        Column(
            "accuracy_by_position_last", TEXT, "",
            "the last step's per-position accuracies, space-separated, of a trainer that logs them: "
            "SpecForge's `acc_i` or `accuracy_position_i`; empty for SpecForge 0.2.0's DFlash, which logs "
            "only its overall `acc`",
        ),
        Column(
            "arm_in_effect", TEXT, "",
            "whether the model the run trained held the Liger modules its arm asks for and no others, and "
            "whether the trainer resolved each key the arm set to the value asked (a user arm's keys; a "
            "built-in arm's, cell.json's `arm_keys`) (`yes`, or `no: ` and what differs), from the run's "
            "own records (run.json's `draft_module_types` and `set_resolved`; the SpecForge CLI's from "
            "inside its process after step 1); empty when a part was not recorded (not proven). A cell "
            "with a `no` run gets the verdict `arm not in effect`, never a Δ",
        ),
        *STARTUP, *STATE, *ENERGY,
        Column("start_time", TEXT, "", "run.json's start time (ISO 8601)"),
        Column("end_time", TEXT, "", "run.json's end time (ISO 8601)"),
        *PROVENANCE,
    ),
)  # fmt: skip

# ---------------------------------------------------------------- vram_per_card.csv

VRAM_PER_CARD_TABLE = Table(
    "vram_per_card.csv",
    "one row per run × card of its vram.json: every card of the machine (of every node), idle ones too",
    (
        RUN_ID, CELL_ID, ARM, REPEAT,
        Column("node", TEXT, "", "0, or the node of a multi-node run"),
        Column("card_index", INT, "", "the card's index on its node (NVML's or AMD SMI's)"),
        Column("card_name", TEXT, "", "the card's name"),
        Column("total_gib", FLOAT, "GiB", "the card's memory"),
        Column("baseline_used_gib", FLOAT, "GiB", "its used memory idle, before the run started"),
        Column("peak_used_gib", FLOAT, "GiB", "its largest used memory during the run"),
        Column("peak_delta_gib", FLOAT, "GiB", "peak_used_gib minus baseline_used_gib"),
    ),
)  # fmt: skip

# ---------------------------------------------------------------- loss_parity.csv

LOSS_PARITY_TABLE = Table(
    "loss_parity.csv",
    "one row per cell × non-baseline arm × pair whose two runs entered the statistics and logged losses",
    (
        CELL_ID, TRAINER,
        *(c for c in CELL if c.name in ("profile", "mode", "batch_size", "seq_len", "gpus")),
        Column("nodes", INT, "", "nodes the run trained on (1 for a cell recorded before multi-node)"),
        ARM, REPEAT,
        Column("steps_compared", INT, "", "the steps both runs logged a loss for, warm-up included"),
        Column("max_abs_delta", FLOAT, "", "the largest |loss_arm − loss_baseline| over those steps"),
        Column("max_abs_delta_step", INT, "", "the step where it is"),
        Column("last_step", INT, "", "the last step both logged"),
        Column("last_step_abs_delta", FLOAT, "", "|Δ loss| at last_step: what the criterion judges"),
        Column("loss_last_baseline", FLOAT, "", "the baseline run's loss at last_step"),
        Column("loss_last_arm", FLOAT, "", "the arm's run's loss at last_step"),
        Column("tolerance", FLOAT, "", "the cell's `loss_tolerance` (0.01 when it sets none)"),
        Column("criterion", TEXT, "", "the rule: `last_step_abs_delta <= tolerance`"),
        Column("passed", BOOL, "", "whether the pair meets the criterion"),
    ),
)  # fmt: skip
