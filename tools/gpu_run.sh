#!/usr/bin/env bash
# The first GPU run, as one command on a lent GPU machine (a copy of this checkout, with the
# wheels of IPython, ipykernel, ipywidgets, nbclient and their needs in .whl/, which git
# ignores; the machine has torch, psutil, matplotlib and nvidia-ml-py already):
#
#   bash tools/gpu_run.sh
#
# It installs the wheels into /tmp/site, runs `python3 tools/gpu_report.py` (self-check,
# notebooks on CUDA at their large sizes, the snapshot benchmark's GPU part, the sampler
# under load and during CUDA graph capture) and leaves in $OUT (or ./gpu-report):
# report.md (rewritten after every section, so a run that is stopped still brings back what it
# measured), console.txt, and the executed notebooks as notebooks.tar.gz. The kernels draw
# inline (no MPLBACKEND here), so the notebooks come back with their figures.
set -uo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-gpu-report}"
mkdir -p "$out"
if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH="/tmp/site:$PWD"
else
    export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1
unset MPLBACKEND
{
    nvidia-smi --query-gpu=index,uuid,name,memory.total,memory.used,driver_version --format=csv || true
    python3 -c "import torch, IPython, ipykernel, nbclient; print('torch', torch.__version__, 'IPython', IPython.__version__)"
    timeout -k 10 470 python3 tools/gpu_report.py "$out" --notebooks-out /tmp/gpu-report/notebooks
    echo "gpu_report exit status: $?"
} 2>&1 | tee "$out/console.txt"
tar -czf "$out/notebooks.tar.gz" -C /tmp/gpu-report notebooks 2>/dev/null || true
