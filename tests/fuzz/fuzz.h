/*
 * fuzz: what the libFuzzer targets in tests/fuzz share. Each fuzz_NAME.c defines
 * LLVMFuzzerTestOneInput (and, when it needs a vocabulary or a server made once,
 * LLVMFuzzerInitialize) and stays thin: it feeds the bytes to a module's public entry point and
 * lets ASan/UBSan/LeakSanitizer judge. See docs/fuzzing.md.
 *
 * Paths are relative to the repository root, where `make fuzz` and scripts/test.sh run the
 * targets. A target whose optional data (tests/data/llama.cpp, fetched by
 * scripts/fetch-testdata.sh) is missing fuzzes with what it has.
 */
#ifndef TM_FUZZ_H
#define TM_FUZZ_H

#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ftw.h>
#include <sys/mman.h>
#include <unistd.h>

#include "util/util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv);

/* Modules log rejected input at WARN; a fuzzer feeds little else. */
static inline void fuzz_quiet(void) { util_log_level = LOG_LEVEL_ERROR; }

/* Aborts the target with a message: a harness that cannot set up must not pass silently. */
static inline void fuzz_die(const char *what, const char *err)
{
    fprintf(stderr, "fuzz: %s: %s\n", what, err ? err : "");
    abort();
}

/* An in-memory file (memfd) for readers that take a path: fuzz_file_set replaces its bytes,
 * fuzz_file_path names it as /proc/self/fd/N. No disk I/O per input. */
typedef struct {
    int fd;
    char path[64];
} fuzz_file;

static inline void fuzz_file_init(fuzz_file *f, const char *name)
{
    f->fd = memfd_create(name, 0);
    if (f->fd < 0) fuzz_die("memfd_create", name);
    snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
}

static inline void fuzz_file_set(fuzz_file *f, const uint8_t *data, size_t size)
{
    if (ftruncate(f->fd, 0) != 0 || (size && pwrite(f->fd, data, size, 0) != (ssize_t)size))
        fuzz_die("memfd write", f->path);
}

static char fuzz_tmpdir_path[64];

static inline int fuzz_tmpdir_rm(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    remove(path);   /* keep going: remove what can be removed */
    return 0;
}

static inline void fuzz_tmpdir_remove(void) { nftw(fuzz_tmpdir_path, fuzz_tmpdir_rm, 16, FTW_DEPTH | FTW_PHYS); }

/* A scratch directory for the target's life (under /dev/shm when it exists: RAM), removed with
 * what it holds when the target exits. */
static inline const char *fuzz_tmpdir(void)
{
    char *dir = fuzz_tmpdir_path;
    if (dir[0]) return dir;
    snprintf(dir, sizeof fuzz_tmpdir_path, "%s/tmfuzz.XXXXXX", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
    if (!mkdtemp(dir)) fuzz_die("mkdtemp", dir);
    atexit(fuzz_tmpdir_remove);
    return dir;
}

#endif
