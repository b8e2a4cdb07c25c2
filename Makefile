# topolaunch: controller setup, lab, tests. `make demo` and `make test` are the two commands a newcomer runs.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)
# The collection topolaunch.sglang: a view of the repository (symlinks), built dereferenced into build/.
COLLECTION := collections/ansible_collections/topolaunch/sglang
VERSION := $(shell sed -n 's/^version: *//p' $(COLLECTION)/galaxy.yml)
TARBALL := build/topolaunch-sglang-$(VERSION).tar.gz
INSTALLED := build/install/ansible_collections/topolaunch/sglang

.PHONY: setup pth vendor-collections lock sglang-wheel sglang-flags sglang-metrics fakenvml repo lab-up lab-down lab-status demo \
	test test-phases lint unit collection sanity collection-test rules molecule lab-layers lab-tests lab-tests-full perf bench \
	clean

setup: $(VENV)/.installed pth vendor-collections ## controller venv with the pinned requirements, collections/ on its path

$(VENV)/.installed: requirements.txt
	$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 11), "python 3.11+ needed, got " + sys.version'
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	touch $@

pth: $(VENV)/.installed ## put collections/ on the venv's path: tools and tests import ansible_collections.topolaunch.sglang.*
	$(BIN)/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
	  | { read -r site; echo "$(CURDIR)/collections" > "$$site/topolaunch-collection.pth"; }

vendor-collections: $(VENV)/.installed ## the pinned third-party collections (community.proxmox) from the ansible wheel into .ansible/collections
	$(BIN)/python tools/vendor_collections.py

lock: ## regenerate requirements.txt from requirements.in
	rm -rf build/lockvenv && $(PYTHON) -m venv build/lockvenv
	build/lockvenv/bin/pip install -q -r requirements.in
	{ echo '# Full pinned controller environment (Python 3.11 and 3.12). Regenerate with `make lock` after editing requirements.in.'; build/lockvenv/bin/pip freeze; } > requirements.txt

sglang-wheel: setup ## every supported SGLang version's wheel (cached in build/wheels): flags are read with ast, never imported
	$(BIN)/python tools/sglang_flags.py --download

sglang-flags: sglang-wheel ## regenerate every supported version's flag and facts tables (module_utils/topolaunch/sglang_{flags,facts}_*.py)
	$(BIN)/python tools/sglang_flags.py --all
	$(BIN)/python tools/sglang_facts.py --all

sglang-metrics: sglang-wheel ## regenerate every supported version's metrics table (module_utils/topolaunch/sglang_metrics_*.py)
	$(BIN)/python tools/sglang_metrics.py --all

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

# What CI runs, in this order (.ci/run times each): `make test` runs them all and stops at the first failure.
TEST_PHASES := lint rules unit collection-test sanity molecule lab-layers lab-tests
test: $(TEST_PHASES) ## everything CI runs

test-phases:
	@echo $(TEST_PHASES)

lint: setup
	$(BIN)/yamllint --strict .
	$(BIN)/ansible-lint --profile production

# The alert rules (roles/monitoring) through the real promtool of the pinned Debian prometheus .deb (extracted into
# build/promtool, not installed): `promtool check rules`, then `promtool test rules` on tests/rules/ (a test per alert).
rules: setup ## promtool check rules and promtool test rules on the rendered alert rules
	$(BIN)/python tools/alert_rules.py

unit: setup fakenvml sglang-wheel
	$(BIN)/pytest -q tests/unit tests/sim

collection: setup ## build/topolaunch-sglang-<version>.tar.gz (and the collection installed from it in build/install)
	rm -rf build/collection build/install $(TARBALL)
	mkdir -p build/collection
	cp -rL $(COLLECTION)/. build/collection/
	find build/collection -name __pycache__ -prune -exec rm -rf {} +
	$(BIN)/ansible-galaxy collection build --output-path build build/collection >/dev/null
	ANSIBLE_COLLECTIONS_PATH=$(CURDIR)/build/install ANSIBLE_COLLECTIONS_SCAN_SYS_PATH=false \
	  $(BIN)/ansible-galaxy collection install --no-deps --force -p build/install $(TARBALL) >/dev/null
	@echo "built $(TARBALL), installed in $(INSTALLED)"

collection-test: collection fakenvml ## the built collection: the repository's code byte for byte, an outside playbook
	$(BIN)/pytest -q tests/collection

# ansible-test lists a collection's files with git when it is in a git tree: the installed copy gets its own.
# It bootstraps pip in its venvs with a get-pip.py from ci-files.testing.ansible.com; offline, .ci/get_pip_offline.py
# stands in (under the name it caches the real one).
ANSIBLE_TEST_PIP := $(shell sed -n "s/^ *pip='\(.*\)',/\1/p" \
	$(VENV)/lib/python3*/site-packages/ansible_test/_internal/python_requirements.py 2>/dev/null | head -1)
sanity: collection ## ansible-test sanity in the installed collection (its own venvs, no Docker)
	cache=$$HOME/.ansible/test/cache/get_pip_$(subst .,_,$(ANSIBLE_TEST_PIP)).py; \
	  if [ ! -s "$$cache" ] && ! curl -sfm 10 -o /dev/null https://ci-files.testing.ansible.com/; then \
	    mkdir -p "$$(dirname "$$cache")" && cp .ci/get_pip_offline.py "$$cache"; fi
	cd $(INSTALLED) && git init -q . && echo /tests/output/ > .git/info/exclude && git add -A
	cd $(INSTALLED) && $(CURDIR)/$(BIN)/ansible-test sanity --venv --python 3.11 --color no

molecule: setup repo
	cd tests && $(CURDIR)/$(BIN)/molecule test --all

lab-layers: setup repo ## the provisioned layers lab tests boot their hosts from (tests/lab/labhosts.py; kept until their inputs change)
	$(BIN)/python tests/lab/lanes.py --layers-only

lab-tests: setup repo ## pytest over lab hosts in parallel lanes (tests/lab/lanes.py), without the tests marked full
	$(BIN)/python tests/lab/lanes.py

lab-tests-full: setup repo ## the lab tests, those marked full too (longer scenarios left out of CI for time)
	$(BIN)/python tests/lab/lanes.py --all

perf: setup fakenvml ## topolaunch's own performance figures (perf/*.py), the README's table regenerated from them
	@rc=0; for f in perf/[!_]*.py; do echo "== $$f"; TOPOLAUNCH_PERF_KEEP=1 $(BIN)/python $$f || rc=1; done; \
	  for lab in bench-provision bench-sweep h12-tune; do \
	    if [ -d .lab/inventories/$$lab ]; then $(BIN)/python lab/lab.py -i .lab/inventories/$$lab down >/dev/null; fi; done; \
	  $(BIN)/python tools/perf_table.py; exit $$rc

bench: perf ## the old name of perf (bench is the stage that benchmarks the server)

clean: lab-down
	rm -rf build .lab artifacts
