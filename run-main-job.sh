#!/usr/bin/env bash
# The main job on a fresh machine: install the package with what the demo needs (and CuPy
# where an NVIDIA driver is present), then train on the digits data set (GPU if any, else CPU).
set -euo pipefail
cd "$(dirname "$0")"
extras="demo"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    cuda_major=$(nvidia-smi | grep -o 'CUDA Version: [0-9]*' | grep -o '[0-9]*$' || echo 0)
    if [ "${cuda_major:-0}" -ge 13 ]; then extras="$extras,cuda13"; else extras="$extras,cuda12"; fi
fi
python3 -m pip install -q -e ".[${extras}]"
exec python3 -m cukernels.demo "$@"
