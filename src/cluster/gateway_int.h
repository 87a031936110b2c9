/*
 * gateway_int: what only the gateway's files (gateway*.c) may see: the worker table, the
 * request tracker's records, the gateway itself, and the functions one of those files calls
 * in another. The design and the locking are in gateway.h; everything here is guarded by
 * gateway.mu unless a field says otherwise.
 *
 *   gateway.c           the request tracker: the api_backend (submit, poll, cancel,
 *                       release), the frames from workers applied to requests, life
 *   gateway_dispatch.c  the dispatcher thread, the balancers' placement of jobs, the frames
 *                       to workers and their writer (gw_flush)
 *   gateway_conn.c      connections: handshake and HELLO, a reader thread per worker, the
 *                       static workers' (re)connects (a connector thread per attempt), the
 *                       registration acceptor
 *   gateway_admin.c     /metrics, the status page's block, /admin/workers, /admin/drain,
 *                       /admin/undrain, /admin/capacity
 *   gateway_window.c    the window states' directory (windir.h) and their fetches: a job
 *                       held until the state it needs came from the worker holding it
 */
#ifndef TM_GATEWAY_INT_H
#define TM_GATEWAY_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cluster/balance.h"
#include "cluster/gateway.h"
#include "cluster/greet.h"
#include "cluster/proto.h"
#include "cluster/windir.h"

#define GW_MAX_WORKERS 64
#define GW_MAX_RETRIES 8      /* re-sends of one request after BUSY / DRAINING answers */
/* moves of one request off a worker that died, stalled, drained or sent a frame the gateway
 * refused: past it the request fails, so one that brings down every worker it meets (or that
 * a worker keeps answering wrongly) ends instead of circling for ever */
#define GW_MAX_MOVES 12
#define GW_RATE_SLOTS 10      /* seconds of history for the prefill token rate */
/* gateway_new waits this long at most for its static workers' first connections (seconds) */
#define GW_START_WAIT_S 2.0

typedef enum { GW_WAIT_PREFILL = 0, GW_PREFILL, GW_WAIT_DECODE, GW_DECODE, GW_DONE } gw_state;

typedef struct {
    bool used;                /* slot taken (static address, or a registered worker) */
    bool connected;           /* a connection is open and its reader runs */
    bool reader_live;         /* the reader thread has not exited yet */
    bool draining;            /* takes no new work */
    bool undraining;          /* UNDRAIN sent: draining ends with its first heartbeat that no
                               * longer says it drains */
    bool is_static;           /* from --prefill/--decode: reconnect when down */
    char addr[128];           /* "HOST:PORT" (static or the HELLO's listen), or the peer */
    char name[64];            /* HELLO name: logs, /admin/drain (unique among live workers) */
    char listen[128];         /* HELLO listen address and the connection's peer address: */
    char peer[64];            /* the same name from the same worker is a reconnection or one
                               * worker in two static lists, not a second worker */
    int role;                 /* proto_role from HELLO (static ones before: the list's role) */
    int fd;                   /* the connection, -1 when none */
    pthread_mutex_t send_mu;  /* held while a frame is written to the connection and while
                               * its reader closes it: no write reaches a closed (or reused) fd */
    int send_fd;              /* the connection writers may use (under send_mu), -1 once closed */
    proto_conn *send_conn;    /* its frame tags (under send_mu; the reader's, freed as it closes) */
    uint64_t send_gen;        /* its gen (under send_mu) */
    uint64_t gen;             /* bumped at each connection loss: stale readers are ignored */
    double last_hb;           /* util_now() of the last frame received */
    double next_connect;      /* static: next reconnect attempt */
    bool connecting;          /* static: a connector thread is (re)connecting it */
    int connect_fd;           /* that attempt's socket once its TCP connect succeeded, -1
                               * otherwise: gateway_free shuts it down to end the handshake */
    proto_heartbeat hb;       /* its last load report (zeros until the first) */
    bool has_curve;           /* hb.step_w holds its learned step-time curve (PROTO_F_STEPTIME) */
    bal_speed speed;          /* prefill tokens/s learned from the reports (balance.h) */
    uint32_t max_seqs;        /* HELLO */
    int kv_dtype;             /* HELLO */
    int max_input;            /* HELLO: tokens it computes in one step, within its context
                               * (min of max_batch_tokens and n_ctx): an encoder's longest input */
    int model;                /* the gw_model it serves (HELLO), index in gateway.m; -1 before */
    /* the gateway's own load figures (what it sent and has not seen finish) */
    double queued_s;          /* prefill: cost-model seconds queued */
    int n_prefill;            /* prefill jobs out */
    int n_decode;             /* decode requests running */
    int64_t sum_ctx;          /* their cache lengths, tokens */
    uint64_t n_jobs;          /* lifetime jobs sent */
} gw_worker;

typedef struct gw_req {
    struct gw_req *prev, *next;  /* the gateway's list of live requests */
    uint64_t id;              /* protocol req_id */
    int model;                /* index in gateway.m: only workers of this model take it */
    uint8_t embed;            /* an embedding (model_pool MEAN or LAST): a PREFILL with
                               * PROTO_F_EMBED, answered by EMBEDDING then FINISH; 0: a generation */
    float *emb;               /* (n_emb) its vector once the EMBEDDING came, else NULL */
    int n_emb;
    int32_t *prompt;          /* (n_prompt) */
    int n_prompt;
    proto_params params;      /* params.salt owned */
    int64_t expect_len;       /* prompt + max new tokens (decode balancer) */
    int hit_len;              /* stored prefix at submit, tokens */
    uint8_t (*keys)[32];      /* (n_keys) block keys of the prompt's full blocks but the one
                               * holding its last token (gw_keys): the store lookup and the
                               * in-flight prefixes (gw_inflight) */
    int n_keys;
    int32_t *gen;             /* (n_gen) tokens streamed to the client, cap_gen allocated */
    int n_gen, cap_gen;
    int n_cached;             /* prompt tokens cached (the HANDOFF's, else hit_len) */
    int n_accepted_drafts;    /* speculative drafts accepted, summed over its workers' FINISHes */
    int n_rejected_drafts;    /* and rejected */
    int n_stored;             /* the HANDOFF's stored prefix, tokens (a multiple of 128) */
    uint32_t n_sampled;       /* sampler draws done (HANDOFF) */
    gw_state state;
    bool resume;              /* the next DECODE resumes (no handoff tail) */
    int worker;               /* slot it is on (PREFILL / DECODE), else -1 */
    double cost_s;            /* prefill cost counted in the worker's queued_s */
    int64_t ctx_counted;      /* tokens counted in the decode worker's sum_ctx */
    proto_kv tail;            /* handoff tail KV (tail.data owned) until the DECODE is sent */
    bool has_tail;
    sched_output *outs;       /* queued outputs [out_head, n_out) */
    int n_out, cap_out, out_head;
    bool finished;            /* FINISH queued */
    bool done;                /* FINISH polled */
    int retries;
    int moves;                /* times moved off a worker (gw_requeue counted), <= GW_MAX_MOVES */
    double t_submit, t_wait;  /* util_now(): submit, entering the current wait */
    double t_job;             /* util_now(): the current job sent, or its last token (stall check) */
    int job_tokens;           /* tokens the current job has produced */
    int avoid_slot;           /* worker this request stalled on (-1 none): others first */
    uint64_t avoid_gen;       /* that worker's connection */
    double t_first;           /* first token (0 none) */
    bool added_seen;          /* its added latency is counted (h_added) */
    pthread_cond_t cv;
} gw_req;

typedef struct gw_msg {      /* a frame waiting for the dispatcher to send it */
    struct gw_msg *next;
    int slot;
    uint64_t gen;             /* sent only while the worker's connection is this one */
    bytebuf buf;
} gw_msg;

typedef struct gw_fetch {    /* a job held until the window state it needs arrives */
    struct gw_fetch *next;
    uint64_t id;              /* the WINFETCH's req_id (from next_id: unique, never a request's) */
    int src;                  /* slot asked (a holder) */
    uint8_t key[32];          /* the state's block key */
    uint64_t req_id;          /* the held job's request */
    gw_msg *job;              /* the held frame (its slot and gen: the target) */
    double deadline;          /* util_now(): sent without the state after this */
} gw_fetch;

typedef struct {             /* one served model (gateway_model) and its backend */
    gateway_model o;
    gateway *g;               /* the backend's ud is this gw_model: its gateway */
    int i;                    /* its index in gateway.m */
    api_backend be;
    int kv_dtype;             /* its workers' KV type (pool fingerprint of its block keys), -1
                               * until the first of them said */
    int kv_parts, kv_heads, kv_dim;   /* its pool's row shape (engine_kv_shape): a tail KV's */
} gw_model;

struct gateway {
    gateway_opts o;
    gw_model m[GATEWAY_MAX_MODELS]; /* (o.n_models) */
    pthread_mutex_t mu;
    pthread_cond_t cv_disp;   /* wakes the dispatcher */
    pthread_cond_t cv_workers;/* a worker came up / a reader exited */
    gw_worker w[GW_MAX_WORKERS];
    int n_slots;
    gw_req *reqs;             /* live requests */
    uint64_t next_id;
    gw_msg *out_head, *out_tail;
    bool flushing;            /* a thread is writing the queued frames (gw_flush) */
    bool stop, shut;
    bool draining;            /* gateway_drain: new requests refused, running ones go on */
    int listen_fd;
    pthread_t disp, acc;
    bool acc_started;
    greet_table greet;        /* registrations in their handshake and their threads, under mu */
    int n_connectors;         /* static workers' connector threads running (at most one per
                               * static slot): gateway_free waits for them */
    double t_evict_log;       /* util_now() of the last line about handshakes cut for room */
    /* counters */
    uint64_t n_requests, n_rejected, n_reprefills, n_resumes, n_prompt_tokens, n_hit_tokens, n_gen_tokens;
    uint64_t n_uncached_tokens;   /* prompt tokens not found in the store, lifetime */
    uint64_t n_bad_conns;         /* connections refused (malformed HELLO / frames) */
    uint64_t n_bad_values;        /* of which: well-formed frames with values out of range */
    uint64_t n_refused_auth;      /* connections that failed the handshake (no / wrong key) */
    uint64_t n_stalls;            /* requests moved off a worker that made no progress */
    uint64_t n_inflight_routed;   /* prefill jobs sent where a prefix of theirs was in flight */
    uint64_t n_inflight_tokens;   /* the tokens they share there, lifetime */
    sched_hist h_added;           /* per request: seconds to its first token here minus the
                                   * worker's own (gw_count_added) */
    double rate_t[GW_RATE_SLOTS]; /* ring: time and n_uncached_tokens once a second */
    uint64_t rate_v[GW_RATE_SLOTS];
    int rate_i;
    /* window states of sliding-window models (gateway_window.c) */
    windir *wdir;             /* key -> workers holding it (bounded) */
    gw_fetch *fetches;        /* jobs held for a fetch */
    uint64_t n_wfetch_ok, n_wfetch_failed, n_wfetch_bytes; /* fetches relayed / failed, bytes */
};

static inline bool gw_can_prefill(const gw_worker *w) { return w->role == PROTO_ROLE_PREFILL || w->role == PROTO_ROLE_MIXED; }
static inline bool gw_can_decode(const gw_worker *w) { return w->role == PROTO_ROLE_DECODE || w->role == PROTO_ROLE_MIXED; }
static inline bool gw_usable(const gw_worker *w) { return w->used && w->connected && !w->draining; }
/* w takes r's jobs of the role (prefill or decode) now. */
static inline bool gw_fits(const gw_worker *w, int mi, bool prefill)
{
    return gw_usable(w) && w->model == mi && (prefill ? gw_can_prefill(w) : gw_can_decode(w));
}

/* gateway.c (all with mu held) */
/* The worker's connection is gone or it is declared dead: its requests move elsewhere (keep_write:
 * its reader, refusing a frame, still says why before closing). */
void gw_worker_lost_how(gateway *g, int slot, const char *why, bool keep_write);
void gw_worker_lost(gateway *g, int slot, const char *why);
/* Applies a worker's frame to the requests; false (with *refused, a static reason) when a value
 * in it is out of range: the caller then closes that worker's connection. */
bool gw_on_msg(gateway *g, int slot, proto_msg *m, const char **refused);
/* Back to waiting for a worker of the role its state needs (count: a failure, for /metrics). */
void gw_requeue(gateway *g, gw_req *r, bool count);
/* Queues the request's FINISH with reason f and takes it off its worker (idempotent). */
void gw_finish(gateway *g, gw_req *r, sched_finish f);
void gw_free_tail(gw_req *r);
/* CANCEL to its worker when it runs on one, then FINISH cancelled. */
void gw_cancel_locked(gateway *g, gw_req *r);

/* gateway_dispatch.c (mu held, but gw_dispatcher, a thread) */
void *gw_dispatcher(void *arg);
/* Places r on the worker the balancer picks and queue its PREFILL / DECODE (nothing when no
 * worker of the role is usable: r keeps waiting). */
void gw_send_prefill(gateway *g, gw_req *r);
void gw_send_decode(gateway *g, gw_req *r);
/* Queues an empty-payload frame (CANCEL) for slot. */
void gw_send_simple(gateway *g, int slot, int type, uint64_t id);
/* Encodes m for slot's current connection into the send queue. */
void gw_queue_msg(gateway *g, int slot, const proto_msg *m);
/* The two halves of gw_queue_msg: encode (NULL when it cannot), then append to the queue. */
gw_msg *gw_encode_msg(gateway *g, int slot, const proto_msg *m);
void gw_queue_push(gateway *g, gw_msg *q);
/* Writes the queued frames now, from the calling thread (mu released while writing). */
void gw_flush(gateway *g);

/* gateway_conn.c */
/* Starts a connector thread that connects, greets and attaches static worker slot (mu held):
 * the caller never waits on a peer that is down or stuck in its handshake. False when no
 * thread could be started (a later attempt tries again). */
bool gw_connect_start(gateway *g, int slot);
/* Every static worker's handshake in progress fails now, and their connector threads are
 * waited for (mu held, g->stop set; released while waiting). */
void gw_connect_stop_all(gateway *g);
void *gw_acceptor(void *arg);

/* gateway_window.c (all with mu held) */
#define GW_WINDOW_FETCH_S 2.0     /* longest a job waits for its window state */
#define GW_WINDOW_DIR_MAX 65536   /* directory entries at most */
void gw_window_init(gateway *g);
void gw_window_free(gateway *g);
/* WINDOW: slot's adds and drops into the directory. */
void gw_window_on_report(gateway *g, int slot, const proto_window *w);
/* WINSTATE from slot: the answer of one of our fetches (others are ignored). */
void gw_window_on_state(gateway *g, int slot, proto_msg *m);
/* Queues job (r's PREFILL or DECODE) for slot. When the window state at block boundary nb
 * (0: none wanted) of r's context is held by another live worker, the job is held and that
 * worker asked for it (WINFETCH); the state then goes to slot just before the job. */
void gw_window_send_job(gateway *g, gw_req *r, int slot, const proto_msg *job, int nb);
/* Request req_id is cancelled: its held job is dropped. */
void gw_window_cancel(gateway *g, uint64_t req_id);
/* Held jobs past GW_WINDOW_FETCH_S are sent without the state (a replay there). */
void gw_window_tick(gateway *g, double now);
/* slot is lost or drains: its directory entries go, fetches from it fail now. */
void gw_window_worker_gone(gateway *g, int slot);

/* gateway_admin.c: the api_backend's metrics and status hooks (they take mu) */
void gw_metrics(void *ud, bytebuf *b);
void gw_status(void *ud, bytebuf *b);

#endif
