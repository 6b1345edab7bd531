"""Command line: ``python -m bench sweep|capacity|submit|status|ab|report|compare|history|export|kernels|detect``
(the ``bench`` console script: ``entry``), and ``--version``. A sweep config may be named by the
name of one the suite ships (``bench sweep cpu``: bench.distribution).

The sweep loop (bench.run) is handed its engine here: Slurm's (bench/slurm/slurm_engine.py), which
runs like the local one outside an allocation.

Bad input prints ``error: <one line>`` to stderr and exits 2, without a traceback.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from bench.results.rawdata import add_raw_parser
from bench.run.ab import add_ab_parser

try:
    import bench.config.loader  # noqa: F401  (PyYAML and the config: a missing dependency fails here, in one line)
    from bench import distribution
    from bench.errors import SweepError
    from bench.fileio import WriteError
except ImportError as _e:  # e.g. PyYAML missing: one line, not a traceback
    print(
        f"error: this Python ({sys.executable}) lacks {getattr(_e, 'name', None) or _e}: run `make install`, "
        "or run an interpreter that has the dependencies (with make: PYTHON=/path/to/python)",
        file=sys.stderr,
    )
    sys.exit(2)


RETRY_HELP = (
    "resume, and first re-run whole every round (one run of each arm of a cell, back to back) that holds "
    "a run which ended in error, timeout or oom; skipped runs and other rounds' ok runs stay"
)


def add_history_parser(sub) -> None:
    """`bench history DIR... [--arm NAME] [--format text|md|json] [--out DIR]` (bench/results/history*.py)."""
    p = sub.add_parser(
        "history", help="the gain over time: every sweep's cells and arms, by workload identity"
    )
    p.add_argument("dirs", nargs="+", metavar="DIR", help="sweep directories, or folders of them (results/)")
    p.add_argument("--arm", action="append", help="only this arm (repeatable; default: every arm)")
    p.add_argument("--format", choices=["text", "md", "json"], default="text", help="what stdout gets")
    p.add_argument("--out", help="write history.md, history.json and a trend plot per series here")


def add_export_parser(sub) -> None:
    """`bench export DIR --to tensorboard|mlflow|wandb [--out DIR]` (bench/results/export.py)."""
    p = sub.add_parser(
        "export",
        help="write a sweep's runs and verdicts to TensorBoard, MLflow or W&B (offline/local unless "
        "your tracker's configuration says otherwise; needs the trackers extra: pip install "
        "'dflash-liger-bench[trackers]')",
    )
    p.add_argument("dir", help="sweep output directory (reported: holds runs/ and summary.csv)")
    p.add_argument("--to", required=True, metavar="TRACKER", help="tensorboard, mlflow or wandb")
    p.add_argument(
        "--out",
        help="where the tracker's files go (default: DIR/tracker/tensorboard, DIR/tracker/mlruns or "
        "DIR/tracker/wandb; for mlflow without --out, MLFLOW_TRACKING_URI when set); must be empty",
    )


def add_compare_parser(sub) -> None:
    """`bench compare A B [--out DIR] [--format text|md|json] [--fail-if-slower PCT]
    [--fail-if-gain-drops POINTS] [--fail-if-inconclusive]`."""
    p = sub.add_parser("compare", help="compare two summary CSVs (two machines, two commits)")
    p.add_argument("a", help="first CSV (the reference, for the gate)")
    p.add_argument("b", help="second CSV (the one held to A)")
    p.add_argument("--out", help="directory for the comparison's table and plots")
    p.add_argument(
        "--fail-if-slower",
        metavar="PCT",
        help="regression gate: exit 3 when a row of B is slower than A by more than PCT%% with its whole "
        "95%% CI below -PCT%% (needs the per-run values: runs.csv beside each summary.csv, or given)",
    )
    p.add_argument(
        "--fail-if-gain-drops",
        metavar="POINTS",
        help="gain gate: exit 3 when an arm's gain over its baseline (its paired Δ samples/s) is lower in B "
        "than in A by more than POINTS percentage points with the whole 95%% CI of the difference below -POINTS",
    )
    p.add_argument(
        "--fail-if-inconclusive",
        action="store_true",
        help="with a gate: also exit 3 when a row's CI straddles the threshold or a row cannot be decided",
    )
    p.add_argument(
        "--format",
        choices=("text", "md", "json"),
        default="text",
        help="what is printed: the console table (text), a Markdown PR comment (md) or JSON",
    )


def prog_name() -> str:
    """How the user started us, for ``usage:`` lines: ``bench`` (the console script) or ``python -m bench``."""
    return "bench" if os.path.basename(sys.argv[0] or "") == "bench" else "python -m bench"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog_name(), description="DFlash x Liger A/B benchmark sweeps.")
    parser.add_argument("--version", action="version", version=distribution.version_line())
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    # sweep and capacity share their flags: one parent parser
    runs = argparse.ArgumentParser(add_help=False)
    runs.add_argument("--out", help="output directory (default: the config's `out`)")
    for name, what, first, write in (
        ("sweep", "run (or resume) a sweep of training runs", "the planned runs and commands", "runs"),
        (
            "capacity",
            "find per arm the largest batch size or sequence length that trains (capacity: section)",
            "the first probe of each arm",
            "probes",
        ),
    ):
        p = sub.add_parser(name, help=what, parents=[runs])
        p.add_argument(
            "config",
            help="sweep config YAML (e.g. configs/h200.yaml)"
            if name == "sweep"
            else "sweep config YAML with a capacity: section",
        )
        unfinished = "sweep" if name == "sweep" else "search"
        p.add_argument(
            "--resume", action="store_true", help=f"finish an unfinished {unfinished} in the output directory"
        )
        p.add_argument(
            "--force",
            action="store_true",
            help=f"delete the output directory's {write} and results (keeps cache/)",
        )
        p.add_argument("--dry-run", action="store_true", help=f"print {first}; write nothing")
        if name == "sweep":
            p.add_argument("--retry-failed", action="store_true", help=RETRY_HELP)

    _submit_parser(sub)
    _status_parser(sub)
    p = sub.add_parser("report", help="rebuild CSVs, plots and report.md from a sweep's run directories")
    p.add_argument("dir", help="sweep output directory (holds runs/)")

    add_compare_parser(sub)
    add_ab_parser(sub)
    add_raw_parser(sub)
    add_export_parser(sub)
    add_history_parser(sub)

    p = sub.add_parser(
        "kernels",
        help="time the modules the Liger arms swap (RMSNorm, SwiGLU MLP, LM head + CE), stock vs Liger, at each cell's shapes",
    )
    p.add_argument("config", help="sweep config YAML (e.g. configs/h200.yaml)")
    p.add_argument("--out", help="output directory (default: the config's `out` + '-kernels')")
    p.add_argument(
        "--cell", action="append", metavar="CELL_ID", help="only this cell (repeatable; default: every cell)"
    )
    p.add_argument(
        "--sweep-dir",
        help="the sweep's output directory, whose summary.csv gives the measured Δ (default: the config's `out`)",
    )
    p.add_argument("--reps", type=int, help="timed repetitions per module (default 50)")
    p.add_argument("--warmup", type=int, help="untimed repetitions first (default 10)")
    p.add_argument(
        "--profile",
        action="store_true",
        help="also train each cell once per arm (baseline, Liger arms) with its last two steps under "
        "torch.profiler, and split a step's time into kernel buckets (kernel_buckets.csv/.png)",
    )
    p.add_argument(
        "--rebuild",
        action="store_true",
        help="measure nothing: write kernels.md/.png (and the buckets) again from --out's kernels.csv and "
        "profiles/, with the measured Δ read now from the sweep's summary.csv",
    )

    sub.add_parser("detect", help="print the sweep config for this machine's hardware")
    return parser


def _submit_parser(sub) -> None:
    p = sub.add_parser(
        "submit",
        help="run a sweep as one Slurm batch job: one allocation, every run a job step over its nodes",
    )
    p.add_argument("config", help="sweep config YAML (nodes: N without a launcher: docs/multinode.md)")
    p.add_argument(
        "--out", help="sweep directory, on a filesystem the first node sees (default: the config's `out`)"
    )
    p.add_argument(
        "--nodes", type=int, help="nodes of the allocation (default and only value: the config's nodes)"
    )
    p.add_argument(
        "--gpus-per-node",
        type=int,
        help="GPUs per node to ask for (default: the config's gpus_per_run; 0: none)",
    )
    p.add_argument("--partition", help="sbatch --partition")
    p.add_argument("--time", help="sbatch --time, e.g. 04:00:00")
    p.add_argument("--account", help="sbatch --account")
    p.add_argument(
        "--extra-sbatch",
        action="append",
        dest="extra",
        metavar="OPTION",
        help="another sbatch option (repeatable)",
    )
    p.add_argument(
        "--requeue",
        action="store_true",
        help="before the time limit the driver stops cleanly and requeues the job; the next allocation resumes",
    )
    p.add_argument(
        "--signal-s", type=int, default=300, help="with --requeue: seconds before the time limit (300)"
    )
    p.add_argument(
        "--max-requeues",
        type=int,
        metavar="N",
        help="with --requeue: requeue at most N times (default 3); never after an allocation that finished no run",
    )
    p.add_argument(
        "--setup",
        metavar="FILE",
        help="shell lines run in the batch script before the driver (module load, venv or conda activation, "
        "NCCL variables); what they export reaches every step",
    )
    p.add_argument(
        "--setup-line",
        action="append",
        metavar="LINE",
        help="one more setup line, after --setup's (repeatable)",
    )
    p.add_argument(
        "--srun-option",
        action="append",
        dest="srun_options",
        metavar="OPTION",
        help="an srun option for every run's job step, one word, e.g. --container-image=IMG, --mpi=pmix, "
        "--cpu-bind=cores (repeatable)",
    )
    p.add_argument("--rdzv-port", type=int, help="the rendezvous port on the first node (default 29400)")
    p.add_argument("--resume", action="store_true", help="submit the resumption of an unfinished sweep")
    p.add_argument(
        "--retry-failed",
        action="store_true",
        help="submit the resumption, whose first start re-runs the failed rounds as `sweep --retry-failed` does",
    )
    p.add_argument("--dry-run", action="store_true", help="print the batch script; write and submit nothing")


def _status_parser(sub) -> None:
    p = sub.add_parser(
        "status",
        help="a sweep's state: its Slurm job, runs done of planned, the run in flight and its last log lines",
    )
    p.add_argument("dir", help="sweep output directory (of `bench sweep` or `bench submit`)")
    p.add_argument("--lines", type=int, default=5, help="last lines of the running run's log to show (5)")


def main(argv: list[str] | None = None) -> int:
    from bench.trainers.isolation import embedded_env

    # A terminal or pipe whose encoding lacks Δ, →, ± (PYTHONIOENCODING=latin-1, a C locale) gets
    # a replacement character, not a UnicodeEncodeError that would kill a sweep between two runs.
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")

    # Every process the driver starts finds our trainer (not installed into site-packages) from
    # any working directory; the user's SpecForge runs without it (isolated_env). Restored on
    # return: a caller of main() in-process keeps its own environment.
    before = os.environ.get("PYTHONPATH")
    if embedded_env(os.environ).get("PYTHONPATH"):
        os.environ["PYTHONPATH"] = embedded_env(os.environ)["PYTHONPATH"]
    try:
        return _main(argv)
    finally:
        if before is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = before


def entry() -> None:
    """The ``bench`` console script ([project.scripts] in pyproject.toml)."""
    sys.exit(main())


def _dispatch(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Run the parsed command; SweepError (and the others _main turns into one line) propagate."""
    if args.command in ("sweep", "capacity"):
        from bench.run.sweep import run_sweep
        from bench.slurm.slurm_engine import SlurmEngine

        return run_sweep(
            args.config,
            out=args.out,
            resume=args.resume,
            force=args.force,
            dry_run=args.dry_run,
            capacity=args.command == "capacity",
            retry_failed=getattr(args, "retry_failed", False),
            engine=SlurmEngine(),
        )
    if args.command == "ab":
        from bench.run.ab import run_ab

        return run_ab(args, ["python", "-m", "bench", *(argv if argv is not None else sys.argv[1:])])
    if args.command == "submit":
        from bench.slurm.submit import submit

        return submit(**{k: v for k, v in vars(args).items() if k != "command"})
    if args.command == "status":
        from bench.slurm.status import show_status

        return show_status(Path(args.dir), args.lines)
    if args.command == "report":
        from bench.results.rawdata import refuse_packed
        from bench.run.console import report

        refuse_packed(Path(args.dir))
        if not (Path(args.dir) / "runs").is_dir():
            raise SweepError(f"{args.dir}: no runs/ directory; expected the output directory of a sweep")
        refuse_blocked_outputs(Path(args.dir))
        return report(Path(args.dir))
    if args.command == "raw":
        from bench.results.rawdata import run_raw
        from bench.run.sweepdir import git_commit

        return run_raw(args.action, args.dirs, git_commit)
    if args.command == "export":
        from bench.results.export import run_export

        return run_export(args)
    if args.command == "history":
        from bench.results.history_format import run_history

        return run_history(args)
    if args.command == "compare":
        from bench.results.compare import run_compare

        try:
            return run_compare(
                args.a, args.b, args.out, args.fail_if_slower, args.fail_if_inconclusive,
                args.fail_if_gain_drops, args.format,
            )  # fmt: skip
        except ValueError as e:
            raise SweepError(str(e)) from None
    if args.command == "kernels":
        from bench.kernels.cli import run_kernels

        return run_kernels(
            args.config,
            out=args.out,
            cells=args.cell,
            sweep_dir=args.sweep_dir,
            reps=args.reps,
            warmup=args.warmup,
            profile=args.profile,
            rebuild=args.rebuild,
            argv=sys.argv[2:] if argv is None else argv[1:],
        )
    if args.command == "detect":
        from bench.probe.hardware import main_detect

        rc = main_detect()
        return rc if isinstance(rc, int) else 0
    return 2


def refuse_blocked_outputs(out: Path) -> None:
    """Before ``bench report`` writes anything: a directory (or anything but a file) where it
    writes one of its files is refused in one line naming it."""
    from bench.results.columns import OPTIONAL_REPORT_FILES, REPORT_FILES

    for name in (*REPORT_FILES, *OPTIONAL_REPORT_FILES):
        path = out / name
        if path.exists() and not path.is_file():
            what = "a directory" if path.is_dir() else "not a file"
            raise SweepError(
                f"{path}: {what}, where bench report writes its {name}; move it away, then run the same "
                "command again"
            )


def _main(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "config", None) is not None:  # a shipped config by its name: `bench sweep cpu`
        args.config = distribution.sweep_config(args.config)
    try:
        return _dispatch(args, argv)
    except SweepError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as e:  # the light install (`pip install .`) running what needs torch
        if (e.name or "").split(".")[0] not in distribution.TRAIN_PACKAGES:
            raise
        print(
            f"error: this Python ({sys.executable}) lacks {e.name}: {distribution.TRAIN_EXTRA} "
            f"(`bench {args.command}` needs that extra)",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # e.g. `python -m bench sweep X --dry-run | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:  # the environment (a read-only filesystem, a full disk): one line, exit 1
        print(environment_error(e, args), file=sys.stderr)
        return 1
    return 2


def environment_error(e: OSError, args: argparse.Namespace) -> str:
    """The line for an OSError that stopped a command: the path that could not be written (or
    read) and why, and what to do. A sweep stopped so is resumable: every result file is written
    atomically, and a run whose records were not all written is not finished."""
    if isinstance(e, WriteError):
        what = str(e)
    elif e.filename:
        what = f"{e.filename}: {e.strerror}"
    else:
        what = e.strerror or str(e)
    fix = "free space or make it writable" if isinstance(e, WriteError) else "fix that"
    then = "run the same command again"
    if args.command in ("sweep", "capacity"):
        then = "run the same command with --resume (finished runs are kept)"
    return f"error: {what} ({fix}, then {then})"


if __name__ == "__main__":
    sys.exit(main())
