"""A warm start for the user's interpreter: ``PYTHON warmserver.py SOCKET DRIVER_PID MODULE...``
imports the modules once (torch, ``specforge.cli``: never a GPU), then forks one run per request.

It runs in the USER's interpreter, under the isolated environment (bench/trainers/isolation.py),
started by path: standard library only, nothing of this checkout is imported. One request on the
Unix socket SOCKET is one run: a JSON line ``{"argv", "env", "cwd"}`` with two descriptors (the
run's stdout and a lifeline pipe's read end). The server forks; the child leads its own session,
puts the run's environment and descriptors in place and runs ``python -m specforge.cli ARGS``
(``runpy``, as a command line would); a thread in it ends its process group when the lifeline
reads EOF (the wrapper holding the write end has died: a SIGKILLed driver leaves no run behind).
The server sends back ``{"pid"}`` at once and ``{"status"}`` (waitpid's) at the end, one run at a
time. It exits when the sweep's driver (DRIVER_PID) has gone, or on SIGTERM; the first run's
wrapper starts it (bench/trainers/specforge_cli/wrapper.py), outside that run's process group.
"""

from __future__ import annotations

import importlib
import json
import os
import signal
import socket
import sys
import threading
import time

READY = "warm-server ready"
HERE = os.path.dirname(os.path.abspath(__file__))


def _lifeline(fd: int) -> None:
    """In the run: EOF on ``fd`` (every writer gone) ends the run's whole process group."""
    try:
        while os.read(fd, 64):
            pass
    except OSError:
        pass
    os.killpg(os.getpgrp(), signal.SIGKILL)


def _run(request: dict, out_fd: int, life_fd: int, listener: socket.socket) -> None:
    """The forked run (never returns)."""
    try:
        listener.close()
        os.setsid()
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out_fd, 1)
        os.dup2(out_fd, 2)
        os.close(out_fd)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        threading.Thread(target=_lifeline, args=(life_fd,), daemon=True).start()
        for stream in (sys.stdout, sys.stderr):
            stream.reconfigure(line_buffering=True, write_through=True)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        import runpy
        import warnings

        # runpy's note that the module was imported before it ran: it was, once, in this server
        warnings.filterwarnings(
            "ignore", message=".*found in sys.modules after import", category=RuntimeWarning
        )
        if request.get("instrument"):  # instrument.py, beside this file: optimizer-step hooks (wrapper.py)
            import importlib.util

            spec = importlib.util.spec_from_file_location(
                "bench_instrument", os.path.join(HERE, "instrument.py")
            )
            instrument = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(instrument)
            instrument.install(**request["instrument"])
        module, *args = request["argv"]
        sys.argv = [module, *args]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _serve_one(conn: socket.socket, listener: socket.socket) -> None:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 2)
    request = json.loads(data.decode())
    pid = os.fork()
    if pid == 0:
        conn.close()
        _run(request, fds[0], fds[1], listener)
    for fd in fds:
        os.close(fd)
    conn.sendall((json.dumps({"pid": pid}) + "\n").encode())
    _, status = os.waitpid(pid, 0)
    code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    conn.sendall((json.dumps({"status": code}) + "\n").encode())


def _watch_driver(pid: int, path: str) -> None:
    """Exit (removing the socket) once the driver is gone."""
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        except PermissionError:
            pass
        time.sleep(1.0)
    try:
        os.unlink(path)
    except OSError:
        pass
    os._exit(0)


def main(argv: list[str]) -> int:
    """MODULE? is optional: one this SpecForge lacks or cannot import is left to the run."""
    path, driver, modules = argv[0], int(argv[1]), argv[2:]
    t0 = time.monotonic()
    for name in modules:
        try:
            importlib.import_module(name.rstrip("?"))
        except ImportError as e:
            if not name.endswith("?"):
                raise
            print(f"warm-server: {name[:-1]} not preloaded ({e})", flush=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".new")
    listener.listen(1)
    os.rename(path + ".new", path)  # the socket appears only once the imports are done
    threading.Thread(target=_watch_driver, args=(driver, path), daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    print(f"{READY} {time.monotonic() - t0:.3f}", flush=True)
    while True:
        conn, _ = listener.accept()
        with conn:
            try:
                _serve_one(conn, listener)
            except (OSError, ValueError, KeyError) as e:
                print(f"warm-server: a request failed: {e!r}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
