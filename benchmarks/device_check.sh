#!/usr/bin/env bash
# The GPU check, one command on a machine with an NVIDIA GPU (docs/gpu.md):
#
#   bash benchmarks/device_check.sh [--out=FILE] [--workdir=DIR]
#   bash benchmarks/device_check.sh --dry_run [--peer_python=PY]   # any machine: CPU, small
#
# 1. refuses (exit 3) when nvidia-smi lists no GPU, unless --dry_run;
# 2. makes a venv with requirements.txt and the CUDA build of the same jax version
#    (jax[cuda13] when the driver supports CUDA 13, else jax[cuda12]), and, in the background
#    meanwhile, the peers' venv (requirements-bench.txt: PyPI's torch wheels for Linux are CUDA
#    builds); --dry_run installs nothing and uses the current python (and --peer_python's);
# 3. runs benchmarks/device_check.py with them: the interpret-mode kernel tests, the GPU-only
#    tests, the tiny main job on the GPU, bench_update.py and bench_rl_step.py on a random
#    Qwen2 of Qwen2.5-0.5B's shapes, the torch update and TRL GRPOTrainer peers on the same GPU,
#    each in its own process; one JSON: step time, tokens/s, peak memory, the kernels used.
#    Default FILE: experiments/results/gpu/device_check.json (--dry_run: WORKDIR's).
set -euo pipefail
cd "$(dirname "$0")/.."
DRY=0
OUT=""
WORK=/tmp/dapo_jax_device_check
PEER=""
for arg in "$@"; do
  case "$arg" in
    --dry_run) DRY=1 ;;
    --out=*) OUT="${arg#*=}" ;;
    --workdir=*) WORK="${arg#*=}" ;;
    --peer_python=*) PEER="${arg#*=}" ;;
    -h|--help) sed -n 2,16p "$0"; exit 0 ;;
    *) echo "device_check: unknown argument $arg (see --help)" >&2; exit 2 ;;
  esac
done
mkdir -p "$WORK"

if [ "$DRY" = 0 ]; then
  if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q "^GPU "; then
    echo "device_check: no NVIDIA GPU on this machine (nvidia-smi lists none); nothing was run." >&2
    echo "  Run it on a machine with a GPU, or rehearse it on CPU with --dry_run." >&2
    exit 3
  fi
  nvidia-smi -L
  JAX_VERSION=$(sed -n 's/^jax\[cpu\]==\([0-9.]*\).*/\1/p' requirements.txt)
  CUDA_MAJOR=$(nvidia-smi | sed -n 's/.*CUDA Version: *\([0-9]*\).*/\1/p' | head -1)
  FLAVOUR=cuda12
  if [ "${CUDA_MAJOR:-0}" -ge 13 ]; then FLAVOUR=cuda13; fi
  echo "device_check: jax[$FLAVOUR]==$JAX_VERSION (driver CUDA ${CUDA_MAJOR:-?}), venvs in $WORK"
  export PIP_DISABLE_PIP_VERSION_CHECK=1
  if [ -z "$PEER" ]; then  # the peers' venv installs while the JAX steps run
    PEER="$WORK/peer_venv/bin/python"
    rm -f "$WORK/peer_venv.rc"
    ( (python3 -m venv "$WORK/peer_venv" && "$PEER" -m pip install -q -r requirements-bench.txt) \
      > "$WORK/peer_venv.log" 2>&1; echo $? > "$WORK/peer_venv.rc" ) &
    READY="$WORK/peer_venv.rc"
  fi
  python3 -m venv "$WORK/venv"
  "$WORK/venv/bin/pip" install -q -r requirements.txt "jax[$FLAVOUR]==$JAX_VERSION" \
    pytest==9.0.3
  PY="$WORK/venv/bin/python"
  OUT="${OUT:-experiments/results/gpu/device_check.json}"
  mkdir -p "$(dirname "$OUT")"
else
  PY=$(command -v python)
  OUT="${OUT:-$WORK/device_check.json}"
  echo "device_check: dry run on CPU with $PY (no CUDA install), small sizes, into $OUT"
fi

ARGS=(--workdir="$WORK" --out="$OUT")
if [ "$DRY" = 1 ]; then ARGS+=(--dry_run); fi
if [ -n "$PEER" ]; then ARGS+=(--peer_python="$PEER"); fi
if [ -n "${READY:-}" ]; then ARGS+=(--peer_ready="$READY"); fi
exec "$PY" benchmarks/device_check.py "${ARGS[@]}"
