#!/usr/bin/env bash
# The H200 measurements behind results/h200* for a GPU machine that has torch/transformers
# but no package registry (liger-kernel comes as a wheel in .whl/).
#
#   bash scripts/h200_sweeps.sh SECONDS [STAGE ...]     (default stages: h200 noise)
#
# Stages, in the order given, each run (or resumed) in /tmp/w until SECONDS are used up:
#   h200      `make bench-h200` (configs/h200.yaml)
#   noise     configs/h200-noise.yaml (A/A and poller cost; shares h200's caches)
#   capacity  `python -m bench capacity configs/h200-capacity.yaml` (shares h200's caches)
#   capseq    `python -m bench capacity configs/h200-capacity-seq.yaml` (sequence axis)
#   arms      configs/h200-arms.yaml (baseline, rmsnorm, swiglu, liger; shares h200's caches)
#   options   configs/h200-options.yaml (baseline, liger, liger_compile, liger_flce, sdpa, adamw_foreach)
#   kernels   `python -m bench kernels configs/h200.yaml --profile` (both cells; Δ from h200)
#   compile   configs/h200-compile.yaml (baseline, liger, liger_compile; 5 pairs)
#   cparity   configs/h200-compile-parity.yaml (+ compile without Liger; 3 pairs; loss parity)
#   optkernels  the same for configs/h200-options.yaml (the 4B cell, the LM head + CE site; Δ from
#             h200-options, whose report is rebuilt first)
#   scaling   configs/h200x2-scaling.yaml (1 and 2 GPUs: the nvidia-h200-x2 machine)
#   twonode   configs/h200x2-2node.yaml (two 1-GPU "nodes" on localhost: the x2 machine)
#   x8        configs/h200x8.yaml (1, 2, 4, 8 GPUs: an 8-GPU machine)
#   specforge configs/h200-specforge.yaml: our trainer and the real SpecForge CLI (PyPI 0.2.0,
#             its wheels in .whl/sf/, installed into their own folder: the "user's environment")
#   sffork    configs/h200-specforge-fork.yaml: the SpecForge cell forked from a warm server of its
#             interpreter (trainer_python_fork): the fork-vs-fresh A/B against specforge's cell
#   sfab      `python -m bench ab --trainer specforge-cli -c <the prepared 4B run.yaml> --steps 8`:
#             the one-command A/B (README defaults: baseline vs liger, the precision rule)
#   sffaults  scripts/sf_faults.sh: the driver SIGKILLed mid-step (nothing left on the card,
#             --resume), an OOM cell (configs/h200-specforge-faults.yaml), foreign_processes: refuse
#             beside a 20 GiB hog -> $OUT/sf-faults.log
#   sffacts   the host and the SpecForge environment: CPUs, cgroup limits, GPU topology and
#             performance state (read only), bytecode caches, import times -> $OUT/sf-facts.log
#   sfdiag    configs/h200-specforge-diag.yaml: fresh SpecForge runs with the probe (steps 14-15:
#             torch.profiler, threads, compile counters, allocator) and py-spy (steps 3-10)
#   sfdiagfork configs/h200-specforge-diag-fork.yaml: the same forked from the warm server
#   sfverdict configs/h200-specforge-verdict.yaml: the SpecForge CLI's Liger verdict (fresh runs,
#             18 steps, 3 warm-up, the shared bytecode cache; ±0.5 target, 5-pair pilot)
#   sfgcfreeze configs/h200-specforge-verdict-gcfreeze.yaml: the same with gc.freeze() after step 1
#   sfverdictlearn configs/h200-specforge-verdict-learn.yaml: the verdict on learnable data (14 steps)
#   sfquiet   configs/h200-specforge-verdict-quiet.yaml: the learnable verdict with the poller at 0.5 s
#             (run with SMI=0 so that nothing else reads the card)
#   sflockstep configs/h200-specforge-verdict-lockstep.yaml: the learnable verdict with each pair's
#             runs on the card at once, taking turns one optimizer step each (pairing: lockstep)
#   sflockgc  configs/h200-specforge-verdict-lockstep-gcfreeze.yaml: the same with gc.freeze() after
#             step 1 and a fixed 5 pairs (is the Liger runs' one-step pause a full collection?)
#   sfprecise configs/h200-specforge-verdict-precise.yaml: lockstep, the heap frozen, the precision
#             rule asked for ±0.5 points (pilot 5, cap 10; about 9 minutes with cold caches)
#   sfprimed  configs/h200-specforge-verdict-primed.yaml: the same with one priming pair per cell
#             (prime_runs: 1) on a freshly started machine; each step's CPU time per thread
#   sfthreads configs/h200-specforge-threads.yaml (one lockstep pair) watched by
#             scripts/thread_census.py: what SpecForge's unnamed threads do in the kernel
#             -> $OUT/thread_census.json
#   sfuserarm configs/h200-specforge-userarm.yaml: a user arm on the real CLI (FlexAttention vs SDPA,
#             SpecForge's own key), lockstep, 3 pairs
#   sfabarm   `python -m bench ab --trainer specforge-cli -c <the prepared 4B run.yaml> --arm
#             torchsdpa:training.attention_backend=sdpa`: the same from the command line
#   sfmemlock configs/h200-specforge-memory-lockstep.yaml: lockstep pairs with each run's own peak
#             VRAM (per-process poll) and energy over its own turns (3 pairs)
#   sfmemseq  configs/h200-specforge-memory-sequential.yaml: the same cell in sequential pairs, the
#             memory figures' reference (3 pairs; run it in the same call as sfmemlock)
#   sfablock  `python -m bench ab --trainer specforge-cli -c <the prepared 4B run.yaml> --python ...
#             --steps 8` in lockstep pairs, the heap frozen, 3 warm-up steps (the prepared learnable
#             inputs hold 64 samples: 8 steps of 8)
#   sfabseq   the same in sequential pairs (the default: --set-sweep pairing=sequential --set-sweep
#             trainer_gc_freeze=false --warmup-steps 1), at most 4 pairs: the side-by-side
#   sfinputs  the 4B cell's SpecForge inputs with 128 random samples (13 steps of 8) in $W/ab-inputs
#             (python -m bench.trainers.specforge_cli.inputs; configs/train/qwen3.5-4b-offline.yaml)
#   sfabdef   `python -m bench ab --trainer specforge-cli -c $W/ab-inputs/run.yaml --python ...`, the
#             README's command with no other flag (the default pairing: lockstep); sfabdef2 the same
#             again into a second directory (caches warm)
#   sfabseq13 the same with --pairing sequential --pairs 5: the side-by-side of the two pairings
#             (run between sfabdef and sfabdef2: lockstep, sequential, lockstep)
#   sfpr      `bench ab ... --arm pr:python=/tmp/sfenv-pr/python --pairs 3`: SpecForge from PyPI against a git
#             checkout of it with a one-line change (sfcheckout), in lockstep pairs
#   sfliger06 `bench ab ... --baseline-arm liger --arm liger064:path=/tmp/liger06,differs=liger-kernel --pairs 3`:
#             liger-kernel 0.6.4 (.whl/liger06/, installed with --target) against 0.8.5, both with Liger on
#   ligerours configs/h200-liger-versions.yaml: liger-kernel 0.6.5 (.whl/liger065/) against 0.8.5 under our
#             own trainer (the 4B cell, sequential pairs; 0.6.4 imports transformers' HybridCache, gone in 5.x)
#   forkcheck warm starts on the GPU after the fork servers changed: our trainer's `bench ab` on the
#             tiny cell (the driver's fork server, its GPU probe), then the SpecForge CLI's on the 4B
#             inputs (run sfinputs first; the tiny cell's float32 features meet SpecForge's bfloat16
#             draft on a GPU: every run fails at step 1, forked or not) with trainer_python_fork and an
#             arm of its own interpreter (sfcheckout; sequential pairs): how each run started and
#             what it imported -> $OUT/forkcheck.txt
#   sfpause   configs/h200-specforge-pause.yaml: one pair of 60-step runs: does the Liger pause recur?
#   sfparity200 configs/h200-specforge-parity-4b-200.yaml: the same at 200 steps (about 9 min)
#   punbiased configs/h200-parity-unbiased.yaml: our trainer's 4B parity with the unbiased ulp floor,
#             lr_off and Liger in one sweep
#   pcontrol  configs/h200-parity-control.yaml: our trainer's 4B parity with the lr_off negative control
#   sfparity4b configs/h200-specforge-parity-4b.yaml: SpecForge CLI parity at the seed's shapes
#   sfblocks  scripts/sf_blocks.py: one long SpecForge run whose host conditions (the VRAM poller,
#             the main thread pinned) switch in 12-s blocks: their effect inside one process
#   hostcopy  scripts/host_copy_probe.py: 80 s of pageable, fresh, pinned host-to-GPU copies, host
#             memcpy and a GPU matmul, round after round: how much each wanders -> $OUT/host_copy.json
#   profile   cProfile of one warm 4B run (startup: where step 1's time goes) -> $OUT/profile.txt
#   parity    configs/h200-parity.yaml: training parity, 200 steps of the 4B draft on learnable data
#             (baseline, A/A, Liger; `make parity-h200`)
#   sfparity  configs/h200-specforge-parity.yaml: training parity of the real SpecForge CLI beside
#             ours, 200 steps of the tiny profile in bfloat16 on learnable data (baseline, A/A, Liger)
# STAGE:N caps that stage at N seconds (e.g. `options:300 optkernels`).
# A stage stops cleanly at the deadline (SIGINT: the run in flight is dropped and redone on
# the next call); call again to finish. Each sweep directory, without its data and compile
# caches, goes to $OUT as a tarball; .gpu/state.tgz, when carried, restores them on a fresh
# machine. Only reads GPU settings.
set -u
budget=${1:?seconds}
shift
stages=${*:-h200 noise}
start=$(date +%s)
left() { echo $((budget - ($(date +%s) - start))); }
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site
[ -f .gpu/commit ] && export BENCH_GIT_COMMIT=$(cat .gpu/commit)
W=/tmp/w
if [ ! -d $W ] && [ -f .gpu/state.tgz ]; then mkdir -p $W && tar -xzf .gpu/state.tgz -C $W && echo "restored $W from .gpu/state.tgz"; fi
DIRS="h200 h200-liger-versions h200-specforge-versions-pr h200-specforge-versions-liger h200-specforge-ab-default h200-specforge-ab-default2 h200-specforge-ab-seq13 h200-specforge-memory-lockstep h200-specforge-memory-sequential h200-specforge-ab-lockstep h200-specforge-ab-sequential h200-specforge-userarm h200-specforge-ab-userarm h200-parity h200-specforge-parity h200-specforge h200-specforge-fork h200-specforge-ab h200-specforge-faults h200-specforge-diag h200-specforge-diag-fork h200-specforge-verdict h200-specforge-verdict-gcfreeze h200-specforge-blocks h200-specforge-verdict-learn h200-specforge-verdict-quiet h200-specforge-verdict-lockstep h200-specforge-verdict-lockstep-gcfreeze h200-specforge-verdict-precise h200-specforge-verdict-primed h200-specforge-threads h200-specforge-pause h200-specforge-parity-4b h200-specforge-parity-4b-200 h200-parity-control h200-parity-unbiased h200-noise h200-capacity h200-capacity-seq h200-arms h200-options h200-compile h200-compile-parity h200-options-kernels h200-kernels h200x2-scaling h200x2-2node h200x8"
for d in $DIRS; do mkdir -p $W/$d; done
mkdir -p $W/h200/cache
for d in $DIRS; do [ $d = h200 ] || [ -e $W/$d/cache ] || ln -s $W/h200/cache $W/$d/cache; done
nvidia-smi --query-gpu=index,name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,persistence_mode --format=csv | tee -a $OUT/gpu.csv
python3 --version | tee -a $OUT/gpu.csv
# The card's clock, power, temperature and clock-event reasons every 250 ms for the whole call
# (read only), to set beside each run's window: $OUT/smi.csv
# SMI=0: no sampler (nothing but the sweep's own poller reads the card: the sfquiet stage's A/B).
if [ "${SMI:-1}" != 0 ]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_event_reasons.active \
    --format=csv,noheader,nounits -lms 250 >$OUT/smi.csv 2>/dev/null &
  SMI_PID=$!
fi
cap=0  # the current stage's own cap in seconds (STAGE:N), 0 = none
run_stage() {  # name command...
  local name=$1 t; shift; t=$(left)
  if [ "$cap" -gt 0 ] && [ "$cap" -lt "$t" ]; then t=$cap; fi
  if [ "$t" -lt 60 ]; then echo "skip $name: ${t}s left"; return 0; fi
  echo "=== $name: up to ${t}s"
  ( time timeout -s INT "$t" "$@" ) 2>&1 | tee -a $OUT/$name.log
}
profile() {  # one warm 4B baseline run under cProfile, the sweep's caches
  local cdir; cdir=$(ls -d $W/h200/cache/compile/*/ | head -1)
  TORCHINDUCTOR_CACHE_DIR=${cdir}inductor TRITON_CACHE_DIR=${cdir}triton \
    python3 -m cProfile -o /tmp/prof.out -m specforge train configs/train/qwen3.5-4b-offline.yaml \
    --set training.steps=3 --set training.batch_size=2 --set data.seq_len=2048 \
    --set training.num_anchors=512 --set training.accumulation_steps=4 \
    --set data.cache_dir=$(ls -d $W/h200/cache/qwen3.5-4b-dflash_s2048_* | head -1) \
    --set model.use_liger_kernel=false --output-dir /tmp/prof --force
  python3 -c "import pstats; p = pstats.Stats('/tmp/prof.out'); p.sort_stats('cumulative').print_stats(70); p.sort_stats('tottime').print_stats(30)" > $OUT/profile.txt
  cat /tmp/prof/run.json | python3 -c "import json,sys; print(json.dumps(json.load(sys.stdin).get('startup'), indent=1))"
}
sfenv() {  # the user's SpecForge environment: upstream's wheels in a folder of their own, python3's torch
  [ -x /tmp/sfenv/python ] && return 0
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/sfsite .whl/sf/*.whl || return 1
  mkdir -p /tmp/sfenv
  printf '#!/bin/sh\nPYTHONPATH=/tmp/sfsite${PYTHONPATH:+:$PYTHONPATH} exec python3 "$@"\n' >/tmp/sfenv/python
  chmod +x /tmp/sfenv/python
}
sfcheckout() {  # SpecForge 0.2.0 as a git checkout with a one-line change, and an interpreter that imports it
  [ -x /tmp/sfenv-pr/python ] && return 0
  mkdir -p /tmp/sfcheckout && cp -r /tmp/sfsite/specforge /tmp/sfcheckout/ && find /tmp/sfcheckout -name __pycache__ -prune -exec rm -rf {} + \
    && git -C /tmp/sfcheckout init -q && git -C /tmp/sfcheckout add -A \
    && git -C /tmp/sfcheckout -c user.name=bench -c user.email=bench@localhost commit -qm "specforge 0.2.0 from PyPI" \
    && sed -i 's/^__all__ = \["TrainerCore"/# a contributor'"'"'s one-line change\n__all__ = ["TrainerCore"/' /tmp/sfcheckout/specforge/training/controller.py \
    && git -C /tmp/sfcheckout diff --stat | tee -a $OUT/sf-checkout.log || return 1
  mkdir -p /tmp/sfenv-pr
  printf '#!/bin/sh\nPYTHONPATH=/tmp/sfcheckout:/tmp/sfsite${PYTHONPATH:+:$PYTHONPATH} exec python3 "$@"\n' >/tmp/sfenv-pr/python
  chmod +x /tmp/sfenv-pr/python
}
export W OUT
export -f profile
for spec in $stages; do
  stage=${spec%%:*}; cap=0; [ "$stage" != "$spec" ] && cap=${spec#*:}
  case $stage in
    h200) run_stage h200 make bench-h200 INSTALL= PYTHON=python3 OUT=$W/h200 ;;
    noise) run_stage h200-noise python3 -m bench sweep configs/h200-noise.yaml --out $W/h200-noise --resume ;;
    capacity) run_stage h200-capacity python3 -m bench capacity configs/h200-capacity.yaml --out $W/h200-capacity --resume ;;
    capseq) run_stage h200-capacity-seq python3 -m bench capacity configs/h200-capacity-seq.yaml --out $W/h200-capacity-seq --resume ;;
    arms) run_stage h200-arms python3 -m bench sweep configs/h200-arms.yaml --out $W/h200-arms --resume ;;
    options) run_stage h200-options python3 -m bench sweep configs/h200-options.yaml --out $W/h200-options --resume ;;
    kernels) run_stage h200-kernels python3 -m bench kernels configs/h200.yaml --profile --reps 30 --out $W/h200-kernels --sweep-dir $W/h200 ;;
    compile) run_stage h200-compile python3 -m bench sweep configs/h200-compile.yaml --out $W/h200-compile --resume ;;
    cparity) run_stage h200-compile-parity python3 -m bench sweep configs/h200-compile-parity.yaml --out $W/h200-compile-parity --resume ;;
    optkernels) [ -d $W/h200-options/runs ] && python3 -m bench report $W/h200-options >/dev/null  # its summary.csv, also when the sweep stopped at a deadline
      run_stage h200-options-kernels python3 -m bench kernels configs/h200-options.yaml --profile --reps 30 --out $W/h200-options-kernels --sweep-dir $W/h200-options ;;
    twonode) run_stage h200x2-2node python3 -m bench sweep configs/h200x2-2node.yaml --out $W/h200x2-2node --resume ;;
    scaling) run_stage h200x2-scaling python3 -m bench sweep configs/h200x2-scaling.yaml --out $W/h200x2-scaling --resume ;;
    x8) run_stage h200x8 python3 -m bench sweep configs/h200x8.yaml --out $W/h200x8 --resume ;;
    specforge) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python run_stage h200-specforge python3 -m bench sweep configs/h200-specforge.yaml --out $W/h200-specforge --resume ;;
    sffork) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python run_stage h200-specforge-fork python3 -m bench sweep configs/h200-specforge-fork.yaml --out $W/h200-specforge-fork --resume ;;
    sfab) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python run_stage h200-specforge-ab python3 -m bench ab --trainer specforge-cli \
        -c "$(find $W/h200/cache -maxdepth 2 -name run.yaml | head -1)" --steps 8 --pairs 2 \
        training.num_anchors=512 training.accumulation_steps=4 --out $W/h200-specforge-ab --resume ;;
    sffacts) sfenv && run_stage sf-facts bash scripts/sf_facts.sh ;;
    sfdiag) sfenv && BENCH_SPECFORGE_PROBE=13:2 BENCH_PYSPY=/tmp/site/bin/py-spy:2:8 SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-diag python3 -m bench sweep configs/h200-specforge-diag.yaml --out $W/h200-specforge-diag --resume ;;
    sfdiagfork) sfenv && BENCH_SPECFORGE_PROBE=13:2 SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-diag-fork python3 -m bench sweep configs/h200-specforge-diag-fork.yaml --out $W/h200-specforge-diag-fork --resume ;;
    sfverdict) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-verdict python3 -m bench sweep configs/h200-specforge-verdict.yaml --out $W/h200-specforge-verdict --resume ;;
    sfgcfreeze) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-verdict-gcfreeze python3 -m bench sweep configs/h200-specforge-verdict-gcfreeze.yaml --out $W/h200-specforge-verdict-gcfreeze --resume ;;
    sfverdictlearn) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-verdict-learn python3 -m bench sweep configs/h200-specforge-verdict-learn.yaml --out $W/h200-specforge-verdict-learn --resume ;;
    sfquiet) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-verdict-quiet python3 -m bench sweep configs/h200-specforge-verdict-quiet.yaml --out $W/h200-specforge-verdict-quiet --resume ;;
    sflockstep) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-verdict-lockstep python3 -m bench sweep configs/h200-specforge-verdict-lockstep.yaml --out $W/h200-specforge-verdict-lockstep --resume ;;
    sflockgc) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-verdict-lockstep-gcfreeze python3 -m bench sweep configs/h200-specforge-verdict-lockstep-gcfreeze.yaml --out $W/h200-specforge-verdict-lockstep-gcfreeze --resume ;;
    sfprecise) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-verdict-precise python3 -m bench sweep configs/h200-specforge-verdict-precise.yaml --out $W/h200-specforge-verdict-precise --resume ;;
    sfprimed) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-verdict-primed python3 -m bench sweep configs/h200-specforge-verdict-primed.yaml --out $W/h200-specforge-verdict-primed --resume ;;
    sfthreads) sfenv && { python3 scripts/thread_census.py $OUT/thread_census.json --seconds "$(left)" >$OUT/thread_census.log 2>&1 & }
        census=$!
        SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-threads python3 -m bench sweep configs/h200-specforge-threads.yaml --out $W/h200-specforge-threads --resume
        wait $census ;;
    sfuserarm) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-userarm python3 -m bench sweep configs/h200-specforge-userarm.yaml --out $W/h200-specforge-userarm --resume ;;
    sfabarm) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python run_stage h200-specforge-ab-userarm python3 -m bench ab --trainer specforge-cli \
        -c "$(find $W/h200/cache -maxdepth 2 -name run.yaml | head -1)" --steps 8 --pairs 2 \
        --arm torchsdpa:training.attention_backend=sdpa \
        training.num_anchors=512 training.accumulation_steps=4 --out $W/h200-specforge-ab-userarm --resume ;;
    sfmemlock) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-memory-lockstep python3 -m bench sweep configs/h200-specforge-memory-lockstep.yaml --out $W/h200-specforge-memory-lockstep --resume ;;
    sfmemseq) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-memory-sequential python3 -m bench sweep configs/h200-specforge-memory-sequential.yaml --out $W/h200-specforge-memory-sequential --resume ;;
    sfablock) sfenv && run_stage h200-specforge-ab-lockstep python3 -m bench ab --trainer specforge-cli \
        -c "$(find $W/h200/cache -maxdepth 2 -name run.yaml | head -1)" --python /tmp/sfenv/python --steps 8 training.accumulation_steps=4 training.num_anchors=512 \
        --set-sweep pairing=lockstep --set-sweep trainer_gc_freeze=true --warmup-steps 3 \
        --out $W/h200-specforge-ab-lockstep --resume ;;
    sfabseq) sfenv && run_stage h200-specforge-ab-sequential python3 -m bench ab --trainer specforge-cli \
        -c "$(find $W/h200/cache -maxdepth 2 -name run.yaml | head -1)" --python /tmp/sfenv/python --steps 8 training.accumulation_steps=4 training.num_anchors=512 \
        --set-sweep pairing=sequential --set-sweep trainer_gc_freeze=false --warmup-steps 1 --max-pairs 4 \
        --out $W/h200-specforge-ab-sequential --resume ;;
    sfinputs) [ -f $W/ab-inputs/meta.json ] || { sed 's/num_samples: 64/num_samples: 128/' configs/train/qwen3.5-4b-offline.yaml >/tmp/ab128.yaml \
        && run_stage sf-inputs python3 -m bench.trainers.specforge_cli.inputs /tmp/ab128.yaml --seq-len 2048 --output-dir $W/ab-inputs; } ;;
    sfabdef|sfabdef2) sfenv && d=h200-specforge-ab-default; [ $stage = sfabdef2 ] && d=${d}2
        run_stage $d python3 -m bench ab --trainer specforge-cli -c $W/ab-inputs/run.yaml --python /tmp/sfenv/python --out $W/$d --resume ;;
    sfabseq13) sfenv && run_stage h200-specforge-ab-seq13 python3 -m bench ab --trainer specforge-cli -c $W/ab-inputs/run.yaml \
        --python /tmp/sfenv/python --pairing sequential --pairs 5 --out $W/h200-specforge-ab-seq13 --resume ;;
    forkcheck) sfenv && sfcheckout \
        && run_stage forkcheck-ours python3 -m bench ab -c configs/train/tiny-offline.yaml --seq-len 128 --steps 20 \
          --pairs 2 --out $W/forkcheck-ours \
        && run_stage forkcheck-sf python3 -m bench ab --trainer specforge-cli -c $W/ab-inputs/run.yaml \
          --python /tmp/sfenv/python --arm pr:python=/tmp/sfenv-pr/python --pairing sequential \
          --set-sweep trainer_python_fork=true --steps 8 --pairs 2 --out $W/forkcheck-sf
      python3 scripts/forkcheck.py $W/forkcheck-ours $W/forkcheck-sf | tee $OUT/forkcheck.txt ;;
    sfpr) sfenv && sfcheckout && run_stage h200-specforge-versions-pr python3 -m bench ab --trainer specforge-cli \
        -c $W/ab-inputs/run.yaml --python /tmp/sfenv/python --arm pr:python=/tmp/sfenv-pr/python --pairs 3 \
        --out $W/h200-specforge-versions-pr --resume ;;
    sfliger06) sfenv && { [ -d /tmp/liger06 ] || python3 -m pip install -q --no-index --no-deps --no-compile \
        --target /tmp/liger06 .whl/liger06/*.whl; } && run_stage h200-specforge-versions-liger python3 -m bench ab \
        --trainer specforge-cli -c $W/ab-inputs/run.yaml --python /tmp/sfenv/python --baseline-arm liger \
        --arm liger064:path=/tmp/liger06,differs=liger-kernel --pairs 3 --out $W/h200-specforge-versions-liger --resume ;;
    ligerours) { [ -d /tmp/liger065 ] || python3 -m pip install -q --no-index --no-deps --no-compile \
        --target /tmp/liger065 .whl/liger065/*.whl; } && run_stage h200-liger-versions python3 -m bench sweep \
        configs/h200-liger-versions.yaml --out $W/h200-liger-versions --resume ;;
    sfpause) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-pause python3 -m bench sweep configs/h200-specforge-pause.yaml --out $W/h200-specforge-pause --resume ;;
    sfparity200) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-parity-4b-200 python3 -m bench sweep configs/h200-specforge-parity-4b-200.yaml --out $W/h200-specforge-parity-4b-200 --resume ;;
    punbiased) run_stage h200-parity-unbiased python3 -m bench sweep configs/h200-parity-unbiased.yaml --out $W/h200-parity-unbiased --resume ;;
    pcontrol) run_stage h200-parity-control python3 -m bench sweep configs/h200-parity-control.yaml --out $W/h200-parity-control --resume ;;
    sfparity4b) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-parity-4b python3 -m bench sweep configs/h200-specforge-parity-4b.yaml --out $W/h200-specforge-parity-4b --resume ;;
    sfblocks) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python \
        run_stage h200-specforge-blocks python3 scripts/sf_blocks.py configs/h200-specforge-blocks.yaml --out $W/h200-specforge-blocks ;;
    sffaults) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python run_stage sf-faults bash scripts/sf_faults.sh ;;
    hostcopy) run_stage host-copy python3 scripts/host_copy_probe.py --seconds 80 --out $OUT/host_copy.json ;;
    profile) run_stage profile bash -c profile ;;
    parity) run_stage h200-parity make parity-h200 INSTALL= PYTHON=python3 OUT=$W/h200-parity ;;
    sfparity) sfenv && SPECFORGE_PYTHON=/tmp/sfenv/python run_stage h200-specforge-parity python3 -m bench sweep configs/h200-specforge-parity.yaml --out $W/h200-specforge-parity --resume ;;
    *) echo "unknown stage $stage" ;;
  esac
done
[ -n "${SMI_PID:-}" ] && kill $SMI_PID 2>/dev/null
tar -czf $OUT/state.tgz -C $W --exclude=cache --exclude=.sweep.lock $DIRS
ls -la $OUT
