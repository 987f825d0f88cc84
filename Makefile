# Two commands matter: `make run` and `make test`. Both create .venv on demand.
# `make run` installs the package alone (the demo needs no extra); `make test` adds the test
# and spark extras (pytest, ruff, matplotlib; pyspark and pyarrow, ~660 MB), everything the
# suite needs from a clean clone.
PY      ?= python3.11
VENV    := .venv
VPY     := $(VENV)/bin/python
BASE    := $(VENV)/.installed-base
STAMP   := $(VENV)/.installed-test
TEST_PKG := .[test,spark]

.PHONY: run test test-long lint venv clean bytecode

# Bytecode for the package, written even where PYTHONDONTWRITEBYTECODE is set (this CI's
# machines set it): a node starts six interpreters' worth of modules, and compiling them from
# source at every start was ~0.15 s of CPU per node, a third of a local group's start
# (docs/performance.md "Start time"). Stale files are harmless: Python checks the source's
# mtime and compiles in memory when they differ. A wheel install compiles at install time.
BYTECODE = $(VPY) -m compileall -q -j 0 node ipc tools >/dev/null

define make_venv
	test -x $(VPY) || $(PY) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet -e '$(1)'
	$(VPY) -c "from node.store.codec import CRC_USES_C_EXTENSION as c; assert c, 'crcmod C extension missing'"
endef

$(BASE): setup.cfg pyproject.toml
	$(call make_venv,.)
	touch $(BASE)

$(STAMP): setup.cfg pyproject.toml
	$(call make_venv,$(TEST_PKG))
	touch $(BASE) $(STAMP)

venv: $(STAMP)

bytecode: $(BASE)
	$(BYTECODE)

## run: the main job (see README); installs no extra
run: $(BASE)
	$(BYTECODE)
	$(VPY) -m tools.demo

## test: lint, then the whole suite but the `long` tests; pytest exit 5 (no tests ran) is a failure
test: $(STAMP)
	$(VENV)/bin/ruff check node ipc tools tests
	$(BYTECODE)
	$(VPY) -m pytest -q -m "not long" tests; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests ran" >&2; exit 1; fi; exit $$rc

## test-long: the tests too long for CI: 100 leader kills under load (bounded by counts: 100 kills,
## 1,000 appends per writer per kill; 745 s measured 2026-11-27 on 2 cores shared with other work,
## load average ~15: about 7 s a kill there, 3 s on a quiet machine) and 480 simulator install seeds
test-long: $(STAMP)
	$(BYTECODE)
	$(VPY) -m pytest -q -m long tests; rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "no tests ran" >&2; exit 1; fi; exit $$rc

lint: $(STAMP)
	$(VENV)/bin/ruff check node ipc tools tests

clean:
	rm -rf $(VENV) build *.egg-info
