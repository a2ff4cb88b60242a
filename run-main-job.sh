#!/usr/bin/env bash
# The main job on a fresh machine: install the package with what the main job needs (and CuPy
# where an NVIDIA driver is present), then train a bidirectional-GRU classifier on the digits
# (GPU if there is one, else CPU). Arguments go to `python -m cugru.train` (see --help).
set -euo pipefail
cd "$(dirname "$0")"
extras="main"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    cuda_major=$(nvidia-smi | grep -o 'CUDA Version: [0-9]*' | grep -o '[0-9]*$' || echo 0)
    if [ "${cuda_major:-0}" -ge 13 ]; then extras="$extras,cuda13"; else extras="$extras,cuda12"; fi
fi
python3 -m pip install -q -e ".[${extras}]"
exec python3 -m cugru.train "$@"
