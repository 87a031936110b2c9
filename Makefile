# tokenmill build.
#
# One binary (build/tokenmill) from every src/**/*.c, plus one unit-test binary per
# tests/unit/test_*.c linked against the same objects (minus main.c).
#
#   make            optimised build (-O2, runtime SIMD dispatch: AVX2 / AVX-512 files are
#                   compiled with their own -m flags and only called when the CPU has them)
#   make san        the same under ASan + UBSan, in build/san/
#   make arm64      the aarch64 binary and kernel tests, cross-built in build/arm64/ (NEON
#                   kernels; scripts/test.sh runs them under qemu-aarch64)
#   make test       installs missing Debian/npm deps, builds both, runs every test
#   make run        the main job on the bundled model
#   make bench      side-by-side benchmark against llama.cpp (bench/engine)
#   make bench-serve tokenmill serve vs llama.cpp at 1, 4, 16 concurrent clients (bench/serve; --full adds 64)
#   make bench-cache block store throughput, the multi-turn agent workload and the isolated effective
#                   prefill speed-up on two real model shapes (bench/cache)
#   make bench-cluster disaggregated vs mixed workers vs serve under a mixed workload (bench/cluster)
#   make bench-chaos   a cluster under load while workers are killed / stopped / restarted (bench/chaos)
#   make fuzz       every libFuzzer target (tests/fuzz) for FUZZ_SECONDS each (default 60),
#                   built with clang into build/fuzz; FUZZ_TARGETS="gguf proto" picks some
#
# WERROR=1 turns warnings into errors (CI sets it via .ci/run).

CC      ?= cc
BUILD   ?= build
PKGS    := libpcre2-8 libcrypto jansson libmicrohttpd libisal
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)

WARN    := -Wall -Wextra -Wshadow -Wno-unused-parameter -Wstrict-prototypes -Wvla
ifeq ($(WERROR),1)
WARN    += -Werror
endif
OPT     ?= -O2 -g -fno-math-errno
CFLAGS_ALL = -std=gnu11 $(OPT) $(ARCH_CFLAGS) $(WARN) -pthread -Isrc -MMD -MP $(PKG_CFLAGS) $(EXTRA_CFLAGS)
LDLIBS  := $(PKG_LIBS) -lm -pthread

# The target's kernel files only: *_avx2.c / *_avx512.c on x86, *_neon.c on aarch64.
TARGET  := $(shell $(CC) -dumpmachine 2>/dev/null)
ifneq ($(filter aarch64%,$(TARGET)),)
ISA_SKIP := %_avx2.c %_avx512.c
# GCC fuses a*b+c into one multiply-add by default on aarch64 (x86-64's baseline has no FMA to
# fuse into): the scalar code would round differently from x86's, e.g. quant_nearest_int's
# magic-number rounding would see the unrounded product. The kernels fuse where they say so.
ARCH_CFLAGS := -ffp-contract=off
else
ISA_SKIP := %_neon.c
endif
SRCS    := $(filter-out $(ISA_SKIP),$(shell find src -name '*.c' | sort))
LIBSRCS := $(filter-out src/main.c,$(SRCS))
OBJS    := $(SRCS:%.c=$(BUILD)/%.o)
LIBOBJS := $(LIBSRCS:%.c=$(BUILD)/%.o)
TESTSRCS:= $(sort $(wildcard tests/unit/test_*.c))
TESTBINS:= $(TESTSRCS:tests/unit/%.c=$(BUILD)/tests/%)

# Per-file ISA flags: the kernels for one instruction set live in files named *_avx2.c /
# *_avx512.c / *_neon.c and are reached only through the dispatch table in ops.c. The NEON
# file's i8mm kernels enable that extension per function (and run only where HWCAP2 says).
AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c
NEON_FLAGS   := -march=armv8.2-a+dotprod

.PHONY: all san arm64 test test-unit test-e2e run bench bench-serve bench-cache bench-cluster bench-chaos deps clean fuzz fuzz-build fuzz-bins fuzz-seeds
all: $(BUILD)/tokenmill $(TESTBINS)

$(BUILD)/tokenmill: $(OBJS)
	$(CC) $(CFLAGS_ALL) -o $@ $^ $(LDLIBS)

$(BUILD)/tests/%: tests/unit/%.c $(LIBOBJS) tests/unit/harness.h
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -Itests/unit -o $@ $< $(LIBOBJS) $(LDLIBS)

$(BUILD)/%_avx2.o: %_avx2.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(AVX2_FLAGS) $(ISA_CFLAGS) -c -o $@ $<

$(BUILD)/%_avx512.o: %_avx512.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(AVX512_FLAGS) $(ISA_CFLAGS) -c -o $@ $<

$(BUILD)/%_neon.o: %_neon.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) $(NEON_FLAGS) $(ISA_CFLAGS) -c -o $@ $<

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c -o $@ $<

# Sanitizer build: a separate tree so both can coexist.
san:
	$(MAKE) BUILD=build/san OPT="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" all

# aarch64: cross-built with Debian's gcc-aarch64-linux-gnu into build/arm64 against the arm64
# libraries that scripts/deps.sh unpacks into build/arm64/sysroot, and run under qemu-user by
# scripts/test.sh (the binary and the kernel/model unit tests, ARM_TESTS; not the whole suite:
# the other modules hold no architecture-specific code). No -g: half the compile time.
ARM_CC      ?= aarch64-linux-gnu-gcc
ARM_SYSROOT := build/arm64/sysroot
ARM_LIBDIR  := $(ARM_SYSROOT)/usr/lib/aarch64-linux-gnu
ARM_TESTS   ?= ops quant engine model moe invariance threadpool
arm64:
	$(MAKE) BUILD=build/arm64 CC=$(ARM_CC) OPT="-O2 -fno-math-errno" \
	  PKG_CFLAGS="-isystem $(ARM_SYSROOT)/usr/include -isystem $(ARM_SYSROOT)/usr/include/aarch64-linux-gnu" \
	  PKG_LIBS="-L$(ARM_LIBDIR) -Wl,-rpath-link,$(ARM_LIBDIR) -lpcre2-8 -lcrypto -ljansson -lmicrohttpd -lisal" \
	  build/arm64/tokenmill $(ARM_TESTS:%=build/arm64/tests/test_%)

# Fuzzing: one libFuzzer binary per tests/fuzz/fuzz_*.c, linked against every library object
# compiled by clang with ASan + UBSan and coverage (fuzzer-no-link) in their own tree,
# build/fuzz, so the cc build above is untouched. `make fuzz` runs each target for
# FUZZ_SECONDS, growing build/fuzz/corpus/NAME from the seeds in tests/fuzz/corpus/NAME (the
# seeds are only read); a crash, leak, timeout or UB report stops the run and leaves the input
# as build/fuzz/crash-NAME-*. scripts/test.sh (make test) runs each target briefly.
CLANG        ?= clang
FUZZ_BUILD   := build/fuzz
FUZZ_SECONDS ?= 60
FUZZ_OPT     := -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
FUZZSRCS     := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_ALL     := $(FUZZSRCS:tests/fuzz/fuzz_%.c=%)
FUZZ_TARGETS ?= $(FUZZ_ALL)
FUZZ_TIMEOUT ?= 10

# The sub-make builds with clang into build/fuzz (its own object tree and .d files). The SIMD
# kernel files are left uninstrumented (ISA_CFLAGS): no target reaches them, and clang takes
# minutes to instrument their intrinsics.
fuzz-build:
	$(MAKE) BUILD=$(FUZZ_BUILD) CC=$(CLANG) OPT="$(FUZZ_OPT)" ISA_CFLAGS=-fno-sanitize=all fuzz-bins

fuzz-bins: $(FUZZSRCS:tests/fuzz/%.c=$(BUILD)/%)

$(BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(wildcard tests/fuzz/*.h) $(LIBOBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -fsanitize=fuzzer -Itests/fuzz -o $@ $< $(LIBOBJS) $(LDLIBS)

# Rewrites the binary seeds (GGUF files, frames, block files, conversations) with the
# project's own writers after a format change (tests/fuzz/seeds.c; built with cc).
fuzz-seeds: $(BUILD)/tools/fuzz-seeds
	$(BUILD)/tools/fuzz-seeds

$(BUILD)/tools/fuzz-seeds: tests/fuzz/seeds.c $(LIBOBJS)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -o $@ $< $(LIBOBJS) $(LDLIBS)

fuzz: deps fuzz-build
	@set -e; for t in $(FUZZ_TARGETS); do \
	  mkdir -p $(FUZZ_BUILD)/corpus/$$t; \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  $(FUZZ_BUILD)/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -timeout=$(FUZZ_TIMEOUT) -rss_limit_mb=4096 \
	    -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/crash-$$t- \
	    $(FUZZ_BUILD)/corpus/$$t tests/fuzz/corpus/$$t; \
	done

deps:
	@scripts/deps.sh

# The four builds are independent trees (build/, build/san/, build/fuzz/, build/arm64/), so one make
# builds them side by side on every core (JOBS, default all of them): on a 2-core CI runner
# the serial builds were a third of `make test`'s time. A -j given to `make test` itself wins
# (its jobserver is passed down).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
test: deps
	$(MAKE) $(if $(filter -j%,$(MAKEFLAGS)),,-j$(JOBS)) all san fuzz-build arm64
	@scripts/test.sh

run: deps
	$(MAKE) all
	@scripts/run.sh

bench: deps
	$(MAKE) all
	@bench/engine

bench-serve: deps
	$(MAKE) all
	@bench/serve

bench-cache: deps
	$(MAKE) all
	@bench/cache

bench-cluster: deps
	$(MAKE) all
	@bench/cluster

bench-chaos: deps
	$(MAKE) all
	@bench/chaos $(CHAOS_ARGS)

clean:
	rm -rf build

-include $(shell find $(BUILD) -name "*.d" 2>/dev/null)
