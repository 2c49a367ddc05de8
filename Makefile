# Two commands set everything up on a fresh machine: `make train` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test

.PHONY: train test test-slow test-slurm gradcheck sweep lint tensorboard clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $@

$(TEST_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $@

train: $(STAMP)            ## train the cartpole with the default configuration
	$(PY) -m harness train +env=cartpole $(ARGS)

test: $(TEST_STAMP)        ## the default (fast) test suite, on two workers
	$(PY) -m pytest -n 2 $(ARGS)

test-slow: $(TEST_STAMP)   ## the slow tests only (full default training run, long horizons)
	$(PY) -m pytest -n 2 -m slow $(ARGS)

test-slurm: $(TEST_STAMP)  ## sweeps on a private one-node SLURM cluster the test starts (as root; apt-get installs slurm-wlm and munge when missing)
	command -v slurmctld >/dev/null && command -v munged >/dev/null || \
		{ apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y slurm-wlm munge; }
	$(PY) -m pytest -n 0 -m slow tests/test_slurm.py $(ARGS)

gradcheck: $(STAMP)
	$(PY) -m harness gradcheck +env=cartpole env.horizon=120

sweep: $(STAMP)            ## the preset clip-threshold sweep (configs/experiment/cartpole_clip_sweep.yaml)
	$(PY) -m harness train -m +experiment=cartpole_clip_sweep $(ARGS)
	$(PY) -m harness report $$(ls -d multirun/cartpole_clip_sweep/* | tail -n 1)

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

tensorboard: $(STAMP)      ## serve outputs/ and multirun/ on http://127.0.0.1:6006
	mkdir -p outputs multirun
	$(VENV)/bin/tensorboard --logdir_spec outputs:outputs,multirun:multirun --host 127.0.0.1 --port 6006

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
