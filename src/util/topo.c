/*
 * topo: see topo.h. Every file read is bounded (4 KiB per sysfs file: a cpulist of 1024 CPUs
 * in ranges fits), every number checked against TOPO_MAX_CPUS, so that a strange tree gives
 * an error or fewer CPUs, never a read out of bounds.
 */
#define _GNU_SOURCE
#include "util/topo.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOPO_FILE_MAX 4096

static topo_status topo_fail(char *err, size_t errsz, topo_status st, const char *fmt, const char *arg)
{
    if (errsz) snprintf(err, errsz, fmt, arg);
    return st;
}

/* Reads root/rel into buf (NUL-terminated, trailing newline kept); false if unreadable. */
static bool topo_file(const char *root, const char *rel, char *buf, size_t sz)
{
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/%s", root, rel) >= sizeof path) return false;
    FILE *f = fopen(path, "r");
    if (!f) return false;
    size_t n = fread(buf, 1, sz - 1, f);
    fclose(f);
    buf[n] = '\0';
    return n > 0;
}

/* A non-negative decimal below TOPO_MAX_CPUS at *p; advances *p. -1 if none. */
static int topo_num(const char **p)
{
    const char *s = *p;
    long v = 0;
    int nd = 0;
    while (*s >= '0' && *s <= '9' && nd < 6) v = v * 10 + (*s++ - '0'), nd++;
    if (nd == 0 || v >= TOPO_MAX_CPUS || (*s >= '0' && *s <= '9')) return -1;
    *p = s;
    return (int)v;
}

topo_status topo_parse_list(const char *z, bool *mask, char *err, size_t errsz)
{
    memset(mask, 0, TOPO_MAX_CPUS * sizeof *mask);
    const char *p = z;
    while (*p == ' ') p++;
    if (!*p || *p == '\n') return topo_fail(err, errsz, TOPO_ERR_LIST, "empty CPU list%s", "");
    for (;;) {
        int a = topo_num(&p), b = a;
        if (a >= 0 && *p == '-') {
            p++;
            b = topo_num(&p);
        }
        if (a < 0 || b < a)
            return topo_fail(err, errsz, TOPO_ERR_LIST,
                             "bad CPU list '%s' (want ids below 1024 and ranges like 0-3,8,10-11)", z);
        for (int c = a; c <= b; c++) mask[c] = true;
        if (*p == ',') {
            p++;
            continue;
        }
        while (*p == '\n' || *p == ' ') p++;
        if (*p) return topo_fail(err, errsz, TOPO_ERR_LIST, "bad CPU list '%s' (want ids below 1024 and ranges like 0-3,8,10-11)", z);
        return TOPO_OK;
    }
}

/* The lowest CPU of a list file, or -1. */
static int topo_first(const char *root, const char *rel)
{
    char buf[TOPO_FILE_MAX];
    bool *mask = calloc(TOPO_MAX_CPUS, sizeof *mask);
    if (!mask) return -1;
    int first = -1;
    if (topo_file(root, rel, buf, sizeof buf) && topo_parse_list(buf, mask, NULL, 0) == TOPO_OK)
        for (int c = 0; c < TOPO_MAX_CPUS && first < 0; c++)
            if (mask[c]) first = c;
    free(mask);
    return first;
}

static int topo_int_file(const char *root, const char *rel)
{
    char buf[64];
    if (!topo_file(root, rel, buf, sizeof buf)) return -1;
    char *end;
    long v = strtol(buf, &end, 10);
    return end == buf || v < 0 || v > 1000000 ? -1 : (int)v;
}

topo_status topo_read(const char *root, const bool *allowed, const bool *only, topo *t, char *err, size_t errsz)
{
    memset(t, 0, sizeof *t);
    char buf[TOPO_FILE_MAX], rel[256];
    bool *online = calloc(TOPO_MAX_CPUS, sizeof *online);
    int *node_of = malloc(TOPO_MAX_CPUS * sizeof *node_of);
    int *pkg_core = malloc(TOPO_MAX_CPUS * 2 * sizeof *pkg_core);   /* fallback core keys */
    topo_status st = TOPO_OK;
    if (!online || !node_of || !pkg_core) {
        st = topo_fail(err, errsz, TOPO_ERR_IO, "out of memory%s", "");
        goto out;
    }
    if (!topo_file(root, "devices/system/cpu/online", buf, sizeof buf) ||
        topo_parse_list(buf, online, NULL, 0) != TOPO_OK) {
        st = topo_fail(err, errsz, TOPO_ERR_IO, "cannot read the online CPUs under %s", root);
        goto out;
    }
    for (int c = 0; c < TOPO_MAX_CPUS; c++) node_of[c] = 0;
    /* NUMA nodes: node<k>/cpulist; none at all means one node */
    snprintf(rel, sizeof rel, "%s/devices/system/node", root);
    DIR *d = opendir(rel);
    if (d) {
        struct dirent *de;
        bool *mask = calloc(TOPO_MAX_CPUS, sizeof *mask);
        while (mask && (de = readdir(d))) {
            const char *p = de->d_name;
            if (strncmp(p, "node", 4) != 0) continue;
            p += 4;
            int k = topo_num(&p);
            if (k < 0 || *p) continue;
            snprintf(rel, sizeof rel, "devices/system/node/node%d/cpulist", k);
            if (!topo_file(root, rel, buf, sizeof buf) || topo_parse_list(buf, mask, NULL, 0) != TOPO_OK) continue;
            for (int c = 0; c < TOPO_MAX_CPUS; c++)
                if (mask[c]) node_of[c] = k;
        }
        free(mask);
        closedir(d);
    }
    for (int c = 0; c < TOPO_MAX_CPUS; c++) {
        if (!online[c] || (allowed && !allowed[c]) || (only && !only[c])) continue;
        snprintf(rel, sizeof rel, "devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
        int core = topo_first(root, rel);
        if (core < 0) {
            /* no sibling list: the package and core ids name the core */
            snprintf(rel, sizeof rel, "devices/system/cpu/cpu%d/topology/core_id", c);
            int cid = topo_int_file(root, rel);
            snprintf(rel, sizeof rel, "devices/system/cpu/cpu%d/topology/physical_package_id", c);
            int pid = topo_int_file(root, rel);
            if (cid < 0 || pid < 0) continue;   /* no topology: not a usable CPU (offline) */
            core = c;
            for (int i = 0; i < t->n; i++)
                if (pkg_core[2 * i] == pid && pkg_core[2 * i + 1] == cid) {
                    core = t->cpus[i].core;
                    break;
                }
            pkg_core[2 * t->n] = pid, pkg_core[2 * t->n + 1] = cid;
        } else {
            pkg_core[2 * t->n] = -1, pkg_core[2 * t->n + 1] = -1;
        }
        t->cpus[t->n++] = (topo_cpu){ .cpu = c, .core = core, .node = node_of[c] };
    }
    if (t->n == 0) {
        st = topo_fail(err, errsz, TOPO_ERR_EMPTY, "no usable CPU (the CPU list, the allowed CPUs and the online ones do not meet)%s", "");
        goto out;
    }
    /* SMT ranks, cores and nodes */
    for (int i = 0; i < t->n; i++) {
        int r = 0;
        bool new_core = true, new_node = true;
        for (int k = 0; k < i; k++) {
            if (t->cpus[k].core == t->cpus[i].core) r++, new_core = false;
            if (t->cpus[k].node == t->cpus[i].node) new_node = false;
        }
        t->cpus[i].smt = r;
        t->n_cores += new_core;
        t->n_nodes += new_node;
    }
out:
    free(online);
    free(node_of);
    free(pkg_core);
    return st;
}

bool topo_allowed(bool *allowed)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) != 0) return false;
    for (int c = 0; c < TOPO_MAX_CPUS; c++) allowed[c] = CPU_ISSET(c, &set);
    return true;
}

int topo_place(const topo *t, int n, int *out)
{
    if (t->n == 0) return 0;
    if (n <= 0) n = t->n_cores;
    /* distinct nodes in ascending id order */
    int nodes[TOPO_MAX_CPUS], n_nodes = 0;
    for (int i = 0; i < t->n; i++) {
        bool seen = false;
        for (int k = 0; k < n_nodes && !seen; k++) seen = nodes[k] == t->cpus[i].node;
        if (!seen) nodes[n_nodes++] = t->cpus[i].node;
    }
    for (int a = 1; a < n_nodes; a++)
        for (int b = a; b > 0 && nodes[b - 1] > nodes[b]; b--) {
            int x = nodes[b];
            nodes[b] = nodes[b - 1], nodes[b - 1] = x;
        }
    /* rank by rank (SMT 0 first), the nodes round-robin, each node's CPUs of that rank in id
     * order */
    int k = 0;
    int next[TOPO_MAX_CPUS];   /* per node: the next index into cpus to look at */
    for (int smt = 0; k < t->n; smt++) {
        for (int j = 0; j < n_nodes; j++) next[j] = 0;
        for (bool any = true; any;) {
            any = false;
            for (int j = 0; j < n_nodes; j++) {
                int i = next[j];
                while (i < t->n && (t->cpus[i].node != nodes[j] || t->cpus[i].smt != smt)) i++;
                next[j] = i + 1;
                if (i < t->n) {
                    if (k < n) out[k] = t->cpus[i].cpu;
                    k++;
                    any = true;
                }
            }
        }
    }
    for (int i = k; i < n; i++) out[i] = out[i % k];   /* more threads than CPUs */
    return n;
}

void topo_describe(const topo *t, const int *cpus, int n, char *buf, size_t sz)
{
    size_t len = 0;
    int cores = 0, sibs = 0, nodes = 0;
    bool *core_seen = calloc(TOPO_MAX_CPUS, sizeof *core_seen), *node_seen = calloc(TOPO_MAX_CPUS, sizeof *node_seen);
    len += (size_t)snprintf(buf, sz, "%d thread%s on CPU%s ", n, n == 1 ? "" : "s", n == 1 ? "" : "s");
    for (int i = 0; i < n; i++) {
        /* the list, in placement order, ranges of consecutive ids folded */
        int j = i;
        while (j + 1 < n && cpus[j + 1] == cpus[j] + 1) j++;
        if (len < sz) {
            if (j > i) len += (size_t)snprintf(buf + len, sz - len, "%s%d-%d", i ? "," : "", cpus[i], cpus[j]);
            else len += (size_t)snprintf(buf + len, sz - len, "%s%d", i ? "," : "", cpus[i]);
        }
        i = j;
    }
    for (int i = 0; i < n && core_seen && node_seen; i++)
        for (int c = 0; c < t->n; c++)
            if (t->cpus[c].cpu == cpus[i]) {
                if (core_seen[t->cpus[c].core]) sibs++;
                else cores++, core_seen[t->cpus[c].core] = true;
                if (!node_seen[t->cpus[c].node]) nodes++, node_seen[t->cpus[c].node] = true;
                break;
            }
    if (len < sz)
        snprintf(buf + len, sz - len, ": %d of %d physical cores, %d SMT sibling%s, %d of %d NUMA node%s", cores,
                 t->n_cores, sibs, sibs == 1 ? "" : "s", nodes, t->n_nodes, t->n_nodes == 1 ? "" : "s");
    free(core_seen);
    free(node_seen);
}
