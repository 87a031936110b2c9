/*
 * topo: the CPU topology that thread placement needs (which CPUs are usable, which of them
 * are SMT siblings of one physical core, which NUMA node each is on), read from a sysfs tree,
 * and the placement of n kernel threads on it.
 *
 * topo_read takes the tree's root ("/sys" in production, a synthetic directory in tests) and
 * reads devices/system/cpu/online, each online CPU's topology/thread_siblings_list (falling
 * back to physical_package_id + core_id) and devices/system/node/node*\/cpulist (no node
 * directory: one node). A CPU is usable when it is online, in the allowed mask (the process's
 * sched_getaffinity, which already reflects a cgroup cpuset) and in the optional --cpus list.
 *
 * topo_place orders the usable CPUs for n threads: first one thread per physical core, the
 * cores taken round-robin over the NUMA nodes (so that the threads use every node's memory
 * controller), then second (third, ...) SMT threads of the cores in the same order; a decode
 * step is bound by memory bandwidth, which a core's sibling does not add to. More threads than
 * usable CPUs wrap around. The default thread count is the number of usable physical cores.
 */
#ifndef TM_TOPO_H
#define TM_TOPO_H

#include <stdbool.h>
#include <stddef.h>

#define TOPO_MAX_CPUS 1024   /* CPU ids 0..1023 (glibc's cpu_set_t) */

typedef enum {
    TOPO_OK = 0,
    TOPO_ERR_LIST,   /* a CPU list that does not parse or names a CPU id out of range */
    TOPO_ERR_IO,     /* the sysfs tree cannot be read (no /sys, a file missing) */
    TOPO_ERR_EMPTY,  /* no usable CPU (the --cpus list and the allowed mask do not meet) */
} topo_status;

typedef struct {
    int cpu;                 /* logical CPU id */
    int core;                /* physical core: the lowest CPU id among its SMT siblings */
    int node;                /* NUMA node id (0 without node information) */
    int smt;                 /* this CPU's rank among its core's usable siblings, 0 first */
} topo_cpu;

typedef struct {
    int n;                   /* usable CPUs */
    topo_cpu cpus[TOPO_MAX_CPUS]; /* (n) ascending CPU id */
    int n_cores;             /* physical cores with a usable CPU */
    int n_nodes;             /* NUMA nodes with a usable CPU */
} topo;

/* Parses a CPU list ("0-3,8,10-11", the kernel's and taskset's form) into mask
 * (TOPO_MAX_CPUS flags). An empty list is an error. */
topo_status topo_parse_list(const char *z, bool *mask, char *err, size_t errsz);

/* Reads the tree at root. allowed (TOPO_MAX_CPUS flags, or NULL: all) and only (the same, or
 * NULL: no restriction) narrow the usable CPUs. On error, a message in err. */
topo_status topo_read(const char *root, const bool *allowed, const bool *only, topo *t, char *err, size_t errsz);

/* This process's allowed CPUs (sched_getaffinity) into allowed; false if unknown. */
bool topo_allowed(bool *allowed);

/* The CPUs for n threads (n <= 0: one per usable physical core) in out (at least
 * max(n, t->n) entries): thread i runs on out[i]. Returns the thread count. */
int topo_place(const topo *t, int n, int *out);

/* One line on a placement of distinct CPUs: "N threads on CPUs LIST: C of T physical cores,
 * S SMT siblings, K of M NUMA nodes". */
void topo_describe(const topo *t, const int *cpus, int n, char *buf, size_t sz);

#endif
