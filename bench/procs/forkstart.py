"""Warm starts: single-process runs forked from a server that has imported the trainer already.

A fresh interpreter pays for its imports before it trains: torch, transformers and the
trainer take 10-15 s on the H200 machine, every run. The driver instead starts Python's
``multiprocessing`` fork server once per sweep with the trainer's modules imported (the
server never touches a GPU), and forks each single-process run from it. The run is still a
process of its own (its own CUDA context, session, output file and exit code) and runs
``python -m <trainer> ARGS`` exactly as a command line would (``runpy``), with the
environment the command would get; only the imports were done before the fork. Runs under
torchrun start as before. ``fork_server: false`` in a sweep config turns this off.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import runpy
import subprocess
import sys
import time
from collections.abc import Sequence

_CTX = multiprocessing.get_context("forkserver")
# Any import-time CUDA availability check in the server goes through NVML, which leaves the
# CUDA driver uninitialised, so forked children can still create their own CUDA context.
# TORCH_WARM_POOL=0: importing TorchInductor must not start its compile workers in the server.
_SERVER_ENV = {"PYTORCH_NVML_BASED_CUDA_CHECK": "1", "TORCH_WARM_POOL": "0"}
_preloaded: tuple[str, ...] | None = None  # what the running server imported; None: no server


def module_argv(argv: Sequence[str]) -> tuple[str, list[str]] | None:
    """(module, args) when argv is ``<this python> -m module args...``, the one shape a fork
    server can start; None otherwise (torchrun, another interpreter, a script)."""
    if len(argv) >= 3 and argv[0] == sys.executable and argv[1] == "-m":
        return argv[2], list(argv[3:])
    return None


class ForkServerUnusable(RuntimeError):
    """The server started, but a run forked from it would not see the machine's GPUs."""


def start_server(preload: Sequence[str], env: dict[str, str] | None = None, gpus: int = 0) -> float:
    """Start the fork server (once per driver process) with ``preload`` imported, under the
    driver's environment plus ``env`` (e.g. the compile cache's; each run gets its own full
    environment anyway); returns the seconds it took to become ready, 0.0 when it was running
    already with these imports. A server of other imports (an earlier sweep run in this same
    process, e.g. of another trainer) is stopped first: its forks would import this trainer
    themselves, every run. A module that fails to import is skipped by the server and imported
    by each run instead. With ``gpus`` > 0 (the machine's count), a forked probe must see
    CUDA/HIP devices (an import that initialised the CUDA driver in the server would leave
    forks without any): ForkServerUnusable otherwise, and runs start afresh."""
    global _preloaded
    wanted = ("bench.procs.launcher", *preload)
    if _preloaded == wanted:
        return 0.0
    if _preloaded is not None:
        stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)  # CPython 3.8+
        if stop is None:
            return 0.0  # runs fork from the server there is and import the rest themselves
        stop()
        _preloaded = None
    _CTX.set_forkserver_preload(list(wanted))
    server_env = {**(env or {}), **_SERVER_ENV}
    saved = {k: os.environ.get(k) for k in server_env}
    os.environ.update(server_env)
    t0 = time.monotonic()
    try:
        probe = _CTX.Process(target=_noop, name="bench-fork-probe")
        probe.start()  # returns once the server has imported `preload` and forked the probe
        probe.join()
        if gpus:
            probe = _CTX.Process(target=_count_devices, name="bench-fork-gpu-probe")
            probe.start()
            probe.join()
            seen = (probe.exitcode or 0) - 10  # an exception exits 1: "no answer"
            if seen < 1:
                why = "no GPU" if seen == 0 else f"an error (exit status {probe.exitcode})"
                raise ForkServerUnusable(f"a process forked from it found {why}; the machine has {gpus}")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    _preloaded = wanted
    return time.monotonic() - t0


def ready() -> bool:
    """Whether the server was started (a run asked to fork starts afresh otherwise)."""
    return _preloaded is not None


def _noop() -> None:
    pass


def _count_devices() -> None:
    """Exit status 10 + the devices torch sees from a fork (initialises the driver, no context)."""
    import torch

    sys.exit(10 + min(torch.cuda.device_count(), 100))


class ForkedRun:
    """A run forked by the server, with the part of Popen's interface the launcher uses."""

    def __init__(self, module: str, args: list[str], log_path: str, env: dict[str, str]):
        self._proc = _CTX.Process(
            target=_child_main, args=(module, args, log_path, env, os.getpid()), name=f"run:{module}"
        )
        self._proc.start()
        self.pid: int = self._proc.pid
        self._wait_for_session()

    def _wait_for_session(self, timeout_s: float = 30.0) -> None:
        """Return once the child leads its own process group (it calls setsid first thing), so
        that killing the group reaches it; or once it has exited."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and self._proc.exitcode is None:
            try:
                if os.getpgid(self.pid) == self.pid:
                    return
            except ProcessLookupError:
                return
            time.sleep(0.002)

    @property
    def returncode(self) -> int | None:
        return self._proc.exitcode

    def poll(self) -> int | None:
        return self._proc.exitcode

    def wait(self, timeout: float | None = None) -> int:
        self._proc.join(timeout)
        if self._proc.exitcode is None:
            raise subprocess.TimeoutExpired(f"run:{self.pid}", timeout or 0)
        return self._proc.exitcode


def _child_main(module: str, args: list[str], log_path: str, env: dict[str, str], driver: int) -> None:
    """The forked run: its own session, output to the run's log, the command's environment,
    then ``python -m module args``. Exit status as the command line would give it."""
    from bench.procs.lifeline import die_with_parent

    os.setsid()
    # Every fork of the server inherits the write end of the pipe whose EOF tells the server
    # that its clients are gone; closed here, so the server exits when the driver does ...
    server = multiprocessing.forkserver._forkserver
    alive_fd = getattr(server, "_forkserver_alive_fd", None)
    if alive_fd is not None:
        os.close(alive_fd)
        server._forkserver_alive_fd = None
    die_with_parent(os.getppid())  # ... and its death sends this run SIGTERM
    try:
        os.kill(driver, 0)
    except ProcessLookupError:
        os._exit(1)  # the driver died while this run was being forked
    fd = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os.dup2(null, 0)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    os.close(null)
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.reconfigure(line_buffering=True, write_through=True)
    # multiprocessing made the server's start method this process's default; a fresh
    # interpreter has the platform's (fork on Linux before Python 3.14). Without this reset,
    # the run's DataLoader would start its workers through a new fork server of its own
    # (measured on the H200: 3-4 s to the first batch instead of 0.3 s).
    multiprocessing.set_start_method(None, force=True)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
