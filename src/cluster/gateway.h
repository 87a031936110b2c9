/*
 * gateway: the front of a disaggregated cluster. It runs the HTTP APIs (recipe/api.h)
 * over an api_backend whose requests live on remote prefill and decode workers, talking the
 * binary protocol of cluster/proto.h (docs/protocol.md).
 *
 * DESIGN. One mutex guards the worker table and every request. Threads:
 *   - one reader per worker connection: decodes frames (HEARTBEAT, HANDOFF, TOKENS, FINISH,
 *     ERROR, DRAIN) and applies them to the requests under the mutex;
 *   - the dispatcher: places the requests still waiting for a worker with the balancers
 *     (cluster/balance.h), drops workers that missed heartbeats (heartbeat_timeout_s),
 *     enforces the progress and wait deadlines, and starts the static ones' reconnects;
 *   - a connector per static worker being (re)connected (one at a time per worker): its
 *     connect, handshake and HELLO, so that one down or stuck in its handshake delays nobody;
 *   - the acceptor (when register_listen is set): workers started with --gateway connect here
 *     and, each in a thread of its own (a bounded table with an absolute deadline, cluster/
 *     greet.h, so that a peer slow in its handshake holds up nobody else and strangers cannot
 *     hold every entry), do the handshake and say HELLO with PROTO_F_REGISTER; they join the
 *     live list unless another live worker goes by their name.
 * Nothing on a request's path waits on a timer: frames are queued under the mutex and written
 * at once by the thread that made them (gw_flush, one writer at a time so that each
 * connection's frames keep their order; the mutex is released while writing), every cluster
 * socket has TCP_NODELAY (proto.h), and the API thread sleeps on the request's condition
 * variable until a token or the end arrives. /metrics' tokenmill_gateway_added_seconds is
 * each request's time to first token here less the worker's own: what this path adds.
 * A request's life: submit computes its block keys and entry point (the longest stored prefix,
 * store_exists) and sends PREFILL from the submitting thread to the prefill worker that
 * finishes it earliest, or to the one prefilling a prefix of it right now when waiting for
 * that costs less than it saves (balance.h, SHARED IN FLIGHT; a worker's learned step-time
 * curve, reported in its heartbeats, is its cost model); the HANDOFF's first token is
 * streamed at once and the reader sends the request to a decode worker (DECODE with the tail
 * KV), whose TOKENS are streamed until FINISH. Every
 * generated token is kept, so when a decode worker dies (connection lost or heartbeats
 * missed) or drains (FINISH MOVED) the request resumes on another one from exactly the tokens
 * already streamed (DECODE with PROTO_F_RESUME: prompt + those tokens; the new worker loads
 * the stored blocks and recomputes the tail). A dead prefill worker's requests are simply
 * prefilled again elsewhere (nothing of them was streamed). With no worker of a role a
 * request waits up to wait_timeout_s: at submit that is a 503 in the API's shape
 * (SCHED_ERR_STOPPED), later it ends with SCHED_FINISH_UNAVAILABLE, which the APIs write as
 * a 503 "no worker was available" error, not an engine failure (but not while the gateway
 * drains: see gateway_drain).
 *
 * Every connection starts with the handshake of cluster/auth.h: a peer that cannot prove it
 * holds the cluster key is logged, counted and closed before it is listed or sent anything,
 * and every later frame is tagged both ways. A worker that heartbeats but makes no progress on
 * a job (no first token within progress_first_s, no next one within progress_next_s) is
 * treated as dead for that request: CANCEL is sent, the request moves elsewhere with its
 * tokens so far (the same path as a dead worker's), and it goes back to that worker only when
 * no other of the role is up.
 *
 * Workers are trusted with nothing: besides the protocol's own checks, every value of a frame
 * the gateway uses is checked against what it knows (token ids below the vocabulary, counts
 * and KV geometry matching the request and the model, request ids it issued, no tokens beyond
 * max_tokens or after a stop token, lifetime counters that never go back). A worker that
 * sends a bad value is logged and dropped like a dead one, before anything of that frame
 * reaches a client; its requests are re-prefilled or resumed elsewhere.
 *
 * Heartbeats carry the workers' lifetime counters: the gateway learns each worker's prefill
 * speed from them (balance.h, bal_speed; used by the prefill balancer and the capacity rule)
 * and reports the KV handoff cost per worker and per token on /metrics, next to the prefill
 * workers' engine seconds per token (the time to recompute what a handoff moves).
 *
 * SEVERAL MODELS. Each worker serves one model and says which in its HELLO (the id requests
 * name it by, and its fingerprint); the gateway serves the models it was given, each with its
 * own api_backend (gateway_backend(g, i)), and places a request only on workers of its model:
 * the balancers, the prefill / decode pairing, the rerouting of a dead or draining worker's
 * requests, the waits for a worker of a role and the window-state fetches all look at that
 * model's workers alone (one worker table, filtered by model). A worker of a model the gateway
 * does not serve is refused with a message naming the ones it does.
 *
 * The handles given to the API layer are gw_req pointers cast to sched_req * (api_backend).
 */
#ifndef TM_GATEWAY_H
#define TM_GATEWAY_H

#include <stdbool.h>
#include <stdint.h>

#include "cache/store.h"
#include "cluster/auth.h"
#include "http/http.h"
#include "model/model.h"
#include "recipe/api.h"

typedef enum {
    GATEWAY_OK = 0,
    GATEWAY_ERR_ARG,      /* bad option (address) */
    GATEWAY_ERR_BIND,     /* cannot listen on register_listen */
} gateway_status;

#define GATEWAY_MAX_MODELS 8       /* models one gateway serves (= API_MAX_MODELS) */

/* One model the gateway serves: its requests go to the workers that serve it. */
typedef struct {
    const model *model;            /* fingerprint (its workers must match), vocabulary, KV shape */
    const char *name;              /* the id requests name it by and its workers announce (HELLO
                                    * model_id); a worker announcing none is matched by fingerprint */
    int n_ctx;                     /* positions per sequence (as its workers) */
    int32_t eos_ids[4];            /* end-of-generation ids its workers stop on (-1 unused) */
} gateway_model;

typedef struct {
    const gateway_model *models;   /* (n_models) served models, [0] the default; copied, but the
                                    * models and names must outlive g */
    int n_models;                  /* 1..GATEWAY_MAX_MODELS */
    store *cache;                  /* the shared block store (entry point hits), or NULL */
    const char *const *prefill;    /* (n_prefill) "HOST:PORT" of prefill workers to connect to */
    int n_prefill;
    const char *const *decode;     /* (n_decode) of decode workers */
    int n_decode;
    const char *register_listen;   /* "HOST:PORT" where workers register (--gateway), or NULL */
    const auth_key *key;           /* the cluster secret (cluster/auth.h), required; outlives g */
    double heartbeat_timeout_s;    /* a worker silent this long is out; <= 0: 2 */
    double handshake_timeout_s;    /* a connection's whole handshake and HELLO, however its
                                    * bytes trickle in; <= 0: GREET_DEADLINE_S */
    double progress_first_s;       /* a job (PREFILL / DECODE) without its first token this long
                                    * is moved elsewhere, as if its worker had died; <= 0: 30 */
    double progress_next_s;        /* the same between two tokens of a job; <= 0: 10 */
    double wait_timeout_s;         /* longest wait for a worker of a role; <= 0: 30 */
    uint32_t drain_deadline_ms;    /* default drain deadline; 0: 60000 */
    double prefill_tokens_per_s;   /* a new worker's prefill speed until learned from its
                                    * heartbeats (balancer, capacity rule); <= 0: 20000 */
    int min_workers, max_workers;  /* capacity limits per role; 0: 1 and 16 */
} gateway_opts;

typedef struct gateway gateway;

gateway_status gateway_new(const gateway_opts *o, gateway **out, char *err, size_t errsz);
/* Draining, for a gateway that stops without cutting its streams (as sched_drain): new
 * requests are refused (SCHED_ERR_STOPPED: a 503 with Retry-After) while the running ones go on
 * to their normal end on the workers; gateway_wait_idle waits up to timeout_ms (< 0: no limit)
 * and returns how many are still running; gateway_abort ends those left with FINISH ABORTED
 * (their API's "incomplete" ending, recipe/api.h), cancelling them on their workers. A request
 * moved off a worker that dies or stalls during the drain waits for a worker of its role with
 * no wait_timeout_s: the caller's deadline (its gateway_abort) ends what is still waiting then,
 * as incomplete, so a caller that drains must abort at some point. */
void gateway_drain(gateway *g);
int gateway_wait_idle(gateway *g, int timeout_ms);
void gateway_abort(gateway *g);
/* Refuses new requests and ends every running one (FINISH CANCELLED), so streams close. */
void gateway_shutdown(gateway *g);
/* Stops the threads, closes the connections, frees. Every handle must have been released. */
void gateway_free(gateway *g);
/* The backend for the api_ctx of model i (gateway_opts.models[i]): its requests go to the
 * workers serving that model. */
const api_backend *gateway_backend(gateway *g, int i);
/* The port workers register at (register_listen with port 0), or -1. */
int gateway_register_port(const gateway *g);
/* GET /admin/workers, POST /admin/drain?worker=NAME|ADDR[&deadline_ms=N], POST
 * /admin/undrain?worker=NAME|ADDR, GET /admin/capacity. */
void gateway_routes(gateway *g, http_server *h);

#endif
