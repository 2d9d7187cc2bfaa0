# The two commands of the README:
#   make test   set up .venv, make figures from the committed records, run every test
#   make book   set up .venv, measure this machine, redraw the figures, build the site
#
# Set-up is a stamp file: the first run creates .venv and installs the package with its book and
# test extras; later runs skip that until pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.smallem-installed
SITE   := site

export NO_MKDOCS_2_WARNING := 1

.PHONY: setup test book chromium cross simde llama figures build site clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -e '.[book,test]'
	@# MPI for the appendix and its 2-rank tests (mpi4py on MPICH's wheel); best effort
	@$(PY) -m pip install --quiet -e '.[mpi]' 2>/dev/null \
	  || echo "could not install mpi4py and mpich: the MPI appendix and its tests will be skipped"
	@# the notebooks' kernel must be this venv's python, whatever else is installed
	$(PY) -m ipykernel install --sys-prefix --name python3 >/dev/null
	@touch $@

# Debian's chromium for the browser test (Playwright drives it; it never downloads a browser).
chromium:
	@if [ -x /usr/bin/chromium ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing chromium for the browser test"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null \
	  || { DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null \
	       && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium >/dev/null; } \
	  || echo "could not install chromium: the browser test will be skipped"; \
	else \
	  echo "no /usr/bin/chromium (install Debian's chromium package): the browser test will be skipped"; \
	fi

# Debian's arm64 cross compiler, so a test can check that every kernel's plain-C path builds
# for arm64 (nothing may assume x86). Best effort: without it that test is skipped, visibly.
cross:
	@if command -v aarch64-linux-gnu-gcc >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing gcc-aarch64-linux-gnu for the arm64 build test"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc-aarch64-linux-gnu >/dev/null \
	  || { DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null \
	       && DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc-aarch64-linux-gnu >/dev/null; } \
	  || echo "could not install gcc-aarch64-linux-gnu: the arm64 build test will be skipped"; \
	fi

# Debian's SIMDe headers, so the tests can run the AVX-512 kernels on a CPU without AVX-512
# (SMALLEM_EMULATE=avx512; see smallem/isa.py). Best effort: without them those runs are skipped.
simde:
	@if echo '#include <simde/x86/avx512.h>' | $${CC:-cc} -E -x c - >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing libsimde-dev for the emulated AVX-512 tests"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q libsimde-dev >/dev/null \
	  || { DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null \
	       && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libsimde-dev >/dev/null; } \
	  || echo "could not install libsimde-dev: the emulated AVX-512 tests will be skipped"; \
	fi

# llama.cpp, chapter 4's peer (never a dependency): llama-bench, llama-simple and llama-quantize
# built from the source the llama-cpp-python sdist bundles, into build/llama.cpp/bin/; the
# sdist's tokenizer test files (models/ggml-vocab-*) stay beside it for the tokenizer tests. Needs the network once
# (pip download) and cmake; a few minutes on two cores. `make book` uses it when it is there.
LLAMA_CPP_PYTHON ?= 0.3.36
LLAMA_DIR := build/llama.cpp
llama: setup
	@if [ -x $(LLAMA_DIR)/bin/llama-bench ] && [ -x $(LLAMA_DIR)/bin/llama-simple ] \
	    && [ -x $(LLAMA_DIR)/bin/llama-quantize ]; then \
	  echo "llama.cpp already built in $(LLAMA_DIR)/bin"; \
	else \
	  mkdir -p $(LLAMA_DIR) && \
	  $(PY) -m pip download --quiet --no-deps --no-binary :all: \
	    llama-cpp-python==$(LLAMA_CPP_PYTHON) -d $(LLAMA_DIR) && \
	  tar xzf $(LLAMA_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON).tar.gz -C $(LLAMA_DIR) && \
	  cmake -S $(LLAMA_DIR)/llama_cpp_python-$(LLAMA_CPP_PYTHON)/vendor/llama.cpp -B $(LLAMA_DIR)/cmake \
	    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
	    -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF >$(LLAMA_DIR)/cmake.log && \
	  cmake --build $(LLAMA_DIR)/cmake -j --target llama-bench llama-simple llama-quantize \
	    >$(LLAMA_DIR)/build.log && \
	  mkdir -p $(LLAMA_DIR)/bin && \
	  cp $(LLAMA_DIR)/cmake/bin/llama-bench $(LLAMA_DIR)/cmake/bin/llama-simple \
	    $(LLAMA_DIR)/cmake/bin/llama-quantize $(LLAMA_DIR)/bin/ && \
	  echo "built llama.cpp into $(LLAMA_DIR)/bin"; \
	fi

figures: setup
	$(PY) -m smallem figures

test: setup chromium cross simde
	$(PY) -m smallem figures
	$(PY) -m pytest tests --durations=12

build: setup
	$(PY) -m smallem build

site: figures
	$(VENV)/bin/mkdocs build --strict --site-dir $(SITE)

book: setup
	$(PY) -m smallem build
	@# every chapter's measurement, in book order (the list is smallem.book.CHAPTERS)
	$(PY) -m smallem measure
	$(PY) -m smallem figures
	$(VENV)/bin/mkdocs build --strict --site-dir $(SITE)
	@echo
	@echo "The book is in $(SITE)/index.html. To read it, serve it and open the address:"
	@echo "    $(PY) -m http.server -d $(SITE)    # then http://127.0.0.1:8000/"

clean:
	rm -rf $(SITE) build
