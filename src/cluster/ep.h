/*
 * ep: expert parallelism. A group of processes serves one mixture-of-experts model: the leader
 * (`serve`, or a gateway worker) runs the whole step as usual except the routed experts, whose
 * input rows it sends to the members holding them (`tokenmill expert`), computes its own share
 * meanwhile, and takes the members' output rows back into the same rows of the engine's expert
 * outputs (engine_ep_hooks), so that the per-token weighted sum runs as in one process: same
 * routing, same rows, same reduction order, the same bits (at one SIMD level).
 *
 * DESIGN. Placement: per layer, each expert has one or more holders among the group's
 * processes (0 = the leader, 1..N = members). Without redundant experts they are contiguous
 * ranges of E / (N + 1); with --redundant-experts R the placement is DeepSeek's EPLB
 * (ep_eplb's global policy: every process is a machine of its own, and the hierarchical one
 * keeps copies within a machine) over the engine's expert load window, recomputed every rebalance_s seconds
 * between steps (the new table is built beside the old and swapped at a step's first MoE
 * layer). In a step, an expert with several holders goes to the holder given the fewest rows
 * so far in that layer (lowest index on ties), so replicas share the load and the choice is a
 * function of the step's routing alone.
 *
 * Exchange, per MoE layer and member: EXPERTS frames (the expert ids, their row counts, the
 * rows as f32; the last one flagged PROTO_F_LAST) go out before the leader computes its own
 * experts; the member reads every frame of the layer, computes them in one pool round
 * (engine_moe_experts_run) and answers one EXPERTS_OUT per EXPERTS frame, same experts, same
 * order. Neither side writes while the other may be blocked writing, so large layers cannot
 * deadlock on full socket buffers. The links are authenticated (cluster/auth.h: the group
 * shares the cluster key; the leader takes the gateway's side of the handshake) and both ends
 * exchange HELLO (role expert) with the model fingerprint, which must match.
 *
 * Overlap (micro_batches 2, the default): a member's share of a layer is cut in two
 * micro-batches at the expert where its rows reach half (the first's last frame carries
 * PROTO_F_LAST | PROTO_F_MORE); the member still reads both before writing, then computes the
 * first, answers it, and computes the second while the first's outputs are on the wire. The
 * cut is by expert, not by token: each expert's weights are still read once per step (a token
 * split reads every expert two micro-batches share twice, and a step on CPUs is bound by
 * those reads), and each row is computed as before, so the bits do not change. What the
 * leader overlaps with the exchange is its own experts (and shared experts); hiding the
 * exchange behind attention needs the layer loop run per micro-batch (docs/ep.md).
 *
 * Failure: a member whose send fails, whose reply is malformed, or which does not answer
 * within timeout_s is closed and marked down; the experts it held for that layer are
 * computed by the leader (which maps the whole file), and so are its experts from then on,
 * until a background thread has reconnected it (every EP_RECONNECT_S); it rejoins at the next
 * step. A stream never fails or hangs for a member's sake, and its tokens do not change.
 *
 * Threads: the hooks run on the engine's step thread; the reconnect thread only prepares a
 * connection and hands it over under mu. A member serves each leader on a thread of its own,
 * one step of one leader at a time (its engine's scratch is shared).
 */
#ifndef TM_EP_H
#define TM_EP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster/auth.h"
#include "engine/engine.h"
#include "util/bytebuf.h"

#define EP_MAX_MEMBERS 63         /* members of one group (the leader is process 0) */

typedef struct {
    const char *const *members;   /* (n_members) HOST:PORT each member listens on */
    int n_members;                /* 1..EP_MAX_MEMBERS */
    const auth_key *key;          /* the cluster key every member holds */
    int redundant;                /* redundant expert slots per layer (EPLB), 0: none */
    double timeout_s;             /* longest a member may take to answer a layer, seconds */
    double rebalance_s;           /* seconds between EPLB placements from the live load; 0:
                                   * only at start (uniform load) */
    int micro_batches;            /* per member and layer: 1, or 2 (overlap: the default, 0) */
} ep_opts;

typedef struct ep_group ep_group;

/* Connects to every member (each must answer, with the same model), places the experts and
 * sets the engine's hooks. NULL with err on failure (nothing left attached). */
ep_group *ep_group_new(engine *e, const ep_opts *o, char *err, size_t errsz);
/* Unsets the hooks (call between steps: after the scheduler stopped) and closes the links. */
void ep_group_free(ep_group *g);
/* Processes of the group (members + 1) and members currently up. */
int ep_group_size(const ep_group *g);
int ep_group_up(ep_group *g);
/* The group's Prometheus lines (tokenmill_ep_*), appended to b. */
void ep_group_metrics(ep_group *g, bytebuf *b);
/* The figures the status page shows: imbalance of the contiguous placement and of the
 * current one over the load window (mean over MoE layers; 0 before any load), the share of
 * exchange time hidden behind the leader's own experts (0..1), members up. */
typedef struct {
    int n_procs, n_up;
    double imb_contiguous, imb_placed;
    double hidden;
    uint64_t n_rebalances;
} ep_summary;
void ep_group_summary(ep_group *g, ep_summary *s);

/* EPLB (DeepSeek's expert-parallelism load balancer, eplb.py's rebalance_experts) for one
 * layer: load (n_log) the tokens of each logical expert, n_phys >= n_log physical slots over
 * n_gpus processes on n_nodes machines (n_phys a multiple of n_gpus, n_gpus of n_nodes),
 * n_groups expert groups (1: none); hierarchical (groups packed onto machines, replicas within
 * a machine, slots onto its processes) when n_groups is a multiple of n_nodes, else global
 * (the same with one group and one machine). Out: phys2log (n_phys), slot s on process
 * s / (n_phys / n_gpus); logcnt (n_log) replicas of each expert. Ties break to the lower
 * index (eplb.py leaves them to torch's sort). false on bad sizes. The group runs the global
 * policy (n_groups 1, n_nodes 1, n_gpus its processes). */
bool ep_eplb(const double *load, int n_log, int n_phys, int n_groups, int n_nodes, int n_gpus, int32_t *phys2log,
             int32_t *logcnt);
/* Holders of each expert as bit masks (bit p: process p) from an EPLB placement:
 * holders (n_log). */
void ep_eplb_holders(const int32_t *phys2log, int n_phys, int n_procs, int n_log, uint64_t *holders);
/* The imbalance of a placement: the busiest process's load (an expert's load split evenly
 * over its holders) over the mean process load; 0 for no load. holders (n_log). */
double ep_placement_imbalance(const double *load, int n_log, const uint64_t *holders, int n_procs);

/* ---- member side ---- */
typedef struct ep_member ep_member;
/* Listens on hostport for leaders holding key, serving the experts of model m (its engines are
 * made per leader's batch size, threads n_threads). NULL with err. */
ep_member *ep_member_new(model *m, int n_threads, const char *hostport, const auth_key *key, char *err,
                         size_t errsz);
int ep_member_port(const ep_member *mb);
/* Layers' exchanges served since start. */
uint64_t ep_member_served(ep_member *mb);
void ep_member_free(ep_member *mb);

#endif
