/*
 * proto: the binary protocol between the gateway and the prefill / decode / mixed workers. The
 * full description of every frame is docs/protocol.md; this header is its C form, shared by
 * both ends. The handshake that opens every connection and the frame tags are cluster/auth.h.
 *
 * DESIGN. A connection carries length-prefixed frames, in both directions, over TCP. A frame
 * is a 24-byte header (magic "TMCP", version, type, flags, request id, payload length, all
 * little-endian) followed by the payload. Every field is checked on receipt: a wrong magic or
 * version, an unknown type, a flag the type does not define, a payload longer than
 * PROTO_MAX_PAYLOAD (PROTO_MAX_PREAUTH before the handshake: a stranger's frame length is
 * refused before anything is allocated for it) or one that does not decode to exactly its
 * length is an error; the receiver logs one line and closes that connection (never the
 * process).
 *
 * Encoding appends to util's bytebuf (out of memory ends the process, as bytebuf's plain
 * appends do; a frame is at most PROTO_MAX_PAYLOAD). Decoding reads through a
 * bounds-checked cursor (proto_rd): every read past the end sets err and returns zeros, so a
 * truncated or corrupt payload becomes PROTO_ERR_MALFORMED, never an out-of-bounds access.
 * Decoded messages own their arrays (malloc'd); proto_msg_free releases them.
 *
 * Flow (see docs/protocol.md): both ends prove the cluster key (CHALLENGE, PROOF), then every
 * frame is tagged; both ends send HELLO first; the gateway sends PREFILL /
 * DECODE / CANCEL / DRAIN; a prefill worker answers PREFILL with HANDOFF (or TOKENS + FINISH
 * when the request ended at its first token, or ERROR); the gateway relays the handoff in a
 * DECODE job to a decode worker, which streams TOKENS and ends with FINISH. Workers send
 * HEARTBEAT every 500 ms. Full KV blocks travel through the shared block store; only the
 * partial tail block travels in HANDOFF / DECODE. On models with sliding-window layers
 * workers report the window states they keep (WINDOW) and the gateway relays one from its
 * holder (WINFETCH, WINSTATE) to the worker a job goes to, just before the job.
 */
#ifndef TM_PROTO_H
#define TM_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cluster/auth.h"
#include "engine/sample.h"
#include "util/bytebuf.h"

#define PROTO_MAGIC 0x50434d54u          /* "TMCP" as bytes on the wire (LE u32) */
#define PROTO_VERSION 3                  /* 2: the handshake and frame tags (cluster/auth.h);
                                          * 3: HELLO names the model the worker serves */
#define PROTO_HDR_SIZE 24                /* bytes of the frame header */
#define PROTO_MAX_PAYLOAD (64u << 20)    /* largest payload accepted, bytes */
#define PROTO_MAX_PREAUTH 2048           /* largest payload accepted before the handshake sealed
                                          * the connection, bytes: CHALLENGE, PROOF and ERROR
                                          * are all a stranger may send, none needs more */
#define PROTO_MAX_TOKENS (1 << 22)       /* most token ids in one array */
#define PROTO_MAX_STR 1024               /* longest string field, bytes */
#define PROTO_MAX_STOP_IDS 8             /* = SCHED_MAX_STOP_IDS */
#define PROTO_MAX_TOP 20                 /* = SCHED_MAX_TOP_LOGPROBS */
#define PROTO_MAX_THINK PROTO_MAX_TOKENS /* largest reasoning budget, tokens */
#define PROTO_MAX_GRAMMAR (1u << 20)     /* longest grammar source (schema / regex / GBNF), bytes */
#define PROTO_GRAMMAR_KINDS 4            /* grammar kinds on the wire: grammar_kind 0..3 */
#define PROTO_MAX_WINDOW_EVENTS 4096     /* most events in one WINDOW frame */

typedef enum {
    PROTO_OK = 0,
    PROTO_ERR_SHORT,       /* not enough bytes yet for a header / frame (incremental parse) */
    PROTO_ERR_MAGIC,       /* not a tokenmill frame */
    PROTO_ERR_VERSION,     /* a protocol version this build does not speak */
    PROTO_ERR_TYPE,        /* unknown frame type */
    PROTO_ERR_FLAGS,       /* a flag the frame type does not define */
    PROTO_ERR_TOO_BIG,     /* payload length above the limit */
    PROTO_ERR_MALFORMED,   /* the payload does not decode to exactly its length / bad value */
    PROTO_ERR_NOMEM,
    PROTO_ERR_IO,          /* read/write failed (errno set) */
    PROTO_ERR_CLOSED,      /* the peer closed the connection (cleanly, between frames) */
    PROTO_ERR_AUTH,        /* a sealed connection's frame whose tag is wrong (forged, altered,
                            * replayed or out of order) */
} proto_status;

typedef enum {
    PROTO_HELLO = 1,       /* both ways, first frame: role, model, capacity */
    PROTO_HEARTBEAT = 2,   /* both ways: load report (the gateway's is all zeros) */
    PROTO_PREFILL = 3,     /* gateway -> prefill/mixed worker: run a prompt, hand off */
    PROTO_HANDOFF = 4,     /* prefill worker -> gateway: first token + tail KV */
    PROTO_DECODE = 5,      /* gateway -> decode/mixed worker: continue (handoff or resume) */
    PROTO_TOKENS = 6,      /* worker -> gateway: generated token ids (+ logprobs) */
    PROTO_FINISH = 7,      /* worker -> gateway: last frame of a request */
    PROTO_CANCEL = 8,      /* gateway -> worker: end this request now */
    PROTO_DRAIN = 9,       /* both ways: drain start (deadline) / drain done */
    PROTO_ERROR = 10,      /* both ways: a request failed (id != 0) or the connection (id 0) */
    PROTO_CHALLENGE = 11,  /* both ways, first frame: a fresh nonce (cluster/auth.h) */
    PROTO_PROOF = 12,      /* both ways, second frame: HMAC of both nonces under the key */
    PROTO_WINDOW = 13,     /* worker -> gateway: window states it added / dropped (directory) */
    PROTO_WINFETCH = 14,   /* gateway -> worker: send me the window state of this key */
    PROTO_WINSTATE = 15,   /* worker -> gateway: the answer (empty: not held); gateway ->
                            * worker: keep this state (fetched from another worker) */
    PROTO_EXPERTS = 16,    /* expert-parallel leader -> member: input rows of some experts of
                            * one layer (cluster/ep.h) */
    PROTO_EXPERTS_OUT = 17,/* member -> leader: the experts' output rows, in the same order */
    PROTO_EMBEDDING = 18,  /* worker -> gateway: the pooled vector of an embedding PREFILL
                            * (PROTO_F_EMBED), before its FINISH */
    PROTO_TYPE_MAX = 18,
} proto_type;

/* Header flags. Each type accepts only the flags listed for it; any other bit is an error. */
#define PROTO_F_REGISTER 0x1u     /* HELLO from a worker that connected to the gateway itself
                                   * (--gateway): the gateway adds it to its live list */
#define PROTO_F_HAS_TAIL 0x1u     /* HANDOFF / DECODE: the payload carries the tail KV */
#define PROTO_F_RESUME 0x2u       /* DECODE: a resume of a request whose decode worker died or
                                   * drained (no handoff; tokens already streamed included) */
#define PROTO_F_LOGPROBS 0x1u     /* TOKENS: each token carries logprob + alternatives */
#define PROTO_F_UNDRAIN 0x1u      /* DRAIN, gateway -> worker: end the drain this gateway asked
                                   * for; the worker takes jobs again (added within version 2) */
#define PROTO_F_STEPTIME 0x1u     /* HEARTBEAT: the worker's learned step-time curve follows the
                                   * counters (a frame without it is what it was before) */
#define PROTO_F_DRAFTS 0x1u       /* FINISH: the request's speculative drafts verified on this
                                   * worker follow (added within version 2: a frame without it is
                                   * what it was before) */
#define PROTO_F_KV_LATENT 0x10u   /* HANDOFF / DECODE with HAS_TAIL: the tail KV has one row per
                                   * (layer, kv head, position), V is K (latent attention; added
                                   * within version 2). proto_encode sets it from kv.n_parts. */
#define PROTO_F_THINK 0x4u        /* PREFILL / DECODE: a reasoning budget section follows the
                                   * params (added within version 1: a frame without the flag
                                   * is byte-for-byte what it was before; see docs/protocol.md) */
#define PROTO_F_GRAMMAR 0x8u      /* PREFILL / DECODE: the structured-output grammar's source
                                   * follows the params (and the THINK section); the worker
                                   * compiles it (added within version 2, like THINK) */
#define PROTO_F_LAST 0x1u         /* EXPERTS / EXPERTS_OUT: the last frame of a layer's exchange */
#define PROTO_F_MORE 0x2u         /* EXPERTS / EXPERTS_OUT with LAST: the last frame of a layer's first
                                   * micro-batch; the second follows (cluster/ep.h) */
#define PROTO_F_EMBED 0x20u       /* PREFILL: an embedding, not a generation: a u8 pooling (model_pool:
                                   * mean or last) follows the prompt; the worker answers EMBEDDING
                                   * then FINISH (version 3) */
#define PROTO_MAX_EMBED 65536     /* most floats in one EMBEDDING */
typedef enum {
    PROTO_ROLE_PREFILL = 1,
    PROTO_ROLE_DECODE = 2,
    PROTO_ROLE_MIXED = 3,
    PROTO_ROLE_GATEWAY = 4,
    PROTO_ROLE_EXPERT = 5,  /* an expert-parallel link's ends (cluster/ep.h): the leader and a
                             * member; the gateway refuses it */
} proto_role;

typedef enum {              /* FINISH reasons; 1..4 have sched_finish's values */
    PROTO_FINISH_STOP = 1,
    PROTO_FINISH_LENGTH = 2,
    PROTO_FINISH_CANCELLED = 3,
    PROTO_FINISH_ERROR = 4,
    PROTO_FINISH_MOVED = 5, /* not finished here (drain deadline): resume it elsewhere */
} proto_finish;

typedef enum {              /* ERROR codes */
    PROTO_E_MALFORMED = 1,  /* id 0: a frame was refused; the sender closes after it */
    PROTO_E_VERSION = 2,
    PROTO_E_MODEL = 3,      /* model fingerprint differs from the peer's */
    PROTO_E_BUSY = 4,       /* queue full: try another worker */
    PROTO_E_TOO_LONG = 5,   /* prompt + max_tokens beyond the context */
    PROTO_E_ARG = 6,        /* bad request (token id out of range, ...) */
    PROTO_E_ROLE = 7,       /* job type this worker's role does not take */
    PROTO_E_DRAINING = 8,   /* worker is draining: try another */
    PROTO_E_INTERNAL = 9,
    PROTO_E_DUPLICATE = 10, /* request id already running on this connection */
    PROTO_E_AUTH = 11,      /* id 0: the handshake failed (the peer lacks the cluster key) */
    PROTO_E_NAME = 12,      /* id 0, gateway -> worker, instead of its HELLO: another live
                             * worker goes by the name this one sent */
} proto_error_code;

typedef struct {
    uint32_t magic;         /* PROTO_MAGIC */
    uint16_t version;       /* PROTO_VERSION */
    uint16_t type;          /* proto_type */
    uint32_t flags;         /* PROTO_F_* of this type */
    uint64_t req_id;        /* request id chosen by the gateway; 0 = connection-level */
    uint32_t len;           /* payload bytes, <= PROTO_MAX_PAYLOAD */
} proto_hdr;

typedef struct {
    uint8_t role;           /* proto_role */
    uint8_t kv_dtype;       /* qtype of the KV pool (F16 / F32); tail KV comes in this type */
    uint8_t model_fp[32];   /* model fingerprint (model.h); peers must match */
    uint32_t max_seqs;      /* running sequences at once */
    uint32_t kv_blocks;     /* KV pool size, 128-token blocks */
    uint32_t max_batch_tokens; /* tokens per engine step */
    uint32_t n_ctx;         /* positions per sequence */
    uint32_t n_vocab;
    char *listen;           /* "HOST:PORT" where the worker accepts the gateway ("" if none) */
    char *name;             /* free-form id for logs ("" if none) */
    char *model_id;         /* the id requests name the served model by ("" if none: the
                             * gateway then matches the fingerprint alone); version 3 */
} proto_hello;

typedef struct {
    uint32_t n_running;     /* requests running */
    uint32_t n_queued;      /* requests waiting */
    uint64_t sum_cache_len; /* sum over running requests of their context length, positions */
    uint64_t uncached_queued; /* prompt tokens of waiting requests not known to be cached */
    uint32_t kv_blocks_free;  /* free + reclaimable blocks */
    uint32_t kv_blocks_total;
    uint8_t draining;       /* 1 while draining: send no new work */
    uint64_t n_prefill_tokens; /* lifetime tokens computed as prefill (rates by difference) */
    uint64_t n_gen_tokens;  /* lifetime tokens generated */
    uint64_t busy_us;       /* lifetime microseconds inside engine steps (prefill speed =
                             * d n_prefill_tokens / d busy_us on a prefill worker) */
    uint64_t n_handoffs_out;    /* prefill side: lifetime HANDOFFs sent */
    uint64_t handoff_out_tokens; /* their context positions (n_prompt) */
    uint64_t handoff_out_us;    /* microseconds from the first token to HANDOFF sent (tail copy,
                                 * waiting for the full blocks' store writes, send) */
    uint64_t n_handoffs_in;     /* decode side: lifetime DECODE jobs whose KV was brought in */
    uint64_t handoff_in_tokens; /* positions brought in (store blocks + installed tail) */
    uint64_t handoff_in_us;     /* microseconds from DECODE receipt to that KV in place
                                 * (admission wait, store loads, tail install) */
    float step_w[4];            /* with PROTO_F_STEPTIME: the worker's engine step time, seconds
                                 * per unit of (1, decodes, prefill tokens, depth / 1024), depth
                                 * = the positions the step's tokens attend to (steptime.h); finite */
} proto_heartbeat;

typedef struct {
    sample_params sample;   /* temp, top_k, top_p, min_p, penalties, window, seed */
    int32_t max_tokens;     /* generated tokens at most, counting those already generated;
                             * <= 0: until the context is full */
    int32_t stop_ids[PROTO_MAX_STOP_IDS]; /* extra ids that end generation */
    uint8_t n_stop_ids;
    uint8_t ignore_eos;
    uint8_t logprobs;
    uint8_t top_logprobs;   /* 0..PROTO_MAX_TOP */
    int32_t cache_class;    /* store_class of the request's blocks */
    char *salt;             /* tenant salt for block keys ("" = none) */
    /* reasoning budget (sched_params' think_*), on the wire only with PROTO_F_THINK, which the
     * sender sets exactly when think_budget > 0. The state of a request continued elsewhere
     * (reasoning tokens so far, block still open) is not sent: the receiver replays it from
     * think_open and the generated tokens, as it replays the sampler's. */
    uint32_t think_budget;  /* reasoning tokens at most, 1..PROTO_MAX_THINK; 0 = no budget */
    int32_t think_start;    /* id that opens a think block, -1 = none */
    int32_t think_end;      /* id that closes it, >= 0 (below the model's vocabulary) */
    uint8_t think_open;     /* 0/1: the prompt ends inside an open think block */
    /* structured output, on the wire only with PROTO_F_GRAMMAR, which the sender sets exactly
     * when grammar is not NULL: the source the request's grammar was compiled from (the
     * receiver compiles it again, through its cache keyed by kind and bytes). The matcher's
     * state of a continued request is not sent: the receiver replays the generated tokens
     * through the automaton (outside think blocks), as it replays the sampler's. */
    uint8_t grammar_kind;   /* grammar_kind (grammar.h), < PROTO_GRAMMAR_KINDS */
    char *grammar;          /* (grammar_len) bytes, no NUL among them, NUL-terminated in memory */
    uint32_t grammar_len;   /* 0..PROTO_MAX_GRAMMAR (0: the JSON kind, which has no source) */
    uint8_t grammar_lazy;   /* 0: the grammar binds the whole answer; 1: a lazy grammar (strict
                             * tools under auto): free until grammar_trigger, then bound */
    int32_t grammar_trigger; /* with grammar_lazy: the token id that opens a bound document (the
                              * receiver checks it against its vocabulary); else 0 */
} proto_params;

typedef struct {            /* KV of positions [start, start + n) of one sequence */
    uint8_t dtype;          /* qtype (F16 / F32), the pool's */
    uint8_t n_parts;        /* rows per (layer, kv head, position): 2 (K, V) or 1 (V is K: MLA);
                             * on the wire as PROTO_F_KV_LATENT */
    uint16_t n_layers;
    uint16_t n_kv_heads;
    uint16_t head_dim;
    uint32_t start;         /* first position: a multiple of 128 (the tail block's start) */
    uint32_t n;             /* positions, 0..127 */
    uint32_t n_bytes;       /* n_layers * n_parts * n_kv_heads * n * head_dim * sizeof(dtype) */
    uint8_t *data;          /* layout [layer][k|v][kv_head][pos][head_dim] (k only: n_parts 1) */
} proto_kv;

typedef struct {
    proto_params params;
    uint32_t hit_len;       /* prompt positions the gateway found cached (a hint) */
    uint32_t n_prompt;
    int32_t *prompt;        /* (n_prompt) token ids */
    uint8_t embed;          /* with PROTO_F_EMBED: the pooling (model_pool MEAN or LAST) */
} proto_prefill_job;

typedef struct {            /* EMBEDDING */
    uint32_t n;             /* floats, 1..PROTO_MAX_EMBED (the model's width) */
    float *v;               /* (n) the pooled vector, not normalised, finite */
} proto_embedding;

typedef struct {
    int32_t token;          /* the first generated token */
    float logprob;          /* with params.logprobs */
    uint8_t n_top;
    int32_t top_ids[PROTO_MAX_TOP];
    float top_lps[PROTO_MAX_TOP];
} proto_tok;

typedef struct {
    proto_tok first;        /* the first generated token (the gateway streams it) */
    uint32_t n_prompt;      /* prompt tokens */
    uint32_t n_cached;      /* of which came from a cache tier */
    uint32_t n_computed;    /* of which were computed by this prefill */
    uint32_t n_stored;      /* leading positions whose full blocks are in the store (k * 128) */
    uint32_t n_sampled;     /* sampler draws done (1 when temp > 0, else 0): the decode side
                             * reseeds with params.sample.seed and skips that many */
    uint32_t prefill_us;    /* microseconds from receipt to handoff */
    proto_kv kv;            /* with PROTO_F_HAS_TAIL: positions [n_stored, n_prompt) */
} proto_handoff;

typedef struct {
    proto_params params;
    uint32_t n_prompt;
    int32_t *prompt;        /* (n_prompt) */
    uint32_t n_gen;         /* tokens generated so far (>= 1), all streamed to the client */
    int32_t *gen;           /* (n_gen) */
    uint32_t n_cached;      /* prompt tokens cached at the first prefill (for usage) */
    uint32_t n_sampled;     /* sampler draws done so far */
    proto_kv kv;            /* with PROTO_F_HAS_TAIL: KV of [kv.start, kv.start + kv.n) of
                             * prompt ++ gen; positions below kv.start come from the store */
} proto_decode_job;

typedef struct {
    uint32_t n;             /* tokens */
    proto_tok *toks;        /* (n); logprob fields only with PROTO_F_LOGPROBS */
} proto_tokens;

typedef struct {
    uint8_t reason;         /* proto_finish */
    uint32_t prompt_tokens;
    uint32_t cached_tokens;
    uint32_t completion_tokens; /* all generated tokens of the request, earlier ones included */
    uint32_t ttft_us;       /* receipt to first token on this worker (0 if none) */
    uint32_t accepted_drafts; /* with PROTO_F_DRAFTS: drafted tokens verified and accepted on
                             * this worker (<= completion_tokens) */
    uint32_t rejected_drafts; /* and rejected (<= SPEC_MAX_K per generated token) */
} proto_finish_msg;

typedef struct {
    uint8_t done;           /* 0: drain starts (no new work), 1: drained, the sender closes */
    uint32_t deadline_ms;   /* start: time left to finish; then FINISH MOVED for the rest */
} proto_drain;

typedef struct {
    uint32_t code;          /* proto_error_code */
    char *msg;
} proto_error;

typedef struct {
    uint8_t nonce[AUTH_NONCE_SIZE]; /* CHALLENGE: fresh random bytes of the sender */
} proto_challenge;

typedef struct {
    uint8_t mac[AUTH_MAC_SIZE];     /* PROOF: HMAC-SHA256 of both nonces under the key */
} proto_proof;

typedef enum {              /* WINDOW event ops (wincache_ev_op's values) */
    PROTO_WIN_ADD = 1,      /* the sender keeps the state ttl_ms from now */
    PROTO_WIN_DROP = 2,     /* the sender dropped it */
} proto_win_op;

typedef struct {            /* one directory event (WINDOW) */
    uint8_t op;             /* proto_win_op */
    uint8_t key[32];        /* block key of the block the window state ends */
    uint32_t ttl_ms;        /* added: milliseconds it is kept; dropped: 0 */
} proto_window_ev;

typedef struct {
    uint32_t n;             /* 1..PROTO_MAX_WINDOW_EVENTS */
    proto_window_ev *ev;    /* (n) */
} proto_window;

typedef struct {
    uint8_t key[32];        /* WINFETCH: the state wanted */
} proto_winfetch;

typedef struct {
    uint8_t key[32];        /* the state's key */
    uint32_t n_bytes;       /* 0 (not held: a fetch's answer only) or the state's bytes */
    uint8_t *data;          /* (n_bytes) the window layers' state, the holder's layout
                             * (kvpool_window_state_bytes: the receiver checks the size) */
} proto_winstate;

#define PROTO_MAX_EXPERTS 4096    /* most experts in one EXPERTS frame */
typedef struct {            /* EXPERTS / EXPERTS_OUT: rows of some experts of one layer */
    uint16_t layer;
    uint32_t dim;           /* floats per row, 1..65536 */
    uint32_t n_exp;         /* 0..PROTO_MAX_EXPERTS */
    int32_t *experts;       /* (n_exp) expert ids, strictly ascending */
    int32_t *n_rows;        /* (n_exp) rows of each, >= 1 */
    uint32_t n_floats;      /* dim * sum of n_rows */
    float *x;               /* (n_floats) the rows in expert order, little-endian f32 */
} proto_experts;

typedef struct {
    proto_hdr hdr;          /* type, flags and req_id are used by proto_encode */
    union {
        proto_hello hello;
        proto_heartbeat heartbeat;
        proto_prefill_job prefill;
        proto_handoff handoff;
        proto_decode_job decode;
        proto_tokens tokens;
        proto_finish_msg finish;
        proto_drain drain;
        proto_error error;
        proto_challenge challenge;
        proto_proof proof;
        proto_window window;
        proto_winfetch winfetch;
        proto_winstate winstate;
        proto_experts experts; /* EXPERTS and EXPERTS_OUT */
        proto_embedding embedding;
    } u;
} proto_msg;

/* ---- byte buffers: encoding appends to a bytebuf, decoding reads through a cursor ---- */
typedef struct {
    const uint8_t *p;       /* (n) bytes */
    size_t n;
    size_t off;             /* next byte to read */
    bool err;               /* a read went past the end or a value was out of range */
} proto_rd;

void proto_put_u8(bytebuf *b, uint8_t v);
void proto_put_u16(bytebuf *b, uint16_t v);
void proto_put_u32(bytebuf *b, uint32_t v);
void proto_put_u64(bytebuf *b, uint64_t v);
void proto_put_f32(bytebuf *b, float v);
void proto_put_bytes(bytebuf *b, const void *p, size_t n);
void proto_put_str(bytebuf *b, const char *z);   /* u16 length + bytes; NULL = "" */

void proto_rd_init(proto_rd *r, const void *p, size_t n);
uint8_t proto_get_u8(proto_rd *r);
uint16_t proto_get_u16(proto_rd *r);
uint32_t proto_get_u32(proto_rd *r);
uint64_t proto_get_u64(proto_rd *r);
float proto_get_f32(proto_rd *r);
const uint8_t *proto_get_bytes(proto_rd *r, size_t n);   /* NULL (err set) when short */
char *proto_get_str(proto_rd *r);    /* malloc'd, NUL-terminated; NULL on error */

/* ---- frames ---- */
const char *proto_status_name(proto_status st);
const char *proto_type_name(int type);
const char *proto_role_name(int role);
int proto_role_parse(const char *z);   /* "prefill" | "decode" | "mixed": the role, else -1 */

/* Parses and checks a header from n bytes at p: PROTO_ERR_SHORT when n < PROTO_HDR_SIZE,
 * else the first problem found (magic, version, type, flags, length). */
proto_status proto_hdr_parse(const uint8_t *p, size_t n, proto_hdr *h);
/* Appends one whole frame (header + payload) for m (m->hdr.type/flags/req_id are used; magic,
 * version and len are filled in). PROTO_ERR_TOO_BIG when the payload exceeds the limit,
 * PROTO_ERR_MALFORMED when a field is beyond its limit (the receiver would refuse it); b is
 * left as it was on error. */
proto_status proto_encode(bytebuf *b, const proto_msg *m);
/* Decodes the payload of a checked header into m (which owns its arrays afterwards, free with
 * proto_msg_free). On error m holds nothing to free. */
proto_status proto_decode(const proto_hdr *h, const uint8_t *payload, proto_msg *m);
/* Frees the arrays and strings of a decoded (or hand-built, malloc'd) message. */
void proto_msg_free(proto_msg *m);

/* ---- connections ----
 * A connection is a socket and, once the handshake (auth_handshake) has sealed it, the tagging
 * state of each direction: every frame sent then carries a tag, every frame received is
 * refused (PROTO_ERR_AUTH) unless its tag is right. Sending is the caller's to serialise (one
 * writer at a time: a send lock); only one thread receives. */
typedef struct proto_conn {
    int fd;                 /* the socket (not closed by proto_conn_free) */
    bool sealed;            /* handshake done: frames are tagged both ways */
    auth_dir tx, rx;        /* sent / received frames' tags (seq, session key) */
    double deadline;        /* util_now() after which proto_recv fails (PROTO_ERR_IO, errno
                             * ETIMEDOUT) however the bytes trickle in; 0: none. The handshake's
                             * bound: a receive timeout would restart with every byte */
} proto_conn;

void proto_conn_init(proto_conn *c, int fd);
void proto_conn_free(proto_conn *c);   /* the tagging state; the fd stays open */

/* Blocking socket I/O. proto_send writes all n raw bytes to fd (MSG_NOSIGNAL). proto_send_frame
 * writes one encoded frame (proto_encode's bytes) and, on a sealed connection, its tag.
 * proto_recv reads one frame: the checked header, then the payload (and tag, checked before
 * anything is decoded), decoded into m; PROTO_ERR_CLOSED when the peer closed before a header
 * byte. On a connection not sealed yet a payload above PROTO_MAX_PREAUTH is PROTO_ERR_TOO_BIG
 * before a byte of it is read. */
proto_status proto_send(int fd, const void *p, size_t n);
proto_status proto_send_frame(proto_conn *c, const void *frame, size_t n);
proto_status proto_send_msg(proto_conn *c, const proto_msg *m);
proto_status proto_recv(proto_conn *c, proto_msg *m);

/* Bytes of a tail KV block for the given geometry (0 when out of range). */
size_t proto_kv_bytes(int dtype, int n_parts, int n_layers, int n_kv_heads, int head_dim, int n);

/* TCP helpers: "HOST:PORT" (HOST may be empty or "*" for any). Return a socket or -1 (errno). */
int proto_listen(const char *hostport, int backlog);
int proto_connect(const char *hostport, int timeout_ms);
/* accept(2) for a cluster listening socket: the connection (close-on-exec, TCP_NODELAY like
 * proto_connect's: every cluster socket comes from one of the two), or -1 (errno). host (may be
 * NULL) receives the peer's address without its port ("" when unknown). */
int proto_accept(int listen_fd, char *host, size_t hostsz);
/* The numeric address of a connected socket's peer, without its port, into host ("" unknown). */
void proto_peer_host(int fd, char *host, size_t hostsz);
/* The port a listening socket is bound to (for tests binding port 0). */
int proto_local_port(int fd);

#endif
