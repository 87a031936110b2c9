/*
 * test_topo: the topology reader and thread placement on synthetic sysfs trees (2 sockets x
 * 32 cores x SMT2 on two NUMA nodes, numbered as Linux does: the second threads of the cores
 * after all first threads; offline CPUs; a cgroup-restricted allowed mask; a tree without
 * sibling lists or node directories), CPU list parsing, bad trees and lists refused with a
 * message, and the thread pool pinning each thread to its CPU.
 */
#define _GNU_SOURCE
#include "harness.h"

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "util/threadpool.h"
#include "util/topo.h"

static char tmpdir[] = "/tmp/tm_test_topo_XXXXXX";

static void put(const char *root, const char *rel, const char *text)
{
    char path[512], dir[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    /* mkdir -p of the parents */
    for (char *p = path + 1; *p; p++)
        if (*p == '/') {
            snprintf(dir, sizeof dir, "%.*s", (int)(p - path), path);
            mkdir(dir, 0755);
        }
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* 2 packages x 32 cores x 2 threads: CPU c < 64 is core c's first thread (package c / 32),
 * c + 64 its sibling; node k holds package k. offline: CPUs without a topology directory. */
static void mk_2s(const char *root, bool siblings_files, bool nodes, const char *online)
{
    char rel[256], v[64];
    put(root, "devices/system/cpu/online", online);
    for (int c = 0; c < 128; c++) {
        int core = c % 64, pkg = core / 32;
        if (c == 100 || c == 7) continue;   /* offline: no topology */
        snprintf(rel, sizeof rel, "devices/system/cpu/cpu%d/topology/core_id", c);
        snprintf(v, sizeof v, "%d\n", core % 32);
        put(root, rel, v);
        snprintf(rel, sizeof rel, "devices/system/cpu/cpu%d/topology/physical_package_id", c);
        snprintf(v, sizeof v, "%d\n", pkg);
        put(root, rel, v);
        if (siblings_files) {
            snprintf(rel, sizeof rel, "devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
            snprintf(v, sizeof v, "%d,%d\n", core, core + 64);
            put(root, rel, v);
        }
    }
    if (nodes) {
        put(root, "devices/system/node/node0/cpulist", "0-31,64-95\n");
        put(root, "devices/system/node/node1/cpulist", "32-63,96-127\n");
        put(root, "devices/system/node/possible", "0-1\n");   /* not a node directory */
    }
}

static bool list(const char *z, bool *mask) { return topo_parse_list(z, mask, NULL, 0) == TOPO_OK; }

TEST(test_parse_list)
{
    static bool m[TOPO_MAX_CPUS];
    char err[200];
    CHECK(list("0-3,8,10-11\n", m));
    int n = 0;
    for (int c = 0; c < TOPO_MAX_CPUS; c++) n += m[c];
    CHECK(n == 7 && m[0] && m[3] && !m[4] && m[8] && m[11] && !m[12]);
    CHECK(list("1023", m) && m[1023]);
    const char *bad[] = { "", "x", "3-1", "1,,2", "1024", "0-", "-3", "1 2", "99999999999", "1-2-3" };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = 0;
        CHECKF(topo_parse_list(bad[i], m, err, sizeof err) == TOPO_ERR_LIST && err[0], "'%s'", bad[i]);
    }
}

static bool *mask_of(const char *z)
{
    static bool m[4][TOPO_MAX_CPUS];
    static int k;
    bool *p = m[k++ % 4];
    list(z, p);
    return p;
}

TEST(test_two_sockets_smt)
{
    char root[300];
    snprintf(root, sizeof root, "%s/two", tmpdir);
    mk_2s(root, true, true, "0-127\n");
    static topo t;
    static int out[TOPO_MAX_CPUS];
    char err[200], line[512];
    CHECK(topo_read(root, NULL, NULL, &t, err, sizeof err) == TOPO_OK);
    CHECKF(t.n == 126 && t.n_cores == 64 && t.n_nodes == 2, "%d %d %d", t.n, t.n_cores, t.n_nodes);
    /* default: one thread per physical core, the nodes alternating */
    int n = topo_place(&t, 0, out);
    CHECK(n == 64);
    CHECK(out[0] == 0 && out[1] == 32 && out[2] == 1 && out[3] == 33);
    bool seen[128] = { 0 }, dup = false, smt = false;
    for (int i = 0; i < n; i++) {
        dup |= seen[out[i]];
        seen[out[i]] = true;
        smt |= out[i] >= 64 && out[i] != 71 && out[i] != 100;
    }
    /* core 7's first thread is offline: its sibling 71 is its only thread */
    CHECK(!dup && !smt && seen[71] && !seen[7]);
    /* 8 threads: 4 cores per node */
    n = topo_place(&t, 8, out);
    int want8[] = { 0, 32, 1, 33, 2, 34, 3, 35 };
    CHECK(n == 8 && !memcmp(out, want8, sizeof want8));
    topo_describe(&t, out, n, line, sizeof line);
    CHECKF(strstr(line, "8 threads on CPUs 0,32,1,33,2,34,3,35: 8 of 64 physical cores, 0 SMT siblings, 2 of 2 NUMA nodes"), "%s", line);
    /* past the cores: second threads, alternating too */
    n = topo_place(&t, 66, out);
    CHECKF(out[64] == 64 && out[65] == 96, "%d %d", out[64], out[65]);
    topo_describe(&t, out, n, line, sizeof line);
    CHECKF(strstr(line, "64 of 64 physical cores, 2 SMT siblings"), "%s", line);
    /* every usable CPU once, then wrapping around */
    n = topo_place(&t, 130, out);
    CHECK(n == 130 && out[126] == out[0] && out[129] == out[3]);
}

TEST(test_offline_and_cgroup)
{
    char root[300], err[200];
    snprintf(root, sizeof root, "%s/off", tmpdir);
    /* CPUs 16-31 and 80-95 offline (not in the online list), 7 and 100 without topology */
    mk_2s(root, true, true, "0-15,32-79,96-127\n");
    static topo t;
    static int out[TOPO_MAX_CPUS];
    CHECK(topo_read(root, NULL, NULL, &t, err, sizeof err) == TOPO_OK);
    CHECKF(t.n == 94 && t.n_cores == 48, "%d %d", t.n, t.n_cores);
    int n = topo_place(&t, 0, out);
    CHECK(n == 48);
    for (int i = 0; i < t.n; i++) CHECK(!(t.cpus[i].cpu >= 16 && t.cpus[i].cpu < 32) && t.cpus[i].cpu != 7);
    /* a cgroup cpuset of 4 cores with their siblings, on node 1 */
    bool *allowed = mask_of("40-43,104-107");
    CHECK(topo_read(root, allowed, NULL, &t, err, sizeof err) == TOPO_OK);
    CHECK(t.n == 8 && t.n_cores == 4 && t.n_nodes == 1);
    n = topo_place(&t, 0, out);
    CHECK(n == 4 && out[0] == 40 && out[3] == 43);
    n = topo_place(&t, 8, out);
    CHECK(n == 8 && out[4] == 104 && out[7] == 107);
    /* --cpus within it narrows further; outside it leaves nothing */
    CHECK(topo_read(root, allowed, mask_of("41,105"), &t, err, sizeof err) == TOPO_OK);
    CHECK(t.n == 2 && t.n_cores == 1 && topo_place(&t, 0, out) == 1 && out[0] == 41);
    err[0] = 0;
    CHECK(topo_read(root, allowed, mask_of("0-3"), &t, err, sizeof err) == TOPO_ERR_EMPTY && err[0]);
}

TEST(test_fallbacks_and_bad_trees)
{
    char root[300], err[200];
    static topo t;
    static int out[TOPO_MAX_CPUS];
    /* no sibling lists, no node directories: cores from package + core id, one node */
    snprintf(root, sizeof root, "%s/plain", tmpdir);
    mk_2s(root, false, false, "0-127");
    CHECK(topo_read(root, NULL, NULL, &t, err, sizeof err) == TOPO_OK);
    CHECKF(t.n == 126 && t.n_cores == 64 && t.n_nodes == 1, "%d %d %d", t.n, t.n_cores, t.n_nodes);
    int n = topo_place(&t, 3, out);
    CHECK(n == 3 && out[0] == 0 && out[1] == 1 && out[2] == 2);
    /* no tree, a garbled online list, a sibling list out of range */
    err[0] = 0;
    snprintf(root, sizeof root, "%s/none", tmpdir);
    CHECK(topo_read(root, NULL, NULL, &t, err, sizeof err) == TOPO_ERR_IO && err[0]);
    snprintf(root, sizeof root, "%s/garbled", tmpdir);
    put(root, "devices/system/cpu/online", "0-3,zz\n");
    CHECK(topo_read(root, NULL, NULL, &t, err, sizeof err) == TOPO_ERR_IO);
    snprintf(root, sizeof root, "%s/odd", tmpdir);
    put(root, "devices/system/cpu/online", "0-1\n");
    put(root, "devices/system/cpu/cpu0/topology/thread_siblings_list", "0,5000\n");
    put(root, "devices/system/cpu/cpu1/topology/thread_siblings_list", "\n");
    put(root, "devices/system/node/node99999/cpulist", "0-1\n");
    CHECK(topo_read(root, NULL, NULL, &t, err, sizeof err) == TOPO_ERR_EMPTY);   /* neither CPU has a usable core */
}

typedef struct {
    const int *cpus;
    int ok[4];
} pin_ctx;

static void pin_job(void *arg, int ith, int nth)
{
    pin_ctx *c = arg;
    (void)nth;
    cpu_set_t set;
    CPU_ZERO(&set);
    c->ok[ith] = pthread_getaffinity_np(pthread_self(), sizeof set, &set) == 0 && CPU_COUNT(&set) == 1 &&
                 CPU_ISSET(c->cpus[ith], &set);
}

/* Runs on the real machine: each thread of a pinned pool may run on its CPU only. */
TEST(test_pool_pinning)
{
    static bool allowed[TOPO_MAX_CPUS];
    CHECK(topo_allowed(allowed));
    int a = -1, b = -1;
    for (int c = 0; c < TOPO_MAX_CPUS; c++)
        if (allowed[c]) {
            if (a < 0) a = c;
            else if (b < 0) b = c;
        }
    if (b < 0) b = a;
    int cpus[2] = { b, a };
    pthread_t self = pthread_self();
    cpu_set_t before;
    pthread_getaffinity_np(self, sizeof before, &before);
    threadpool *tp = threadpool_new_pinned(2, cpus);
    CHECK(tp);
    pin_ctx c = { .cpus = cpus };
    for (int r = 0; r < 3 && tp; r++) {
        memset(c.ok, 0, sizeof c.ok);
        threadpool_run(tp, pin_job, &c);
        CHECK(c.ok[0] && c.ok[1]);
    }
    threadpool_free(tp);
    pthread_setaffinity_np(self, sizeof before, &before);   /* the caller was pinned to cpus[0] */
}

int main(void)
{
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_parse_list);
    RUN(test_two_sockets_smt);
    RUN(test_offline_and_cgroup);
    RUN(test_fallbacks_and_bad_trees);
    RUN(test_pool_pinning);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd)) return 1;
    printf("%d passed, %d failed\n", harness_passed, harness_failed);
    return harness_failed ? 1 : 0;
}
