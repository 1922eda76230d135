# Wraps CMake (as neovim's Makefile does). On a fresh Debian machine with the
# CUDA toolkit, `make run` and `make test` install what is missing (apt-get,
# when root), configure, build into build/ and run.
#
#   make run     build, then run the default preset's whole layer (moejit run; without a GPU it
#                only compiles the kernels into cache/)
#   make test    build, then run every test (GPU tests skip without a GPU)
#   make asan    the CPU tests under AddressSanitizer + UBSan (build-asan/)
#   make clean   remove build/
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CUDA_BIN := $(firstword $(wildcard $(CUDA_HOME)/bin /usr/local/cuda/bin))
export PATH := $(if $(CUDA_BIN),$(CUDA_BIN):,)$(PATH)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")
CMAKE_FLAGS ?=

.PHONY: all deps configure build run test asan clean

all: build

deps:
	@scripts/install-deps.sh

configure: deps
	@if [ ! -f $(BUILD_DIR)/CMakeCache.txt ]; then \
	  cmake -S . -B $(BUILD_DIR) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_FLAGS); \
	fi

build: configure
	cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	./$(BUILD_DIR)/moejit run --cache-dir cache
	./$(BUILD_DIR)/moejit info

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

asan: deps
	cmake -S . -B build-asan -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Debug \
	  -DMOEJIT_SANITIZE=address,undefined -DMOEJIT_BUILD_BENCH=OFF
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 ctest --test-dir build-asan -L cpu --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD_DIR)
