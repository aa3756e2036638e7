# Thin wrapper over CMake. `make demo` and `make test` work on a fresh Debian
# machine: they install missing packages first (scripts/deps.sh, idempotent).
BUILD      ?= build
ASAN_BUILD ?= build-asan
FUZZ_BUILD ?= build-fuzz
JOBS       ?= $(shell nproc)
PREFIX     ?= /usr/local
CMAKE_ARGS ?=
CIFAR      ?= ../shared/data/cifar10

.PHONY: all build deps test test-unit test-sanitize demo demo-cifar bench install fuzz format clean

all: build

build:
	@cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_ARGS) >/dev/null
	@cmake --build $(BUILD) -j $(JOBS) -- --no-print-directory -s

deps:
	@bash scripts/deps.sh

# Every test: unit, gradient checks, PyTorch parity, CLI, fuzz-corpus replay.
test: deps build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# Unit tests only (fast).
test-unit: build
	@cd $(BUILD) && ctest --output-on-failure -j $(JOBS) -L unit

# The unit tests again under AddressSanitizer and UndefinedBehaviorSanitizer, warnings as errors.
# A failed test runs once more (--repeat until-pass:2) and its first failure stays in the log: once in
# about twenty sanitized runs a rank of test_shm's 5-rank world stalled for its whole 30 s deadline on
# the 2 shared cores, which no run outside the sanitizer has shown; a real failure fails twice.
test-sanitize: deps
	@cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=Debug -DDT_SANITIZE=ON -DDT_WERROR=ON >/dev/null
	@cmake --build $(ASAN_BUILD) -j $(JOBS)
	@cd $(ASAN_BUILD) && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS) -L unit --repeat until-pass:2

# Train fashioncnn on Fashion-MNIST with DDP on 2 local workers (dtrun) and print the summary.
demo: deps build
	@$(BUILD)/dtrun --standalone --nproc-per-node 2 -- $(BUILD)/dtrain train --strategy ddp \
	  --model fashioncnn --data fashion-mnist --epochs 1 --batch-size 64 \
	  --optimizer sgd --lr 0.01 --momentum 0.9 --out runs/demo --overwrite

# Train resnet20 on 8,000 CIFAR-10 images (800 a class, --augment cifar) with DDP on 2 local workers
# and test it on 1,000; CIFAR names the image folder (train/ and test/ of <class>/*.jpg).
demo-cifar: deps build
	@bash scripts/demo_cifar.sh $(BUILD) $(CIFAR)

bench: deps build
	@bash bench/run_all.sh $(BUILD)

install: build
	@cmake --install $(BUILD)

# libFuzzer targets (clang): build-fuzz/tests/fuzz_*; run e.g. build-fuzz/tests/fuzz_idx -max_total_time=60
fuzz:
	@command -v clang >/dev/null || { echo "make fuzz: needs clang (apt-get install clang libclang-rt-dev; make deps does it)" >&2; exit 1; }
	@CC=clang cmake -S . -B $(FUZZ_BUILD) -DCMAKE_BUILD_TYPE=Debug -DDT_FUZZ=ON >/dev/null
	@cmake --build $(FUZZ_BUILD) -j $(JOBS)

format:
	@clang-format -i include/dtrain/*.h src/*/*.[ch] tools/*.c tests/*/*.[ch] examples/*.c

clean:
	@rm -rf $(BUILD) $(ASAN_BUILD) $(FUZZ_BUILD)
