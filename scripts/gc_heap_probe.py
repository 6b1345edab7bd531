"""How long a full garbage collection takes in a SpecForge process's heap: ``SPECFORGE_PYTHON
scripts/gc_heap_probe.py [base|liger]``, run with the user's SpecForge interpreter.

It imports what ``specforge train`` imports before its first step (the warm server's preload list,
bench/trainers/specforge_cli/wrapper.py's WARM_PRELOAD), plus with ``liger`` the module SpecForge
loads for ``model.use_liger_kernel=true`` (``liger_kernel.transformers``), then times five full
collections (``gc.collect(2)``) and counts the objects they walk. This says what a full collection costs in
that heap, before any model is built, on whatever machine it runs. The
Liger runs' one-step pause (docs/method.md) is about that size; whether it is one, each lockstep
turn's ``gc2_s`` says on the GPU.
"""

from __future__ import annotations

import gc
import importlib
import sys
import time

PRELOAD = (
    "torch",
    "specforge.cli",
    "accelerate.utils",
    "specforge.distributed",
    "specforge.application",
    "specforge.training.assembly",
    "specforge.algorithms.builtin",
    "transformers.models.qwen3.modeling_qwen3",
    "torch._dynamo",
    "torch._inductor.compile_fx",
    "torch.distributed.fsdp",
)


def main(which: str) -> int:
    mods = [*PRELOAD, *(["liger_kernel.transformers"] if which == "liger" else [])]
    for name in mods:
        try:
            importlib.import_module(name)
        except Exception as e:  # a module this SpecForge lacks: said, not fatal
            print(f"skipped {name}: {type(e).__name__}: {e}", file=sys.stderr)
    gc.collect()
    took = []
    for _ in range(5):
        t = time.perf_counter()
        gc.collect(2)
        took.append(time.perf_counter() - t)
    print(
        f"{which}: {len(gc.get_objects())} objects; full collection {', '.join(f'{s:.3f}' for s in took)} s"
    )
    return 0


if __name__ == "__main__":
    arg = sys.argv[1] if len(sys.argv) > 1 else "base"
    if arg not in ("base", "liger"):
        print("usage: scripts/gc_heap_probe.py [base|liger]", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(arg))
