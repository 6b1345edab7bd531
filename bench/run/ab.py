"""``python -m bench ab -c RUN.yaml [--trainer NAME] [key=value ...]``: an A/B of one training
config with no sweep YAML to write. It writes the sweep config the README's example would be —
one cell of that config, baseline vs liger, 13 steps, the precision rule ``{ci_halfwidth_pct:
1.0, min_pairs: 3, max_pairs: 6}``, ``hardware: any`` — into the sweep
directory as ``ab.yaml`` and runs it as ``bench sweep`` would (same checks, runs, resume and
report); the PR Summary is what it prints last. ``key=value`` are the training config's own
dotted keys (the cell's ``set:``); ``--arm NAME:key=value[,key=value...]`` (repeatable) declares
an arm of your own with the trainer's own keys (the sweep's ``user_arms``), so that ``--arm
eager:training.attention_backend=sdpa`` alone is the A/B baseline vs eager; bad input is one line
and exit 2, before anything is written.

The pairing follows the trainer: one whose runs can take turns on a card (the SpecForge CLI)
runs each pair in lockstep with the collector's heap frozen after step 1 and 3 warm-up steps
(LOCKSTEP: the precise mode, docs/method.md says why); any other runs its pairs one run after
the other with 1 warm-up step. ``--pairing`` (or ``--set-sweep pairing=...``) chooses, and an
explicit ``--warmup-steps`` or ``--set-sweep trainer_gc_freeze=...`` is kept.
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from bench.errors import SweepError
from bench.fileio import writing

AB_CONFIG = "ab.yaml"  # the generated sweep config, inside the sweep directory
HEADER = "# Written by `python -m bench ab` (bench/run/ab.py)"  # how an ab.yaml of ours begins
DEFAULTS = {"steps": 13, "batch_size": 2, "seq_len": 2048}
WARMUP_STEPS = {"lockstep": 3, "sequential": 1}  # per pairing, when --warmup-steps is not given
LOCKSTEP = {"pairing": "lockstep", "trainer_gc_freeze": True}  # a turn-taking trainer's default
PRECISION = {"ci_halfwidth_pct": 1.0, "min_pairs": 3, "max_pairs": 6}
_KEY = re.compile(r"^[A-Za-z_][\w.-]*$")


def add_ab_parser(sub) -> None:
    p = sub.add_parser("ab", help="A/B one training config (baseline vs liger) with no sweep YAML")
    p.add_argument(
        "-c", "--config", required=True, help="your training config (a SpecForge run.yaml, or ours)"
    )
    p.add_argument("--trainer", help="the trainer (registered name, e.g. specforge-cli; default: the first)")
    p.add_argument("--python", help="trainer_python: your environment's interpreter")
    p.add_argument(
        "--baseline-arm",
        help="the built-in arm the baseline runs as (e.g. liger: A/B two environments of Liger; baseline_arm)",
    )
    p.add_argument("--out", help="the sweep directory (default: results/ab-<config name>)")
    p.add_argument(
        "--arms",
        help="comma-separated arms (default baseline,liger; with --arm: baseline and your arms)",
    )
    p.add_argument(
        "--arm",
        action="append",
        default=[],
        metavar="NAME:KEY=VALUE[,KEY=VALUE...]",
        help="an arm of your own: the trainer's own dotted keys it sets, and/or its environment "
        "(python=PATH, path=DIR[:DIR], env.NAME=VALUE, base=ARM, differs=PKG[+PKG]) (repeatable; user_arms)",
    )
    for name, default in DEFAULTS.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=default, help=f"default {default}")
    p.add_argument(
        "--warmup-steps",
        type=int,
        help="steps dropped from each run (default 3 in lockstep pairs, 1 in sequential pairs)",
    )
    p.add_argument(
        "--pairing",
        choices=("lockstep", "sequential"),
        help="a pair's two runs on the card at once, taking turns (default where the trainer can: "
        "the SpecForge CLI), or one after the other (default otherwise)",
    )
    p.add_argument("--pairs", type=int, help="a fixed number of pairs instead of the precision rule")
    p.add_argument("--ci-halfwidth-pct", type=float, default=PRECISION["ci_halfwidth_pct"])
    p.add_argument("--min-pairs", type=int, default=PRECISION["min_pairs"])
    p.add_argument("--max-pairs", type=int, default=PRECISION["max_pairs"])
    p.add_argument("--hardware", default="any", help="the config's hardware (default any)")
    p.add_argument("--set-sweep", action="append", default=[], metavar="KEY=VALUE", help="another sweep key")
    p.add_argument("--resume", action="store_true", help="finish the A/B in --out")
    p.add_argument("--force", action="store_true", help="start the A/B in --out over (keeps cache/)")
    p.add_argument("--dry-run", action="store_true", help="print the plan; write nothing")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="the training config's own dotted keys")


def _pairs(items: list[str], what: str, comma: str = "") -> dict:
    """``key=value`` items as a mapping, each value read as YAML; a key given twice is refused.
    ``comma``: what to say when an item is not one, where the flag split its keys at commas."""
    out = {}
    for item in items:
        key, eq, value = item.partition("=")
        if not eq or not _KEY.fullmatch(key):
            raise SweepError(f"{what}: expected key=value, got {item!r}{comma}")
        if key in out:
            raise SweepError(f"{what}: {key} is given twice ({_given(items, key)}); give each key once")
        import yaml  # not at import time: `python -m bench` parses its flags without it

        try:
            out[key] = yaml.safe_load(value) if value.strip() else value
        except yaml.YAMLError as e:
            why = str(getattr(e, "problem", None) or "not YAML")
            fix = comma or "; quote it as a string"
            raise SweepError(f"{what}: {item!r}: the value is not YAML ({why}){fix}") from None
    return out


def _given(items: list[str], key: str) -> str:
    return " and ".join(repr(item) for item in items if item.partition("=")[0] == key)


# --arm splits its keys at commas: a value cannot hold one, whatever the quoting.
ARM_COMMA = (
    "; --arm splits its keys at commas, so no value can hold one (quotes do not help): declare the arm "
    "in a sweep config's user_arms (docs/reference.md) and run it with bench sweep"
)


def user_arms(specs: list[str]) -> dict:
    """``--arm NAME:key=value[,key=value...]`` as the sweep's user_arms (the names and keys are
    checked there, as a sweep config's; a name with a control character or whitespace around it,
    and a key given twice, are refused here)."""
    # not at import time: `python -m bench` parses its flags without PyYAML (bench.config needs it)
    from bench.config.typed import name_problem

    out: dict = {}
    for spec in specs:
        name, colon, body = spec.partition(":")
        if not colon or not name.strip() or not body.strip():
            raise SweepError(f"--arm: expected NAME:key=value[,key=value...], got {spec!r}")
        why = name_problem(name)
        if why:
            raise SweepError(
                f"--arm {spec!r}: the arm's name {name!r} {why}; expected letters and digits, a letter first"
            )
        if name in out:
            raise SweepError(f"--arm: {name!r} is given twice; one --arm per arm, its keys comma-separated")
        items = [item.strip() for item in body.split(",") if item.strip()]
        comma = ARM_COMMA if len(items) > 1 else ""
        sets = _pairs(items, f"--arm {name}", comma)
        out[name] = {"doc": f"bench ab --arm {name}:{','.join(items)}", **_environment(sets)}
    return out


# --arm's keys that are not the trainer's: the arm's environment and base (user_arms' keys of the same
# names); env.NAME=VALUE sets a variable, path= takes folders joined by os.pathsep, differs= packages by "+".
ARM_ENV_KEYS = ("python", "path", "base", "differs")


def _environment(sets: dict) -> dict:
    """One --arm's keys as a user_arms entry: its environment and base apart from the trainer's keys."""
    arm: dict = {"set": {}}
    for key, value in sets.items():
        if key in ARM_ENV_KEYS:
            text = "" if value is None else str(value)
            arm[key] = (
                text.split(os.pathsep) if key == "path" else text.split("+") if key == "differs" else text
            )
        elif key.startswith("env."):
            arm.setdefault("env", {})[key[len("env.") :]] = value
        else:
            arm["set"][key] = value
    return arm


def sweep_doc(args) -> dict:
    """The sweep config of the A/B (what ab.yaml holds)."""
    config = Path(args.config)
    if not config.is_file():
        raise SweepError(f"-c {args.config}: no such file; expected your training config")
    name = re.sub(
        r"[^A-Za-z0-9._-]", "-", f"ab-{config.stem}"
    )  # ASCII: the sweep name rule (a non-ASCII file name too)
    doc: dict = {"name": name, "hardware": args.hardware}
    if args.trainer:
        doc["trainer"] = args.trainer
    if args.python:
        from bench.trainers.specforge_cli.facts import NAME as CLI

        if args.trainer != CLI:  # our trainer runs in this Python: --python would be ignored
            raise SweepError(
                f"--python {args.python}: only --trainer {CLI} runs in another interpreter (your "
                f"SpecForge environment's); {'--trainer ' + args.trainer if args.trainer else 'our trainer'} runs in "
                "this one"
            )
        doc["trainer_python"] = args.python
    user = user_arms(args.arm)
    if user:
        doc["user_arms"] = user
    if args.baseline_arm:
        doc["baseline_arm"] = args.baseline_arm
    arms = args.arms if args.arms is not None else "baseline" if user else "baseline,liger"
    doc["arms"] = [a.strip() for a in arms.split(",") if a.strip()]
    doc["arms"] += [name for name in user if name not in doc["arms"]]
    doc |= {"steps": args.steps}
    if args.pairs is not None:
        doc["repeats"] = args.pairs
    else:
        doc["precision"] = {
            "ci_halfwidth_pct": args.ci_halfwidth_pct,
            "min_pairs": args.min_pairs,
            "max_pairs": args.max_pairs,
        }
    doc |= pairing_keys(args, _pairs(args.set_sweep, "--set-sweep"))
    cell = {"config": str(config.resolve()), "batch_size": [args.batch_size], "seq_len": [args.seq_len]}
    sets = _pairs(args.overrides, "key=value")
    if sets:
        cell["set"] = sets
    return {**doc, "cells": [cell]}


def pairing_keys(args, set_sweep: dict) -> dict:
    """The sweep keys of the pairing (pairing, trainer_gc_freeze, warmup_steps) with the other
    ``--set-sweep`` keys: lockstep with the heap frozen and 3 warm-up steps for a trainer whose
    runs take turns, sequential with 1 otherwise; what the user gave wins."""
    if args.pairing is not None:
        if set_sweep.get("pairing", args.pairing) != args.pairing:
            raise SweepError(
                f"--pairing {args.pairing} and --set-sweep pairing={set_sweep['pairing']} disagree"
            )
        set_sweep["pairing"] = args.pairing
    default = LOCKSTEP if _takes_turns(args.trainer) else {"pairing": "sequential"}
    pairing = set_sweep.get("pairing", default["pairing"])
    keys = dict(LOCKSTEP) if pairing == "lockstep" else {}
    if args.warmup_steps is not None:
        keys["warmup_steps"] = args.warmup_steps
    else:
        keys["warmup_steps"] = warmup = WARMUP_STEPS.get(pairing, WARMUP_STEPS["sequential"])
        if warmup >= args.steps:  # the user never typed --warmup-steps: say where the number comes from
            raise SweepError(
                f"--steps {args.steps}: {pairing} pairs drop {warmup} warm-up step(s) by default, which "
                f"leaves none to measure; give --steps above {warmup}, or --warmup-steps N"
            )
    return keys | set_sweep


def _takes_turns(trainer: str | None) -> bool:
    """Whether the trainer (None: the default one) can run a pair's runs in lockstep; an unknown
    name is False here and refused by the sweep's own checks."""
    from bench.trainers import registered

    trainers = registered()
    reader = trainers.get(trainer) if trainer else next(iter(trainers.values()))
    return bool(getattr(reader, "reader", None) and reader.reader.takes_turns)


def run_ab(args, argv: list[str] | None = None) -> int:
    """Write ab.yaml into the sweep directory and run it. An ab.yaml the suite did not write is
    never overwritten, and nothing is written while another sweep holds the directory. When the
    sweep refuses before it starts (SweepError), everything is as it was: ab.yaml restored (or
    removed), and the directories this call created removed where empty."""
    from bench.run.sweep import run_sweep
    from bench.run.sweepdir import LOCK, check_out_path
    from bench.run.sweepstate import lock_holder

    doc = sweep_doc(args)
    if args.out is not None and not args.out.strip():
        raise SweepError(
            "--out: empty path; expected a directory (or leave --out out: results/ab-<config name>)"
        )
    out = Path(args.out or f"results/{doc['name']}")
    check_out_path(out)
    doc["out"] = str(out)
    import yaml

    text = HEADER + "\n" + yaml.safe_dump(doc, sort_keys=False)
    if args.dry_run:
        with tempfile.TemporaryDirectory(prefix="bench-ab-") as tmp:
            (Path(tmp) / AB_CONFIG).write_text(text)
            try:
                return run_sweep(Path(tmp) / AB_CONFIG, out=out, dry_run=True, argv=argv)
            except SweepError as e:
                raise SweepError(in_user_words(str(e), Path(tmp) / AB_CONFIG)) from None
    path = out / AB_CONFIG
    before = _read(path)
    if before is not None and not before.startswith(HEADER):
        raise SweepError(
            f"{path}: not written by bench ab (the suite never overwrites a file it did not write, --force "
            "included); move it away or choose another --out"
        )
    if before is not None and before != text and not args.force:
        raise SweepError(f"{path}: an A/B with another config is there; pass --force or another --out")
    # before anything is written, so that a refused second command changes nothing; read from
    # /proc/locks, never taken (a sweep starting this instant is not refused because we looked)
    if lock_holder(out / LOCK) is not None:
        raise SweepError(f"{out}: another sweep is running in this directory")
    created, stamp = _missing_ancestors(out), _mtime(out / "sweep.json")
    with writing(out):
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    try:
        return run_sweep(path, out=out, resume=args.resume, force=args.force, argv=argv)
    except SweepError as e:
        if _mtime(out / "sweep.json") == stamp:  # the sweep never started: leave all as it was
            _restore(path, before)
            for d in created:  # the directories this call made, deepest first, where left empty
                if d.is_dir() and not any(d.iterdir()):
                    d.rmdir()
        raise SweepError(in_user_words(str(e), path)) from None


# The sweep keys bench ab writes from a flag, as the flag (an error names what the user typed).
FLAGS = {
    "warmup_steps": "--warmup-steps", "steps": "--steps", "repeats": "--pairs", "arms": "--arms",
    "hardware": "--hardware", "trainer": "--trainer", "trainer_python": "--python", "baseline_arm": "--baseline-arm",
    "cells[0].batch_size": "--batch-size", "cells[0].seq_len": "--seq-len",
    "precision.ci_halfwidth_pct": "--ci-halfwidth-pct", "precision.min_pairs": "--min-pairs",
    "precision.max_pairs": "--max-pairs",
}  # fmt: skip


def in_user_words(message: str, config: Path) -> str:
    """A sweep error about the generated ab.yaml, in the words of the bench ab command line: no
    path of a file the user never wrote, and each sweep key bench ab set from a flag named as
    that flag (``cells[0].set.KEY`` as the ``KEY=value`` typed)."""
    for prefix in (f"{config}: ", f"{config.name}: "):
        message = message.removeprefix(prefix)
    message = re.sub(r"\bcells\[0\]\.set\.([\w.-]+)", r"\1=", message)
    message = re.sub(r"\buser_arms\.(\w+)\.set\.([\w.-]+)", r"--arm \1:\2=", message)
    message = re.sub(r"\buser_arms\.(\w+)", r"--arm \1", message)
    for key in sorted(FLAGS, key=len, reverse=True):
        message = re.sub(rf"(?<![\w.\[-]){re.escape(key)}(?=[:\s(]|$)", FLAGS[key], message, count=1)
    return message


def _mtime(path: Path) -> int | None:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return None


def _read(path: Path) -> str | None:
    """The file's text (bytes that are not UTF-8 replaced: such a file is not ours), None if absent."""
    try:
        return path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return None
    except OSError as e:
        raise SweepError(f"{path}: cannot read it ({e.strerror or e})") from None


def _restore(path: Path, before: str | None) -> None:
    """Put ab.yaml back as it was before this call (gone if it was not there)."""
    if before is None:
        path.unlink(missing_ok=True)
    elif _read(path) != before:
        path.write_text(before)


def _missing_ancestors(out: Path) -> list[Path]:
    """``out`` and its parents that do not exist yet, deepest first (what mkdir(parents=True) makes)."""
    made, p = [], out.absolute()
    while not p.exists() and p != p.parent:
        made.append(p)
        p = p.parent
    return made
