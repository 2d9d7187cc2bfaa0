# The two commands of the README:
#   make test   set up .venv, make figures from the committed records, run every test
#   make book   set up .venv, bring the peers (PyTorch, llama.cpp), measure this machine,
#               redraw the figures, build the site
#
# Set-up is a stamp file: the first run creates .venv and installs the package with its book and
# test extras; later runs skip that until pyproject.toml changes.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.smallem-installed
SITE   := site

export NO_MKDOCS_2_WARNING := 1

.PHONY: setup test book chromium cross simde torch llama peers figures build site clean

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
# (SMALLEM_EMULATE=avx512; see smallem/cpu/isa.py). Best effort: without them those runs are skipped.
simde:
	@if echo '#include <simde/x86/avx512.h>' | $${CC:-cc} -E -x c - >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing libsimde-dev for the emulated AVX-512 tests"; \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -q libsimde-dev >/dev/null \
	  || { DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null \
	       && DEBIAN_FRONTEND=noninteractive apt-get install -y -q libsimde-dev >/dev/null; } \
	  || echo "could not install libsimde-dev: the emulated AVX-512 tests will be skipped"; \
	fi

# The peers the chapters measure against, never dependencies of the library:
# - PyTorch (CPU, pinned) into .venv: chapter 3's training steps and chapter 4's decoders;
# - llama.cpp's llama-bench, llama-simple and llama-quantize, built once per machine into the
#   kernel cache (`smallem llama`: the sdist of llama-cpp-python, its instruction sets named
#   and AMX left out, checked on quantised files right after building; `smallem llama --where`
#   prints the folder). A second clone on the same machine finds it built.
# `make book` brings both; `make book PEERS=0` skips them (the chapters then say "not measured").
# Neither stops the book: a peer that cannot be installed or built is said and left out.
TORCH ?= 2.13.0
PEERS ?= 1
torch: setup
	@$(PY) -c "import torch" 2>/dev/null \
	  || { echo "installing torch==$(TORCH) (CPU) into $(VENV): the peer of chapters 3 and 4"; \
	       $(PY) -m pip install --quiet torch==$(TORCH) \
	       || echo "could not install torch==$(TORCH): chapters 3 and 4 will say PyTorch was not measured"; }

llama: setup
	@command -v cmake >/dev/null || $(PY) -m pip install --quiet cmake
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(PY) -m smallem llama

peers: torch
	@$(MAKE) --no-print-directory llama \
	  || echo "llama.cpp could not be built or run here (above): the chapters will say why it was not measured"

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
	@if [ "$(PEERS)" != 0 ]; then $(MAKE) --no-print-directory peers; \
	 else echo "PEERS=0: PyTorch and llama.cpp are not brought; their rows will read 'not measured'"; fi
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
