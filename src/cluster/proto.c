/*
 * proto: encoding, decoding and checking of the gateway <-> worker frames (proto.h,
 * docs/protocol.md).
 *
 * DESIGN. Every message has one put function and one get function written side by side, in
 * the same field order, so the two cannot drift. Gets read through proto_rd, whose reads past
 * the end set err and return zeros; counts are checked against their limits before anything
 * is allocated, and a decode must consume the payload exactly. The socket helpers are plain
 * blocking I/O (one reader thread per connection on both ends); on a sealed connection they
 * append and check the frame tags of cluster/auth.h.
 */
#include "cluster/proto.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <fcntl.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <openssl/crypto.h>

#include "engine/spec.h"
#include "model/quant.h"
#include "util/util.h"

/* ---- buffers ---- */

void proto_put_bytes(bytebuf *b, const void *p, size_t n)
{
    if (n) bytebuf_append(b, p, n);
}

void proto_put_u8(bytebuf *b, uint8_t v) { proto_put_bytes(b, &v, 1); }
void proto_put_u16(bytebuf *b, uint16_t v)
{
    uint8_t x[2] = { (uint8_t)v, (uint8_t)(v >> 8) };
    proto_put_bytes(b, x, 2);
}
void proto_put_u32(bytebuf *b, uint32_t v)
{
    uint8_t x[4];
    for (int i = 0; i < 4; i++) x[i] = (uint8_t)(v >> (8 * i));
    proto_put_bytes(b, x, 4);
}
void proto_put_u64(bytebuf *b, uint64_t v)
{
    uint8_t x[8];
    for (int i = 0; i < 8; i++) x[i] = (uint8_t)(v >> (8 * i));
    proto_put_bytes(b, x, 8);
}
void proto_put_f32(bytebuf *b, float v)
{
    uint32_t u;
    memcpy(&u, &v, 4);
    proto_put_u32(b, u);
}
void proto_put_str(bytebuf *b, const char *z)
{
    size_t n = z ? strlen(z) : 0;
    if (n > PROTO_MAX_STR) n = PROTO_MAX_STR;   /* encode checks this first */
    proto_put_u16(b, (uint16_t)n);
    proto_put_bytes(b, z, n);
}

void proto_rd_init(proto_rd *r, const void *p, size_t n)
{
    r->p = p;
    r->n = n;
    r->off = 0;
    r->err = false;
}

const uint8_t *proto_get_bytes(proto_rd *r, size_t n)
{
    if (r->err || n > r->n - r->off) { r->err = true; return NULL; }
    const uint8_t *p = r->p + r->off;
    r->off += n;
    return p;
}
uint8_t proto_get_u8(proto_rd *r)
{
    const uint8_t *p = proto_get_bytes(r, 1);
    return p ? p[0] : 0;
}
uint16_t proto_get_u16(proto_rd *r)
{
    const uint8_t *p = proto_get_bytes(r, 2);
    return p ? (uint16_t)(p[0] | p[1] << 8) : 0;
}
uint32_t proto_get_u32(proto_rd *r)
{
    const uint8_t *p = proto_get_bytes(r, 4);
    if (!p) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
    return v;
}
uint64_t proto_get_u64(proto_rd *r)
{
    const uint8_t *p = proto_get_bytes(r, 8);
    if (!p) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 8; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}
float proto_get_f32(proto_rd *r)
{
    uint32_t u = proto_get_u32(r);
    float v;
    memcpy(&v, &u, 4);
    return v;
}
char *proto_get_str(proto_rd *r)
{
    uint16_t n = proto_get_u16(r);
    if (n > PROTO_MAX_STR) { r->err = true; return NULL; }
    const uint8_t *p = proto_get_bytes(r, n);
    if (!p) return NULL;
    if (memchr(p, 0, n)) { r->err = true; return NULL; }
    char *z = malloc((size_t)n + 1);
    if (!z) { r->err = true; return NULL; }
    memcpy(z, p, n);
    z[n] = 0;
    return z;
}

/* ---- names ---- */

const char *proto_status_name(proto_status st)
{
    static const char *names[] = { "ok", "short", "bad magic", "bad version", "unknown type",
                                   "bad flags", "frame too big", "malformed payload",
                                   "out of memory", "i/o error", "closed", "bad frame tag" };
    return (unsigned)st < TM_ARRAY_LEN(names) ? names[st] : "?";
}

const char *proto_type_name(int type)
{
    static const char *names[] = { "?", "HELLO", "HEARTBEAT", "PREFILL", "HANDOFF", "DECODE",
                                   "TOKENS", "FINISH", "CANCEL", "DRAIN", "ERROR", "CHALLENGE", "PROOF",
                                   "WINDOW", "WINFETCH", "WINSTATE", "EXPERTS", "EXPERTS_OUT", "EMBEDDING" };
    return type > 0 && type <= PROTO_TYPE_MAX ? names[type] : "?";
}

const char *proto_role_name(int role)
{
    switch (role) {
    case PROTO_ROLE_PREFILL: return "prefill";
    case PROTO_ROLE_DECODE: return "decode";
    case PROTO_ROLE_MIXED: return "mixed";
    case PROTO_ROLE_GATEWAY: return "gateway";
    case PROTO_ROLE_EXPERT: return "expert";
    default: return "?";
    }
}

int proto_role_parse(const char *z)
{
    if (!z) return -1;
    if (!strcmp(z, "prefill")) return PROTO_ROLE_PREFILL;
    if (!strcmp(z, "decode")) return PROTO_ROLE_DECODE;
    if (!strcmp(z, "mixed")) return PROTO_ROLE_MIXED;
    return -1;
}

/* ---- header ---- */

static uint32_t proto_allowed_flags(int type)
{
    switch (type) {
    case PROTO_HELLO: return PROTO_F_REGISTER;
    case PROTO_HANDOFF: return PROTO_F_HAS_TAIL | PROTO_F_KV_LATENT;
    case PROTO_PREFILL: return PROTO_F_THINK | PROTO_F_GRAMMAR | PROTO_F_EMBED;
    case PROTO_DECODE: return PROTO_F_HAS_TAIL | PROTO_F_RESUME | PROTO_F_THINK | PROTO_F_GRAMMAR | PROTO_F_KV_LATENT;
    case PROTO_TOKENS: return PROTO_F_LOGPROBS;
    case PROTO_HEARTBEAT: return PROTO_F_STEPTIME;
    case PROTO_FINISH: return PROTO_F_DRAFTS;
    case PROTO_DRAIN: return PROTO_F_UNDRAIN;
    case PROTO_EXPERTS:
    case PROTO_EXPERTS_OUT: return PROTO_F_LAST | PROTO_F_MORE;
    default: return 0;
    }
}

proto_status proto_hdr_parse(const uint8_t *p, size_t n, proto_hdr *h)
{
    if (n < PROTO_HDR_SIZE) return PROTO_ERR_SHORT;
    proto_rd r;
    proto_rd_init(&r, p, PROTO_HDR_SIZE);
    h->magic = proto_get_u32(&r);
    h->version = proto_get_u16(&r);
    h->type = proto_get_u16(&r);
    h->flags = proto_get_u32(&r);
    h->req_id = proto_get_u64(&r);
    h->len = proto_get_u32(&r);
    if (h->magic != PROTO_MAGIC) return PROTO_ERR_MAGIC;
    if (h->version != PROTO_VERSION) return PROTO_ERR_VERSION;
    if (h->type < 1 || h->type > PROTO_TYPE_MAX) return PROTO_ERR_TYPE;
    if (h->flags & ~proto_allowed_flags(h->type)) return PROTO_ERR_FLAGS;
    if (h->len > PROTO_MAX_PAYLOAD) return PROTO_ERR_TOO_BIG;
    return PROTO_OK;
}

/* ---- message bodies ---- */

size_t proto_kv_bytes(int dtype, int n_parts, int n_layers, int n_kv_heads, int head_dim, int n)
{
    bool q = dtype == QTYPE_Q8_0 || dtype == QTYPE_Q4_0;
    if (!(dtype == QTYPE_F16 || dtype == QTYPE_F32 || (q && head_dim % QK8_0 == 0)) || n_parts < 1 || n_parts > 2 || n_layers <= 0 || n_kv_heads <= 0 || head_dim <= 0 || n < 0 || n >= 128)
        return 0;
    return (size_t)n_layers * (size_t)n_parts * (size_t)n_kv_heads * (size_t)n * quant_row_bytes((qtype)dtype, head_dim);
}

/* The reasoning budget section's ranges (the vocabulary is the worker's check). */
static bool proto_think_ok(const proto_params *p)
{
    return p->think_budget >= 1 && p->think_budget <= PROTO_MAX_THINK && p->think_start >= -1 &&
           p->think_end >= 0 && p->think_open <= 1;
}

/* The grammar section's ranges: a known kind, at most PROTO_MAX_GRAMMAR bytes without a NUL
 * (none for the JSON kind, which has no source). */
static bool proto_grammar_ok(const proto_params *p)
{
    return p->grammar && p->grammar_kind < PROTO_GRAMMAR_KINDS && p->grammar_len <= PROTO_MAX_GRAMMAR &&
           p->grammar_lazy <= 1 && p->grammar_trigger >= 0 && (p->grammar_lazy || !p->grammar_trigger) &&
           !memchr(p->grammar, 0, p->grammar_len);
}

/* flags: the frame's; a budget or a grammar without its flag would be dropped silently. */
static bool proto_params_ok(const proto_params *p, uint32_t flags)
{
    bool think = flags & PROTO_F_THINK;
    if (!((flags & PROTO_F_GRAMMAR) ? proto_grammar_ok(p) : !p->grammar)) return false;
    return p->n_stop_ids <= PROTO_MAX_STOP_IDS && p->top_logprobs <= PROTO_MAX_TOP &&
           p->sample.penalty_last_n >= 0 && p->sample.penalty_last_n <= PROTO_MAX_TOKENS &&
           p->sample.n_bias >= 0 && p->sample.n_bias <= SAMPLE_MAX_BIAS &&
           p->ignore_eos <= 1 && p->logprobs <= 1 && (!p->salt || strlen(p->salt) <= PROTO_MAX_STR) &&
           (think ? proto_think_ok(p) : p->think_budget == 0);
}

static void proto_put_params(bytebuf *b, const proto_params *p, uint32_t flags)
{
    bool think = flags & PROTO_F_THINK;
    const sample_params *s = &p->sample;
    proto_put_f32(b, s->temp);
    proto_put_u32(b, (uint32_t)s->top_k);
    proto_put_f32(b, s->top_p);
    proto_put_f32(b, s->min_p);
    proto_put_f32(b, s->repeat_penalty);
    proto_put_f32(b, s->presence_penalty);
    proto_put_f32(b, s->frequency_penalty);
    proto_put_u32(b, (uint32_t)s->penalty_last_n);
    proto_put_u64(b, s->seed);
    proto_put_u32(b, (uint32_t)p->max_tokens);
    proto_put_u8(b, p->n_stop_ids);
    for (int i = 0; i < p->n_stop_ids; i++) proto_put_u32(b, (uint32_t)p->stop_ids[i]);
    proto_put_u8(b, p->ignore_eos);
    proto_put_u8(b, p->logprobs);
    proto_put_u8(b, p->top_logprobs);
    proto_put_u32(b, (uint32_t)p->cache_class);
    proto_put_str(b, p->salt);
    proto_put_u8(b, (uint8_t)s->n_bias);  /* logit_bias: id, bias pairs */
    for (int i = 0; i < s->n_bias; i++) {
        proto_put_u32(b, (uint32_t)s->bias_id[i]);
        proto_put_f32(b, s->bias[i]);
    }
    if (think) {
        proto_put_u32(b, p->think_budget);
        proto_put_u32(b, (uint32_t)p->think_start);
        proto_put_u32(b, (uint32_t)p->think_end);
        proto_put_u8(b, p->think_open);
    }
    if (flags & PROTO_F_GRAMMAR) {
        proto_put_u8(b, p->grammar_kind);
        proto_put_u32(b, p->grammar_len);
        proto_put_bytes(b, p->grammar, p->grammar_len);
        proto_put_u8(b, p->grammar_lazy);
        proto_put_u32(b, (uint32_t)p->grammar_trigger);
    }
}

static void proto_get_params(proto_rd *r, proto_params *p, uint32_t flags)
{
    bool think = flags & PROTO_F_THINK;
    sample_params *s = &p->sample;
    s->temp = proto_get_f32(r);
    s->top_k = (int)proto_get_u32(r);
    s->top_p = proto_get_f32(r);
    s->min_p = proto_get_f32(r);
    s->repeat_penalty = proto_get_f32(r);
    s->presence_penalty = proto_get_f32(r);
    s->frequency_penalty = proto_get_f32(r);
    s->penalty_last_n = (int)proto_get_u32(r);
    s->seed = proto_get_u64(r);
    p->max_tokens = (int32_t)proto_get_u32(r);
    p->n_stop_ids = proto_get_u8(r);
    if (p->n_stop_ids > PROTO_MAX_STOP_IDS) { r->err = true; return; }
    for (int i = 0; i < p->n_stop_ids; i++) p->stop_ids[i] = (int32_t)proto_get_u32(r);
    p->ignore_eos = proto_get_u8(r);
    p->logprobs = proto_get_u8(r);
    p->top_logprobs = proto_get_u8(r);
    p->cache_class = (int32_t)proto_get_u32(r);
    /* the penalty window sizes an allocation: no longer than the longest token array */
    if (s->penalty_last_n < 0 || s->penalty_last_n > PROTO_MAX_TOKENS || p->ignore_eos > 1 || p->logprobs > 1 ||
        p->top_logprobs > PROTO_MAX_TOP || p->cache_class < 0 || p->cache_class > 255) {
        r->err = true;
        return;
    }
    p->salt = proto_get_str(r);
    s->n_bias = proto_get_u8(r);
    if (s->n_bias > SAMPLE_MAX_BIAS) {
        r->err = true;
        return;
    }
    for (int i = 0; i < s->n_bias; i++) {
        s->bias_id[i] = (int32_t)proto_get_u32(r);
        s->bias[i] = proto_get_f32(r);
        if (!(s->bias[i] >= -100 && s->bias[i] <= 100)) r->err = true;  /* NaN too */
    }
    if (think && !r->err) {   /* else the think_* fields stay 0: no budget */
        p->think_budget = proto_get_u32(r);
        p->think_start = (int32_t)proto_get_u32(r);
        p->think_end = (int32_t)proto_get_u32(r);
        p->think_open = proto_get_u8(r);
        if (!proto_think_ok(p)) r->err = true;
    }
    if ((flags & PROTO_F_GRAMMAR) && !r->err) {   /* the length is checked before any allocation */
        p->grammar_kind = proto_get_u8(r);
        uint32_t n = proto_get_u32(r);
        const uint8_t *src = n <= PROTO_MAX_GRAMMAR ? proto_get_bytes(r, n) : NULL;
        if (!src || p->grammar_kind >= PROTO_GRAMMAR_KINDS || memchr(src, 0, n)) {
            r->err = true;
            return;
        }
        p->grammar_lazy = proto_get_u8(r);
        p->grammar_trigger = (int32_t)proto_get_u32(r);   /* the worker checks it against its vocabulary */
        if (r->err || p->grammar_lazy > 1 || p->grammar_trigger < 0 || (!p->grammar_lazy && p->grammar_trigger)) {
            r->err = true;
            return;
        }
        p->grammar = xmalloc(n + 1);
        memcpy(p->grammar, src, n);
        p->grammar[n] = 0;
        p->grammar_len = n;
    }
}

static void proto_put_ids(bytebuf *b, const int32_t *ids, uint32_t n)
{
    proto_put_u32(b, n);
    bytebuf_reserve(b, (size_t)n * 4);
    for (uint32_t i = 0; i < n; i++) proto_put_u32(b, (uint32_t)ids[i]);
}

/* A token array of at most PROTO_MAX_TOKENS, every id >= 0; allocated only after the count
 * is known to fit in what is left of the payload. */
static int32_t *proto_get_ids(proto_rd *r, uint32_t *n_out, bool allow_empty)
{
    uint32_t n = proto_get_u32(r);
    *n_out = 0;
    if (r->err || n > PROTO_MAX_TOKENS || (size_t)n * 4 > r->n - r->off || (!n && !allow_empty)) {
        r->err = true;
        return NULL;
    }
    int32_t *ids = malloc((size_t)(n ? n : 1) * 4);
    if (!ids) { r->err = true; return NULL; }
    for (uint32_t i = 0; i < n; i++) {
        ids[i] = (int32_t)proto_get_u32(r);
        if (ids[i] < 0) r->err = true;
    }
    if (r->err) { free(ids); return NULL; }
    *n_out = n;
    return ids;
}

static void proto_put_tok(bytebuf *b, const proto_tok *t, bool lp)
{
    proto_put_u32(b, (uint32_t)t->token);
    if (!lp) return;
    proto_put_f32(b, t->logprob);
    proto_put_u8(b, t->n_top);
    for (int i = 0; i < t->n_top; i++) {
        proto_put_u32(b, (uint32_t)t->top_ids[i]);
        proto_put_f32(b, t->top_lps[i]);
    }
}

/* The log-probs go out as JSON numbers: the sampled token's must be finite (else malformed);
 * an alternative whose log-prob is not finite (a token a grammar ruled out, as older workers
 * listed them) is no alternative and is dropped. */
static void proto_get_tok(proto_rd *r, proto_tok *t, bool lp)
{
    memset(t, 0, sizeof *t);
    t->token = (int32_t)proto_get_u32(r);
    if (t->token < 0) r->err = true;
    if (!lp) return;
    t->logprob = proto_get_f32(r);
    if (!isfinite(t->logprob)) r->err = true;
    int n_top = proto_get_u8(r), n = 0;
    if (n_top > PROTO_MAX_TOP) { r->err = true; return; }
    for (int i = 0; i < n_top; i++) {
        t->top_ids[n] = (int32_t)proto_get_u32(r);
        t->top_lps[n] = proto_get_f32(r);
        if (isfinite(t->top_lps[n])) n++;
    }
    t->n_top = (uint8_t)n;
}

static bool proto_kv_ok(const proto_kv *kv)
{
    return kv->start % 128 == 0 &&
           kv->n_bytes == proto_kv_bytes(kv->dtype, kv->n_parts, kv->n_layers, kv->n_kv_heads, kv->head_dim, (int)kv->n) &&
           (kv->n == 0 || kv->n_bytes > 0) && (kv->n_bytes == 0 || kv->data);
}

static void proto_put_kv(bytebuf *b, const proto_kv *kv)
{
    proto_put_u8(b, kv->dtype);
    proto_put_u16(b, kv->n_layers);
    proto_put_u16(b, kv->n_kv_heads);
    proto_put_u16(b, kv->head_dim);
    proto_put_u32(b, kv->start);
    proto_put_u32(b, kv->n);
    proto_put_u32(b, kv->n_bytes);
    proto_put_bytes(b, kv->data, kv->n_bytes);
}

static void proto_get_kv(proto_rd *r, proto_kv *kv, uint32_t flags)
{
    kv->dtype = proto_get_u8(r);
    kv->n_parts = flags & PROTO_F_KV_LATENT ? 1 : 2;
    kv->n_layers = proto_get_u16(r);
    kv->n_kv_heads = proto_get_u16(r);
    kv->head_dim = proto_get_u16(r);
    kv->start = proto_get_u32(r);
    kv->n = proto_get_u32(r);
    kv->n_bytes = proto_get_u32(r);
    kv->data = NULL;
    if (r->err || kv->start % 128 || kv->n >= 128 ||
        kv->n_bytes != proto_kv_bytes(kv->dtype, kv->n_parts, kv->n_layers, kv->n_kv_heads, kv->head_dim, (int)kv->n) ||
        (kv->n > 0 && kv->n_bytes == 0)) {
        r->err = true;
        return;
    }
    const uint8_t *p = proto_get_bytes(r, kv->n_bytes);
    if (!p || !kv->n_bytes) return;
    kv->data = malloc(kv->n_bytes);
    if (!kv->data) { r->err = true; return; }
    memcpy(kv->data, p, kv->n_bytes);
}

/* An EXPERTS frame's shape: ids strictly ascending, every count >= 1, n_floats = dim * rows. */
static bool proto_experts_ok(const proto_experts *x)
{
    if (x->dim < 1 || x->dim > 65536 || x->n_exp > PROTO_MAX_EXPERTS) return false;
    uint64_t rows = 0;
    for (uint32_t i = 0; i < x->n_exp; i++) {
        if (x->experts[i] < 0 || (i > 0 && x->experts[i] <= x->experts[i - 1]) || x->n_rows[i] < 1) return false;
        rows += (uint64_t)x->n_rows[i];
    }
    return rows * x->dim == x->n_floats && (uint64_t)x->n_floats * 4 <= PROTO_MAX_PAYLOAD;
}

/* An embedding PREFILL's pooling and an EMBEDDING's vector (version 3 additions). */
static bool proto_embed_pool_ok(unsigned pool) { return pool >= 1 && pool <= 3; }   /* model_pool MEAN, CLS, LAST */

static bool proto_embedding_ok(const proto_embedding *x)
{
    if (x->n < 1 || x->n > PROTO_MAX_EMBED || !x->v) return false;
    for (uint32_t i = 0; i < x->n; i++)
        if (!isfinite(x->v[i])) return false;
    return true;
}

static void proto_put_embedding(bytebuf *b, const proto_embedding *x)
{
    proto_put_u32(b, x->n);
    for (uint32_t i = 0; i < x->n; i++) proto_put_f32(b, x->v[i]);
}

static void proto_get_embedding(proto_rd *r, proto_embedding *x)
{
    uint32_t n = proto_get_u32(r);
    if (r->err || n < 1 || n > PROTO_MAX_EMBED || (uint64_t)n * 4 != r->n - r->off) {
        r->err = true;
        return;
    }
    if (!(x->v = malloc((size_t)n * sizeof *x->v))) {
        r->err = true;
        return;
    }
    x->n = n;
    for (uint32_t i = 0; i < n; i++) x->v[i] = proto_get_f32(r);
    if (!r->err && !proto_embedding_ok(x)) r->err = true;
}

/* Checks the limits a receiver enforces, so that an encoder never produces a frame its peer
 * would refuse. */
static bool proto_msg_ok(const proto_msg *m)
{
    switch (m->hdr.type) {
    case PROTO_HELLO:
        return (!m->u.hello.listen || strlen(m->u.hello.listen) <= PROTO_MAX_STR) &&
               (!m->u.hello.name || strlen(m->u.hello.name) <= PROTO_MAX_STR) &&
               (!m->u.hello.model_id || strlen(m->u.hello.model_id) <= PROTO_MAX_STR) &&
               m->u.hello.role >= PROTO_ROLE_PREFILL && m->u.hello.role <= PROTO_ROLE_EXPERT;
    case PROTO_HEARTBEAT:
        for (int i = 0; i < 4 && (m->hdr.flags & PROTO_F_STEPTIME); i++)
            if (!isfinite(m->u.heartbeat.step_w[i])) return false;
        return m->u.heartbeat.draining <= 1;
    case PROTO_PREFILL:
        return proto_params_ok(&m->u.prefill.params, m->hdr.flags) && m->u.prefill.n_prompt >= 1 &&
               m->u.prefill.n_prompt <= PROTO_MAX_TOKENS &&
               (!(m->hdr.flags & PROTO_F_EMBED) || proto_embed_pool_ok(m->u.prefill.embed));
    case PROTO_EMBEDDING:
        return proto_embedding_ok(&m->u.embedding);
    case PROTO_HANDOFF:
        return m->u.handoff.first.n_top <= PROTO_MAX_TOP && m->u.handoff.n_sampled <= 1 &&
               (!(m->hdr.flags & PROTO_F_HAS_TAIL) || proto_kv_ok(&m->u.handoff.kv));
    case PROTO_DECODE:
        return proto_params_ok(&m->u.decode.params, m->hdr.flags) && m->u.decode.n_prompt >= 1 &&
               m->u.decode.n_prompt <= PROTO_MAX_TOKENS && m->u.decode.n_gen >= 1 &&
               m->u.decode.n_gen <= PROTO_MAX_TOKENS && m->u.decode.n_sampled <= m->u.decode.n_gen &&
               (!(m->hdr.flags & PROTO_F_HAS_TAIL) || proto_kv_ok(&m->u.decode.kv));
    case PROTO_TOKENS:
        if (m->u.tokens.n > PROTO_MAX_TOKENS) return false;
        for (uint32_t i = 0; i < m->u.tokens.n; i++)
            if (m->u.tokens.toks[i].n_top > PROTO_MAX_TOP) return false;
        return true;
    case PROTO_FINISH:
        return m->u.finish.reason >= PROTO_FINISH_STOP && m->u.finish.reason <= PROTO_FINISH_MOVED &&
               m->u.finish.accepted_drafts <= m->u.finish.completion_tokens &&
               m->u.finish.rejected_drafts / SPEC_MAX_K <= m->u.finish.completion_tokens;
    case PROTO_DRAIN: return m->u.drain.done <= 1;
    case PROTO_CHALLENGE:
    case PROTO_PROOF: return true;
    case PROTO_ERROR: return !m->u.error.msg || strlen(m->u.error.msg) <= PROTO_MAX_STR;
    case PROTO_CANCEL: return true;
    case PROTO_WINDOW:
        if (m->u.window.n < 1 || m->u.window.n > PROTO_MAX_WINDOW_EVENTS) return false;
        for (uint32_t i = 0; i < m->u.window.n; i++)
            if (m->u.window.ev[i].op < PROTO_WIN_ADD || m->u.window.ev[i].op > PROTO_WIN_DROP) return false;
        return true;
    case PROTO_WINFETCH: return true;
    case PROTO_WINSTATE: return m->u.winstate.n_bytes <= PROTO_MAX_PAYLOAD - 36;
    case PROTO_EXPERTS:
    case PROTO_EXPERTS_OUT: return proto_experts_ok(&m->u.experts);
    default: return false;
    }
}

/* The header's flags as sent: KV_LATENT follows the tail's n_parts (one source of truth). */
static uint32_t proto_wire_flags(const proto_msg *m)
{
    uint32_t f = m->hdr.flags & ~PROTO_F_KV_LATENT;
    const proto_kv *kv = m->hdr.type == PROTO_HANDOFF ? &m->u.handoff.kv
                         : m->hdr.type == PROTO_DECODE ? &m->u.decode.kv : NULL;
    if (kv && (f & PROTO_F_HAS_TAIL) && kv->n_parts == 1) f |= PROTO_F_KV_LATENT;
    return f;
}

/* The payload of the connection's own frames: greeting, load, drain, error, cancel and the
 * handshake. */
static void proto_put_control(bytebuf *b, const proto_hdr *h, const proto_msg *m)
{
    switch (h->type) {
        case PROTO_HELLO: {
            const proto_hello *x = &m->u.hello;
            proto_put_u8(b, x->role);
            proto_put_u8(b, x->kv_dtype);
            proto_put_bytes(b, x->model_fp, 32);
            proto_put_u32(b, x->max_seqs);
            proto_put_u32(b, x->kv_blocks);
            proto_put_u32(b, x->max_batch_tokens);
            proto_put_u32(b, x->n_ctx);
            proto_put_u32(b, x->n_vocab);
            proto_put_str(b, x->listen);
            proto_put_str(b, x->name);
            proto_put_str(b, x->model_id);
            break;
        }
        case PROTO_HEARTBEAT: {
            const proto_heartbeat *x = &m->u.heartbeat;
            proto_put_u32(b, x->n_running);
            proto_put_u32(b, x->n_queued);
            proto_put_u64(b, x->sum_cache_len);
            proto_put_u64(b, x->uncached_queued);
            proto_put_u32(b, x->kv_blocks_free);
            proto_put_u32(b, x->kv_blocks_total);
            proto_put_u8(b, x->draining);
            proto_put_u64(b, x->n_prefill_tokens);
            proto_put_u64(b, x->n_gen_tokens);
            proto_put_u64(b, x->busy_us);
            proto_put_u64(b, x->n_handoffs_out);
            proto_put_u64(b, x->handoff_out_tokens);
            proto_put_u64(b, x->handoff_out_us);
            proto_put_u64(b, x->n_handoffs_in);
            proto_put_u64(b, x->handoff_in_tokens);
            proto_put_u64(b, x->handoff_in_us);
            for (int i = 0; i < 4 && (h->flags & PROTO_F_STEPTIME); i++) proto_put_f32(b, x->step_w[i]);
            break;
        }
        case PROTO_DRAIN:
            proto_put_u8(b, m->u.drain.done);
            proto_put_u32(b, m->u.drain.deadline_ms);
            break;
        case PROTO_ERROR:
            proto_put_u32(b, m->u.error.code);
            proto_put_str(b, m->u.error.msg);
            break;
        case PROTO_CANCEL:
            break;
        case PROTO_CHALLENGE:
            proto_put_bytes(b, m->u.challenge.nonce, AUTH_NONCE_SIZE);
            break;
        case PROTO_PROOF:
            proto_put_bytes(b, m->u.proof.mac, AUTH_MAC_SIZE);
            break;
    }
}

/* The payload of a request's way through the cluster: its jobs, the handoff between them, its
 * tokens and its end. */
static void proto_put_job(bytebuf *b, const proto_hdr *h, const proto_msg *m)
{
    switch (h->type) {
        case PROTO_PREFILL: {
            const proto_prefill_job *x = &m->u.prefill;
            proto_put_params(b, &x->params, h->flags);
            proto_put_u32(b, x->hit_len);
            proto_put_ids(b, x->prompt, x->n_prompt);
            if (h->flags & PROTO_F_EMBED) proto_put_u8(b, x->embed);
            break;
        }
        case PROTO_EMBEDDING:
            proto_put_embedding(b, &m->u.embedding);
            break;
        case PROTO_HANDOFF: {
            const proto_handoff *x = &m->u.handoff;
            proto_put_tok(b, &x->first, true);
            proto_put_u32(b, x->n_prompt);
            proto_put_u32(b, x->n_cached);
            proto_put_u32(b, x->n_computed);
            proto_put_u32(b, x->n_stored);
            proto_put_u32(b, x->n_sampled);
            proto_put_u32(b, x->prefill_us);
            if (h->flags & PROTO_F_HAS_TAIL) proto_put_kv(b, &x->kv);
            break;
        }
        case PROTO_DECODE: {
            const proto_decode_job *x = &m->u.decode;
            proto_put_params(b, &x->params, h->flags);
            proto_put_ids(b, x->prompt, x->n_prompt);
            proto_put_ids(b, x->gen, x->n_gen);
            proto_put_u32(b, x->n_cached);
            proto_put_u32(b, x->n_sampled);
            if (h->flags & PROTO_F_HAS_TAIL) proto_put_kv(b, &x->kv);
            break;
        }
        case PROTO_TOKENS: {
            const proto_tokens *x = &m->u.tokens;
            proto_put_u32(b, x->n);
            for (uint32_t i = 0; i < x->n; i++) proto_put_tok(b, &x->toks[i], h->flags & PROTO_F_LOGPROBS);
            break;
        }
        case PROTO_FINISH: {
            const proto_finish_msg *x = &m->u.finish;
            proto_put_u8(b, x->reason);
            proto_put_u32(b, x->prompt_tokens);
            proto_put_u32(b, x->cached_tokens);
            proto_put_u32(b, x->completion_tokens);
            proto_put_u32(b, x->ttft_us);
            if (h->flags & PROTO_F_DRAFTS) {
                proto_put_u32(b, x->accepted_drafts);
                proto_put_u32(b, x->rejected_drafts);
            }
            break;
        }
    }
}

/* The payload of sliding-window states: who holds which, and one relayed. */
static void proto_put_window(bytebuf *b, const proto_hdr *h, const proto_msg *m)
{
    switch (h->type) {
        case PROTO_WINDOW:
            proto_put_u32(b, m->u.window.n);
            for (uint32_t i = 0; i < m->u.window.n; i++) {
                proto_put_u8(b, m->u.window.ev[i].op);
                proto_put_bytes(b, m->u.window.ev[i].key, 32);
                proto_put_u32(b, m->u.window.ev[i].ttl_ms);
            }
            break;
        case PROTO_WINFETCH:
            proto_put_bytes(b, m->u.winfetch.key, 32);
            break;
        case PROTO_WINSTATE:
            proto_put_bytes(b, m->u.winstate.key, 32);
            proto_put_u32(b, m->u.winstate.n_bytes);
            proto_put_bytes(b, m->u.winstate.data, m->u.winstate.n_bytes);
            break;
    }
}

/* The payload of expert parallelism: a layer's routed rows out to a member and its results
 * back. */
static void proto_put_experts(bytebuf *b, const proto_hdr *h, const proto_msg *m)
{
    switch (h->type) {
        case PROTO_EXPERTS:
        case PROTO_EXPERTS_OUT: {
            const proto_experts *x = &m->u.experts;
            proto_put_u16(b, x->layer);
            proto_put_u32(b, x->dim);
            proto_put_u32(b, x->n_exp);
            for (uint32_t i = 0; i < x->n_exp; i++) {
                proto_put_u32(b, (uint32_t)x->experts[i]);
                proto_put_u32(b, (uint32_t)x->n_rows[i]);
            }
            proto_put_u32(b, x->n_floats);
            proto_put_bytes(b, x->x, (size_t)x->n_floats * 4);   /* little-endian hosts only (the build's) */
            break;
        }
    }
}

static void proto_get_control(proto_rd *r, const proto_hdr *h, proto_msg *m);
static void proto_get_job(proto_rd *r, const proto_hdr *h, proto_msg *m);
static void proto_get_window(proto_rd *r, const proto_hdr *h, proto_msg *m);
static void proto_get_experts(proto_rd *r, const proto_hdr *h, proto_msg *m);

/* The kinds of frame, each with its payload's encoder and decoder. */
typedef enum { PROTO_KIND_NONE = 0, PROTO_KIND_CONTROL, PROTO_KIND_JOB, PROTO_KIND_WINDOW, PROTO_KIND_EXPERTS } proto_kind;

static proto_kind proto_kind_of(int type)
{
    switch (type) {
    case PROTO_HELLO: case PROTO_HEARTBEAT: case PROTO_DRAIN: case PROTO_ERROR: case PROTO_CANCEL:
    case PROTO_CHALLENGE: case PROTO_PROOF:
        return PROTO_KIND_CONTROL;
    case PROTO_PREFILL: case PROTO_HANDOFF: case PROTO_DECODE: case PROTO_TOKENS: case PROTO_FINISH: case PROTO_EMBEDDING:
        return PROTO_KIND_JOB;
    case PROTO_WINDOW: case PROTO_WINFETCH: case PROTO_WINSTATE:
        return PROTO_KIND_WINDOW;
    case PROTO_EXPERTS: case PROTO_EXPERTS_OUT:
        return PROTO_KIND_EXPERTS;
    default:
        return PROTO_KIND_NONE;
    }
}

static void proto_put_none(bytebuf *b, const proto_hdr *h, const proto_msg *m) {}
static void proto_get_none(proto_rd *r, const proto_hdr *h, proto_msg *m) { r->err = true; }

static const struct {
    void (*put)(bytebuf *b, const proto_hdr *h, const proto_msg *m);
    void (*get)(proto_rd *r, const proto_hdr *h, proto_msg *m);
} proto_kinds[] = {
    [PROTO_KIND_NONE] = { proto_put_none, proto_get_none },
    [PROTO_KIND_CONTROL] = { proto_put_control, proto_get_control },
    [PROTO_KIND_JOB] = { proto_put_job, proto_get_job },
    [PROTO_KIND_WINDOW] = { proto_put_window, proto_get_window },
    [PROTO_KIND_EXPERTS] = { proto_put_experts, proto_get_experts },
};

proto_status proto_encode(bytebuf *b, const proto_msg *m)
{
    const proto_hdr *h = &m->hdr;
    if (h->type < 1 || h->type > PROTO_TYPE_MAX) return PROTO_ERR_TYPE;
    if (h->flags & ~proto_allowed_flags(h->type)) return PROTO_ERR_FLAGS;
    if (!proto_msg_ok(m)) return PROTO_ERR_MALFORMED;
    size_t start = b->len;
    proto_put_u32(b, PROTO_MAGIC);
    proto_put_u16(b, PROTO_VERSION);
    proto_put_u16(b, h->type);
    proto_put_u32(b, proto_wire_flags(m));
    proto_put_u64(b, h->req_id);
    proto_put_u32(b, 0);   /* length, patched below */
    proto_kinds[proto_kind_of(h->type)].put(b, h, m);
    size_t len = b->len - start - PROTO_HDR_SIZE;
    if (len > PROTO_MAX_PAYLOAD) {
        b->len = start;
        b->p[start] = 0;
        return PROTO_ERR_TOO_BIG;
    }
    for (int i = 0; i < 4; i++) b->p[start + 20 + i] = (char)(uint8_t)(len >> (8 * i));
    return PROTO_OK;
}

/* The payload of the connection's own frames: greeting, load, drain, error, cancel and the
 * handshake; errors set r->err. */
static void proto_get_control(proto_rd *r, const proto_hdr *h, proto_msg *m)
{
    switch (h->type) {
        case PROTO_HELLO: {
            proto_hello *x = &m->u.hello;
            x->role = proto_get_u8(r);
            x->kv_dtype = proto_get_u8(r);
            const uint8_t *fp = proto_get_bytes(r, 32);
            if (fp) memcpy(x->model_fp, fp, 32);
            x->max_seqs = proto_get_u32(r);
            x->kv_blocks = proto_get_u32(r);
            x->max_batch_tokens = proto_get_u32(r);
            x->n_ctx = proto_get_u32(r);
            x->n_vocab = proto_get_u32(r);
            if (x->role < PROTO_ROLE_PREFILL || x->role > PROTO_ROLE_EXPERT) r->err = true;
            if (!r->err) x->listen = proto_get_str(r);
            if (!r->err) x->name = proto_get_str(r);
            if (!r->err) x->model_id = proto_get_str(r);
            break;
        }
        case PROTO_HEARTBEAT: {
            proto_heartbeat *x = &m->u.heartbeat;
            x->n_running = proto_get_u32(r);
            x->n_queued = proto_get_u32(r);
            x->sum_cache_len = proto_get_u64(r);
            x->uncached_queued = proto_get_u64(r);
            x->kv_blocks_free = proto_get_u32(r);
            x->kv_blocks_total = proto_get_u32(r);
            x->draining = proto_get_u8(r);
            x->n_prefill_tokens = proto_get_u64(r);
            x->n_gen_tokens = proto_get_u64(r);
            x->busy_us = proto_get_u64(r);
            x->n_handoffs_out = proto_get_u64(r);
            x->handoff_out_tokens = proto_get_u64(r);
            x->handoff_out_us = proto_get_u64(r);
            x->n_handoffs_in = proto_get_u64(r);
            x->handoff_in_tokens = proto_get_u64(r);
            x->handoff_in_us = proto_get_u64(r);
            for (int i = 0; i < 4 && (h->flags & PROTO_F_STEPTIME); i++) {
                x->step_w[i] = proto_get_f32(r);
                if (!isfinite(x->step_w[i])) r->err = true;
            }
            if (x->draining > 1) r->err = true;
            break;
        }
        case PROTO_DRAIN:
            m->u.drain.done = proto_get_u8(r);
            m->u.drain.deadline_ms = proto_get_u32(r);
            if (m->u.drain.done > 1) r->err = true;
            break;
        case PROTO_ERROR:
            m->u.error.code = proto_get_u32(r);
            if (!r->err) m->u.error.msg = proto_get_str(r);
            break;
        case PROTO_CANCEL:
            break;
        case PROTO_CHALLENGE:
        case PROTO_PROOF: {
            bool ch = h->type == PROTO_CHALLENGE;
            const uint8_t *p = proto_get_bytes(r, ch ? AUTH_NONCE_SIZE : AUTH_MAC_SIZE);
            if (p) memcpy(ch ? m->u.challenge.nonce : m->u.proof.mac, p, ch ? AUTH_NONCE_SIZE : AUTH_MAC_SIZE);
            break;
        }
    }
}

/* The payload of a request's way through the cluster: its jobs, the handoff between them, its
 * tokens and its end; errors set r->err. */
static void proto_get_job(proto_rd *r, const proto_hdr *h, proto_msg *m)
{
    switch (h->type) {
        case PROTO_PREFILL: {
            proto_prefill_job *x = &m->u.prefill;
            proto_get_params(r, &x->params, h->flags);
            x->hit_len = proto_get_u32(r);
            if (!r->err) x->prompt = proto_get_ids(r, &x->n_prompt, false);
            if (!r->err && (h->flags & PROTO_F_EMBED) && !proto_embed_pool_ok(x->embed = proto_get_u8(r))) r->err = true;
            break;
        }
        case PROTO_EMBEDDING:
            proto_get_embedding(r, &m->u.embedding);
            break;
        case PROTO_HANDOFF: {
            proto_handoff *x = &m->u.handoff;
            proto_get_tok(r, &x->first, true);
            x->n_prompt = proto_get_u32(r);
            x->n_cached = proto_get_u32(r);
            x->n_computed = proto_get_u32(r);
            x->n_stored = proto_get_u32(r);
            x->n_sampled = proto_get_u32(r);
            x->prefill_us = proto_get_u32(r);
            if (x->n_cached > x->n_prompt || x->n_stored > x->n_prompt || x->n_stored % 128 || x->n_sampled > 1)
                r->err = true;
            if ((h->flags & PROTO_F_KV_LATENT) && !(h->flags & PROTO_F_HAS_TAIL)) r->err = true;
            if (!r->err && (h->flags & PROTO_F_HAS_TAIL)) proto_get_kv(r, &x->kv, h->flags);
            break;
        }
        case PROTO_DECODE: {
            proto_decode_job *x = &m->u.decode;
            proto_get_params(r, &x->params, h->flags);
            if (!r->err) x->prompt = proto_get_ids(r, &x->n_prompt, false);
            if (!r->err) x->gen = proto_get_ids(r, &x->n_gen, false);
            x->n_cached = proto_get_u32(r);
            x->n_sampled = proto_get_u32(r);
            /* at most one draw per generated token: the receiver replays n_sampled draws */
            if (x->n_cached > x->n_prompt || x->n_sampled > x->n_gen) r->err = true;
            if ((h->flags & PROTO_F_KV_LATENT) && !(h->flags & PROTO_F_HAS_TAIL)) r->err = true;
            if (!r->err && (h->flags & PROTO_F_HAS_TAIL)) {
                proto_get_kv(r, &x->kv, h->flags);
                /* the tail lies inside the context whose KV exists (all but the last token) */
                if ((uint64_t)x->kv.start + x->kv.n > (uint64_t)x->n_prompt + x->n_gen - 1) r->err = true;
            }
            break;
        }
        case PROTO_TOKENS: {
            proto_tokens *x = &m->u.tokens;
            bool lp = h->flags & PROTO_F_LOGPROBS;
            uint32_t n = proto_get_u32(r);
            if (r->err || n > PROTO_MAX_TOKENS || (size_t)n * 4 > r->n - r->off) { r->err = true; break; }
            x->toks = calloc(n ? n : 1, sizeof *x->toks);
            if (!x->toks) { r->err = true; break; }
            x->n = n;
            for (uint32_t i = 0; i < n && !r->err; i++) proto_get_tok(r, &x->toks[i], lp);
            break;
        }
        case PROTO_FINISH: {
            proto_finish_msg *x = &m->u.finish;
            x->reason = proto_get_u8(r);
            x->prompt_tokens = proto_get_u32(r);
            x->cached_tokens = proto_get_u32(r);
            x->completion_tokens = proto_get_u32(r);
            x->ttft_us = proto_get_u32(r);
            if (h->flags & PROTO_F_DRAFTS) {
                x->accepted_drafts = proto_get_u32(r);
                x->rejected_drafts = proto_get_u32(r);
            }
            if (x->reason < PROTO_FINISH_STOP || x->reason > PROTO_FINISH_MOVED ||
                x->cached_tokens > x->prompt_tokens || x->accepted_drafts > x->completion_tokens ||
                x->rejected_drafts / SPEC_MAX_K > x->completion_tokens)
                r->err = true;
            break;
        }
    }
}

/* The payload of sliding-window states: who holds which, and one relayed; errors set r->err. */
static void proto_get_window(proto_rd *r, const proto_hdr *h, proto_msg *m)
{
    switch (h->type) {
        case PROTO_WINDOW: {
            proto_window *x = &m->u.window;
            uint32_t n = proto_get_u32(r);
            /* the count against its limit and the bytes present before anything is allocated */
            if (r->err || n < 1 || n > PROTO_MAX_WINDOW_EVENTS || (size_t)n * 37 != r->n - r->off) { r->err = true; break; }
            x->ev = calloc(n, sizeof *x->ev);
            if (!x->ev) { r->err = true; break; }
            x->n = n;
            for (uint32_t i = 0; i < n && !r->err; i++) {
                x->ev[i].op = proto_get_u8(r);
                const uint8_t *k = proto_get_bytes(r, 32);
                if (k) memcpy(x->ev[i].key, k, 32);
                x->ev[i].ttl_ms = proto_get_u32(r);
                if (x->ev[i].op < PROTO_WIN_ADD || x->ev[i].op > PROTO_WIN_DROP) r->err = true;
            }
            break;
        }
        case PROTO_WINFETCH: {
            const uint8_t *k = proto_get_bytes(r, 32);
            if (k) memcpy(m->u.winfetch.key, k, 32);
            break;
        }
        case PROTO_WINSTATE: {
            proto_winstate *x = &m->u.winstate;
            const uint8_t *k = proto_get_bytes(r, 32);
            if (k) memcpy(x->key, k, 32);
            uint32_t n = proto_get_u32(r);
            if (r->err || n != r->n - r->off) { r->err = true; break; }
            if (n) {
                x->data = malloc(n);
                if (!x->data) { r->err = true; break; }
                memcpy(x->data, proto_get_bytes(r, n), n);
            }
            x->n_bytes = n;
            break;
        }
    }
}

/* The payload of expert parallelism: a layer's routed rows out to a member and its results
 * back; errors set r->err. */
static void proto_get_experts(proto_rd *r, const proto_hdr *h, proto_msg *m)
{
    switch (h->type) {
        case PROTO_EXPERTS:
        case PROTO_EXPERTS_OUT: {
            proto_experts *x = &m->u.experts;
            x->layer = proto_get_u16(r);
            x->dim = proto_get_u32(r);
            uint32_t n = proto_get_u32(r);
            if (r->err || n > PROTO_MAX_EXPERTS || (uint64_t)n * 8 > r->n - r->off) { r->err = true; break; }
            x->experts = malloc((n ? n : 1) * sizeof *x->experts);
            x->n_rows = malloc((n ? n : 1) * sizeof *x->n_rows);
            if (!x->experts || !x->n_rows) { r->err = true; break; }
            x->n_exp = n;
            for (uint32_t i = 0; i < n; i++) {
                x->experts[i] = (int32_t)proto_get_u32(r);
                x->n_rows[i] = (int32_t)proto_get_u32(r);
            }
            x->n_floats = proto_get_u32(r);
            if (r->err || (uint64_t)x->n_floats * 4 != r->n - r->off || !proto_experts_ok(x)) { r->err = true; break; }
            x->x = malloc(x->n_floats ? (size_t)x->n_floats * 4 : 1);
            if (!x->x) { r->err = true; break; }
            memcpy(x->x, proto_get_bytes(r, (size_t)x->n_floats * 4), (size_t)x->n_floats * 4);
            break;
        }
    }
}

proto_status proto_decode(const proto_hdr *h, const uint8_t *payload, proto_msg *m)
{
    memset(m, 0, sizeof *m);
    m->hdr = *h;
    proto_rd rd, *r = &rd;
    proto_rd_init(r, payload, h->len);
    proto_kind k = proto_kind_of(h->type);
    if (k == PROTO_KIND_NONE) return PROTO_ERR_TYPE;
    proto_kinds[k].get(r, h, m);
    if (!r->err && r->off != r->n) r->err = true;   /* trailing bytes */
    if (r->err) {
        proto_msg_free(m);
        return PROTO_ERR_MALFORMED;
    }
    return PROTO_OK;
}

void proto_msg_free(proto_msg *m)
{
    if (!m) return;
    switch (m->hdr.type) {
    case PROTO_HELLO: free(m->u.hello.listen); free(m->u.hello.name); free(m->u.hello.model_id); break;
    case PROTO_PREFILL:
        free(m->u.prefill.params.salt);
        free(m->u.prefill.params.grammar);
        free(m->u.prefill.prompt);
        break;
    case PROTO_HANDOFF: free(m->u.handoff.kv.data); break;
    case PROTO_DECODE:
        free(m->u.decode.params.salt);
        free(m->u.decode.params.grammar);
        free(m->u.decode.prompt);
        free(m->u.decode.gen);
        free(m->u.decode.kv.data);
        break;
    case PROTO_TOKENS: free(m->u.tokens.toks); break;
    case PROTO_ERROR: free(m->u.error.msg); break;
    case PROTO_WINDOW: free(m->u.window.ev); break;
    case PROTO_WINSTATE: free(m->u.winstate.data); break;
    case PROTO_EXPERTS:
    case PROTO_EXPERTS_OUT:
        free(m->u.experts.experts);
        free(m->u.experts.n_rows);
        free(m->u.experts.x);
        break;
    case PROTO_EMBEDDING: free(m->u.embedding.v); break;
    default: break;
    }
    memset(&m->u, 0, sizeof m->u);
}

/* ---- sockets ---- */

proto_status proto_send(int fd, const void *p, size_t n)
{
    const uint8_t *q = p;
    while (n) {
        ssize_t k = send(fd, q, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            return PROTO_ERR_IO;
        }
        q += k;
        n -= (size_t)k;
    }
    return PROTO_OK;
}

void proto_conn_init(proto_conn *c, int fd)
{
    memset(c, 0, sizeof *c);
    c->fd = fd;
}

void proto_conn_free(proto_conn *c)
{
    if (!c) return;
    auth_dir_free(&c->tx);
    auth_dir_free(&c->rx);
    c->sealed = false;
}

proto_status proto_send_frame(proto_conn *c, const void *frame, size_t n)
{
    if (!c->sealed) return proto_send(c->fd, frame, n);
    /* the tag goes out with the frame in one write: no partial frame waits for its tag */
    uint8_t tag[AUTH_TAG_SIZE];
    if (n < PROTO_HDR_SIZE ||
        !auth_dir_tag(&c->tx, frame, PROTO_HDR_SIZE, (const uint8_t *)frame + PROTO_HDR_SIZE, n - PROTO_HDR_SIZE, tag))
        return PROTO_ERR_NOMEM;
    struct iovec iov[2] = { { (void *)frame, n }, { tag, sizeof tag } };
    struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 2 };
    while (mh.msg_iovlen) {
        ssize_t k = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            return PROTO_ERR_IO;
        }
        while (mh.msg_iovlen && (size_t)k >= mh.msg_iov[0].iov_len) {
            k -= (ssize_t)mh.msg_iov[0].iov_len;
            mh.msg_iov++;
            mh.msg_iovlen--;
        }
        if (mh.msg_iovlen) {
            mh.msg_iov[0].iov_base = (uint8_t *)mh.msg_iov[0].iov_base + k;
            mh.msg_iov[0].iov_len -= (size_t)k;
        }
    }
    return PROTO_OK;
}

proto_status proto_send_msg(proto_conn *c, const proto_msg *m)
{
    bytebuf b = { 0 };
    proto_status st = proto_encode(&b, m);
    if (st == PROTO_OK) st = proto_send_frame(c, b.p, b.len);
    bytebuf_free(&b);
    return st;
}

/* Reads exactly n bytes: 1 ok, 0 closed before the first byte, -1 error / closed mid-way /
 * deadline (util_now(), 0 none) passed (errno ETIMEDOUT). */
static int proto_read_full(int fd, void *p, size_t n, double deadline)
{
    uint8_t *q = p;
    size_t got = 0;
    while (got < n) {
        if (deadline > 0) {
            double left = deadline - util_now();
            struct pollfd pfd = { .fd = fd, .events = POLLIN };
            int pr = left > 0 ? poll(&pfd, 1, (int)(left * 1000) + 1) : 0;
            if (pr < 0 && errno == EINTR) continue;
            if (pr <= 0) {
                if (pr == 0) errno = ETIMEDOUT;
                return -1;
            }
        }
        ssize_t k = recv(fd, q + got, n - got, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        if (k == 0) {
            if (got == 0) return 0;
            errno = ECONNRESET;
            return -1;
        }
        got += (size_t)k;
    }
    return 1;
}

proto_status proto_recv(proto_conn *c, proto_msg *m)
{
    memset(m, 0, sizeof *m);
    uint8_t hb[PROTO_HDR_SIZE];
    int rc = proto_read_full(c->fd, hb, sizeof hb, c->deadline);
    if (rc == 0) return PROTO_ERR_CLOSED;
    if (rc < 0) return PROTO_ERR_IO;
    proto_hdr h;
    proto_status st = proto_hdr_parse(hb, sizeof hb, &h);
    if (st == PROTO_OK && !c->sealed && h.len > PROTO_MAX_PREAUTH) st = PROTO_ERR_TOO_BIG;
    if (st != PROTO_OK) {
        m->hdr = h;
        return st;
    }
    /* payload and tag in one buffer, the tag checked before a byte of the payload is decoded */
    size_t n_tag = c->sealed ? AUTH_TAG_SIZE : 0;
    uint8_t *pl = malloc(h.len + n_tag ? h.len + n_tag : 1);
    if (!pl) return PROTO_ERR_NOMEM;
    if (h.len + n_tag && proto_read_full(c->fd, pl, h.len + n_tag, c->deadline) != 1) {
        free(pl);
        return PROTO_ERR_IO;
    }
    if (c->sealed) {
        uint8_t want[AUTH_TAG_SIZE];
        if (!auth_dir_tag(&c->rx, hb, sizeof hb, pl, h.len, want) || CRYPTO_memcmp(want, pl + h.len, AUTH_TAG_SIZE)) {
            free(pl);
            m->hdr = h;
            return PROTO_ERR_AUTH;
        }
    }
    st = proto_decode(&h, pl, m);
    free(pl);
    if (st != PROTO_OK) m->hdr = h;
    return st;
}

/* Splits "HOST:PORT" (the last colon; "[v6]:port" brackets stripped). */
static int proto_split(const char *hostport, char *host, size_t hsz, char *port, size_t psz)
{
    const char *c = strrchr(hostport, ':');
    if (!c || !c[1]) return -1;
    size_t hn = (size_t)(c - hostport);
    const char *h = hostport;
    if (hn >= 2 && h[0] == '[' && h[hn - 1] == ']') { h++; hn -= 2; }
    if (hn >= hsz || strlen(c + 1) >= psz) return -1;
    memcpy(host, h, hn);
    host[hn] = 0;
    strcpy(port, c + 1);
    return 0;
}

int proto_listen(const char *hostport, int backlog)
{
    char host[256], port[32];
    if (proto_split(hostport, host, sizeof host, port, sizeof port)) { errno = EINVAL; return -1; }
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE };
    struct addrinfo *res = NULL;
    const char *hp = (!host[0] || !strcmp(host, "*")) ? NULL : host;
    if (getaddrinfo(hp, port, &hints, &res) || !res) { errno = EINVAL; return -1; }
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (!bind(fd, a->ai_addr, a->ai_addrlen) && !listen(fd, backlog > 0 ? backlog : 64)) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* Every cluster socket sends each frame the moment it is written: frames are small (a TOKENS
 * frame is a few dozen bytes) and written whole, so Nagle's algorithm would only hold the
 * second of two frames (TOKENS then FINISH) until the peer's delayed ACK, ~40 ms. */
static void proto_nodelay(int fd)
{
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

void proto_peer_host(int fd, char *host, size_t hostsz)
{
    if (!host || !hostsz) return;
    host[0] = 0;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) ||
        getnameinfo((struct sockaddr *)&ss, sl, host, (socklen_t)hostsz, NULL, 0, NI_NUMERICHOST))
        host[0] = 0;
}

int proto_accept(int listen_fd, char *host, size_t hostsz)
{
    int fd = accept(listen_fd, NULL, NULL);
    if (fd < 0) return -1;
    proto_peer_host(fd, host, hostsz);
    fcntl(fd, F_SETFD, FD_CLOEXEC);
    proto_nodelay(fd);
    return fd;
}

int proto_connect(const char *hostport, int timeout_ms)
{
    char host[256], port[32];
    if (proto_split(hostport, host, sizeof host, port, sizeof port)) { errno = EINVAL; return -1; }
    struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM };
    struct addrinfo *res = NULL;
    if (getaddrinfo(host[0] ? host : "127.0.0.1", port, &hints, &res) || !res) { errno = EINVAL; return -1; }
    int fd = -1;
    for (struct addrinfo *a = res; a; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int fl = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, fl | O_NONBLOCK);
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        if (rc < 0 && errno == EINPROGRESS) {
            struct pollfd pfd = { .fd = fd, .events = POLLOUT };
            int err = 0;
            socklen_t el = sizeof err;
            if (poll(&pfd, 1, timeout_ms > 0 ? timeout_ms : 5000) == 1 &&
                !getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) && !err)
                rc = 0;
            else if (err)
                errno = err;
            else
                errno = ETIMEDOUT;
        }
        if (rc == 0) {
            fcntl(fd, F_SETFL, fl);
            proto_nodelay(fd);
            break;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

int proto_local_port(int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl)) return -1;
    if (ss.ss_family == AF_INET) return ntohs(((struct sockaddr_in *)&ss)->sin_port);
    if (ss.ss_family == AF_INET6) return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
    return -1;
}
