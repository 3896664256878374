# Two commands: `make run` starts the bot, `make test` runs the whole suite.
# Each creates or refreshes the local virtualenv in .venv by itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: run chat test lint bench

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

run: $(BIN)/.installed
	$(BIN)/bub-bot serve

chat: $(BIN)/.installed
	$(BIN)/bub-bot chat

test: $(BIN)/.installed
	$(BIN)/python -m pytest

lint: $(BIN)/.installed
	$(BIN)/ruff format --check .
	$(BIN)/ruff check .

bench: $(BIN)/.installed
	$(BIN)/python bench/tape_bench.py
