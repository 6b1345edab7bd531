"""How the SpecForge CLI's cells are read (PyPI ``specforge``, ``specforge train -c CONFIG
key=value ...``): its cell facts, the keys the driver owns, the arms it can express.

A ``specforge-cli`` cell's ``config`` is either
one of our training configs (top-level ``profile`` and ``mode: offline``: the plug prepares
SpecForge's inputs from it with random weights, inputs.py) or the
user's own SpecForge run config (passed through; only the keys below are set per run). Its
``set:`` keys are SpecForge's dotted keys. Nothing here imports SpecForge or reads past the files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.arms import ARMS, LIGER_DEFAULT, Arm
from bench.config import pick

NAME = "specforge-cli"
LIGER_KEY = "model.use_liger_kernel"  # SpecForge's one Liger switch

# The SpecForge keys the driver sets on every run of a specforge-cli cell (a cell's `set:` may not).
CLI_DRIVER_KEYS = {
    LIGER_KEY: "use arms",
    "training.batch_size": "use the cell's batch_size",
    "data.max_length": "use the cell's seq_len",
    "training.max_steps": "use steps",
    "training.log_interval": "the driver reads every step",
    "training.save_interval": "the driver keeps no checkpoints",
    "training.eval_interval": "the driver measures training steps only",
    "tracking.report_to": "the driver reads the steps from stdout",
    "profiling.enabled": "profiled steps are not for timing",
    "deployment.trainer.nproc_per_node": "use gpus_per_run",
    "run_id": "the driver names each run",
    "output_dir": "the driver gives each run its directory",
}
# ... and, when the plug prepares the inputs (one of our training configs), these as well.
CLI_PREPARED_KEYS = {
    "data.hidden_states_path": "the plug prepares the features (or give your own SpecForge config)",
    "model.target_model_path": "the plug prepares the target (or give your own SpecForge config)",
    "model.draft_model_config": "the plug writes the draft config (or give your own SpecForge config)",
    "training.num_epochs": "the plug feeds exactly the samples a run trains on",
}

# The sweep keys only this trainer's runs honour (the plug: the interpreter it runs in, and the run
# wrapper's time-to-verdict levers): set in a sweep none of whose cells runs it, they are refused.
SWEEP_KEYS = frozenset({"trainer_python", "stop_after_last_step", "trainer_python_fork", "trainer_gc_freeze"})


def cli_arm(arm: Arm) -> bool:
    """Whether SpecForge expresses the arm: it has one Liger switch (model.use_liger_kernel), which
    swaps its RMSNorm and SwiGLU, and no key for compile, attention or the optimizer here; its
    learning rate is a key (lr_off), and aa_eps is instrument.py's, inside its process. A sweep's
    own arm (user_arms) is SpecForge's own keys, passed on the command line."""
    return set(arm.changes) <= {"learning rate"} and arm.kernels in (frozenset(), LIGER_DEFAULT)


CLI_ARMS = tuple(name for name, arm in ARMS.items() if cli_arm(arm))
ONLINE_OUT_OF_SCOPE = (
    "the SpecForge CLI's online runs need an SGLang server, which the suite does not start; "
    "use an offline config (features precomputed: data.hidden_states_path)"
)


def is_ours(train: dict) -> bool:
    """Whether a training config is one of ours (a top-level profile), not a SpecForge run config."""
    return isinstance(train.get("profile"), str)


def cli_cell_facts(train: dict, cfg_path: Path, overrides: dict) -> dict[str, Any] | str:
    """What a specforge-cli cell's config says about the cell: profile, mode, whether the plug
    prepares the inputs, and the shape keys (as the runs will see them: ``set:`` over the file);
    or one line on why it cannot be one."""
    if is_ours(train):
        if train.get("mode") != "offline":
            return ONLINE_OUT_OF_SCOPE
        ours = dict(
            accumulation_steps=pick(overrides, train, "training.accumulation_steps"),
            num_anchors=pick(overrides, train, "training.num_anchors"),
            attention_backend=pick({}, train, "model.attention_backend"),
        )
        if "training.attention_backend" in overrides:
            ours["attention_backend"] = overrides["training.attention_backend"]
        return dict(profile=train["profile"], mode="offline", inputs="prepared", **ours)
    for section in ("model", "data", "training"):
        if not isinstance(train.get(section), dict):
            return (
                f"neither one of our training configs (no top-level profile) nor a SpecForge run config "
                f"(no '{section}' mapping)"
            )
    if not pick(overrides, train, "data.hidden_states_path"):
        return ONLINE_OUT_OF_SCOPE
    run_id = train.get("run_id")
    return dict(
        profile=str(run_id) if isinstance(run_id, str) and run_id.strip() else cfg_path.stem,
        mode="offline",
        inputs="user",
        accumulation_steps=pick(overrides, train, "training.accumulation_steps") or 1,
        num_anchors=pick(overrides, train, "training.num_anchors") or 512,  # SpecForge's defaults
        attention_backend=pick(overrides, train, "training.attention_backend") or "flex_attention",
    )


class SpecForgeReader:
    module = None  # the user's interpreter runs specforge.cli
    takes_turns = True  # turns.py's Lockstep in its process: pairing: lockstep
    sweep_keys = SWEEP_KEYS
    name = NAME

    def read_cell(self, train: Any, cfg_path: Path, sets: dict, nodes: int, where: str) -> dict | str:
        facts = cli_cell_facts(train, cfg_path, sets)
        if isinstance(facts, str):
            return f"{where}.config: {str(cfg_path)!r}: {facts}"
        if nodes > 1:
            return f"nodes: trainer {self.name} runs on one node here ({where}); use the embedded trainer"
        return facts

    def refuse_set(self, key: str, facts: dict) -> str | None:
        owned = {**CLI_DRIVER_KEYS, **(CLI_PREPARED_KEYS if facts["inputs"] == "prepared" else {})}
        return f"set by the driver for trainer {self.name}; {owned[key]}" if key in owned else None

    def refuse_arm_key(self, key: str, facts: dict) -> str | None:
        """The keys a cell's `set:` may not set (the plug passes them on every run's command line)."""
        return self.refuse_set(key, facts)

    def refuse_arms(self, arms: list[Arm], where: str) -> str | None:
        unfit = [a.name for a in arms if not cli_arm(a)]
        if not unfit:
            return None
        return (
            f"arms: {', '.join(unfit)} cannot run on {where} (trainer {self.name}): SpecForge has one Liger "
            f"switch, model.use_liger_kernel; its arms are {', '.join(CLI_ARMS)}"
        )
