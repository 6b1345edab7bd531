"""Two SpecForge runs taking turns on one card (a sweep's ``pairing: lockstep``): the optimizer-step
hook instrument.py installs in each run's process with ``--lockstep DIR ROLE LAST OUT``.

It runs in the USER's interpreter, loaded by path beside instrument.py: standard library and torch
only, nothing of this checkout.
"""

from __future__ import annotations

import gc
import json
import os
import time

_KERNEL_NAMES: dict[int, str] = {}  # tid -> its kernel name, read once per thread (not at every step)


def thread_times() -> dict[int, tuple[str, float, float]]:
    """Every thread of this process: its name and its user and system CPU seconds (psutil's
    thread times: SpecForge depends on psutil, so the user's interpreter has it), named by Python
    where Python knows the thread, else by the kernel (``/proc/self/task/<tid>/comm``)."""
    import threading

    import psutil

    named = {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
    out = {}
    for t in psutil.Process().threads():
        name = named.get(t.id) or _KERNEL_NAMES.get(t.id)
        if name is None:
            try:
                with open(f"/proc/self/task/{t.id}/comm") as f:
                    name = _KERNEL_NAMES[t.id] = f.read().strip()
            except OSError:
                name = "?"
        out[t.id] = (name, t.user_time, t.system_time)
    return out


class Lockstep:
    """The two runs of a lockstep pair take turns on one card, one optimizer step each: role 0
    runs step k while role 1 waits, then role 1 runs its step k while role 0 waits, and so on
    (step 1, which compiles, runs in both at once and is a warm-up step). The turn passes after
    the step's update, once the card has finished the step's work (``cuda.synchronize``), through
    two FIFOs in DIR that the driver made: ``to0`` (role 0's inbox) and ``to1``, each message a
    step number. A run's step therefore has the card to itself (the other run's main thread waits;
    its data-loader threads may still prefetch), and both arms of a pair see the host's state at
    most one step apart.

    OUT (JSON lines, one per step, written before SpecForge logs the step):

    - ``own_s``: from taking the turn to the step's end on the card (the step's time without the
      wait), and that span's wall-clock ends, ``started`` and ``ended``; ``wait_s``: the wait for
      the partner's step after it;
    - ``alone``: true once the partner has gone (it died, or its run ended); the run then goes on
      by itself. Role 1 does not wait after step LAST (its run ends there), so neither run waits
      for a step that never comes;
    - what the turn did on the host: ``gc2_s``, the garbage collector's full (generation 2)
      collections inside it (``gc2_wait_s``: in the wait after it); ``cpu_s`` and ``main_cpu_s``,
      the CPU time of the whole process and of its main thread (a pause of host work shows in
      them, a wait on the device does not); ``threads``, that CPU time per thread (Linux's
      /proc/self/task, user and system seconds, by the thread's Python name or else its kernel
      name; threads of one name summed; only those that ran in the turn, and a thread that ended
      inside the turn is missing from it though ``cpu_s`` counts it), which names the threads
      when the process's CPU time outside the main thread moves; ``allocator``, the CUDA caching allocator's cudaMalloc
      and cudaFree calls, retries and syncs of all streams; the allocator's peaks so far. (In the
      Liger runs of results/h200-specforge-verdict-lockstep one step paid a 0.23-0.33 s host-side
      pause that no baseline step did: these say what it is.)
    """

    POLL_S = 1.0  # how often a wait checks that the partner is still alive
    START_S = 120.0  # a partner that has not written its pid by then never started its hooks

    def __init__(self, pair_dir: str, role: int, last: int, out: str):
        self.role, self.last, self.out = int(role), int(last), out
        self.inbox = os.open(os.path.join(pair_dir, f"to{self.role}"), os.O_RDWR)
        self.outbox = os.open(os.path.join(pair_dir, f"to{1 - self.role}"), os.O_RDWR)
        self.pid_dir = pair_dir
        with open(os.path.join(pair_dir, f"pid{self.role}"), "w") as f:
            f.write(str(os.getpid()))
        self.step, self.heard, self.alone = 0, 0, False
        self.buf = b""
        self.t_turn = self.t_install = time.perf_counter()
        self.gc2_s, self._gc_t0 = 0.0, 0.0
        self.main0, self.cpu0, self.alloc0 = time.thread_time(), self._cpu(), {}
        self.threads0 = self._threads()
        gc.callbacks.append(self.on_gc)

    @staticmethod
    def _cpu() -> float:
        return time.process_time()  # every thread's user + system time, at the clock's resolution

    @staticmethod
    def _threads() -> dict[int, tuple[str, float, float]]:
        """Every thread's (name, user seconds, system seconds): thread_times."""
        return thread_times()

    def _thread_cpu(self, now: dict[int, tuple[str, float, float]]) -> dict[str, dict[str, float]]:
        """The turn's CPU time per thread name (threads of one name summed): user and system seconds."""
        by_name: dict[str, list[float]] = {}
        for tid, (name, user, system) in now.items():
            _, user0, system0 = self.threads0.get(tid, (name, 0.0, 0.0))
            if user - user0 or system - system0:
                acc = by_name.setdefault(name, [0.0, 0.0])
                acc[0] += user - user0
                acc[1] += system - system0
        return {
            name: {"user_s": round(u, 3), "sys_s": round(sy, 3)} for name, (u, sy) in sorted(by_name.items())
        }

    ALLOCATOR_KEYS = ("num_device_alloc", "num_device_free", "num_alloc_retries", "num_sync_all_streams")

    def _allocator(self, torch) -> dict:
        stats = torch.cuda.memory_stats()
        return {k: int(stats.get(k, 0)) for k in self.ALLOCATOR_KEYS}

    def on_gc(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        else:
            self.gc2_s += time.perf_counter() - self._gc_t0

    def _partner_alive(self) -> bool:
        try:
            with open(os.path.join(self.pid_dir, f"pid{1 - self.role}")) as f:
                os.kill(int(f.read().strip()), 0)
            return True
        except FileNotFoundError:  # it writes its pid when its hooks are installed, seconds after its start
            return time.perf_counter() - self.t_install < self.START_S
        except (ProcessLookupError, ValueError):
            return False
        except PermissionError:
            return True

    def _wait_for(self, step: int) -> None:
        import select

        while self.heard < step and not self.alone:
            ready, _, _ = select.select([self.inbox], [], [], self.POLL_S)
            if ready:
                self.buf += os.read(self.inbox, 4096)
                *lines, self.buf = self.buf.split(b"\n")
                self.heard = max([self.heard, *(int(x) for x in lines if x.strip())])
            elif not self._partner_alive():
                self.alone = True

    def __call__(self, _optimizer, _args, _kwargs) -> None:
        import torch

        self.step += 1
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        if cuda:
            torch.cuda.synchronize()
        ended, ended_wall = time.perf_counter(), time.time()
        own = ended - self.t_turn
        main, cpu = time.thread_time(), self._cpu()  # the thread first: it is part of the process
        alloc = self._allocator(torch) if cuda else {}
        threads = self._threads()
        turn = {
            "gc2_s": round(self.gc2_s, 6),
            "cpu_s": round(cpu - self.cpu0, 4),
            "main_cpu_s": round(main - self.main0, 4),
            "threads": self._thread_cpu(threads),
            "allocator": {k: v - self.alloc0.get(k, 0) for k, v in alloc.items()} if alloc else None,
        }
        self.gc2_s = 0.0
        os.write(self.outbox, f"{self.step}\n".encode())
        if self.role == 0:
            self._wait_for(self.step)
        elif self.step < self.last:
            self._wait_for(self.step + 1)
        self.threads0 = self._threads()  # read before the turn's clock starts: not in own_s
        self.t_turn = time.perf_counter()
        self.main0, self.cpu0, self.alloc0 = time.thread_time(), self._cpu(), alloc
        rec = {
            "step": self.step,
            "own_s": round(own, 6),
            "wait_s": round(self.t_turn - ended, 6),
            "ended": ended_wall,  # time.time() when the step's work on the card was done
            "started": ended_wall - own,  # ... and when its turn began
            "alone": self.alone,
            **turn,
            "gc2_wait_s": round(self.gc2_s, 6),  # full collections while it waited (not in own_s)
            "peak_reserved_bytes": torch.cuda.max_memory_reserved() if cuda else None,
            "peak_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        }
        self.gc2_s = 0.0
        with open(self.out, "a") as f:
            f.write(json.dumps(rec) + "\n")
