"""What ``bench submit`` takes from its user, checked before anything is written: the time limit
(Slurm's formats, nothing absurd), the requeue signal against it, the requeue bound, the setup
lines of the batch script, and the srun options of every step. Each refusal is one line."""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

from bench.errors import SweepError

MIN_WINDOW_S = 60  # with --requeue: the time before the signal must hold the driver's start and a run
MAX_SIGNAL_S = 65535  # sbatch --signal's largest @time
MAX_REQUEUES = 100
_TIME_RE = re.compile(r"^(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?$")
_CONTROL_RE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # every control character but tab
# srun options the driver sets on every step itself (bench/config: SLURM_STEP; launch.step_name)
# or that would take its output or its step away from it
_DRIVER_SRUN = {"--nodes": "-N", "--ntasks-per-node": None, "--ntasks": "-n", "--job-name": "-J",
                "--label": "-l", "--kill-on-bad-exit": "-K", "--output": "-o", "--error": "-e",
                "--input": "-i", "--jobid": None, "--pty": None}  # fmt: skip


def time_seconds(text: str) -> int | None:
    """Seconds of a Slurm time limit (MINUTES, MINUTES:SECONDS, HOURS:MINUTES:SECONDS, DAYS-HOURS,
    DAYS-HOURS:MINUTES, DAYS-HOURS:MINUTES:SECONDS); None for INFINITE/UNLIMITED."""
    value = text.strip()
    if value.upper() in ("INFINITE", "UNLIMITED"):
        return None
    m = _TIME_RE.match(value)
    if not m:
        raise SweepError(
            f"--time {text}: expected a Slurm time limit (MINUTES, HH:MM:SS or DAYS-HH[:MM[:SS]]), e.g. 04:00:00"
        )
    days, a, b, c = (int(g) if g is not None else None for g in m.groups())
    if days is not None:  # D-H, D-H:M, D-H:M:S
        seconds = days * 86400 + a * 3600 + (b or 0) * 60 + (c or 0)
    elif c is not None:  # H:M:S
        seconds = a * 3600 + b * 60 + c
    else:  # M, M:S
        seconds = a * 60 + (b or 0)
    if seconds <= 0:
        raise SweepError(
            f"--time {text}: expected a limit above zero (leave --time out for the partition's default)"
        )
    return seconds


def check_requeue(time: str | None, requeue: bool, signal_s: int, max_requeues: int | None) -> int:
    """The requeue bound to write (0 without --requeue); refuses a signal that would come before
    any run could finish, and bounds that are no bounds."""
    if not 0 < signal_s <= MAX_SIGNAL_S:
        raise SweepError(f"--signal-s: expected seconds from 1 to {MAX_SIGNAL_S}, got {signal_s}")
    if max_requeues is not None and not requeue:
        raise SweepError("--max-requeues bounds the requeues of --requeue: pass --requeue too")
    if max_requeues is not None and not 0 <= max_requeues <= MAX_REQUEUES:
        raise SweepError(f"--max-requeues: expected 0 to {MAX_REQUEUES}, got {max_requeues}")
    limit = time_seconds(time) if time is not None else None
    if requeue and limit is not None and limit - signal_s < MIN_WINDOW_S:
        raise SweepError(
            f"--time {time} with --signal-s {signal_s}: the requeue signal would come "
            f"{max(limit - signal_s, 0)} s into each allocation, before any run could finish (at least "
            f"{MIN_WINDOW_S} s are needed): use a longer --time or a smaller --signal-s"
        )
    if not requeue:
        return 0
    return 3 if max_requeues is None else max_requeues


def setup_lines(path: str | None, lines: list[str] | None) -> list[str]:
    """The batch script's setup lines: the file's, then each --setup-line; each one line of
    printable text, no #SBATCH (sbatch ignores it after the first command: use --extra-sbatch), no
    exec (it would replace the batch shell before the driver), and bash must parse them."""
    found: list[tuple[str, str]] = []
    if path is not None:
        try:
            text = Path(path).read_text()
        except (OSError, UnicodeDecodeError) as e:
            raise SweepError(f"--setup {path}: cannot read it ({e})") from None
        found += [(f"--setup {path} line {i}", ln) for i, ln in enumerate(text.splitlines(), 1)]
    found += [("--setup-line", ln) for ln in lines or []]
    for where, line in found:
        if _CONTROL_RE.search(line):
            raise SweepError(f"{where}: {line!r} holds a control character (a newline?); one shell line each")
        words = line.strip().split()
        if line.lstrip().upper().startswith("#SBATCH"):
            raise SweepError(
                f"{where}: {line.strip()!r}: an #SBATCH line after the first command is ignored; use --extra-sbatch"
            )
        if words and words[0] == "exec":
            raise SweepError(
                f"{where}: {line.strip()!r}: exec would replace the batch shell, and the driver never start"
            )
    kept = [ln.rstrip() for _, ln in found]
    _parses(kept)
    return kept


def _parses(lines: list[str]) -> None:
    """Refuse setup lines bash cannot parse (an unclosed quote would swallow the driver's line)."""
    bash = shutil.which("bash")
    if not lines or bash is None:
        return
    r = subprocess.run(
        [bash, "-n"], input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=30
    )
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["a syntax error"])[-1]
        raise SweepError(f"setup lines: bash cannot parse them: {last.removeprefix('bash: ')}")


def srun_options(opts: list[str] | None, launcher_from: str | None) -> list[str]:
    """srun options for every run's step: each one word ``--name[=value]`` (or a short ``-x...``),
    no control character, none of those the driver sets itself; only for a sweep whose runs are
    the suite's job steps (nodes > 1 and no launcher of the config's)."""
    opts = list(opts or [])
    if opts and launcher_from != "slurm":
        where = (
            "its runs are not job steps (nodes: 1)" if launcher_from is None else "it names its own launcher"
        )
        raise SweepError(f"--srun-option: the config's runs are not the suite's srun steps: {where}")
    for opt in opts:
        if not opt.startswith("-") or opt in ("-", "--") or _CONTROL_RE.search(opt):
            raise SweepError(f"--srun-option {opt!r}: expected one srun option as one word, e.g. --mpi=pmix")
        name = opt.split("=", 1)[0]
        taken = (
            name
            if opt.startswith("--")
            else next((s for s in _DRIVER_SRUN.values() if s and opt.startswith(s)), None)
        )
        if taken is not None and (taken in _DRIVER_SRUN or taken in _DRIVER_SRUN.values()):
            raise SweepError(
                f"--srun-option {opt}: the driver sets {taken} on every step itself (docs/multinode.md)"
            )
    return opts


def srun_env(opts: list[str]) -> str:
    """The value of $BENCH_SRUN_OPTIONS: the options as shell words (parse_srun_env reads it)."""
    return shlex.join(opts)


def parse_srun_env(value: str) -> list[str]:
    try:
        return shlex.split(value)
    except ValueError as e:
        raise SweepError(f"$BENCH_SRUN_OPTIONS: {e}") from None
