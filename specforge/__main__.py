"""Command line: ``python -m specforge train|prepare CONFIG.yaml [--set key=value ...]``."""

from __future__ import annotations

import time

CLI_START = time.time()  # before torch is imported: the run's startup time counts from here

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from .config import ConfigError, load_config  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specforge", description="DFlash draft-model training")
    sub = p.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("config", help="training config (YAML)")
    common.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key"
    )
    common.add_argument(
        "--output-dir", type=Path, help="where to write (default: runs/<time>-<profile>-<arm>)"
    )
    common.add_argument(
        "--force", action="store_true", help="write into a directory that already holds results"
    )
    t = sub.add_parser("train", parents=[common], help="train a draft and write the run files")
    t.add_argument(
        "--use-liger-kernel", action="store_true", help="Liger fused RMSNorm + SwiGLU (the Liger arm)"
    )
    pr = sub.add_parser("prepare", parents=[common], help="write an offline hidden-state cache")
    pr.add_argument(
        "--hidden-states",
        choices=["target", "random"],
        default="target",
        help="run the target over the data (default) or synthesise features",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    overrides = list(args.set)
    if getattr(args, "use_liger_kernel", False):
        overrides.append("model.use_liger_kernel=true")
    try:
        cfg, profile = load_config(args.config, overrides)
        if args.command == "prepare":
            if args.output_dir is None:
                raise ConfigError("--output-dir: prepare needs a cache directory")
            from .prepare import prepare

            return prepare(cfg, profile, args.output_dir, args.hidden_states, args.force)
        out = args.output_dir
        if out is None:
            arm = "liger" if cfg.model.use_liger_kernel else "baseline"
            out = Path("runs") / f"{dt.datetime.now():%Y%m%d-%H%M%S}-{profile.name}-{arm}"
        if (out / "run.json").exists() and not args.force:
            raise ConfigError(f"--output-dir: {out} already holds a run (use --force or another directory)")
        if args.force:
            for name in ("run.json", "metrics.jsonl"):
                (out / name).unlink(missing_ok=True)
        from .train import run

        return run(cfg, profile, out, started=CLI_START)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
