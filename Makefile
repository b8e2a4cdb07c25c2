# topolaunch: controller setup, lab, tests. `make demo` and `make test` are the two commands a newcomer runs.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: setup lock sglang-wheel sglang-flags fakenvml repo lab-up lab-down lab-status demo test lint unit molecule lab-tests bench clean

setup: $(VENV)/.installed ## controller venv with the pinned requirements

$(VENV)/.installed: requirements.txt
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "python 3.11+ needed, got " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	touch $@

lock: ## regenerate requirements.txt from requirements.in
	rm -rf build/lockvenv && $(PYTHON) -m venv build/lockvenv
	build/lockvenv/bin/pip install -q -r requirements.in
	{ echo '# Full pinned controller environment (Python 3.11 and 3.12). Regenerate with `make lock` after editing requirements.in.'; build/lockvenv/bin/pip freeze; } > requirements.txt

sglang-wheel: setup ## every supported SGLang version's wheel (cached in build/wheels): flags are read with ast, never imported
	$(BIN)/python tools/sglang_flags.py --download

sglang-flags: sglang-wheel ## regenerate every supported version's flag table (module_utils/topolaunch/sglang_flags_*.py)
	$(BIN)/python tools/sglang_flags.py --all

fakenvml: ## build the fake libnvidia-ml.so.1 and the nvidia-smi stand-in
	$(MAKE) -C lab/fakenvml OUT=$(CURDIR)/build/fakenvml

repo: setup fakenvml ## build the lab's apt and pip repository (stand-in packages, simulator wheel)
	$(BIN)/python lab/repo/build.py --out build/repo

lab-up: setup repo ## boot the lab hosts of inventory/lab (reuses a running lab)
	$(BIN)/python lab/lab.py up

lab-down: ## stop the lab hosts, leave nothing behind
	$(BIN)/python lab/lab.py down

lab-status:
	$(BIN)/python lab/lab.py status

demo: setup lab-up ## set everything up and run deploy.yml on the lab
	$(BIN)/ansible-playbook deploy.yml

test: lint unit molecule lab-tests ## everything CI runs

lint: setup
	$(BIN)/yamllint --strict .
	$(BIN)/ansible-lint --profile production

unit: setup fakenvml sglang-wheel
	$(BIN)/pytest -q tests/unit

molecule: setup repo
	cd tests && $(CURDIR)/$(BIN)/molecule test --all

lab-tests: setup repo ## pytest over lab hosts: lab.py itself, lifecycle faults, sweep
	$(BIN)/pytest -q tests/lab

bench: setup fakenvml
	@for f in bench/*.py; do echo "== $$f"; $(BIN)/python $$f; done

clean: lab-down
	rm -rf build .lab artifacts
