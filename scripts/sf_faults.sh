#!/usr/bin/env bash
# The SpecForge CLI plug's faults on a GPU (called by scripts/h200_sweeps.sh, stage sffaults;
# W, OUT and SPECFORGE_PYTHON set there). Writes $OUT/sf-faults.log.
#  1. the driver SIGKILLed while a SpecForge run is mid-step: no process of that run may be left
#     holding memory on the card (SpecForge's workers included); --resume redoes the run;
#  2. a cell whose batch does not fit: recorded oom, the sweep goes on (the same sweep);
#  3. foreign_processes: refuse with another process holding 20 GiB on the card.
set -u
D=$W/h200-specforge-faults
say() { echo "sf-faults: $*"; }
apps() { nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; }
python3 -m bench sweep configs/h200-specforge-faults.yaml --out $D --resume > $D.driver.log 2>&1 &
driver=$!
for _ in $(seq 600); do  # until a run of the first cell has logged 3 steps
  m=$(ls $D/runs/*_bs2_*/metrics.jsonl 2>/dev/null | head -1)
  [ -n "$m" ] && [ "$(wc -l < "$m")" -ge 3 ] && break
  sleep 0.5
done
run=$(basename "$(dirname "$m")")
pgid=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['pgid'])" $D/runs/$run/launch.json)
say "SIGKILL the driver (pid $driver) while $run is at step $(wc -l < "$m"); its process group $pgid"
kill -9 $driver
sleep 15
say "processes of the run's group after 15 s: $(ps -o pid=,comm= -g $pgid | tr '\n' ' ')"
say "compute apps on the card: $(apps | tr '\n' ' ')"
left=$(ps -o pid= -g $pgid | wc -l)
[ "$left" -eq 0 ] && say "PASS: nothing of $run is left" || say "FAIL: $left process(es) of $run left"
say "--resume"
python3 -m bench sweep configs/h200-specforge-faults.yaml --out $D --resume 2>&1 | grep -v '^\s*$' | tail -25
python3 -c "
import json, pathlib
for p in sorted(pathlib.Path('$D/runs').glob('*/run.json')):
    d = json.loads(p.read_text()); print('sf-faults:', p.parent.name, d['status'], d.get('reason'))
"
say "a 20 GiB hog on the card, then foreign_processes: refuse"
python3 -c "
import time, torch
x = torch.empty(20 * 2**30, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()
print('hog holds 20 GiB', flush=True); time.sleep(600)" &
hog=$!
sleep 20
say "compute apps: $(apps | tr '\n' ' ')"
run_yaml=$(find $W/h200/cache -maxdepth 2 -name run.yaml | head -1)
python3 -m bench ab --trainer specforge-cli -c $run_yaml --pairs 1 --steps 8 --out $W/sf-refuse --force \
  --set-sweep foreign_processes=refuse 2>&1 | grep -v '^\s*$' | tail -12
kill $hog
