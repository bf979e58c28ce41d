#!/usr/bin/env bash
# The whole GPU check of issue 43 in one call, for a machine with one CUDA GPU (GPU time is short):
# the CUDA parity and noise tests, the kernel/step benchmark, the device noise sampler, and the
# `fedpriv run` commands at the ML-20M and Million Song Dataset shapes. Every part writes its own
# file under OUT and has its own time limit; a part that fails or runs out of time is recorded
# and the next one runs. The parts run in order of value (the CUDA tests first: they are short),
# within BUDGET seconds in all.
#
#   bash benchmarks/gpu_check.sh OUT [BUDGET]
#
# PARTS="noise_cost bench_kernel ...": only the parts named (default: all).
# STRICT=1: exit 1 when a part failed or was skipped (the documented smoke test on torch:cpu).
# WHEELS=DIR installs the wheels of DIR (no index, no dependencies) into OUT-side scratch first:
# for a GPU machine whose Python lacks flwr, dp-accounting or pytest (docs/how-to/gpu.md).
set -u
OUT=${1:?usage: gpu_check.sh OUT [BUDGET]}
BUDGET=${2:-540}
OUT=$(mkdir -p "$OUT" && cd "$OUT" && pwd)
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
START=$(date +%s)
export FLWR_TELEMETRY_ENABLED=0 FLWR_DISABLE_UPDATE_CHECK=1 PYTHONUNBUFFERED=1
if [ -n "${WHEELS:-}" ]; then
  SITE=$(mktemp -d)
  trap 'rm -rf "$SITE"' EXIT
  # a wheel is a zip archive: unpacked onto the path it imports (this works where pip is absent)
  python -c "import sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sys.argv[2:]]" "$SITE" "$WHEELS"/*.whl > "$OUT/wheels.log" 2>&1 || echo "wheel unpacking failed: see wheels.log" >> "$OUT/summary.txt"
  export PYTHONPATH="$ROOT:$SITE"
else
  export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
fi
# a smoke test of this script without a GPU: DEVICE=torch:cpu ML20M=... MSD=... BENCH="--preset ml1m ..."
DEVICE=${DEVICE:-cuda}
ML20M=${ML20M:-"synthetic-mf:users=136677,items=20108,ratings=10000000,seed=1,select=1.5"}
MSD=${MSD:-"synthetic-mf:users=571355,items=41140,ratings=33600000,seed=1,select=1.5"}
BENCH=${BENCH:-"--dims 32 --step-dims 32"}
BENCH128=${BENCH128:-"--dims 128 --step-dims 128 --steps 1"}
NOISE=${NOISE:-"--rank 32"}
PROFILE=${PROFILE:-"--dims 32 --steps 1"}
TESTS=${TESTS:-cuda}  # the CUDA cases (the torch:cpu ones run in every suite)

part() {  # part NAME LIMIT COMMAND...: run with a limit cut to the budget left
  local name=$1 limit=$2; shift 2
  case " ${PARTS:-$name} " in *" $name "*) ;; *) return ;; esac  # PARTS: only these parts
  local left=$((BUDGET - ($(date +%s) - START)))
  if [ "$left" -lt 20 ]; then echo "$name: skipped (budget spent)" >> "$OUT/summary.txt"; FAILED="$FAILED $name"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  local t0=$(date +%s)
  timeout --signal=TERM --kill-after=5 "$limit" "$@" > "$OUT/$name.out" 2> "$OUT/$name.err"
  local rc=$?
  echo "$name: rc $rc in $(( $(date +%s) - t0 )) s (limit $limit s)" >> "$OUT/summary.txt"
  [ "$rc" -eq 0 ] || FAILED="$FAILED $name"
}
FAILED=""

{ nvidia-smi; python -c "import torch, numpy; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name(0)); print('numpy', numpy.__version__)"; nproc; } > "$OUT/machine.txt" 2>&1
part pytest_device 120 python -m pytest -q -p no:cacheprovider -rs -k "$TESTS" tests/test_device.py tests/test_device_noise.py
part noise_cost 90 python benchmarks/noise_cost.py $NOISE --repeats 2 --no-opendp --device "$DEVICE"
part bench_kernel 120 python benchmarks/bench_kernel.py --device "$DEVICE" $BENCH
part run_ml20m_adadpals 150 python benchmarks/gpu_cli.py adadpals --data "$ML20M" --epsilon 5 --device "$DEVICE" --out "$OUT/runs/ml20m-adadpals"
part run_ml20m_topk 120 python benchmarks/gpu_cli.py topk --data "$ML20M" --epsilon 5 --device "$DEVICE" --out "$OUT/runs/ml20m-topk"
part bench_kernel_128 120 python benchmarks/bench_kernel.py --device "$DEVICE" $BENCH128
part run_msd_adadpals 150 python benchmarks/gpu_cli.py adadpals --data "$MSD" --epsilon 5 --device "$DEVICE" --out "$OUT/runs/msd-adadpals"
part run_msd_topk 120 python benchmarks/gpu_cli.py topk --data "$MSD" --epsilon 5 --device "$DEVICE" --out "$OUT/runs/msd-topk"
part profile_step 90 python -m cProfile -s tottime benchmarks/bench_kernel.py --device "$DEVICE" $PROFILE
head -c 20000 "$OUT/profile_step.out" > "$OUT/profile_head.txt" 2>/dev/null; rm -f "$OUT/profile_step.out"
echo "total $(( $(date +%s) - START )) s" >> "$OUT/summary.txt"
# one file back (a device call returns few files): every part's output, then the summary
for f in "$OUT"/machine.txt "$OUT"/wheels.log "$OUT"/*.out "$OUT"/*.err "$OUT"/profile_head.txt "$OUT"/summary.txt; do
  [ -f "$f" ] && { echo "===== $(basename "$f")"; cat "$f"; }
done > "$OUT/../gpu_check_all.txt"
if [ -n "$FAILED" ]; then
  echo "failed or skipped:$FAILED" >> "$OUT/summary.txt"
  [ "${STRICT:-0}" = 1 ] && { cat "$OUT/summary.txt"; tail -n 5 "$OUT"/*.err; exit 1; }
fi
exit 0
