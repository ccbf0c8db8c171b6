# The README's commands. Each target sets up the virtual environment first (once).
.PHONY: setup run test lint bench

setup:
	@scripts/setup.sh

run: setup
	.venv/bin/batos run

test: setup
	.venv/bin/python -m pytest -q

lint: setup
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports --no-cache
	.venv/bin/mypy

bench: setup
	.venv/bin/python bench/uvm.py
