#!/usr/bin/env bash
# One prepared GPU run for issue 3: the GPU-marked kernel and draft-model tests, then the
# capture_into (CSV + PNG) and verify_tree_greedy (CSV) benchmarks. Needs torch with CUDA, triton and nvcc;
# not sglang. (The other GPU tests need the bundled 98 MB GGUF and flashinfer.) Builds the CUDA extension on the fly for this GPU's arch only
# (a few tens of seconds on 16 cores). The benchmark runs even when a test
# fails (device time is scarce); the exit status is the tests' if they failed,
# else the benchmark's.
#   bash benchmarks/gpu_check.sh                   # from the repository root
#   RESULTS_DIR="$OUT" bash benchmarks/gpu_check.sh  # lent device: results (and the test log) come back
# Extra arguments go to bench_capture_into.py (e.g. --n 1 64 8192 --rep 50).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python}
RESULTS_DIR=${RESULTS_DIR:-benchmarks/results}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-$($PY -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())")}
export MAX_JOBS=${MAX_JOBS:-16}
mkdir -p "$RESULTS_DIR"
$PY -c "import torch, triton; print('gpu', torch.cuda.get_device_name(), 'torch', torch.__version__, 'triton', triton.__version__)" || exit 1
$PY - <<'PYEOF'
from eagle3_backend.ops import _ext, describe_backends
print("jit build:", _ext.jit_build(), _ext.load_error())
print(describe_backends("cuda"))
PYEOF
timeout "${TEST_TIMEOUT:-300}" $PY -m pytest -q --maxfail=10 tests/ops tests/test_model.py -m gpu -p no:cacheprovider >"$RESULTS_DIR/gpu_tests.log" 2>&1
tests=$?
tail -25 "$RESULTS_DIR/gpu_tests.log"
$PY benchmarks/bench_capture_into.py --out-dir "$RESULTS_DIR" "$@"
bench=$?
$PY benchmarks/bench_verify_tree.py --out-dir "$RESULTS_DIR" || bench=$?
echo "gpu_check: tests exit $tests, benchmark exit $bench; results in $RESULTS_DIR"
[ "$tests" -ne 0 ] && exit "$tests"
exit "$bench"
