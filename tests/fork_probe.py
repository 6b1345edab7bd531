"""A tiny program for the fork-server tests: `python -m tests.fork_probe OUT.json [EXIT] [sleep|child]`.

Writes what a run sees of its process (argv, __name__, session, an environment variable) to
OUT.json, then exits with EXIT; with `sleep` it sleeps forever, with `child` it first starts a
grandchild that sleeps forever (its pid goes into OUT.json).
"""

import json
import multiprocessing
import os
import subprocess
import sys
import time

if __name__ == "__main__":
    out, code = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
    mode = sys.argv[3] if len(sys.argv) > 3 else ""
    info = {
        "argv": sys.argv[1:],
        "pid": os.getpid(),
        "leads_session": os.getsid(0) == os.getpid(),
        "probe_env": os.environ.get("FORK_PROBE"),
        "stdin_is_devnull": os.path.samestat(os.fstat(0), os.stat(os.devnull)),
        "start_method": multiprocessing.get_start_method(),
        # which of these modules the run found imported (a forked run: what its server preloaded)
        "preloaded": [m for m in os.environ.get("FORK_PROBE_MODULES", "").split(",") if m in sys.modules],
    }
    if mode == "child":
        info["grandchild"] = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]).pid
    with open(out + ".tmp", "w") as f:
        json.dump(info, f)
    os.replace(out + ".tmp", out)
    print("probe says hello", flush=True)
    print("probe on stderr", file=sys.stderr, flush=True)
    if mode in ("sleep", "child"):
        time.sleep(600)
    sys.exit(code)
