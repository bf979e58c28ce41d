#!/usr/bin/env bash
# The wheels gpu_check.sh needs on a GPU machine that has torch, numpy, scipy, pandas, pyarrow,
# absl-py and attrs but no package index (../shared/specs/gpu-notes.md): what `fedpriv run`, the
# benchmarks and the CUDA tests import beyond those, at the versions CI tests. All are pure
# Python, so they unpack onto any Python 3.
#
#   bash benchmarks/gpu_wheels.sh DIR      # then: WHEELS=DIR bash benchmarks/gpu_check.sh OUT
#
# PIP: the pip to download with (default: .venv/bin/pip, else pip3).
set -euo pipefail
DIR=${1:?usage: gpu_wheels.sh DIR}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PIP=${PIP:-$([ -x "$ROOT/.venv/bin/pip" ] && echo "$ROOT/.venv/bin/pip" || echo pip3)}
mkdir -p "$DIR"
# dp-accounting and tqdm: fedpriv's imports; pytest and its own (pygments since pytest 8.4): the CUDA tests
"$PIP" download --quiet --no-deps --only-binary=:all: -c "$ROOT/ci/constraints-oldest.txt" -d "$DIR" \
  dp-accounting tqdm pytest pluggy iniconfig packaging pygments
ls "$DIR"
