"""The end of a multi-process run: the process group destroyed, then, on gloo, no interpreter shutdown.

A gloo worker thread drops its last reference to a finished collective only after the main
thread has seen that collective complete. When the main thread is faster (a loaded CPU), the
worker does so while the interpreter is already finalizing; freeing the collective's tensors
then takes the GIL, the finalizing interpreter ends the thread with ``pthread_exit``, whose
unwind through a ``noexcept`` frame calls ``std::terminate``: the rank dies with SIGABRT
("terminate called without an active exception") after its run finished and its files were
written. Caught here in a core dump of a CPU run under load (3 two-rank runs on 2 cores, about
1 run in 40): the aborting thread is in ``ProcessGroupGloo::runLoop`` ->
``~AsyncWork`` -> ``decref_pyobject`` -> ``take_gil`` -> ``PyThread_exit_thread``, the main
thread in ``Py_FinalizeEx``. ``destroy_process_group`` does not stop gloo's threads (the
backend has no shutdown, and the group stays referenced from C++), so it cannot prevent this.
PyTorch tracks the race as pytorch/pytorch#190489.

So a process that ran on gloo leaves with ``os._exit`` once its files are closed and its output
flushed: nothing is left for the interpreter's shutdown to do that the run needs. NCCL's
``destroy_process_group`` joins its own threads; those runs exit normally.
"""

from __future__ import annotations

import os
import sys

_gloo_used = False


def destroy_process_group() -> None:
    """Destroy the default process group (a failure to do so is not the run's failure) and
    remember whether it was gloo's."""
    global _gloo_used
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        _gloo_used = _gloo_used or dist.get_backend() == "gloo"
        dist.destroy_process_group()
    except Exception as e:  # the run's outcome is in its files already; say it, do not change it
        print(f"warning: destroy_process_group: {' '.join(str(e).split())}", file=sys.stderr, flush=True)


def exit_process(code: int) -> None:
    """Leave with ``code``: without the interpreter's shutdown after a gloo process group, as
    usual otherwise."""
    if _gloo_used:
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        os._exit(code)
    sys.exit(code)
