#!/usr/bin/env bash
# The GPU check (issues 28 and 41) in one call: the first thing to run on a GPU machine.
#
#   bash benchmarks/runtime_speed_gpu.sh [--device cuda|cpu] [OUT_DIR]   # default $OUT, ./gpu-check
#
# Fits in 10 minutes on one GPU (the Horovod build from the cache included):
# 0. the device, and Horovod from scripts/build-horovod.sh's cache (NCCL, else the CPU
#    build; never longer than HOROVOD_BUILD_S, default 240 s, if it must compile);
# 1. benchmarks/runtime_speed.py: runtime/plain at batches 64, 256 and 1024 on one
#    process, runtime/DDP on every GPU (torchrun's NCCL group), the defaults against the
#    best fixed batch; warm-up before sizing, and no checkpoint on either side of the
#    fixed-batch runs;
# 2. the runtime under torchrun and under Horovod (if it built) on every GPU, the same
#    work, samples/s of each (train_mlp.py), and both examples on one GPU;
# 3. the device tests (reducer, probe);
# then runtime_speed.json, summary.json and a one-screen summary in OUT_DIR.
#
# --device cpu is the same script at tiny sizes on the CPU (no Horovod build): the dry run
# that tests/benchmarks/test_gpu_check.py runs, so this script cannot rot unseen.
# Needs a Python with a CUDA build of torch for --device cuda (PYTHON, default python3);
# bftrainer is installed into it from this tree without dependencies if not importable.
set -euo pipefail
HERE=$(cd "$(dirname "$0")/.." && pwd)
cd "$HERE"
PY=${PYTHON:-python3}
DEV=cuda
if [ "${1:-}" = "--device" ]; then DEV=$2; shift 2; fi
case "$DEV" in cuda | cpu) ;; *) echo "gpu-check: --device must be cuda or cpu, got '$DEV'" >&2; exit 2 ;; esac
DEST=${1:-${OUT:-$HERE/gpu-check}}
mkdir -p "$DEST"
log() { echo "gpu-check: $*" >&2; }
START=$(date +%s)

if [ "$DEV" = cuda ]; then
  "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' \
    || { log "no CUDA device visible to $PY (torch $("$PY" -c 'import torch; print(torch.__version__)'))"; exit 1; }
  GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count())')
  SPEED_ARGS=(--device cuda --epochs 20)
  RUN_ARGS=(--work-epochs 2)
else
  GPUS=2 # two CPU processes stand for the GPUs
  SPEED_ARGS=(--device cpu --tiny --rounds 1 --seconds 0.2 --epochs 2)
  RUN_ARGS=(--work-samples 2048 --samples 1024)
fi
"$PY" -c "import torch; print('torch', torch.__version__, 'on', torch.cuda.get_device_name(0) if '$DEV' == 'cuda' else 'the CPU', 'x', $GPUS)" \
  | tee "$DEST/device.txt"
if ! "$PY" -c 'import bftrainer.trainers.runtime' 2>/dev/null; then
  log "installing bftrainer from $HERE (no dependencies)"
  "$PY" -m pip install --quiet --no-deps --no-build-isolation -e "$HERE"
fi

log "0/3 Horovod"
if [ "$DEV" = cuda ]; then
  timeout "${HOROVOD_BUILD_S:-240}" bash scripts/build-horovod.sh "$PY" 2>&1 | tail -3 | tee "$DEST/horovod.txt" || true
fi
HVD=0
"$PY" -c 'import horovod.torch' 2>/dev/null && HVD=1
[ "$HVD" = 1 ] || log "Horovod not importable: its runs are skipped"

log "1/3 runtime_speed on $DEV: batches 64, 256, 1024; $GPUS process(es); the defaults"
"$PY" benchmarks/runtime_speed.py "${SPEED_ARGS[@]}" --batches 64,256,1024 --procs "$GPUS" \
  --json "$DEST/runtime_speed.json" 2>&1 | grep -v '^{"batch_sizes"' | tee "$DEST/runtime_speed.txt"

log "2/3 the runtime on every device under torchrun$([ "$HVD" = 1 ] && echo ' and Horovod'); the examples"
# time_run NAME CMD...: the run's wall time and its result line, into NAME.json
time_run() {
  local name=$1 t0 t1
  shift
  t0=$(date +%s.%N)
  if "$@" >"$DEST/$name.txt" 2>&1; then
    t1=$(date +%s.%N)
    "$PY" - "$DEST/$name.txt" "$t0" "$t1" "$name" >"$DEST/$name.json" <<'EOF'
import json, re, sys
# Horovod prefixes each rank's lines with "[0]<stdout>:"
lines = [re.sub(r"^\[\d+\]<stdout>:", "", l) for l in open(sys.argv[1])]
lines = [l for l in lines if l.startswith('{"batch_sizes"')]
result = json.loads(lines[-1]) if lines else {}
wall = float(sys.argv[3]) - float(sys.argv[2])
print(json.dumps({"name": sys.argv[4], "wall_s": wall, "result": result,
                  "samples_per_s": result.get("samples", 0) / wall}))
EOF
  else
    log "$name failed: see $DEST/$name.txt"
    echo "{\"name\": \"$name\", \"failed\": true}" >"$DEST/$name.json"
  fi
}
MLP=(examples/train_mlp.py --device "$DEV" "${RUN_ARGS[@]}" --no-checkpoint)
time_run torchrun_all "$PY" -m torch.distributed.run --standalone --nproc-per-node "$GPUS" \
  "${MLP[@]}" --trainer-dir "$DEST/torchrun_all"
if [ "$HVD" = 1 ]; then
  # Elastic Horovod, as the runtime runs under it (hvd.elastic.run), on one fixed host
  printf '#!/bin/sh\necho localhost:%s\n' "$GPUS" >"$DEST/discover.sh" && chmod +x "$DEST/discover.sh"
  time_run horovod_all env BFTRAINER_BACKEND=horovod "$(dirname "$(command -v "$PY")")/horovodrun" -np "$GPUS" \
    --min-np "$GPUS" --max-np "$GPUS" --host-discovery-script "$DEST/discover.sh" \
    --network-interface lo "$PY" "${MLP[@]}" --trainer-dir "$DEST/horovod_all"
fi
time_run train_mlp "$PY" "${MLP[@]}" --trainer-dir "$DEST/mlp"
time_run train_cnn "$PY" examples/train_cnn.py --device "$DEV" "${RUN_ARGS[@]}" --trainer-dir "$DEST/cnn"

log "3/3 the device tests"
if [ "$DEV" = cuda ]; then
  "$PY" -m pytest -q -p no:cacheprovider tests/trainers/test_reducer.py tests/trainers/test_agent.py 2>&1 \
    | tail -3 | tee "$DEST/tests.txt"
else
  echo "dry run: device tests skipped" >"$DEST/tests.txt"
fi

"$PY" - "$DEST" "$(($(date +%s) - START))" "$GPUS" <<'EOF'
import json, sys
from pathlib import Path
# procs: one a GPU; on the CPU, the two processes that stand for them
dest, took, procs = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
speed = json.loads((dest / "runtime_speed.json").read_text())
runs = {p.stem: json.loads(p.read_text()) for p in sorted(dest.glob("*.json"))
        if p.stem not in ("runtime_speed", "summary")}
summary = {"device": speed["device"], "gpu": speed["gpu"], "gpus": speed["gpus"],
           "took_s": took, "runtime_speed": speed["summary"],
           "runs": {k: {"samples_per_s": v.get("samples_per_s"), "failed": v.get("failed", False)}
                    for k, v in runs.items()},
           "tests": (dest / "tests.txt").read_text().strip().splitlines()[-1:]}
(dest / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
print(f"== GPU check on {speed['gpu'] or speed['device']} x {procs}, {took} s ==")
for line in speed["summary"]:
    print(line)
for k, v in summary["runs"].items():
    print(f"{k:14s} " + ("FAILED" if v["failed"] else f"{v['samples_per_s']:,.0f} samples/s"))
print("tests:", *summary["tests"])
print(f"full figures: {dest}/runtime_speed.json, {dest}/summary.json")
EOF
