/*
 * worker_int: what only worker*.c may see: the worker, its connections and its jobs. The
 * worker is split as the gateway is: worker.c its life and drain, worker_conn.c the
 * connections (handshake, reader, accept, registration, heartbeat, broadcasts),
 * worker_jobs.c the jobs (submission, the pumps that turn outputs into frames, the handoff
 * thread, the tail KV hooks, window reports).
 *
 * Thread life: the accept, heartbeat, register and pump threads are joined by worker_free;
 * reader threads are detached and counted in w->n_active (worker_free waits for zero, and for
 * no job left, after closing every connection, which cancels their jobs). A connection is
 * freed (its fd closed) when its last reference goes: the reader holds one, each of its jobs
 * one.
 */
#ifndef TM_WORKER_INT_H
#define TM_WORKER_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cluster/greet.h"
#include "cluster/proto.h"
#include "cluster/worker.h"
#include "engine/wincache.h"

#define WORKER_FLUSH_WAIT_S 5.0   /* longest a prefill waits for its blocks' write-behind */
#define WORKER_MAX_PEERS 16       /* connections past the handshake at once (gateways); a
                                   * peer beyond them is refused (ERROR BUSY) */
#define WORKER_GREET 8            /* handshakes in progress at once on --listen (greet.h) */
#define WORKER_PUMPS 2            /* threads that submit jobs and turn their outputs into frames:
                                   * one is enough to keep up with the engine; the second keeps
                                   * the streams going while the other compiles a grammar or
                                   * writes to a slow socket (a prefill's wait for its store
                                   * writes is the handoff thread's, never a pump's) */

typedef struct wconn wconn;
typedef struct wjob wjob;

struct wconn {
    worker *w;
    int fd;                      /* socket; closed when refs reaches 0 */
    proto_conn pc;               /* fd with its frame tags (sealed by the handshake); tx under
                                  * send_mu, rx the reader's */
    pthread_mutex_t send_mu;     /* whole frames only */
    int refs;                    /* reader + jobs, under w->mu */
    bool closed;                 /* reader has stopped: jobs are cancelled, no more frames */
    bool ready;                  /* handshake done and HELLO sent: broadcasts may go to it
                                  * (listed before, so that worker_free reaches it) */
    wjob *jobs;                  /* this connection's jobs, under w->mu */
    wconn *next;                 /* w->conns */
    char peer[80];               /* for logs */
    uint64_t ticket;             /* accepted: its entry in w->greet until the handshake ends
                                  * (0: none, the register thread's own connection) */
};

struct wjob {
    worker *w;
    wconn *c;                    /* holds a reference */
    uint64_t id;                 /* request id (gateway's) */
    proto_msg msg;               /* the PREFILL or DECODE frame (owned) */
    sched_req *req;              /* under w->mu once submitted */
    bool cancel;                 /* CANCEL or connection gone (under w->mu) */
    bool moved;                  /* drain deadline: report FINISH MOVED (under w->mu) */
    bool first_done;             /* prefill: first token produced (heartbeat figures) */
    int ctx_len;                 /* context positions now (heartbeat), under w->mu */
    double t_recv;               /* util_now() at receipt */
    /* tail KV: prefill exports it (kv_out hook), decode installs it (kv_in hook) */
    uint8_t *tail;               /* (tail_bytes) [layer][k|v][kv_head][pos][head_dim], pool dtype
                                  * (k only in a pool where V is K) */
    size_t tail_bytes;
    int tail_start, tail_n;      /* positions [tail_start, tail_start + tail_n) */
    bool tail_used;              /* decode: the handoff's tail was installed */
    bool kv_in_seen;             /* decode: the kv_in hook ran (first admission) */
    double t_kv_in;              /* util_now() when it ran: the handed-off KV was in place */
    int kv_in_pos;               /* positions valid then (store blocks + installed tail) */
    bool linked;                 /* in c->jobs (under w->mu); unlinked before the last frame */
    wjob *next;                  /* c->jobs */
    /* the pump serving it (worker_pump_thread) */
    bool started;                /* submitted (or refused); the pump's only */
    bool counted;                /* decode: its handoff cost is counted (or it is a resume) */
    sched_output first, fin;     /* prefill: its token (token -1: none yet) and FINISH */
    bool got_fin;                /* prefill: fin holds the FINISH */
    bool queued;                 /* in the ready queue (under pump_mu) */
    bool busy;                   /* a pump serves it now (under pump_mu) */
    bool again;                  /* outputs came meanwhile: serve it again (under pump_mu) */
    wjob *rnext;                 /* ready queue (under pump_mu) */
};

struct worker {
    worker_opts o;
    engine *e;
    sched *s;
    store *st;
    blockio *bio;
    const model *m;
    int listen_fd;               /* -1 without --listen */
    int port;
    pthread_mutex_t mu;
    pthread_cond_t cv;           /* n_active changed, stop, drain progress */
    bool stop;
    bool draining, drained;
    int drain_deadline_ms;
    wconn *conns;
    int n_active;                /* detached reader threads */
    int n_jobs;
    pthread_t accept_thr, hb_thr, reg_thr, drain_thr;
    char name[128];              /* in HELLO and logs: --name, else HOSTNAME:PORT (or
                                  * HOSTNAME/PID without --listen), unique per gateway */
    greet_table greet;           /* accepted connections in their handshake, under mu */
    double t_evict_log;          /* util_now() of the last line about handshakes cut for room */
    bool drain_remote;           /* the drain came from a gateway (DRAIN): it may undo it */
    char last_refusal[256];      /* the gateway's last refusal of our registration, logged once */
    uint64_t drain_gen;          /* bumped by each drain and undrain: a drain thread of an
                                  * older one stops (under mu) */
    pthread_t pumps[WORKER_PUMPS];
    int n_pumps;                 /* pump threads started */
    pthread_mutex_t pump_mu;     /* the ready queue; never held while calling sched_* or taking mu */
    pthread_cond_t pump_cv;      /* a job was queued, or pump_stop */
    wjob *ready_head, *ready_tail; /* jobs with something to do (a new job, new outputs) */
    bool pump_stop;              /* no job left: the pumps and the handoff thread exit (under pump_mu) */
    pthread_t handoff_thr;       /* answers the prefills that ended (worker_handoff_thread) */
    bool has_handoff;
    pthread_cond_t handoff_cv;   /* a prefill ended, or pump_stop */
    wjob *ho_head, *ho_tail;     /* prefills that ended, to answer (under pump_mu; rnext) */
    grammar_cache *gcache;       /* the jobs' compiled grammars, by kind and source (thread-safe) */
    bool has_accept, has_hb, has_reg, has_drain;
    uint8_t pool_fp[32];         /* blockkey_pool_fp(model, kv dtype) */
    /* handoff cost, lifetime (heartbeat), under mu */
    uint64_t n_handoffs_out;     /* prefill: HANDOFFs sent */
    uint64_t handoff_out_tokens; /* their n_prompt */
    uint64_t handoff_out_us;     /* first token -> HANDOFF sent, microseconds */
    uint64_t n_handoffs_in;      /* decode: handed-off DECODE jobs with KV brought in */
    uint64_t handoff_in_tokens;  /* positions brought in */
    uint64_t handoff_in_us;      /* DECODE receipt -> KV in place, microseconds */
    /* window cache directory reports (models with window layers; wincache.h) */
    wincache *wc;                /* the scheduler's, journaled; NULL without window layers */
    pthread_mutex_t wrep_mu;     /* one report at a time, so that adds and drops keep their order */
    wincache_event *wev;         /* (PROTO_MAX_WINDOW_EVENTS) events being sent, under wrep_mu */
    proto_window_ev *wpev;       /* (PROTO_MAX_WINDOW_EVENTS) their wire form, under wrep_mu */
};

/* ---- shared between the files (worker_conn.c, worker_jobs.c, worker.c) ---- */

/* worker_conn.c */
void worker_conn_unref_locked(worker *w, wconn *c);
bool worker_send(wconn *c, const proto_msg *m);
void worker_send_error(wconn *c, uint64_t id, int code, const char *msg);
void *worker_accept_thread(void *arg);
bool worker_nap(worker *w, int ms);
void *worker_register_thread(void *arg);
void worker_broadcast(worker *w, const proto_msg *m);
void *worker_hb_thread(void *arg);
/* worker_jobs.c */
void worker_window_report(worker *w);
void worker_window_serve(worker *w, wconn *c, const proto_msg *q);
void worker_window_keep(worker *w, wconn *c, const proto_msg *m);
void *worker_pump_thread(void *arg);
void *worker_handoff_thread(void *arg);
void worker_start_job(worker *w, wconn *c, proto_msg *m);
/* worker.c */
void worker_drain_start(worker *w, int deadline_ms, bool remote);
void worker_undrain(worker *w, wconn *c);

#endif
