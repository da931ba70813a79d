# Two commands do everything on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PY := .venv/bin/python
export PYTHONDONTWRITEBYTECODE := 1
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
ARTIFACTS := artifacts
SMOLLM2_GGUF = $(shell $(PY) -c "from eagle3_backend.target import bundled_target_path; print(bundled_target_path())")

.PHONY: setup demo test test-fast ext clean

.venv/.setup-done: scripts/setup_env.sh requirements/base.txt requirements/lock.txt requirements/data.txt pyproject.toml setup.py
	./scripts/setup_env.sh
	touch $@

setup: .venv/.setup-done

demo: setup
	@mkdir -p $(ARTIFACTS)
	$(PY) -m eagle3_backend make-demo-draft $(ARTIFACTS)/demo-draft --target $(SMOLLM2_GGUF) --force
	$(PY) -m eagle3_backend inspect $(ARTIFACTS)/demo-draft
	$(PY) -m eagle3_backend validate $(ARTIFACTS)/demo-draft --target $(SMOLLM2_GGUF)
	$(PY) -m eagle3_backend eval --draft $(ARTIFACTS)/demo-draft --target $(SMOLLM2_GGUF) \
		--dataset mt-bench --limit 2 --max-new-tokens 32 --threads 1 --dtype float32

test: setup
	$(PY) -m pytest -q tests

test-fast: setup
	$(PY) -m pytest -q tests -m "not server and not slow"

ext: setup
	EAGLE3_SKIP_CUDA_BUILD=0 $(PY) setup.py build_ext --inplace

clean:
	rm -rf .venv build *.egg-info $(ARTIFACTS)
