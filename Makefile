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

images:  ## build the dataset/model initializer images with podman (local base; images/README.md)
	bash images/build.sh

e2e: install images  ## build the images, then run them for real against local S3 and Hub servers
	$(PYTHON) -m pytest -q -m images tests/images tests/runtimes tests/launchers/test_images.py

bench:  ## side-by-side figures vs s5cmd, aws, boto3, hf, Kubeflow, KServe -> docs/benchmarks.*
	PYTHON=$(PYTHON) bash benchmarks/setup.sh
	.bench/venv/bin/python -m benchmarks $(BENCH_ARGS)

test-launchers: install  ## real torchrun/mpirun launches over loopback (sshd: .ci/launchers.sh)
	$(PIP) install -q -r tests/launchers/requirements.txt
	$(PYTHON) -m pytest -q -m launchers tests/launchers

clean:
	rm -rf workspace .pytest_cache build *.egg-info
