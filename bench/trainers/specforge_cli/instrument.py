"""Hooks inside one SpecForge process: ``PYTHON instrument.py [--modules OUT] [--probe OUT FIRST COUNT]
[--gc-freeze OUT] [--perturb-ulp OUT[:DTYPE]] [--lockstep DIR ROLE LAST OUT] -m MODULE ARGS...``
runs ``python -m MODULE ARGS`` (``runpy``, as a command line would) after hooking every
optimizer's step. ``--modules``: ModuleCensus below (which module classes the trained model
holds: whether an arm's kernels are in it); ``--gc-freeze``: GcFreeze; ``--perturb-ulp``: PerturbUlp (the aa_eps arm);
``--lockstep``: turns.py's Lockstep (the two runs of a pair take turns on one card). ``--probe``:
what the process did while it trained, written to OUT (JSON) once optimizer step FIRST + COUNT
has run:

- ``step_t``: the wall time of every optimizer step (``time.time()``), for the step-time level;
- ``profile``: torch.profiler over optimizer steps FIRST..FIRST+COUNT: each GPU kernel's name,
  calls and time, the GPU's busy time (the union of its kernels' intervals) against the window's
  wall time, i.e. how GPU-bound the step is;
- ``host``: every thread of the process over the same window: its name, CPU seconds, the CPU it
  last ran on, voluntary and involuntary context switches (a thread preempted by another);
  the process's CPU affinity, torch's intra-op and inter-op threads, its child processes;
- ``compile``: torch.compile's counters (graph-cache hits and misses, recompiles, autotuning),
  the inductor settings that decide kernel choices, the compile-cache directories;
- ``allocator``: the CUDA caching allocator's state (segments, retries, reserved bytes);
- ``gc``: every collection of Python's cyclic garbage collector's oldest generation (the one that
  walks the whole heap) up to then: the optimizer step it fell in, and how long it took.

It runs in the USER's interpreter, started by path under the isolated environment
(bench/trainers/isolation.py): standard library and torch only, nothing of this checkout. What it
measures costs nothing outside the profiled window but one ``time.time()`` per optimizer step; the
profiled steps themselves run slower and are left out of any level the report states.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time


def _threads() -> dict:
    """Every thread of this process: name, CPU seconds (turns.py's thread_times), context switches."""
    out = {}
    for tid, (name, user, system) in _sibling("turns").thread_times().items():
        try:
            with open(f"/proc/self/task/{tid}/status") as f:
                status = dict(line.split(":\t", 1) for line in f.read().splitlines() if ":\t" in line)
        except OSError:
            continue
        out[str(tid)] = {
            "name": name,
            "cpu_s": user + system,
            "voluntary": int(status.get("voluntary_ctxt_switches", "0").strip()),
            "involuntary": int(status.get("nonvoluntary_ctxt_switches", "0").strip()),
        }
    return out


def _children() -> list[dict]:
    """Processes below this one (compile workers, data workers): pid, name, threads (psutil)."""
    import psutil

    below = []
    for p in psutil.Process().children(recursive=True):
        try:
            below.append({"pid": p.pid, "name": p.name(), "threads": p.num_threads()})
        except psutil.Error:  # ended while it was read
            continue
    return sorted(below, key=lambda r: r["pid"])


def _host_window(before: dict, after: dict, seconds: float) -> list[dict]:
    rows = []
    for tid, a in after.items():
        b = before.get(tid, {"cpu_s": 0.0, "voluntary": 0, "involuntary": 0})
        rows.append(
            {
                "tid": int(tid),
                "name": a["name"],
                "cpu_share": round((a["cpu_s"] - b["cpu_s"]) / seconds, 3) if seconds > 0 else None,
                "voluntary": a["voluntary"] - b["voluntary"],
                "involuntary": a["involuntary"] - b["involuntary"],
            }
        )
    return sorted(rows, key=lambda r: -(r["cpu_share"] or 0))


def _compile_facts(torch) -> dict:
    facts: dict = {"env": {k: v for k, v in os.environ.items() if k.startswith(("TORCHINDUCTOR", "TRITON"))}}
    try:
        from torch._dynamo.utils import counters

        facts["counters"] = {k: dict(v) for k, v in counters.items() if v}
    except Exception as e:  # noqa: BLE001 (a torch without these internals: say so, go on)
        facts["counters_error"] = repr(e)
    try:
        import torch._inductor.config as ic

        facts["inductor"] = {
            k: getattr(ic, k, None)
            for k in ("max_autotune", "max_autotune_gemm", "coordinate_descent_tuning", "fx_graph_cache")
        }
    except Exception as e:  # noqa: BLE001
        facts["inductor_error"] = repr(e)
    facts["backends"] = {
        "matmul_tf32": torch.backends.cuda.matmul.allow_tf32,
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
    }
    return facts


def _allocator(torch) -> dict:
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return {}
    s = torch.cuda.memory_stats()
    keys = ("num_alloc_retries", "num_ooms", "num_device_alloc", "num_device_free")
    out = {k: s.get(k) for k in keys}
    out["segments"] = s.get("segment.all.current")
    out["reserved_gib"] = round(s.get("reserved_bytes.all.current", 0) / 2**30, 3)
    out["allocated_gib"] = round(s.get("allocated_bytes.all.current", 0) / 2**30, 3)
    out["inactive_split_gib"] = round(s.get("inactive_split_bytes.all.current", 0) / 2**30, 3)
    return out


def _kernels(prof, wall_s: float) -> dict:
    """Per-kernel GPU time and the GPU's busy time over the profiled window."""
    from torch.autograd import DeviceType

    spans, table = [], {}
    for e in prof.events():
        if e.device_type != DeviceType.CUDA:
            continue
        start, end = e.time_range.start, e.time_range.end
        spans.append((start, end))
        t = table.setdefault(e.name, [0, 0.0])
        t[0] += 1
        t[1] += (end - start) / 1e6
    busy, reach = 0.0, None
    for start, end in sorted(spans):
        if reach is None or start > reach:
            busy += end - start
            reach = end
        elif end > reach:
            busy += end - reach
            reach = end
    kernel_s = sum(v[1] for v in table.values())
    top = sorted(table.items(), key=lambda kv: -kv[1][1])
    return {
        "wall_s": round(wall_s, 4),
        "gpu_busy_s": round(busy / 1e6, 4),
        "gpu_busy_share": round(busy / 1e6 / wall_s, 4) if wall_s > 0 else None,
        "kernel_s": round(kernel_s, 4),
        "kernels": len(spans),
        "top": [{"name": k[:160], "calls": v[0], "s": round(v[1], 5)} for k, v in top[:60]],
    }


class Probe:
    def __init__(self, out: str, first: int, count: int):
        self.out, self.first, self.count = out, first, count
        self.step = 0
        self.doc: dict = {"pid": os.getpid(), "first": first, "count": count, "step_t": []}
        self.prof = None
        self.t_start = 0.0
        self.threads0: dict = {}
        self.doc["gc"] = []
        self._gc_t0 = 0.0

    def on_gc(self, phase: str, info: dict) -> None:
        """gc.callbacks: each full (generation 2) collection, with the step it fell in."""
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._gc_t0 = time.perf_counter()
        elif len(self.doc["gc"]) < 500:
            took = time.perf_counter() - self._gc_t0
            self.doc["gc"].append(
                {"step": self.step + 1, "s": round(took, 4), "collected": info.get("collected")}
            )

    def __call__(self, _optimizer, _args, _kwargs) -> None:
        import torch

        self.step += 1
        self.doc["step_t"].append(time.time())
        if self.step == self.first:
            torch.cuda.synchronize() if torch.cuda.is_initialized() else None
            self.threads0, self.t_start = _threads(), time.perf_counter()
            acts = [torch.profiler.ProfilerActivity.CPU]
            if torch.cuda.is_available():
                acts.append(torch.profiler.ProfilerActivity.CUDA)
            self.prof = torch.profiler.profile(activities=acts)
            self.prof.start()
        elif self.prof is not None and self.step == self.first + self.count:
            torch.cuda.synchronize() if torch.cuda.is_initialized() else None
            wall = time.perf_counter() - self.t_start
            threads1 = _threads()
            self.prof.stop()
            self.doc["profile"] = _kernels(self.prof, wall)
            self.prof = None
            self.doc["host"] = {
                "affinity": sorted(os.sched_getaffinity(0)),
                "torch_threads": torch.get_num_threads(),
                "torch_interop_threads": torch.get_num_interop_threads(),
                "threads": _host_window(self.threads0, threads1, wall),
                "children": _children(),
                "loadavg": os.getloadavg(),
            }
            self.doc["compile"] = _compile_facts(torch)
            self.doc["allocator"] = _allocator(torch)
            self.write()

    def write(self) -> None:
        tmp = self.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.doc, f, indent=1, default=str)
        os.replace(tmp, self.out)


class _FirstStep:
    """An optimizer-step hook that acts at the first step only (``first``) and writes what it did
    to OUT (JSON), whole: a temporary file renamed over it."""

    def __init__(self, out: str):
        self.out, self.done = out, False

    def __call__(self, optimizer, _args, _kwargs) -> None:
        if self.done:
            return
        self.done = True
        doc = self.first(optimizer)
        with open(self.out + ".tmp", "w") as f:
            json.dump(doc, f)
        os.replace(self.out + ".tmp", self.out)

    def first(self, optimizer) -> dict:
        raise NotImplementedError


class GcFreeze(_FirstStep):
    """After the first optimizer step, move every live object into Python's permanent generation
    (``gc.freeze()``): a full collection then walks only what was made since, instead of the
    whole heap of torch, TorchInductor and transformers inside a measured step. It changes no
    number the step computes; OUT (JSON) says how many objects were frozen."""

    def first(self, _optimizer) -> dict:
        import gc

        gc.collect()
        gc.freeze()
        return {"after_step": 1, "frozen_objects": gc.get_freeze_count()}


class ModuleCensus(_FirstStep):
    """After the first optimizer step, the class names of the modules of the smallest module whose
    parameters match what the optimizer trains (the draft, inside any wrapper): whether an arm's
    kernels are in the model SpecForge built (Liger's RMSNorm and SwiGLU are modules of their own:
    ``LigerRMSNorm``, ``LigerSwiGLUMLP``), read from the run itself. Matched by shape, not identity:
    SpecForge's optimizer holds float32 master copies of the draft's parameters, not the
    parameters. It reads, never changes, the model; its cost (one pass over the collector's
    objects) falls in step 1, a warm-up step. Hooked first, before gc.freeze(): frozen objects are
    not listed by gc.get_objects(). With it, ``resolved``: what SpecForge made of each key set on
    its command line (resolved_keys): whether a user arm's keys took effect. OUT (JSON)."""

    def first(self, optimizer) -> dict:
        import gc
        from collections import Counter

        import torch

        trained = Counter(tuple(p.shape) for group in optimizer.param_groups for p in group["params"])
        best = None  # ((-trained tensors matched, parameters in all), module)
        objects = gc.get_objects()  # one pass serves the census and the resolved keys
        for obj in objects:
            if issubclass(type(obj), torch.nn.Module):  # type(): no lazy __class__ of a module proxy
                shapes = Counter(tuple(p.shape) for p in obj.parameters())
                key = (-sum((trained & shapes).values()), sum(shapes.values()))
                if key[0] and (best is None or key < best[0]):
                    best = (key, obj)
        doc = {"after_step": 1, "trained_tensors": sum(trained.values())}
        if best is not None:
            root = best[1]
            doc |= {"root": type(root).__name__, "matched_tensors": -best[0][0]}
            doc["module_types"] = sorted({type(m).__name__ for m in root.modules()})
        doc["resolved"] = resolved_keys(_argv_keys(sys.argv[1:]), objects, torch.nn.Module)
        doc.update(
            code=_sibling("codefacts").collect()
        )  # the versions this run imported (an arm's environment)
        return doc


def _argv_keys(args: list[str]) -> list[str]:
    """The dotted keys set on SpecForge's command line (``key=value`` after ``train -c CONFIG``)."""
    return [a.split("=", 1)[0] for a in args if "=" in a and not a.startswith("-")]


def _plain(value):
    """A JSON value for what a config or module holds: an enum's value, else scalars as they are,
    anything else as its text."""
    value = getattr(value, "value", value)
    return value if value is None or isinstance(value, (bool, int, float, str)) else str(value)


def resolved_keys(keys: list[str], objects: list, module_type: type) -> dict:
    """What SpecForge made of each key set on its command line, read from its process: the value
    in its validated run config (``config``: every ``specforge.config`` object named Config that
    holds the key, their distinct values) and, as a visible effect, every module of the process
    with an attribute named as the key's last part (``model``: ``Class.attribute`` -> value; e.g.
    the DFlash model's ``attention_backend``). A key no config object holds has no ``config``."""
    configs = [
        o
        for o in objects
        if type(o).__name__ == "Config" and type(o).__module__.startswith("specforge.config")
    ]
    modules = [o for o in objects if issubclass(type(o), module_type)]  # type(): no lazy __class__
    out: dict = {}
    for key in keys:
        seen, missing = [], object()
        for cfg in configs:
            value = cfg
            for part in key.split("."):
                value = value.get(part, missing) if isinstance(value, dict) else getattr(value, part, missing)
                if value is missing:
                    break
            if value is not missing and _plain(value) not in seen:
                seen.append(_plain(value))
        attr, model = key.rsplit(".", 1)[-1], {}
        for m in modules:
            held = vars(m).get(attr, missing)
            if held is not missing and (held is None or isinstance(held, (bool, int, float, str))):
                model[f"{type(m).__name__}.{attr}"] = held
        out[key] = ({"config": seen[0] if len(seen) == 1 else seen} if seen else {}) | (
            {"model": model} if model else {}
        )
    return out


class PerturbUlp(_FirstStep):
    """Before the first optimizer step's update, move every parameter the optimizer holds by one
    unit in the last place, up or down at random (a sign per element from a fixed seed, in the
    optimizer's parameter order): the aa_eps arm, whose divergence from the baseline measures how
    far training carries one rounding step. Without a direction, as rounding differences are
    (moved all towards +inf, a bfloat16 RMSNorm weight of 1.0 becomes 1.0078: a model change, not
    a rounding step). The unit is that of ``ulp_dtype`` (the dtype the forward computes in:
    SpecForge's FSDP casts its float32 weights to bfloat16 there, so a float32 ulp would mostly
    round away), or of each parameter's own dtype ("param"). OUT (JSON) says how many tensors and
    elements were moved, how many up, in which unit, from which seed."""

    SEED = 1234

    def __init__(self, out: str, ulp_dtype: str = "param"):
        super().__init__(out)
        self.ulp_dtype = ulp_dtype

    def first(self, optimizer) -> dict:
        import torch

        unit = None if self.ulp_dtype == "param" else getattr(torch, self.ulp_dtype)
        tensors = elements = ups = 0
        gen = None
        with torch.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    if gen is None or gen.device != p.device:
                        gen = torch.Generator(device=p.device).manual_seed(self.SEED + tensors)
                    up = torch.rand(p.shape, generator=gen, device=p.device) < 0.5
                    if unit is None or unit == p.dtype:
                        p.copy_(torch.nextafter(p, torch.where(up, float("inf"), float("-inf")).to(p.dtype)))
                    else:  # p + the spacing of ``unit`` at p's value in the drawn direction, kept in p's dtype
                        q = p.to(unit)
                        towards = torch.where(up, float("inf"), float("-inf")).to(unit)
                        p.add_((torch.nextafter(q, towards) - q).to(p.dtype))
                    tensors += 1
                    elements += p.numel()
                    ups += int(up.sum())
        doc = {"before_step": 1, "tensors": tensors, "elements": elements, "up": ups}
        return {**doc, "ulp_of": self.ulp_dtype, "direction": "random", "seed": self.SEED}


@functools.cache
def _sibling(name: str):
    """A module beside this file, loaded by path once: this file runs in the user's interpreter,
    where nothing of this checkout is importable (bench/trainers/isolation.py)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"bench_{name}", os.path.join(os.path.dirname(__file__), f"{name}.py")
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def install(
    probe: list | None = None,
    gc_freeze: str | None = None,
    perturb_ulp: str | None = None,
    lockstep: list | None = None,
    modules: str | None = None,
) -> None:
    """Hook every optimizer's step in this process (also a run forked by warmserver.py):
    ``modules`` = OUT (ModuleCensus, hooked first),
    ``probe`` = [OUT, FIRST, COUNT] (Probe), ``gc_freeze`` = OUT (GcFreeze), ``perturb_ulp`` =
    OUT[:DTYPE] (PerturbUlp), ``lockstep`` = [DIR, ROLE, LAST, OUT] (turns.py's Lockstep; hooked last, so
    that the other hooks' work is part of the step it timed)."""
    import gc

    import torch.optim.optimizer as opt

    if perturb_ulp:  # OUT, or OUT:DTYPE (the unit's dtype: bfloat16, float16, or param)
        out, _, unit = (
            str(perturb_ulp).rpartition(":") if ":" in str(perturb_ulp) else (perturb_ulp, "", "param")
        )
        opt.register_optimizer_step_pre_hook(PerturbUlp(out, unit or "param"))

    if modules:
        opt.register_optimizer_step_post_hook(ModuleCensus(str(modules)))
    if probe:
        hook = Probe(str(probe[0]), int(probe[1]), int(probe[2]))
        opt.register_optimizer_step_post_hook(hook)
        gc.callbacks.append(hook.on_gc)
    if gc_freeze:
        opt.register_optimizer_step_post_hook(GcFreeze(gc_freeze))
    if lockstep:
        opt.register_optimizer_step_post_hook(_sibling("turns").Lockstep(*lockstep))


USAGE = (
    "usage: instrument.py [--modules OUT] [--probe OUT FIRST COUNT] [--gc-freeze OUT] [--perturb-ulp OUT[:DTYPE]] "
    "[--lockstep DIR ROLE LAST OUT] -m MODULE ARGS..."
)


def parse(argv: list[str]) -> tuple[dict, list[str]]:
    opts: dict = {}
    i = 0
    while i < len(argv) and argv[i] != "-m":
        if argv[i] == "--probe" and i + 3 < len(argv):
            opts["probe"], i = argv[i + 1 : i + 4], i + 4
        elif argv[i] == "--modules" and i + 1 < len(argv):
            opts["modules"], i = argv[i + 1], i + 2
        elif argv[i] == "--gc-freeze" and i + 1 < len(argv):
            opts["gc_freeze"], i = argv[i + 1], i + 2
        elif argv[i] == "--perturb-ulp" and i + 1 < len(argv):
            opts["perturb_ulp"], i = argv[i + 1], i + 2
        elif argv[i] == "--lockstep" and i + 4 < len(argv):
            opts["lockstep"], i = argv[i + 1 : i + 5], i + 5
        else:
            raise ValueError(f"{USAGE} (not {argv[i]!r})")
    if i + 1 >= len(argv):
        raise ValueError(USAGE)
    return opts, argv[i + 1 :]


def main(argv: list[str]) -> int:
    try:
        opts, (module, *args) = parse(argv)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    import runpy

    install(**opts)
    sys.argv = [module, *args]
    # PYTHONSAFEPATH=1 (the isolated environment): neither this file's folder nor the working
    # directory is on sys.path, as for `python -m` under it
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
