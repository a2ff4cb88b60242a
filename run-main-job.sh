#!/usr/bin/env bash
# The main job on a fresh machine: install the package with what the main job needs (and CuPy
# where an NVIDIA driver is present) the first time, then train a bidirectional-GRU classifier
# on the digits (GPU if there is one, else CPU). Arguments go to `python -m cugru.train` (see
# --help); it runs in the folder you call it from, so --data, --save and --plot paths are
# yours. Set CK_REINSTALL=1 to install again.
set -euo pipefail
repo="$(cd "$(dirname "$0")" && pwd)"
extras="main"
need="import cugru, sklearn, tqdm, matplotlib"
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
    cuda_major=$(nvidia-smi | grep -o 'CUDA Version: [0-9]*' | grep -o '[0-9]*$' || echo 0)
    if [ "${cuda_major:-0}" -ge 13 ]; then extras="$extras,cuda13"; else extras="$extras,cuda12"; fi
    need="$need, cupy"
fi
# installed already (this checkout, with what the job needs): no pip run
here=$(python3 -c "import os, cugru; print(os.path.dirname(os.path.dirname(cugru.__file__)))" \
       2>/dev/null || true)
if [ "${CK_REINSTALL:-0}" = 1 ] || [ "$here" != "$repo" ] || ! python3 -c "$need" 2>/dev/null
then
    python3 -m pip install -q -e "${repo}[${extras}]"
fi
exec python3 -m cugru.train "$@"
