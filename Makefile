# Entry points for people and CI. Every target is safe to run on a fresh machine.
PYTHON ?= python3
PIP ?= $(PYTHON) -m pip

.PHONY: install test lint demo images e2e test-launchers bench clean

install:  ## install the package and what the tests need
	$(PIP) install -q -e '.[test]'

test: install  ## the README's test command: lint + the whole default test suite
	$(PYTHON) -m ruff check .
	$(PYTHON) -m ruff format --check .
	$(PYTHON) -m pytest -q

lint:
	$(PYTHON) -m ruff check . && $(PYTHON) -m ruff format --check .

demo: install  ## fetch a generated model and dataset from local S3 and Hub servers into ./workspace
	$(PYTHON) -m scripts.demo

clean:
	rm -rf workspace .pytest_cache build *.egg-info
