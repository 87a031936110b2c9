/*
 * worker: a prefill / decode / mixed worker of the disaggregated server: one engine
 * and scheduler (engine/sched.h) serving the cluster protocol (cluster/proto.h,
 * docs/protocol.md) to the gateway.
 *
 * DESIGN. An accept thread takes gateway connections on --listen; with --gateway a register
 * thread connects out (HELLO with REGISTER) and reconnects every second when that connection
 * drops. Every connection starts with the handshake of cluster/auth.h (the peer must prove it
 * holds the cluster key, and so must we; then every frame is tagged) within one absolute
 * deadline; a peer that fails it is logged and closed before it sees a HELLO. Accepted
 * connections in their handshake take an entry of a small table (cluster/greet.h: a full table
 * makes room by cutting the oldest handshake of the busiest address, so strangers cannot keep a
 * gateway out), and at most WORKER_MAX_PEERS connections are past it at once (more: ERROR BUSY):
 * threads are bounded whatever connects. A registering worker is in once the gateway answers
 * its HELLO with its own; an ERROR instead (its name is taken, another model) is logged and it
 * retries every second. Each connection has a reader thread that decodes frames (a refused frame: one log
 * line, ERROR MALFORMED, that connection closed; the others and the process go on) and one
 * send mutex (frames from several threads never interleave). Jobs (PREFILL or DECODE) take no
 * thread of their own: a fixed pair of pump threads submits each job the reader hands them and
 * turns its outputs into frames as they come (the scheduler's on_output hook queues a job for
 * the pumps whenever it has outputs; one pump at a time serves a job, so its frames keep their
 * order), and a handoff thread sends the HANDOFFs that must wait for the prompt's blocks to
 * reach the store (so the pumps never wait on it); concurrent requests cost no thread
 * creation and no timer sits on their path:
 *   - PREFILL: sched with max_tokens 1; the kv_out hook copies the partial tail block out of
 *     the pool before it is released; then the worker waits for the block store's write-behind
 *     to have taken the prompt's full blocks, counts how many are stored (store_exists), and
 *     sends HANDOFF (first token, counts, tail KV when the stored blocks reach the tail).
 *   - DECODE: sched with the generated tokens (sched_params.gen, n_sampled); the kv_in hook
 *     installs the handoff's tail right after the store's blocks were attached (when it starts
 *     exactly there; else the tail is recomputed); TOKENS as they come, then FINISH.
 * A job with a grammar (PROTO_F_GRAMMAR) has it compiled by its pump through the worker's
 * grammar cache (keyed by kind and source, so a schema many requests send is compiled once);
 * one that does not compile is answered ERROR ARG naming the problem. A DECODE's generated
 * tokens are replayed through the automaton by sched_submit, so the matcher's state is never
 * sent.
 * A heartbeat thread sends the load report to every connection every 500 ms. Drain: no new
 * jobs (ERROR DRAINING), DRAIN sent to every connection; at the deadline the jobs left are
 * cancelled and reported FINISH MOVED; then DRAIN done. The handoff cost is counted both
 * ways and reported in every heartbeat (lifetime counters): the prefill side from the first
 * token to the HANDOFF sent, the decode side from the DECODE's receipt to the kv_in hook (the
 * store's blocks attached and the tail installed); details per request at debug level.
 *
 * Locks: w->mu guards the connection list, every connection's job list and the worker's
 * flags; a connection's send_mu guards its socket writes. Jobs and connections are
 * reference-counted under w->mu.
 */
#ifndef TM_WORKER_H
#define TM_WORKER_H

#include <stdbool.h>

#include "cache/store.h"
#include "cluster/auth.h"
#include "engine/blockio.h"
#include "engine/engine.h"
#include "engine/sched.h"
#include "grammar/grammar.h"

typedef struct {
    int role;                 /* proto_role: PREFILL, DECODE or MIXED */
    const char *listen;       /* "HOST:PORT" to accept the gateway on (port 0: any), or NULL */
    const char *gateway;      /* "HOST:PORT" to register with, or NULL */
    const char *name;         /* id in HELLO, logs and /admin/drain; NULL: HOSTNAME:PORT of
                              * --listen, else HOSTNAME/PID (a gateway refuses a name another
                              * live worker has) */
    const char *model_id;     /* the id requests name its model by, in HELLO: the gateway routes
                              * that model's requests here; NULL: "" (the fingerprint alone) */
    const auth_key *key;      /* the cluster secret (cluster/auth.h), required; outlives the worker */
    int heartbeat_ms;         /* <= 0: 500 */
    int max_seqs;             /* capacity reported in HELLO (the scheduler's) */
    int n_ctx;                /* the scheduler's context */
    const grammar_vocab *gvocab; /* the model's token bytes for the jobs' grammars (grammar.h),
                              * or NULL: a job with a grammar is refused (ERROR ARG); outlives
                              * the worker */
} worker_opts;

typedef struct worker worker;

/* Starts the threads. e, s, (st, bio: the shared block store, may be NULL) and o->key must
 * outlive the worker. NULL when the listen address cannot be bound or there is no key (logged). */
worker *worker_new(const worker_opts *o, engine *e, sched *s, store *st, blockio *bio);
/* The bound listen port (-1 without --listen). */
int worker_port(const worker *w);
/* Its name (worker_opts.name or the default made from the host and port). */
const char *worker_name(const worker *w);
/* Starts a drain of its own (idempotent): no new work; at deadline_ms the rest is reported
 * MOVED. A drain a gateway asked for (DRAIN) it may undo (DRAIN UNDRAIN); this one no one undoes. */
void worker_drain(worker *w, int deadline_ms);
/* True once a drain has completed (every job gone, DRAIN done sent). */
bool worker_drained(worker *w);
/* Closes every connection, joins every thread, frees. Jobs still running are cancelled. */
void worker_free(worker *w);

#endif
