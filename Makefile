# Set-up on a fresh machine: `make demo` and `make test` do everything (venv, install, run).
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench crds clean install test-deps e2e e2e-kind

$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/inferasim demo

test: test-deps $(STAMP)
	$(BIN)/ruff check inferasim operator tests benchmarks
	$(BIN)/lint-imports --no-cache
	$(BIN)/python -m pytest

lint: $(STAMP)
	$(BIN)/ruff check inferasim operator tests benchmarks
	$(BIN)/lint-imports --no-cache

bench: $(STAMP)
	$(BIN)/python benchmarks/run.py

clean:
	rm -rf $(VENV) build *.egg-info

# Prometheus, etcd and a Kubernetes v1.20.2 control plane for the integration and e2e tests
# (scripts/k8s; the build is cached outside the repository). Without root/apt it installs nothing
# and those tests skip, saying why.
test-deps:
	@bash scripts/k8s/test-deps.sh

# The CRDs (crds/, the chart's crds/) and the chart's ClusterRole rules, from the pydantic models.
crds: $(STAMP)
	$(BIN)/python -m inferasim_operator.crds

# Only the tests on real parts: the local control plane + Prometheus (or INFERASIM_E2E_KUBECONFIG).
e2e: test-deps $(STAMP)
	$(BIN)/python -m pytest tests/e2e tests/integration

# The same e2e tests against a kind cluster (needs docker and kind): make e2e-kind
KIND_CLUSTER ?= inferasim-e2e
e2e-kind: $(STAMP)
	kind get clusters | grep -qx $(KIND_CLUSTER) || kind create cluster --name $(KIND_CLUSTER)
	kind get kubeconfig --name $(KIND_CLUSTER) > $${TMPDIR:-/tmp}/$(KIND_CLUSTER).kubeconfig
	INFERASIM_E2E_KUBECONFIG=$${TMPDIR:-/tmp}/$(KIND_CLUSTER).kubeconfig $(BIN)/python -m pytest tests/e2e
