# Wraps CMake (as neovim's Makefile does). On a fresh Debian machine with the
# CUDA toolkit, `make run` and `make test` install what is missing (apt-get,
# when root), configure, build into build/ and run.
#
#   make run     build, then run the default preset's whole layer (moejit run; without a GPU it
#                only compiles the kernels into cache/)
#   make test    build, then run every test (GPU tests skip without a GPU)
#   make asan    the CPU tests under AddressSanitizer + UBSan (build-asan/)
#   make tsan    the stress programs (tests/stress/) under ThreadSanitizer (build-tsan/)
#   make fuzz    FUZZ_MINUTES=N (default 5) of libFuzzer per harness (clang, ASan+UBSan;
#                build-fuzz/), then executions, coverage and crashes per harness
#   make fuzz-merge  add the inputs make fuzz found that reach new code to tests/fuzz/corpus/
#   make clean   remove build/
BUILD_DIR ?= build
BUILD_TYPE ?= RelWithDebInfo
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
CUDA_BIN := $(firstword $(wildcard $(CUDA_HOME)/bin /usr/local/cuda/bin))
export PATH := $(if $(CUDA_BIN),$(CUDA_BIN):,)$(PATH)
GENERATOR := $(shell command -v ninja >/dev/null 2>&1 && echo Ninja || echo "Unix Makefiles")
CMAKE_FLAGS ?=
# CUDA::nvrtc drags in the libcuda stub; the library dlopens the driver, so
# keep it out of sanitized binaries (gcc with ASan and clang would record it
# and then not start on a machine without a driver).
AS_NEEDED := -DCMAKE_EXE_LINKER_FLAGS=-Wl,--as-needed -DCMAKE_SHARED_LINKER_FLAGS=-Wl,--as-needed
FUZZ_MINUTES ?= 5
FUZZ_SECONDS ?= $(shell echo $$(( $(FUZZ_MINUTES) * 60 )))
FUZZ_BUILD_DIR ?= build-fuzz
FUZZ_HARNESSES ?= config cache_entry tuned_table

.PHONY: all deps configure build run test asan tsan fuzz-build fuzz fuzz-merge clean

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
	./$(BUILD_DIR)/moejit info --cache-dir cache

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

# install.consumer links the sanitized library into an unsanitized program,
# which ASan refuses to start (make test runs it). test_badargs is a GPU test
# with a no-GPU half (launch checks against a fake driver), run here too.
asan: deps
	cmake -S . -B build-asan -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=Debug \
	  -DMOEJIT_SANITIZE=address,undefined -DMOEJIT_BUILD_BENCH=OFF $(AS_NEEDED)
	cmake --build build-asan -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 ctest --test-dir build-asan -L cpu -E install.consumer \
	  --output-on-failure -j $(JOBS)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 ctest --test-dir build-asan -R gpu.test_badargs \
	  --output-on-failure

# Criterion cannot start under ThreadSanitizer, so only the stress programs
# run here: threads on one cache directory, and on one expert-parallel
# communicator's abort. halt_on_error: a report fails the run.
STRESS_TARGETS := $(patsubst tests/stress/%.c,%,$(wildcard tests/stress/stress_*.c))
tsan: deps
	cmake -S . -B build-tsan -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DMOEJIT_SANITIZE=thread -DMOEJIT_BUILD_BENCH=OFF $(AS_NEEDED)
	cmake --build build-tsan -j $(JOBS) --target $(STRESS_TARGETS)
	TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 ctest --test-dir build-tsan -L stress \
	  --output-on-failure

# The library is built with coverage instrumentation (fuzzer-no-link) so that
# libFuzzer sees into it; tests and benchmarks are not needed there.
fuzz-build:
	@scripts/install-deps.sh fuzz
	CC=clang cmake -S . -B $(FUZZ_BUILD_DIR) -G "$(GENERATOR)" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
	  -DMOEJIT_SANITIZE=address,undefined,fuzzer-no-link -DMOEJIT_FUZZ=ON \
	  -DMOEJIT_BUILD_TESTS=OFF -DMOEJIT_BUILD_BENCH=OFF $(AS_NEEDED)
	cmake --build $(FUZZ_BUILD_DIR) -j $(JOBS) --target $(addprefix fuzz_,$(FUZZ_HARNESSES))

fuzz: fuzz-build
	tests/fuzz/run-fuzzers.sh $(FUZZ_BUILD_DIR) $(FUZZ_SECONDS) $(FUZZ_HARNESSES)

fuzz-merge: fuzz-build
	for h in $(FUZZ_HARNESSES); do \
	  mkdir -p $(FUZZ_BUILD_DIR)/fuzz-corpus/$$h && \
	  $(FUZZ_BUILD_DIR)/tests/fuzz/fuzz_$$h -merge=1 tests/fuzz/corpus/$$h $(FUZZ_BUILD_DIR)/fuzz-corpus/$$h \
	    >$(FUZZ_BUILD_DIR)/fuzz-merge-$$h.log 2>&1 || exit 1; \
	  echo "$$h: $$(ls tests/fuzz/corpus/$$h | wc -l) inputs in tests/fuzz/corpus/$$h"; \
	done

clean:
	rm -rf $(BUILD_DIR)
