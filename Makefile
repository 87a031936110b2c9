# tokenmill build.
#
# One binary (build/tokenmill) from every src/**/*.c, plus one unit-test binary per
# tests/unit/test_*.c linked against the same objects (minus main.c).
#
#   make            optimised build (-O2, runtime SIMD dispatch: AVX2 / AVX-512 files are
#                   compiled with their own -m flags and only called when the CPU has them)
#   make san        the same under ASan + UBSan, in build/san/
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
CFLAGS_ALL = -std=gnu11 $(OPT) $(WARN) -pthread -Isrc -MMD -MP $(PKG_CFLAGS) $(EXTRA_CFLAGS)
LDLIBS  := $(PKG_LIBS) -lm -pthread

SRCS    := $(shell find src -name '*.c' | sort)
LIBSRCS := $(filter-out src/main.c,$(SRCS))
OBJS    := $(SRCS:%.c=$(BUILD)/%.o)
LIBOBJS := $(LIBSRCS:%.c=$(BUILD)/%.o)
TESTSRCS:= $(sort $(wildcard tests/unit/test_*.c))
TESTBINS:= $(TESTSRCS:tests/unit/%.c=$(BUILD)/tests/%)

# Per-file ISA flags: the kernels for one instruction set live in files named *_avx2.c /
# *_avx512.c and are reached only through the dispatch table in ops.c.
AVX2_FLAGS   := -mavx2 -mfma -mf16c
AVX512_FLAGS := -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx2 -mfma -mf16c

.PHONY: all san test test-unit test-e2e run bench bench-serve bench-cache bench-cluster bench-chaos deps clean fuzz fuzz-build fuzz-bins fuzz-seeds
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

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS_ALL) -c -o $@ $<

# Sanitizer build: a separate tree so both can coexist.
san:
	$(MAKE) BUILD=build/san OPT="-O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=undefined" all

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

# The three builds are independent trees (build/, build/san/, build/fuzz/), so one make
# builds them side by side on every core (JOBS, default all of them): on a 2-core CI runner
# the serial builds were a third of `make test`'s time. A -j given to `make test` itself wins
# (its jobserver is passed down).
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
test: deps
	$(MAKE) $(if $(filter -j%,$(MAKEFLAGS)),,-j$(JOBS)) all san fuzz-build
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
