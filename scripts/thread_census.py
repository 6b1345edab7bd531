"""What SpecForge's unnamed threads do while its measured steps run: ``python scripts/thread_census.py
OUT_JSON [--seconds 300] [--every 0.1] [--from-step 4] [--linger 10] [--pid PID ...]``

Every EVERY seconds, for each SpecForge training process on this machine (a command line holding
``specforge.cli`` and ``output_dir=``) whose run has logged FROM_STEP-1 lockstep turns
(``lockstep.jsonl`` beside ``specforge-out``), it reads each thread's /proc entry: its state, the
system call it is in (``syscall``: its number, x86-64), where it sleeps in the kernel (``wchan``)
and, for a running thread, its kernel stack (``stack``, root only). Per thread name (the kernel's
``comm``: native threads that never named themselves carry the interpreter's, ``python3``) it
writes how many threads, their CPU seconds (user and system) over the sampled window, and the
sample counts of each state, system call, wait channel and kernel stack top. Read only; the run it
watches pays the reads (some 110 threads x 4 small files per look), so use it in a diagnostic
sweep, never in a verdict. It stops after SECONDS, or LINGER seconds (default 10) after the last sampled
run ended with none after it. Linux only. Used for results/h200-specforge-threads/.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


SYSCALLS = {0: "read", 1: "write", 7: "poll", 9: "mmap", 10: "mprotect", 11: "munmap", 16: "ioctl"}
SYSCALLS |= {23: "select", 24: "sched_yield", 28: "madvise", 35: "nanosleep", 202: "futex"}
SYSCALLS |= {230: "clock_nanosleep", 232: "epoll_wait", 270: "pselect6", 271: "ppoll", 281: "epoll_pwait"}


def read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return ""


def trainers() -> dict[int, Path]:
    """SpecForge training processes and their run directories (output_dir's parent)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        argv = read(f"/proc/{pid}/cmdline").split("\0")
        out = [a.split("=", 1)[1] for a in argv if a.startswith("output_dir=")]
        if out and any("specforge.cli" in a for a in argv):
            found[int(pid)] = Path(out[0]).parent
    return found


def task_stats(task_dir: str) -> dict[int, tuple[str, list[str]]]:
    """Each thread under ``task_dir`` (Linux's /proc/<pid>/task): its kernel name and its stat fields
    from field 3 (the state) on, so field N of proc(5) is ``fields[N - 3]``; the kernel's view this
    census is about (state, wait channel, stacks), which no library gives per thread."""
    try:
        tids = os.listdir(task_dir)
    except OSError:
        return {}
    out = {}
    for tid in tids:
        try:
            with open(f"{task_dir}/{tid}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        out[int(tid)] = (stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split())
    return out


def sample(pid: int, census: dict, cpu: dict) -> None:
    """One look at every thread of ``pid`` but its main one."""
    for tid, (comm, rest) in task_stats(f"/proc/{pid}/task").items():
        if tid == pid:
            continue
        base = f"/proc/{pid}/task/{tid}"
        state, user, system = rest[0], int(rest[11]), int(rest[12])
        c = census[comm]
        c["tids"].add(f"{pid}/{tid}")
        c["state"][state] += 1
        first = cpu.setdefault((pid, tid), (comm, user, system))
        cpu[(pid, tid)] = (comm, first[1], first[2], user, system)
        if state == "R":
            top = [line.split(" ", 1)[-1].split("+")[0] for line in read(f"{base}/stack").splitlines()[:4]]
            c["running_stack"][" < ".join(top) or "(user space or unreadable)"] += 1
        else:
            nr = read(f"{base}/syscall").split(" ", 1)[0].strip()
            name = SYSCALLS.get(int(nr), nr) if nr.lstrip("-").isdigit() else nr or "?"
            c["syscall"][name] += 1
            c["wchan"][read(f"{base}/wchan") or "?"] += 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--seconds", type=float, default=300)
    ap.add_argument("--every", type=float, default=0.1)
    ap.add_argument("--from-step", type=int, default=4)
    ap.add_argument(
        "--linger", type=float, default=10.0, help="seconds to wait for another run once the last ended"
    )
    ap.add_argument(
        "--pid", type=int, action="append", help="only this process (repeatable; default: every run)"
    )
    a = ap.parse_args()
    census: dict = defaultdict(
        lambda: {
            "tids": set(),
            "state": Counter(),
            "syscall": Counter(),
            "wchan": Counter(),
            "running_stack": Counter(),
        }
    )
    cpu: dict = {}
    samples, deadline, gone = 0, time.monotonic() + a.seconds, None
    while time.monotonic() < deadline:
        found = {pid: rdir for pid, rdir in trainers().items() if not a.pid or pid in a.pid}
        gone = None if found or not samples else gone or time.monotonic()
        if gone is not None and time.monotonic() - gone > a.linger:  # the sampled runs ended, none since
            break
        for pid, rdir in found.items():
            turns = read(str(rdir / "lockstep.jsonl")).count("\n")
            if turns >= a.from_step - 1:
                sample(pid, census, cpu)
                samples += 1
        time.sleep(a.every)
    tick = os.sysconf("SC_CLK_TCK")
    doc = {"samples": samples, "every_s": a.every, "by_name": {}}
    for comm, c in sorted(census.items(), key=lambda kv: -len(kv[1]["tids"])):
        spent = [v for v in cpu.values() if v[0] == comm and len(v) == 5]
        doc["by_name"][comm] = {
            "threads": len(c["tids"]),
            "user_s": round(sum(v[3] - v[1] for v in spent) / tick, 2),
            "sys_s": round(sum(v[4] - v[2] for v in spent) / tick, 2),
            **{k: dict(c[k].most_common(8)) for k in ("state", "syscall", "wchan", "running_stack")},
        }
    a.out.write_text(json.dumps(doc, indent=1))
    print(
        json.dumps({k: {x: v[x] for x in ("threads", "user_s", "sys_s")} for k, v in doc["by_name"].items()})
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
