# labkit's two commands (README "Quick start"). Both create or reuse the virtual environment
# .venv, installing what pyproject.toml lists; they reinstall when pyproject.toml changes.
#
#   make workbook   execute every notebook into runs/<timestamp>_<profile>/   (command 1)
#   make test       run the test suite in TEST_WORKERS processes             (command 2)
#   make lint       ruff check and ruff format --check: the package, tests, scripts, notebooks
#   make lab        JupyterLab on notebooks/ (labkit lab; --allow-root added as root)
#   make site       static HTML in site/: README, docs/, the notebooks as the newest complete CPU run
#                   under runs/ executed them (or LABKIT_EXECUTED_RUN), the API reference (docs/site.md)
#
# LABKIT_EXECUTED_RUN=runs/<timestamp>_cpu make test: the notebook tests read the notebooks that run
# executed instead of executing them again (docs/testing.md); CI does this after `make workbook`.
#
# ARGS goes to the command: `make workbook ARGS="--only start_here"`,
# `make lab ARGS="--port=8899 --IdentityProvider.token=abc --no-browser"`.
#
# TORCH_SPEC picks the torch to install into a new .venv. The default, torch==2.13.0, is a local
# CPU build on the project's CPU machines; elsewhere it may pull the CUDA packages (gigabytes).
# On a GPU node, create .venv with the torch you want first, or use scripts/gpu_tier.sh.
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.labkit-installed
ARGS ?=
PYTEST_ARGS ?=
# pytest-xdist workers; --dist loadgroup keeps the browser tests (one JupyterLab, one Chromium) in one,
# and each file's tests that share an expensive module fixture (xdist_group in the file)
TEST_WORKERS ?= 2

.PHONY: workbook test lint lab site doctor clean

workbook: $(STAMP)
	$(BIN)/labkit run $(ARGS)

test: $(STAMP)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

lab: $(STAMP)
	$(BIN)/labkit lab $(ARGS)

site: $(STAMP)
	$(BIN)/python scripts/build_site.py --out site

doctor: $(STAMP)
	$(BIN)/labkit doctor

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install -q "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[test]"
	touch $(STAMP)

clean:
	rm -rf $(VENV) .pytest_cache site
