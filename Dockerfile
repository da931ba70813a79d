# eagle3-backend on SGLang's official image, for NVIDIA RTX PRO 6000 Blackwell (sm_120).
#
# Build:  docker build -t eagle3-backend .
# Run:    docker run --gpus all --ipc=host --shm-size 32g -p 30000:30000 \
#             -v /path/to/target:/models/target:ro -v /path/to/draft:/models/draft:ro \
#             -e TP_SIZE=8 eagle3-backend
#
# The default command serves /models/target with the EAGLE-3 draft in /models/draft;
# the eagle3 SGLang plugin is active because the package is installed (its
# `sglang.srt.plugins` entry point). Pass any `python -m sglang.launch_server ...`
# command instead to change the flags.

# SGLang's images ship CUDA 13.0 (>= 12.8, which sm_120 needs) and sglang itself.
# The plugin checks its hook table against the installed SGLang at start-up and
# refuses to run on a version that lacks a hook; keep this tag at 0.5.23.
ARG SGLANG_IMAGE=lmsysorg/sglang:v0.5.23-cu130
FROM ${SGLANG_IMAGE}

# Compile eagle3_backend._C for Blackwell workstation GPUs only (sm_120); the build
# fails loudly instead of silently installing without the extension.
ENV EAGLE3_CUDA_ARCHS=12.0 \
    EAGLE3_REQUIRE_CUDA_BUILD=1 \
    EAGLE3_SKIP_CUDA_BUILD=0

WORKDIR /opt/eagle3-backend
COPY pyproject.toml setup.py README.md ./
COPY csrc ./csrc
COPY eagle3_backend ./eagle3_backend

# --no-build-isolation: build _C against the image's torch; --no-deps: keep the
# image's sglang / torch / flashinfer exactly as SGLang pinned them. setuptools >= 77
# reads pyproject.toml's SPDX license string (setup.py stops older ones with this fix).
# The checks need no GPU: the extension must hold sm_120 code, and the plugin's
# entry point must be visible to SGLang's loader.
RUN python3 -m pip install --no-cache-dir 'setuptools>=77' \
 && python3 -m pip install --no-cache-dir --no-build-isolation --no-deps . \
 && so="$(python3 -c "import importlib.util as u; print(u.find_spec('eagle3_backend._C').origin)")" \
 && cuobjdump --list-elf "$so" | grep -q "sm_120" \
 && python3 -c "from importlib.metadata import entry_points as ep; \
assert any(e.name == 'eagle3' for e in ep(group='sglang.srt.plugins')), 'plugin entry point missing'"

ENV TP_SIZE=8 \
    PORT=30000 \
    SPEC_STEPS=3 \
    SPEC_TOPK=1 \
    SPEC_DRAFT_TOKENS=4
EXPOSE 30000

# Shell form so the environment variables above can be overridden with -e.
CMD python3 -m sglang.launch_server \
        --model-path /models/target \
        --speculative-algorithm EAGLE3 \
        --speculative-draft-model-path /models/draft \
        --speculative-num-steps ${SPEC_STEPS} \
        --speculative-eagle-topk ${SPEC_TOPK} \
        --speculative-num-draft-tokens ${SPEC_DRAFT_TOKENS} \
        --tp-size ${TP_SIZE} \
        --trust-remote-code \
        --host 0.0.0.0 --port ${PORT}
