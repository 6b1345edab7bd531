#!/usr/bin/env bash
# Facts about the machine and the SpecForge environment behind a SpecForge run's start and spread
# (read only: nothing is set): CPUs and their limits, NUMA, the GPU's topology and performance
# state, where Python's bytecode caches are and whether they can be written, and how long the
# imports of `specforge train` take, twice (the second with the OS's file cache warm).
# Run by scripts/h200_sweeps.sh's `sffacts` stage (needs its /tmp/sfenv/python).
PY=${SPECFORGE_PYTHON:-/tmp/sfenv/python}
echo "== cpus: $(nproc) usable; affinity $(python3 -c 'import os; print(sorted(os.sched_getaffinity(0)))')"
lscpu | grep -E "^(Model name|Socket|Core|Thread|NUMA|CPU\(s\)|CPU MHz|L3)" 
for f in /sys/fs/cgroup/cpu.max /sys/fs/cgroup/cpuset.cpus.effective /sys/fs/cgroup/memory.max; do
  [ -r $f ] && echo "$f: $(cat $f)"; done
command -v numactl >/dev/null && numactl -H
echo "== gpu"
nvidia-smi topo -m
nvidia-smi -q -d PERFORMANCE,POWER,CLOCK,TEMPERATURE | grep -vE "^\s*$" | head -90
echo "== python files"
for m in torch transformers specforge accelerate; do
  $PY -c "import importlib.util as u, os, sys; s = u.find_spec('$m'); d = os.path.dirname(s.origin); \
p = os.path.join(d, '__pycache__'); print('$m', d, 'writable' if os.access(d, os.W_OK) else 'read-only', \
'pycache', len(os.listdir(p)) if os.path.isdir(p) else 'none', 'PYTHONDONTWRITEBYTECODE', os.environ.get('PYTHONDONTWRITEBYTECODE'), 'prefix', sys.pycache_prefix)" 2>&1 | grep -v Warn
done
df -h /tmp /usr 2>/dev/null; mount | grep -E " / | /tmp | /usr" | head
echo "== imports of specforge train (-X importtime; the 15 slowest top-level imports)"
MODS="import specforge.cli, accelerate.utils, specforge.distributed, specforge.application, transformers.models.qwen3.modeling_qwen3, torch._dynamo, torch._inductor.compile_fx"
for i in 1 2; do
  s=$(date +%s.%N)
  PYTHONSAFEPATH=1 $PY -X importtime -c "$MODS" 2>/tmp/importtime.$i >/dev/null
  echo "pass $i: $(python3 -c "print(round($(date +%s.%N) - $s, 2))") s"
done
python3 - <<'PY'
rows = []
for line in open("/tmp/importtime.2"):
    if not line.startswith("import time:") or "cumulative" in line:
        continue
    _, self_us, cum_us, name = [x.strip() for x in line[len("import time:"):].split("|")]
    if not name.startswith("  "):  # first level below the -c statement
        rows.append((int(cum_us), name.strip()))
for cum, name in sorted(rows, reverse=True)[:15]:
    print(f"{cum / 1e6:8.2f} s  {name}")
PY
