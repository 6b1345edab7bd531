"""Command line: ``python -m specforge train|prepare|check CONFIG.yaml [--set key=value ...]``.

Bad input (config, key, type, path, cache, an option this machine cannot run) is one line on
stderr, ``error: ...``, and exit status 2, with nothing written or deleted: every check runs
before the first write. ``check`` runs the checks that need neither the offline cache nor
the hardware, writes nothing and imports no torch (the sweep driver calls it per cell).
"""

from __future__ import annotations

import time

CLI_START = time.time()  # before torch is imported: the run's startup time counts from here

import argparse  # noqa: E402
import datetime as dt  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from .config import ConfigError, load_config, validate_for  # noqa: E402
from .runfiles import check_cache_output, check_train_output, output_path  # noqa: E402


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is the one ``error:`` line too (exit 2), not usage + error."""

    def error(self, message: str):
        self.exit(2, f"error: {self.prog}: {message} (see --help)\n")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m specforge", description="DFlash draft-model training")
    sub = p.add_subparsers(dest="command", required=True)
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument("config", help="training config (YAML)")
    config.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key"
    )
    common = argparse.ArgumentParser(add_help=False, parents=[config])
    common.add_argument("--output-dir", help="where to write (default: runs/<time>-<profile>-<arm>)")
    common.add_argument(
        "--force", action="store_true", help="replace the run or cache the output directory holds"
    )
    liger = argparse.ArgumentParser(add_help=False)
    liger.add_argument(
        "--use-liger-kernel", action="store_true", help="Liger fused RMSNorm + SwiGLU (the Liger arm)"
    )
    sub.add_parser("train", parents=[common, liger], help="train a draft and write the run files")
    pr = sub.add_parser("prepare", parents=[common], help="write an offline hidden-state cache")
    pr.add_argument(
        "--hidden-states",
        choices=["target", "random"],
        default="target",
        help="run the target over the data (default) or synthesise features",
    )
    ch = sub.add_parser(
        "check",
        parents=[config, liger],
        help="validate a config as train/prepare would (no cache, no hardware); exit 0 or 2, writes nothing",
    )
    ch.add_argument("--mode", choices=["train", "prepare"], default="train", help="the command to check for")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    overrides = list(args.set)
    if getattr(args, "use_liger_kernel", False):
        overrides.append("model.use_liger_kernel=true")
    try:
        cfg, profile = load_config(args.config, overrides)
        if args.command == "check":
            validate_for(cfg, args.mode)
            cache = Path(cfg.data.cache_dir) if cfg.data.cache_dir else None
            if args.mode == "train" and cfg.mode == "offline" and cache is not None and cache.is_dir():
                from .data import cache_dataset  # imports torch: only with a cache to verify

                cache_dataset(cfg.data, profile)  # the cache matches the run (as train checks) and is whole
            return 0
        if args.command == "prepare":
            validate_for(cfg, "prepare", args.hidden_states)
            out = output_path(args.output_dir)
            if out is None:
                raise ConfigError("--output-dir: prepare needs a cache directory")
            check_cache_output(out, args.force)  # again in prepare(); here before torch's import
            from .prepare import prepare

            return prepare(cfg, profile, out, args.hidden_states, args.force)
        validate_for(cfg, "train")
        out = output_path(args.output_dir)
        if out is None:
            arm = "liger" if cfg.model.use_liger_kernel else "baseline"
            out = Path("runs") / f"{dt.datetime.now():%Y%m%d-%H%M%S}-{profile.name}-{arm}"
        if os.environ.get("RANK", "0") == "0":  # only rank 0 writes (and the others would race it)
            check_train_output(out, args.force)
        from .train import run

        keys = [o.split("=", 1)[0].strip() for o in overrides]
        return run(cfg, profile, out, started=CLI_START, force=args.force, set_keys=keys)
    except ConfigError as e:
        print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from .teardown import exit_process  # imports no torch

    exit_process(main())
