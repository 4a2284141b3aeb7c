# dcu-serving — the two commands that matter: `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help
VENV := .venv
BIN := $(VENV)/bin
PY := python3
export PATH := $(CURDIR)/$(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg

.PHONY: help venv loadgen gateway rag capacity lint sanity-compat changelog unit unit-docker molecule integration compat test images vendor bundle demo demo-down collection constraints clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-12s %s\n", $$1, $$2}'

$(BIN)/.stamp: requirements/constraints.txt requirements/dev.txt pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade -c requirements/constraints.txt pip setuptools wheel
	$(BIN)/pip install -q -c requirements/constraints.txt -r requirements/dev.txt -e '.[all]'
	mkdir -p .collections/ansible_collections/dcu
	ln -sfn ../../.. .collections/ansible_collections/dcu/serving
	touch $@

venv: $(BIN)/.stamp  ## create .venv with the pinned toolchain and dcu-serving (editable)

# The load generator's own venv: aiperf drags in ~140 packages (1.2 GB) the dev venv does not need. Its wheels,
# each checked against its hash, go to a wheelhouse beside the bundle first; the venv is built from it offline,
# as playbooks/benchmark.yml builds it on a machine without internet.
LOADGEN := build/loadgen-venv
LOADGEN_WHEELS := build/loadgen-wheels
$(LOADGEN)/.stamp: requirements/benchmark.txt pyproject.toml
	$(BIN)/pip download -q --require-hashes --only-binary :all: -r requirements/benchmark.txt -d $(LOADGEN_WHEELS)
	rm -rf $(LOADGEN) && $(PY) -m venv $(LOADGEN)
	$(LOADGEN)/bin/pip install -q --no-index --find-links $(LOADGEN_WHEELS) --require-hashes -r requirements/benchmark.txt
	$(LOADGEN)/bin/pip install -q --no-deps -e .
	touch $@

loadgen: venv $(LOADGEN)/.stamp  ## build/loadgen-venv: aiperf (pinned with hashes, requirements/benchmark.txt) and dcu-benchmark

# The gateway's venv (LiteLLM's proxy, requirements/gateway.txt: 118 packages), built as roles/dcu_gateway builds it
# on a gateway host: every wheel checked against its hash, installed offline from a wheelhouse. dcu-serving goes in
# without its dependencies, for the auth and hook modules LiteLLM loads (src/dcu_serving/gateway).
GATEWAY := build/gateway-venv
GATEWAY_WHEELS := build/gateway-wheels
$(GATEWAY)/.stamp: requirements/gateway.txt pyproject.toml
	$(BIN)/pip download -q --require-hashes --only-binary :all: -r requirements/gateway.txt -d $(GATEWAY_WHEELS)
	rm -rf $(GATEWAY) && $(PY) -m venv $(GATEWAY)
	$(GATEWAY)/bin/pip install -q --no-index --find-links $(GATEWAY_WHEELS) --require-hashes -r requirements/gateway.txt
	$(GATEWAY)/bin/pip install -q --no-deps -e .
	touch $@

gateway: venv $(GATEWAY)/.stamp loadgen  ## LiteLLM's proxy (build/gateway-venv) in front of dcu-proxy, and dcu-benchmark through it
	DCU_LITELLM=$(CURDIR)/$(GATEWAY)/bin/litellm DCU_AIPERF=$(CURDIR)/$(LOADGEN)/bin/aiperf \
	  $(BIN)/pytest -q -m gateway tests/gateway

# MinerU's own code for the RAG chain's test (tests/rag): its API and vlm-http-client backend, in a venv of its
# own (751 MB: opencv, onnxruntime); no torch, no model weights.
MINERU := build/mineru-venv
$(MINERU)/.stamp: requirements/mineru.txt
	rm -rf $(MINERU) && $(PY) -m venv $(MINERU)
	$(MINERU)/bin/pip install -q -r requirements/mineru.txt
	touch $@

rag: venv images $(MINERU)/.stamp  ## the RAG chain end to end: MinerU (real) -> dcu-proxy -> simulators, Milvus (image)
	tools/ensure-docker
	tools/build-milvus-image >/dev/null
	DCU_MINERU=$(CURDIR)/$(MINERU) $(BIN)/pytest -q -m rag tests/rag

capacity: venv loadgen  ## the knee test: dcu-benchmark with real aiperf against simulators behind dcu-proxy
	DCU_AIPERF=$(CURDIR)/$(LOADGEN)/bin/aiperf $(BIN)/pytest -q -m loadgen

lint: venv  ## ansible-lint (production profile), yamllint, ruff, ansible-test sanity (offline)
	$(BIN)/yamllint -s .
	$(BIN)/ruff check src tests tools bench plugins molecule
	$(BIN)/ansible-lint --profile production
	# sanity's own pinned wheels: a no-op once build/sanity/wheels holds them (docs/publishing.md)
	tests/sanity/run.sh wheels
	tests/sanity/run.sh

sanity-compat:  ## ansible-test sanity of the oldest ansible-core claimed (make compat converges with it in CI)
	tools/compat-check --venv-only
	ANSIBLE_TEST=$(CURDIR)/.venv-compat/bin/ansible-test tests/sanity/run.sh wheels
	ANSIBLE_TEST=$(CURDIR)/.venv-compat/bin/ansible-test tests/sanity/run.sh

changelog: venv  ## lint changelogs/fragments and render CHANGELOG.md from changelogs/changelog.yaml (docs/publishing.md)
	$(BIN)/antsibull-changelog lint
	$(BIN)/antsibull-changelog generate
	rm -f changelogs/.plugin-cache.yaml

# promtool and amtool for tests/monitoring: from the Prometheus and Alertmanager packages the demo bundle carries
# (tools/install-prometheus-tool).
$(BIN)/promtool $(BIN)/amtool: inventories/demo/group_vars/all/bundle.yml | $(BIN)/.stamp
	$(BIN)/python tools/install-prometheus-tool $@

unit: venv $(BIN)/promtool $(BIN)/amtool  ## pytest without a Docker engine: modules, filters, proxy, client, simulator, bundle, rules
	$(BIN)/pytest -q -m "not docker and not loadgen and not gateway" -n auto  # one worker per core: the cases start real servers, CPU-bound

unit-docker: venv  ## the pytest cases that need a Docker engine (image archives, the simulator image)
	tools/ensure-docker
	$(BIN)/pytest -q -m "docker and not gateway and not rag"

images: venv  ## build the local test images (cached by recipe hash)
	tools/ensure-docker
	tools/build-image node
	tools/build-image pybase

vendor: venv  ## emulated vendor artifacts (rock .run, DTK) into build/vendor/, reproducibly
	tools/build-vendor-artifacts

bundle: venv images vendor  ## the demo/test offline bundle in build/bundle/ (playbooks/bundle.yml)
	tools/build-sim-image >/dev/null
	tools/build-proxy-image >/dev/null
	tools/build-milvus-image >/dev/null
	tools/build-mineru-image >/dev/null
	$(BIN)/ansible-playbook -i inventories/demo playbooks/bundle.yml

molecule: venv images bundle  ## every molecule scenario, two at a time (logs in build/molecule/)
	tools/molecule-scenarios

integration: venv images bundle  ## every molecule scenario and the compat check, two at a time
	tools/molecule-scenarios $$(ls molecule | grep -vx _shared) compat

compat: venv images bundle  ## the oldest ansible-core claimed converges an older-generation node over SSH
	tools/compat-check

test: lint unit unit-docker capacity gateway rag integration  ## everything CI runs, cheapest first

collection: venv  ## build the collection tarball into build/
	$(BIN)/ansible-galaxy collection build --force --output-path build/

constraints:  ## re-pin requirements/constraints.txt from a fresh resolve
	rm -rf build/pin && $(PY) -m venv build/pin
	build/pin/bin/pip install -q -r requirements/dev.txt -e '.[all]'
	{ echo "# Pinned toolchain and runtime versions (regenerate: make constraints)."; \
	  build/pin/bin/pip freeze --exclude-editable; } > requirements/constraints.txt

DEMO_NODE := dcu-demo
DEMO_PORT ?= 8000
demo: venv images bundle  ## provision the emulated 8-card node end to end and send it one request
	tools/dcu-node up $(DEMO_NODE) --cards 8 --publish 127.0.0.1:$(DEMO_PORT):8000
	$(BIN)/ansible-playbook -i inventories/demo/hosts.yml tools/stand-in-model.yml
	$(BIN)/ansible-playbook -i inventories/demo/hosts.yml playbooks/site.yml
	$(BIN)/python tools/demo-report --url http://127.0.0.1:$(DEMO_PORT) --node $(DEMO_NODE)

demo-down:  ## tear the demo node down
	tools/dcu-node down $(DEMO_NODE)

clean:  ## remove build output (keeps .venv)
	rm -rf build bundle .pytest_cache .ruff_cache
