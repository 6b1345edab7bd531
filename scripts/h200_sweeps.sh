#!/usr/bin/env bash
# The H200 measurements behind results/h200 and results/h200-noise, for a GPU machine that has
# torch/transformers but no package registry (liger-kernel comes as a wheel in .whl/).
#
#   bash scripts/h200_sweeps.sh SECONDS
#
# Runs (or resumes) `make bench-h200` (configs/h200.yaml), then configs/h200-noise.yaml (A/A
# and poller cost), in /tmp/w, stopping cleanly (SIGINT: the run in flight is dropped and
# redone on the next call) when SECONDS are used up. Call it again to finish. Each sweep
# directory, without its data and compile caches, goes to $OUT as a tarball; .gpu/state.tgz,
# when carried, restores them on a fresh machine. The noise sweep shares the first sweep's
# caches (same offline data, same compiled kernels). Only reads GPU settings.
set -u
budget=${1:?seconds}
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
[ -f .gpu/commit ] && export BENCH_GIT_COMMIT=$(cat .gpu/commit)
W=/tmp/w
if [ ! -d $W ] && [ -f .gpu/state.tgz ]; then mkdir -p $W && tar -xzf .gpu/state.tgz -C $W && echo "restored $W from .gpu/state.tgz"; fi
mkdir -p $W/h200-noise
[ -e $W/h200-noise/cache ] || ln -s $W/h200/cache $W/h200-noise/cache
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,persistence_mode --format=csv | tee -a $OUT/gpu.csv
sweep() {  # name config
  local t; t=$(left)
  if [ "$t" -lt 60 ]; then echo "skip $1: ${t}s left"; return 0; fi
  echo "=== $1: up to ${t}s"
  ( time timeout -s INT "$t" make bench-$1 INSTALL= PYTHON=python3 OUT=$W/$1 ) 2>&1 | tee -a $OUT/$1.log
}
sweep h200
# the noise sweep has no make target of its own: call the CLI the same way
t=$(left)
if [ "$t" -ge 60 ]; then
  echo "=== h200-noise: up to ${t}s"
  ( time timeout -s INT "$t" python3 -m bench sweep configs/h200-noise.yaml --out $W/h200-noise --resume ) 2>&1 | tee -a $OUT/h200-noise.log
fi
tar -czf $OUT/state.tgz -C $W --exclude=cache --exclude=.sweep.lock h200 h200-noise
ls -la $OUT
