#!/usr/bin/env bash
# One prepared GPU run for issue 3: the GPU-marked kernel tests, then the
# gather_concat benchmark (CSV + PNG into benchmarks/results/). Needs torch
# with CUDA, triton and nvcc; not sglang. Builds the CUDA extension on the fly
# for this GPU's arch only (a few tens of seconds on 16 cores).
#   bash benchmarks/gpu_check.sh            # from the repository root
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$($PY -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")}
export MAX_JOBS=${MAX_JOBS:-16}
mkdir -p benchmarks/results
$PY -c "import torch, triton; print('gpu', torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__)"
$PY - <<'EOF'
from eagle3_backend.ops import _ext, describe_backends
print("jit build:", _ext.jit_build(), _ext.load_error())
print(describe_backends("cuda"))
EOF
$PY -m pytest -q -x tests/ops -m gpu -p no:cacheprovider 2>&1 | tail -20
$PY benchmarks/bench_gather_concat.py "$@"
