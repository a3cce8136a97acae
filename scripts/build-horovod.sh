#!/usr/bin/env bash
# Build Horovod 0.28.1 (PyTorch + Gloo, no MPI) against torch 2.13 once, cache the wheel
# outside the work tree, and install it into a Python environment.
#
#   scripts/build-horovod.sh [PYTHON]      # default: .venv/bin/python
#
# Horovod 0.28.1 (its last release) does not build against torch 2.13 as published: it
# hard-codes C++14 and torch needs C++17 (../shared/notes/elastic-backends.md). We patch
# CMAKE_CXX_STANDARD to 17 in the two CMakeLists.txt files of the sdist and build without
# build isolation, so it compiles against the torch already installed. The first build
# takes 3-7 min on 2 cores (2.5 min measured here); later runs install the cached wheel in seconds.
#
# Where torch is a CUDA build, nvcc runs and NCCL's header is found (NCCL_HOME, the CUDA
# tree, /usr, or the nvidia-nccl wheel that CUDA torch brings), Horovod is built with
# its GPU operations on NCCL (HOROVOD_GPU_OPERATIONS=NCCL): GPU gradients are then
# reduced on the GPU. NCCL is linked as a shared library (HOROVOD_NCCL_LINK=SHARED): the
# nvidia-nccl wheel has no static one, and the process then shares the libnccl.so.2 that
# torch loaded. If that build fails, the CPU build follows, after a one-line warning
# that names the cause. Otherwise it is built for the CPU (Gloo). The script says which.
#
# Settings (environment): BFTRAINER_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/bftrainer),
# HOROVOD_VERSION (0.28.1). The cache key includes the Python and torch versions, so a
# wheel built for another torch is never installed.
# Exit codes: 0 installed and `horovodrun --check-build` shows PyTorch and Gloo; 1 failure.
set -euo pipefail

HERE=$(cd "$(dirname "$0")/.." && pwd)
PY=${1:-$HERE/.venv/bin/python}
VERSION=${HOROVOD_VERSION:-0.28.1}
CACHE=${BFTRAINER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/bftrainer}

log() { echo "build-horovod: $*" >&2; }

[ -x "$PY" ] || { log "no Python at $PY (run 'make venv' first)"; exit 1; }
TORCH=$("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null) \
  || { log "torch is not installed in $PY (pip install torch==2.13.0)"; exit 1; }
PYTAG=$("$PY" -c 'import sys; print(f"cp{sys.version_info[0]}{sys.version_info[1]}")')

# NCCL's home (the folder holding include/nccl.h), or nothing.
nccl_home() {
  local d
  for d in ${NCCL_HOME:-} ${CUDA_HOME:-/usr/local/cuda} /usr \
    "$("$PY" -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__))' 2>/dev/null)"; do
    [ -n "$d" ] && [ -f "$d/include/nccl.h" ] && { echo "$d"; return 0; }
  done
  return 1
}
FLAVOUR=cpu
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.version.cuda else 1)' 2>/dev/null \
  && command -v nvcc >/dev/null && NCCL=$(nccl_home); then
  FLAVOUR=nccl
fi
KEY="horovod-$VERSION-$PYTAG-torch$TORCH"
[ "$FLAVOUR" = nccl ] && KEY="$KEY-nccl"
WHEELS="$CACHE/wheels/$KEY"
BIN=$(dirname "$PY")

check_build() {
  local out
  out=$("$BIN/horovodrun" --check-build 2>&1) || return 1
  grep -q '\[X\] PyTorch' <<<"$out" && grep -q '\[X\] Gloo' <<<"$out" || return 1
  [ "$FLAVOUR" != nccl ] || grep -q '\[X\] NCCL' <<<"$out"
}
WHAT="PyTorch, Gloo; CPU only (no CUDA torch, nvcc or nccl.h here)"
[ "$FLAVOUR" = nccl ] && WHAT="PyTorch, Gloo, NCCL GPU operations (NCCL from $NCCL)"

if "$PY" -c "import horovod.torch" 2>/dev/null && check_build; then
  log "Horovod $VERSION already installed in $PY ($WHAT)"
  exit 0
fi

# build_wheel FLAVOUR DEST: build Horovod's wheel into DEST (its log in $WORK/build.log).
build_wheel() {
  local flavour=$1 dest=$2 SRC="$WORK/horovod-$VERSION"
  if [ ! -d "$SRC" ]; then
    "$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==$VERSION" -d "$WORK"
    tar -xzf "$WORK"/horovod-"$VERSION".tar.gz -C "$WORK"
    for f in "$SRC/CMakeLists.txt" "$SRC/horovod/torch/CMakeLists.txt"; do
      grep -q 'CMAKE_CXX_STANDARD 14' "$f" || { log "$f: CMAKE_CXX_STANDARD 14 not found"; return 1; }
      sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/' "$f"
    done
  fi
  (
    # Debian's cmake 3.25 accepts gloo's old cmake_minimum_required; pip's cmake 4 needs this.
    export CMAKE_POLICY_VERSION_MINIMUM=3.5
    export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
      HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS="-j$(nproc)"
    if [ "$flavour" = nccl ]; then
      export HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_LINK=SHARED
      export HOROVOD_NCCL_INCLUDE="$NCCL/include" HOROVOD_NCCL_LIB="$NCCL/lib"
      if [ ! -e "$NCCL/lib/libnccl.so" ] && [ -e "$NCCL/lib/libnccl.so.2" ]; then
        # the wheel ships libnccl.so.2 only: give the linker the name it looks for
        mkdir -p "$WORK/nccl-lib" && ln -sf "$NCCL/lib/libnccl.so.2" "$WORK/nccl-lib/libnccl.so"
        export HOROVOD_NCCL_LIB="$WORK/nccl-lib"
      fi
    fi
    rm -rf "$SRC/build"
    "$PY" -m pip wheel --no-build-isolation --no-deps -w "$WORK/dist-$flavour" "$SRC"
  ) >"$WORK/build.log" 2>&1 || return 1
  mkdir -p "$dest"
  mv "$WORK"/dist-"$flavour"/horovod-*.whl "$dest"/
  log "cached $(ls "$dest")"
}

if ! ls "$WHEELS"/horovod-*.whl >/dev/null 2>&1; then
  log "building Horovod $VERSION for $PYTAG, torch $TORCH: $WHAT (3-7 min on 2 cores)"
  WORK=$(mktemp -d)
  trap 'rm -rf "$WORK"' EXIT
  "$PY" -m pip install --quiet -c "$HERE/scripts/horovod-constraints.txt" \
    wheel packaging setuptools cloudpickle psutil pyyaml cffi
  if ! build_wheel "$FLAVOUR" "$WHEELS"; then
    CAUSE=$(grep -iE 'error|fatal|not found' "$WORK/build.log" | tail -1 | cut -c1-200)
    if [ "$FLAVOUR" != nccl ]; then
      tail -30 "$WORK/build.log" >&2
      log "build failed: ${CAUSE:-see the log above}"
      exit 1
    fi
    log "warning: the NCCL (GPU) build failed (${CAUSE:-no error line in its log}); building for the CPU instead"
    FLAVOUR=cpu
    KEY="horovod-$VERSION-$PYTAG-torch$TORCH"
    WHEELS="$CACHE/wheels/$KEY"
    WHAT="PyTorch, Gloo; CPU only (the NCCL build failed)"
    if ! ls "$WHEELS"/horovod-*.whl >/dev/null 2>&1; then
      build_wheel cpu "$WHEELS" || { tail -30 "$WORK/build.log" >&2; log "the CPU build failed too"; exit 1; }
    fi
  fi
fi

"$PY" -m pip install --quiet -c "$HERE/scripts/horovod-constraints.txt" "$WHEELS"/horovod-*.whl
check_build || { log "horovodrun --check-build does not show: $WHAT"; "$BIN/horovodrun" --check-build >&2 || true; exit 1; }
log "Horovod $VERSION installed in $PY ($WHAT)"
