#!/usr/bin/env bash
# Trainer verification on an H200 machine (issue: DFlash trainer). Writes logs and run files
# under $OUT (default results/h200/trainer). Run from the repo root:
#   OUT=results/h200/trainer bash scripts/h200_trainer_checks.sh [numerics] [4b] [fsdp] [8b]
set -u
OUT=${OUT:-results/h200/trainer}
STEPS=${STEPS:-60}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
parts=${*:-numerics 4b fsdp 8b}
PY=${PYTHON:-python3}
CACHE=${CACHE:-/tmp/dflash-cache/qwen3.5-4b-s2048}
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$OUT/commands.log"; }

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$OUT/gpus.csv" 2>&1
$PY -c "import torch, triton, transformers, liger_kernel; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)" | tee "$OUT/versions.txt"

train() {  # name, gpus, extra args...
  local name=$1 gpus=$2; shift 2
  rm -rf "$OUT/$name"
  if [ "$gpus" -gt 1 ]; then
    log "torchrun --nproc-per-node $gpus -m specforge train $*  --output-dir $OUT/$name"
    timeout 400 $PY -m torch.distributed.run --nproc-per-node "$gpus" -m specforge train "$@" --output-dir "$OUT/$name" > "$OUT/$name.log" 2>&1
  else
    log "CUDA_VISIBLE_DEVICES=0 python -m specforge train $*  --output-dir $OUT/$name"
    CUDA_VISIBLE_DEVICES=0 timeout 400 $PY -m specforge train "$@" --output-dir "$OUT/$name" > "$OUT/$name.log" 2>&1
  fi
  log "  exit $? ; $(grep -E '^step|setup' "$OUT/$name.log" | tail -1)"
}

for part in $parts; do
  case $part in
    numerics)
      log "python -m specforge.numerics --out $OUT/numerics.json"
      CUDA_VISIBLE_DEVICES=0 timeout 300 $PY -m specforge.numerics --out "$OUT/numerics.json" > "$OUT/numerics.log" 2>&1
      log "  exit $?"; tail -5 "$OUT/numerics.log" ;;
    4b)
      if [ ! -f "$CACHE/meta.json" ]; then
        log "python -m specforge prepare configs/train/qwen3.5-4b-offline.yaml --output-dir $CACHE"
        CUDA_VISIBLE_DEVICES=0 $PY -m specforge prepare configs/train/qwen3.5-4b-offline.yaml --output-dir "$CACHE" > "$OUT/prepare-4b.log" 2>&1
        log "  exit $? ; $(tail -1 "$OUT/prepare-4b.log")"
      fi
      train 4b-offline-baseline 1 configs/train/qwen3.5-4b-offline.yaml --set data.cache_dir=$CACHE --set training.steps=$STEPS
      train 4b-offline-liger 1 configs/train/qwen3.5-4b-offline.yaml --set data.cache_dir=$CACHE --set training.steps=$STEPS --use-liger-kernel ;;
    fsdp)
      train 4b-offline-fsdp2-baseline 2 configs/train/qwen3.5-4b-offline.yaml --set data.cache_dir=$CACHE --set training.steps=30
      train 4b-offline-fsdp2-liger 2 configs/train/qwen3.5-4b-offline.yaml --set data.cache_dir=$CACHE --set training.steps=30 --use-liger-kernel ;;
    8b)
      train 8b-online-baseline 1 configs/train/qwen3-8b-online.yaml --set training.steps=$STEPS
      train 8b-online-liger 1 configs/train/qwen3-8b-online.yaml --set training.steps=$STEPS --use-liger-kernel ;;
  esac
done
$PY scripts/summarize_runs.py "$OUT" | tee "$OUT/summary.md"
