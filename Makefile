# plancc: `make install` sets up .venv and runs the example; `make test` runs the tests.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
DEMO_OUT ?= out/chat-plan
RECIPE_OUT ?= out/recipe-plan

.PHONY: install kernels demo test lint bench bench-scale clean axolotl-venv

install: $(BIN)/plancc kernels demo

$(BIN)/plancc: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -qq --upgrade pip
	# -qq: errors only (setuptools' notice about editable installs is not one); constraints.txt: the tested versions
	$(BIN)/python -m pip install -qq -c constraints.txt -e ".[dev]"
	touch $@

# compile the kernels into the installation's cache (plancc/_kernels): the first compile, in any plancc cache dir, is warm
kernels: $(BIN)/plancc
	$(BIN)/python -m plancc.build.kernels

demo: $(BIN)/plancc
	$(BIN)/plancc compile examples/data/chat.jsonl -o $(DEMO_OUT) --config examples/chat.toml --overwrite
	$(BIN)/plancc inspect metrics $(DEMO_OUT) --epoch 0 --compact
	$(BIN)/plancc show $(DEMO_OUT) --sample 1 --no-color
	$(BIN)/plancc validate $(DEMO_OUT)
	$(BIN)/plancc compile -o $(RECIPE_OUT) --config examples/recipe.toml --overwrite
	$(BIN)/plancc inspect metrics $(RECIPE_OUT) --by dataset --epoch 0
	$(BIN)/plancc validate $(RECIPE_OUT)

test: $(BIN)/plancc
	$(BIN)/ruff check plancc tests benchmarks examples
	$(BIN)/python -m pytest

bench: $(BIN)/plancc
	$(BIN)/python benchmarks/run_all.py

# compile at 10M, 50M and 100M samples alone (part of `make bench` too): needs ~8 GiB of memory, ~10 min of CPU
bench-scale: $(BIN)/plancc
	$(BIN)/python benchmarks/bench_scale.py

clean:
	rm -rf out bench-out .pytest_cache .ruff_cache

# A separate venv with Axolotl for the plugin's test (tests/runtime/test_axolotl.py): Axolotl pins its own
# transformers/TRL, so it never shares the project's venv. The CPU torch wheel first, so Axolotl's deps keep it.
AXOLOTL_VENV ?= /tmp/plancc-axolotl-venv
AXOLOTL_VERSION ?= 0.19.0
TORCH_VERSION ?= 2.13.0

axolotl-venv: $(AXOLOTL_VENV)/bin/axolotl

$(AXOLOTL_VENV)/bin/axolotl:
	$(PYTHON) -m venv $(AXOLOTL_VENV)
	$(AXOLOTL_VENV)/bin/python -m pip install -qq torch==$(TORCH_VERSION)
	$(AXOLOTL_VENV)/bin/python -m pip install -qq axolotl==$(AXOLOTL_VERSION)
