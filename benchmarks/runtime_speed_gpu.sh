#!/usr/bin/env bash
# The GPU checks of issue 28 in one call, on a machine with an NVIDIA GPU:
#
#   bash benchmarks/runtime_speed_gpu.sh [OUT_DIR]      # default: $OUT, else ./gpu-check
#
# 1. benchmarks/runtime_speed.py --device cuda: runtime/plain at one process, the
#    defaults against the best fixed batch (and runtime/DDP when two GPUs are visible);
#    then the same on the CPU of that machine, for a baseline from the same run.
# 2. Both examples on the GPU for one short run each (train_cnn.py: autocast + scaler),
#    and train_mlp.py in a worker forked by torchrun's agent (CUDA starts in the worker).
# 3. The unit tests of the device code paths (tests/trainers/test_reducer.py).
# Needs a Python with a CUDA build of torch (PYTHON, default python3); bftrainer is
# installed into it from this tree without dependencies if it is not importable.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
cd "$HERE"
PY=${PYTHON:-python3}
DEST=${1:-${OUT:-$HERE/gpu-check}}
mkdir -p "$DEST"
log() { echo "gpu-check: $*" >&2; }

"$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
  || { log "no CUDA device visible to $PY (torch $("$PY" -c 'import torch; print(torch.__version__)'))"; exit 1; }
"$PY" -c 'import torch; print("torch", torch.__version__, "on", torch.cuda.get_device_name(0), "x", torch.cuda.device_count())' | tee "$DEST/device.txt"
if ! "$PY" -c 'import bftrainer.trainers.runtime' 2>/dev/null; then
  log "installing bftrainer from $HERE (no dependencies)"
  "$PY" -m pip install --quiet --no-deps --no-build-isolation -e "$HERE"
fi

log "1/3 runtime_speed on the GPU, then on the CPU"
"$PY" benchmarks/runtime_speed.py --device cuda --json "$DEST/runtime_speed_cuda.json" 2>&1 \
  | grep -v '^{"batch_sizes"' | tee "$DEST/runtime_speed_cuda.txt"
"$PY" benchmarks/runtime_speed.py --device cpu --only plain --json "$DEST/runtime_speed_cpu.json" 2>&1 \
  | grep -v '^{"batch_sizes"' | tee "$DEST/runtime_speed_cpu.txt"

log "2/3 the examples on the GPU"
"$PY" examples/train_mlp.py --device cuda --work-epochs 2 --trainer-dir "$DEST/mlp" \
  > "$DEST/train_mlp.txt" 2>&1 && tail -1 "$DEST/train_mlp.txt"
"$PY" examples/train_cnn.py --device cuda --work-epochs 2 --trainer-dir "$DEST/cnn" \
  > "$DEST/train_cnn.txt" 2>&1 && tail -1 "$DEST/train_cnn.txt"

log "2/3 a worker forked by torchrun's agent on the GPU (the agent imports torch, never CUDA)"
WORKER_FILE=$("$PY" -c 'from bftrainer.trainers.launch.supervisor import WORKER_FILE; print(WORKER_FILE)')
BFTRAINER_TRAINER_DIR="$DEST/forked" "$PY" -m bftrainer.trainers.launch.torchrun_agent \
  --standalone --nnodes=1 --nproc-per-node=1 --run-path --start-method=fork "$WORKER_FILE" \
  examples/train_mlp.py --device cuda --work-epochs 2 --trainer-dir "$DEST/forked" \
  > "$DEST/train_mlp_forked.txt" 2>&1 && tail -1 "$DEST/train_mlp_forked.txt"

log "3/3 the device tests"
"$PY" -m pytest -q -p no:cacheprovider tests/trainers/test_reducer.py 2>&1 | tail -3 | tee "$DEST/tests.txt"
log "done: $DEST"
