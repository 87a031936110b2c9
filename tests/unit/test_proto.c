/*
 * test_proto: the gateway <-> worker protocol (src/cluster/proto.h): every message survives
 * encode -> header parse -> decode unchanged; headers with a wrong field are refused with the
 * right status; the reasoning budget section (flag THINK) and the grammar section (flag
 * GRAMMAR) round-trip, leave frames without them unchanged and refuse values out of range; 100k random, truncated, bit-flipped and oversized
 * frames decode to a clean error or a valid message, never a crash (run under ASan/UBSan by make
 * san); frames over a socket pair. The handshake: the same key seals both ends (a session key
 * per direction); a wrong key, no handshake (a HELLO first) and a replayed recording of a whole
 * session are refused; after it, an altered, repeated, reordered or reflected frame is refused.
 * Before it, a frame above PROTO_MAX_PREAUTH is refused from its header, and a connection's
 * deadline ends a receive however slowly the bytes trickle in.
 * Key files: private regular files only, not empty; the generated default is 0600 and stable.
 */
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdlib.h>
#include <string.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "harness.h"
#include "cluster/proto.h"
#include "engine/spec.h"
#include "model/quant.h"
#include "util/util.h"

static proto_params test_params(void)
{
    proto_params p;
    memset(&p, 0, sizeof p);
    p.sample = sample_params_default();
    p.sample.seed = 0x1234567890abcdefull;
    p.max_tokens = 77;
    p.n_stop_ids = 2;
    p.stop_ids[0] = 5;
    p.stop_ids[1] = 9;
    p.ignore_eos = 1;
    p.logprobs = 1;
    p.top_logprobs = 3;
    p.cache_class = 2;
    p.salt = "tenant-a";
    return p;
}

static bool params_eq(const proto_params *a, const proto_params *b)
{
    return !memcmp(&a->sample, &b->sample, sizeof a->sample) && a->max_tokens == b->max_tokens &&
           a->n_stop_ids == b->n_stop_ids && !memcmp(a->stop_ids, b->stop_ids, sizeof a->stop_ids[0] * a->n_stop_ids) &&
           a->ignore_eos == b->ignore_eos && a->logprobs == b->logprobs &&
           a->top_logprobs == b->top_logprobs && a->cache_class == b->cache_class &&
           !strcmp(a->salt ? a->salt : "", b->salt ? b->salt : "") && a->think_budget == b->think_budget &&
           !a->grammar == !b->grammar && (!a->grammar || (a->grammar_kind == b->grammar_kind &&
                                                         a->grammar_len == b->grammar_len &&
                                                         a->grammar_lazy == b->grammar_lazy &&
                                                         a->grammar_trigger == b->grammar_trigger &&
                                                         !memcmp(a->grammar, b->grammar, a->grammar_len))) &&
           (!a->think_budget || (a->think_start == b->think_start && a->think_end == b->think_end &&
                                 a->think_open == b->think_open));
}

/* Encodes m, parses the header back, decodes the payload into out. */
static proto_status roundtrip(const proto_msg *m, proto_msg *out)
{
    bytebuf b = { 0 };
    proto_status st = proto_encode(&b, m);
    if (st != PROTO_OK) { bytebuf_free(&b); return st; }
    proto_hdr h;
    st = proto_hdr_parse((const uint8_t *)b.p, b.len, &h);
    if (st == PROTO_OK) {
        if (h.len + PROTO_HDR_SIZE != b.len || h.type != m->hdr.type || h.flags != m->hdr.flags ||
            h.req_id != m->hdr.req_id)
            st = PROTO_ERR_MALFORMED;
        else
            st = proto_decode(&h, (const uint8_t *)b.p + PROTO_HDR_SIZE, out);
    }
    bytebuf_free(&b);
    return st;
}

static proto_kv test_kv(uint8_t *data, int n)
{
    proto_kv kv = { .dtype = QTYPE_F16, .n_parts = 2, .n_layers = 2, .n_kv_heads = 2, .head_dim = 8,
                    .start = 256, .n = (uint32_t)n };
    kv.n_bytes = (uint32_t)proto_kv_bytes(kv.dtype, 2, 2, 2, 8, n);
    for (uint32_t i = 0; i < kv.n_bytes; i++) data[i] = (uint8_t)(i * 7 + 1);
    kv.data = data;
    return kv;
}

TEST(test_roundtrip_hello_heartbeat)
{
    proto_msg m, o;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_HELLO;
    m.hdr.flags = PROTO_F_REGISTER;
    proto_hello *h = &m.u.hello;
    h->role = PROTO_ROLE_DECODE;
    h->kv_dtype = QTYPE_F16;
    for (int i = 0; i < 32; i++) h->model_fp[i] = (uint8_t)i;
    h->max_seqs = 16; h->kv_blocks = 99; h->max_batch_tokens = 512; h->n_ctx = 2048; h->n_vocab = 512;
    h->listen = "127.0.0.1:9000";
    h->name = "w1";
    h->model_id = "qwen3-emb";
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.hello.role == PROTO_ROLE_DECODE && o.u.hello.kv_dtype == QTYPE_F16);
    CHECK(!memcmp(o.u.hello.model_fp, h->model_fp, 32));
    CHECK(o.u.hello.max_seqs == 16 && o.u.hello.kv_blocks == 99 && o.u.hello.max_batch_tokens == 512);
    CHECK(o.u.hello.n_ctx == 2048 && o.u.hello.n_vocab == 512);
    CHECK(!strcmp(o.u.hello.listen, "127.0.0.1:9000") && !strcmp(o.u.hello.name, "w1"));
    CHECK(!strcmp(o.u.hello.model_id, "qwen3-emb"));
    proto_msg_free(&o);
    h->model_id = NULL;   /* none: an empty string on the wire */
    CHECK(roundtrip(&m, &o) == PROTO_OK && o.u.hello.model_id && !o.u.hello.model_id[0]);
    proto_msg_free(&o);

    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_HEARTBEAT;
    proto_heartbeat *b = &m.u.heartbeat;
    b->n_running = 3; b->n_queued = 4; b->sum_cache_len = 1ull << 40; b->uncached_queued = 777;
    b->kv_blocks_free = 5; b->kv_blocks_total = 6; b->draining = 1;
    b->n_prefill_tokens = 123456789012ull; b->n_gen_tokens = 42;
    b->busy_us = 9876543; b->n_handoffs_out = 7; b->handoff_out_tokens = 1500; b->handoff_out_us = 321;
    b->n_handoffs_in = 8; b->handoff_in_tokens = 1600; b->handoff_in_us = 654;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.heartbeat.busy_us == 9876543 && o.u.heartbeat.n_handoffs_out == 7 && o.u.heartbeat.handoff_out_tokens == 1500 &&
          o.u.heartbeat.handoff_out_us == 321 && o.u.heartbeat.n_handoffs_in == 8 && o.u.heartbeat.handoff_in_tokens == 1600 &&
          o.u.heartbeat.handoff_in_us == 654);
    CHECK(!memcmp(&o.u.heartbeat, b, sizeof *b) || (o.u.heartbeat.n_running == 3 &&
          o.u.heartbeat.sum_cache_len == (1ull << 40) && o.u.heartbeat.draining == 1 &&
          o.u.heartbeat.n_prefill_tokens == 123456789012ull && o.u.heartbeat.n_gen_tokens == 42));
    proto_msg_free(&o);

    /* the learned step-time curve travels only with PROTO_F_STEPTIME, 16 bytes more; a value
     * that is not finite is refused */
    bytebuf without, with;
    without = (bytebuf){ 0 };
    with = (bytebuf){ 0 };
    CHECK(proto_encode(&without, &m) == PROTO_OK);
    float cv[4] = { 0.0125f, 3e-5f, 7.5e-6f, -1e-7f };
    memcpy(b->step_w, cv, sizeof cv);
    m.hdr.flags = PROTO_F_STEPTIME;
    CHECK(proto_encode(&with, &m) == PROTO_OK);
    CHECK(with.len == without.len + 16);
    CHECK(roundtrip(&m, &o) == PROTO_OK && (o.hdr.flags & PROTO_F_STEPTIME) && !memcmp(o.u.heartbeat.step_w, cv, sizeof cv));
    proto_msg_free(&o);
    m.hdr.flags = 0;   /* without the flag the curve is not sent: zeros at the other end */
    CHECK(roundtrip(&m, &o) == PROTO_OK && o.u.heartbeat.step_w[0] == 0 && o.u.heartbeat.step_w[2] == 0);
    proto_msg_free(&o);
    m.hdr.flags = PROTO_F_STEPTIME;
    b->step_w[2] = NAN;
    bytebuf_free(&with);
    with = (bytebuf){ 0 };
    CHECK(proto_encode(&with, &m) == PROTO_ERR_MALFORMED);
    bytebuf_free(&with);
    bytebuf_free(&without);
}

TEST(test_roundtrip_jobs)
{
    int32_t prompt[300];
    for (int i = 0; i < 300; i++) prompt[i] = i * 3;
    proto_msg m, o;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_PREFILL;
    m.hdr.req_id = 0xdeadbeefcafeull;
    m.u.prefill.params = test_params();
    m.u.prefill.hit_len = 256;
    m.u.prefill.n_prompt = 300;
    m.u.prefill.prompt = prompt;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.hdr.req_id == 0xdeadbeefcafeull);
    CHECK(params_eq(&o.u.prefill.params, &m.u.prefill.params));
    CHECK(o.u.prefill.hit_len == 256 && o.u.prefill.n_prompt == 300);
    CHECK(!memcmp(o.u.prefill.prompt, prompt, sizeof prompt));
    proto_msg_free(&o);
    /* logit_bias travels with the params; a bias out of [-100, 100] is malformed */
    sample_params *sb = &m.u.prefill.params.sample;
    sb->n_bias = 2;
    sb->bias_id[0] = 5, sb->bias[0] = 100;
    sb->bias_id[1] = 9, sb->bias[1] = -2.5f;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.prefill.params.sample.n_bias == 2 && o.u.prefill.params.sample.bias_id[1] == 9 &&
          o.u.prefill.params.sample.bias[0] == 100 && o.u.prefill.params.sample.bias[1] == -2.5f);
    proto_msg_free(&o);
    sb->bias[1] = 101;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    sb->n_bias = 0;

    uint8_t kvdata[8192];
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_HANDOFF;
    m.hdr.flags = PROTO_F_HAS_TAIL;
    m.hdr.req_id = 7;
    proto_handoff *x = &m.u.handoff;
    x->first.token = 17; x->first.logprob = -0.5f; x->first.n_top = 2;
    x->first.top_ids[0] = 17; x->first.top_lps[0] = -0.5f;
    x->first.top_ids[1] = 3; x->first.top_lps[1] = -1.5f;
    x->n_prompt = 300; x->n_cached = 128; x->n_computed = 172; x->n_stored = 256;
    x->n_sampled = 1; x->prefill_us = 1234;
    x->kv = test_kv(kvdata, 44);
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    proto_handoff *y = &o.u.handoff;
    CHECK(y->first.token == 17 && y->first.logprob == -0.5f && y->first.n_top == 2);
    CHECK(y->first.top_ids[1] == 3 && y->first.top_lps[1] == -1.5f);
    CHECK(y->n_prompt == 300 && y->n_cached == 128 && y->n_computed == 172 && y->n_stored == 256);
    CHECK(y->n_sampled == 1 && y->prefill_us == 1234);
    CHECK(y->kv.n == 44 && y->kv.start == 256 && y->kv.n_bytes == x->kv.n_bytes);
    CHECK(y->kv.data && !memcmp(y->kv.data, kvdata, x->kv.n_bytes) && y->kv.n_parts == 2);
    proto_msg_free(&o);
    CHECK(!(o.hdr.flags & PROTO_F_KV_LATENT));
    /* a latent tail (V is K: one row per position) is half the bytes; the header flag that says
     * so comes from n_parts */
    x->kv.n_parts = 1;
    x->kv.n_bytes = (uint32_t)proto_kv_bytes(QTYPE_F16, 1, 2, 2, 8, 44);
    CHECK(x->kv.n_bytes * 2 == (uint32_t)proto_kv_bytes(QTYPE_F16, 2, 2, 2, 8, 44));
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);   /* the header went out with the flag */
    m.hdr.flags = PROTO_F_HAS_TAIL | PROTO_F_KV_LATENT;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.handoff.kv.n_parts == 1 && o.u.handoff.kv.n_bytes == x->kv.n_bytes && (o.hdr.flags & PROTO_F_KV_LATENT));
    CHECK(!memcmp(o.u.handoff.kv.data, kvdata, x->kv.n_bytes));
    proto_msg_free(&o);
    /* the flag without a tail is refused by the decoder */
    m.hdr.flags = PROTO_F_KV_LATENT;
    {
        bytebuf b = { 0 };
        CHECK(proto_encode(&b, &m) == PROTO_OK);   /* the encoder drops it: no tail */
        CHECK(!(b.p[8] & PROTO_F_KV_LATENT));
        b.p[8] |= PROTO_F_KV_LATENT;
        proto_hdr hh;
        CHECK(proto_hdr_parse((const uint8_t *)b.p, PROTO_HDR_SIZE, &hh) == PROTO_OK);
        CHECK(proto_decode(&hh, (const uint8_t *)b.p + PROTO_HDR_SIZE, &o) == PROTO_ERR_MALFORMED);
        bytebuf_free(&b);
    }
    m.hdr.flags = PROTO_F_HAS_TAIL;
    /* other part counts are refused */
    x->kv.n_parts = 3;
    CHECK(proto_kv_bytes(QTYPE_F16, 3, 2, 2, 8, 44) == 0 && proto_kv_bytes(QTYPE_F16, 0, 2, 2, 8, 44) == 0);
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    x->kv = test_kv(kvdata, 44);
    /* without the tail */
    m.hdr.flags = 0;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.handoff.kv.data == NULL && o.u.handoff.first.token == 17);
    proto_msg_free(&o);

    int32_t gen[5] = { 1, 2, 3, 4, 5 };
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_DECODE;
    m.hdr.flags = PROTO_F_HAS_TAIL | PROTO_F_RESUME;
    m.hdr.req_id = 8;
    proto_decode_job *d = &m.u.decode;
    d->params = test_params();
    d->params.salt = NULL;
    d->n_prompt = 300; d->prompt = prompt;
    d->n_gen = 5; d->gen = gen;
    d->n_cached = 128; d->n_sampled = 5;
    d->kv = test_kv(kvdata, 44);
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(params_eq(&o.u.decode.params, &d->params));
    CHECK(o.u.decode.n_prompt == 300 && !memcmp(o.u.decode.prompt, prompt, sizeof prompt));
    CHECK(o.u.decode.n_gen == 5 && !memcmp(o.u.decode.gen, gen, sizeof gen));
    CHECK(o.u.decode.n_cached == 128 && o.u.decode.n_sampled == 5);
    CHECK(o.u.decode.kv.n == 44 && !memcmp(o.u.decode.kv.data, kvdata, d->kv.n_bytes));
    proto_msg_free(&o);
    /* a tail reaching past the context is refused by the decoder */
    d->n_prompt = 290;
    d->n_gen = 1;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    /* and encode refuses values a receiver would refuse */
    d->n_prompt = 300;
    d->params.n_stop_ids = 9;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    d->params.n_stop_ids = 0;
    /* more sampler draws than generated tokens (the receiver replays them: a 2^31 loop) */
    d->n_gen = 5;
    d->n_sampled = 6;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    d->n_sampled = 5;
    /* a penalty window that would size a huge allocation (INT_MAX + 1 overflowed) */
    d->params.sample.penalty_last_n = 0x7fffffff;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    d->params.sample.penalty_last_n = 64;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    proto_msg_free(&o);
    m.hdr.type = PROTO_HANDOFF;
    m.hdr.flags = 0;
    memset(&m.u, 0, sizeof m.u);
    m.u.handoff.n_prompt = 300;
    m.u.handoff.n_sampled = 2;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
}

/* Encodes m, overwrites the u32 at payload offset off (negative: from the payload's end) with
 * v, decodes: what a receiver does with a frame a peer built by hand. */
static proto_status patched(const proto_msg *m, long off, uint32_t v)
{
    bytebuf b = { 0 };
    proto_status st = proto_encode(&b, m);
    if (st != PROTO_OK) { bytebuf_free(&b); return PROTO_OK; }   /* not what is tested */
    proto_hdr h;
    st = proto_hdr_parse((const uint8_t *)b.p, b.len, &h);
    if (st == PROTO_OK) {
        size_t at = PROTO_HDR_SIZE + (off >= 0 ? (size_t)off : h.len - (size_t)-off);
        memcpy(b.p + at, &v, 4);   /* little-endian host */
        proto_msg o;
        st = proto_decode(&h, (const uint8_t *)b.p + PROTO_HDR_SIZE, &o);
        if (st == PROTO_OK) proto_msg_free(&o);
    }
    bytebuf_free(&b);
    return st;
}

TEST(test_decoder_ranges)
{
    int32_t prompt[3] = { 1, 200, 300 }, gen[2] = { 301, 302 };
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_DECODE;
    m.u.decode.params = test_params();
    m.u.decode.n_prompt = 3; m.u.decode.prompt = prompt;
    m.u.decode.n_gen = 2; m.u.decode.gen = gen;
    m.u.decode.n_sampled = 2;
    CHECK(patched(&m, -4, 2) == PROTO_OK);
    /* n_sampled (the last field) beyond the generated tokens: the worker would replay 2^31 draws */
    CHECK(patched(&m, -4, 3) == PROTO_ERR_MALFORMED);
    CHECK(patched(&m, -4, 0x7fffffff) == PROTO_ERR_MALFORMED);
    /* penalty_last_n (params offset 28) of INT_MAX: an allocation of (n + 1) entries */
    CHECK(patched(&m, 28, 64) == PROTO_OK);
    CHECK(patched(&m, 28, 0x7fffffff) == PROTO_ERR_MALFORMED);
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_PREFILL;
    m.u.prefill.params = test_params();
    m.u.prefill.n_prompt = 3; m.u.prefill.prompt = prompt;
    CHECK(patched(&m, 28, PROTO_MAX_TOKENS) == PROTO_OK);
    CHECK(patched(&m, 28, PROTO_MAX_TOKENS + 1) == PROTO_ERR_MALFORMED);
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_HANDOFF;
    m.u.handoff.n_prompt = 3;
    m.u.handoff.n_sampled = 1;
    CHECK(patched(&m, -8, 1) == PROTO_OK);   /* n_sampled, then prefill_us */
    CHECK(patched(&m, -8, 2) == PROTO_ERR_MALFORMED);
}

/* The window cache's frames: WINDOW (directory events), WINFETCH, WINSTATE (a state or none)
 * survive a round trip; counts, ops and lengths out of range are refused. */
TEST(test_window_frames)
{
    proto_window_ev ev[2] = { { .op = PROTO_WIN_ADD, .ttl_ms = 180000 }, { .op = PROTO_WIN_DROP } };
    for (int i = 0; i < 32; i++) ev[0].key[i] = (uint8_t)i, ev[1].key[i] = (uint8_t)(100 + i);
    proto_msg m, o;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_WINDOW;
    m.u.window.n = 2;
    m.u.window.ev = ev;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.window.n == 2 && o.u.window.ev[0].op == PROTO_WIN_ADD && o.u.window.ev[0].ttl_ms == 180000 &&
          !memcmp(o.u.window.ev[1].key, ev[1].key, 32) && o.u.window.ev[1].op == PROTO_WIN_DROP);
    proto_msg_free(&o);
    CHECK(patched(&m, 0, 3) == PROTO_ERR_MALFORMED);            /* more events than bytes */
    CHECK(patched(&m, 0, 1) == PROTO_ERR_MALFORMED);            /* fewer: trailing bytes */
    CHECK(patched(&m, 0, 0) == PROTO_ERR_MALFORMED);            /* an empty report */
    CHECK(patched(&m, 0, 0xffffffffu) == PROTO_ERR_MALFORMED);  /* checked before any allocation */
    CHECK(patched(&m, 4, 3) == PROTO_ERR_MALFORMED);            /* an unknown op (and key bytes) */
    m.u.window.n = 0;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);            /* never encoded */
    ev[0].op = 7;
    m.u.window.n = 1;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);

    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_WINFETCH;
    m.hdr.req_id = 9;
    m.u.winfetch.key[5] = 55;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.hdr.req_id == 9 && o.u.winfetch.key[5] == 55);
    proto_msg_free(&o);

    uint8_t state[100];
    for (int i = 0; i < 100; i++) state[i] = (uint8_t)(i * 3);
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_WINSTATE;
    m.hdr.req_id = 9;
    m.u.winstate.key[0] = 1;
    m.u.winstate.n_bytes = 100;
    m.u.winstate.data = state;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.winstate.n_bytes == 100 && o.u.winstate.key[0] == 1 && !memcmp(o.u.winstate.data, state, 100));
    proto_msg_free(&o);
    CHECK(patched(&m, 32, 101) == PROTO_ERR_MALFORMED);         /* longer than the payload */
    CHECK(patched(&m, 32, 99) == PROTO_ERR_MALFORMED);          /* shorter: trailing bytes */
    CHECK(patched(&m, 32, 0xffffffffu) == PROTO_ERR_MALFORMED);
    m.u.winstate.n_bytes = 0;                                   /* "not held" */
    m.u.winstate.data = NULL;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.winstate.n_bytes == 0 && !o.u.winstate.data);
    proto_msg_free(&o);
}

/* The reasoning budget (flag THINK on PREFILL / DECODE): its fields survive; a frame without
 * the flag is the same bytes as before the section existed; bad values are refused both ways. */
TEST(test_think_budget)
{
    int32_t prompt[3] = { 1, 200, 300 }, gen[4] = { 301, 302, 303, 7 };
    proto_msg m, o;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_PREFILL;
    m.hdr.req_id = 3;
    m.u.prefill.params = test_params();
    m.u.prefill.n_prompt = 3;
    m.u.prefill.prompt = prompt;
    bytebuf plain = { 0 };
    CHECK(proto_encode(&plain, &m) == PROTO_OK);
    m.hdr.flags = PROTO_F_THINK;
    proto_params *pp = &m.u.prefill.params;
    pp->think_budget = 5; pp->think_start = 6; pp->think_end = 7; pp->think_open = 0;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.hdr.flags == PROTO_F_THINK && params_eq(&o.u.prefill.params, pp));
    CHECK(o.u.prefill.params.think_budget == 5 && o.u.prefill.params.think_start == 6 &&
          o.u.prefill.params.think_end == 7 && !o.u.prefill.params.think_open);
    CHECK(o.u.prefill.n_prompt == 3 && o.u.prefill.prompt[2] == 300);
    proto_msg_free(&o);
    /* the section is 13 bytes after the params; the rest of the frame is unchanged */
    bytebuf b = { 0 };
    CHECK(proto_encode(&b, &m) == PROTO_OK && b.len == plain.len + 13);
    bytebuf_free(&b);
    /* without the flag: the budget is not sent, and the encoder refuses to drop it silently */
    m.hdr.flags = 0;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    pp->think_budget = 0;
    b = (bytebuf){ 0 };
    CHECK(proto_encode(&b, &m) == PROTO_OK && b.len == plain.len && !memcmp(b.p, plain.p, b.len));
    bytebuf_free(&b);
    bytebuf_free(&plain);
    /* a resume: the prompt opened the block, no start id, the end already generated */
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_DECODE;
    m.hdr.flags = PROTO_F_RESUME | PROTO_F_THINK;
    m.hdr.req_id = 4;
    proto_decode_job *d = &m.u.decode;
    d->params = test_params();
    d->params.think_budget = 3; d->params.think_start = -1; d->params.think_end = 7; d->params.think_open = 1;
    d->n_prompt = 3; d->prompt = prompt;
    d->n_gen = 4; d->gen = gen;
    d->n_sampled = 4;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(params_eq(&o.u.decode.params, &d->params) && o.u.decode.params.think_open == 1 &&
          o.u.decode.params.think_start == -1);
    CHECK(o.u.decode.n_gen == 4 && o.u.decode.gen[3] == 7 && o.u.decode.n_sampled == 4);
    proto_msg_free(&o);
    /* values out of range: refused by the encoder ... */
    d->params.think_end = -1;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    d->params.think_end = 7;
    d->params.think_start = -2;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    d->params.think_start = -1;
    d->params.think_open = 2;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    d->params.think_open = 1;
    d->params.think_budget = PROTO_MAX_THINK + 1;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    d->params.think_budget = PROTO_MAX_THINK;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    proto_msg_free(&o);
    /* ... and by the decoder from a frame built by hand. The section sits right after the
     * params: 60 bytes up to cache_class (with 2 stop ids) + salt "tenant-a" (2 + 8) + u8 n_bias
     * (no logit_bias) = 71: u32 budget, i32 start, i32 end, u8 open */
    enum { AT = 71 };
    d->params.think_budget = 0x003bcdef;
    b = (bytebuf){ 0 };
    CHECK(proto_encode(&b, &m) == PROTO_OK);
    uint32_t v = 0x003bcdef;
    CHECK(b.len > PROTO_HDR_SIZE + AT + 13 && !memcmp(b.p + PROTO_HDR_SIZE + AT, &v, 4));
    bytebuf_free(&b);
    d->params.think_budget = 3;
    CHECK(patched(&m, AT, 3) == PROTO_OK);
    CHECK(patched(&m, AT, 0) == PROTO_ERR_MALFORMED);             /* budget 0 with the flag */
    CHECK(patched(&m, AT, 0x80000000u) == PROTO_ERR_MALFORMED);   /* "negative" budget */
    CHECK(patched(&m, AT, PROTO_MAX_THINK + 1) == PROTO_ERR_MALFORMED);
    CHECK(patched(&m, AT + 4, 0xfffffffeu) == PROTO_ERR_MALFORMED);   /* start -2 */
    CHECK(patched(&m, AT + 8, 0xffffffffu) == PROTO_ERR_MALFORMED);   /* end -1 */
    CHECK(patched(&m, AT + 8, 9) == PROTO_OK);
    /* the flag cleared on a frame with the section: its bytes are read as the prompt's ids
     * (a -1 among them), so the payload does not decode */
    b = (bytebuf){ 0 };
    m.hdr.flags = PROTO_F_RESUME | PROTO_F_THINK;
    CHECK(proto_encode(&b, &m) == PROTO_OK);
    proto_hdr h;
    CHECK(proto_hdr_parse((const uint8_t *)b.p, b.len, &h) == PROTO_OK);
    uint32_t f = PROTO_F_RESUME;
    memcpy(b.p + 8, &f, 4);   /* the flags: the section is now read as prompt ids */
    CHECK(proto_hdr_parse((const uint8_t *)b.p, b.len, &h) == PROTO_OK);
    CHECK(proto_decode(&h, (const uint8_t *)b.p + PROTO_HDR_SIZE, &o) == PROTO_ERR_MALFORMED);
    bytebuf_free(&b);
    /* a flag the type does not define: THINK on a HANDOFF */
    uint8_t hdr[PROTO_HDR_SIZE];
    bytebuf hb = { 0 };
    proto_put_u32(&hb, PROTO_MAGIC); proto_put_u16(&hb, PROTO_VERSION); proto_put_u16(&hb, PROTO_HANDOFF);
    proto_put_u32(&hb, PROTO_F_THINK); proto_put_u64(&hb, 1); proto_put_u32(&hb, 0);
    memcpy(hdr, hb.p, sizeof hdr);
    bytebuf_free(&hb);
    CHECK(proto_hdr_parse(hdr, sizeof hdr, &h) == PROTO_ERR_FLAGS);
}

/* The grammar section (flag GRAMMAR on PREFILL / DECODE): kind and source survive, after the
 * THINK section when both are there; a frame without the flag is the same bytes as before;
 * the encoder refuses a grammar without its flag (it would be dropped silently) and the
 * decoder an unknown kind, a length beyond PROTO_MAX_GRAMMAR or beyond the payload (before
 * allocating), and a NUL in the source. */
TEST(test_grammar_section)
{
    int32_t prompt[3] = { 1, 200, 300 }, gen[2] = { 301, 302 };
    static const char src[] = "{\"type\":\"object\",\"properties\":{\"a\":{\"type\":\"integer\"}}}";
    proto_msg m, o;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_PREFILL;
    m.hdr.req_id = 5;
    m.u.prefill.params = test_params();
    m.u.prefill.n_prompt = 3;
    m.u.prefill.prompt = prompt;
    bytebuf plain, b;
    plain = (bytebuf){ 0 };
    CHECK(proto_encode(&plain, &m) == PROTO_OK);
    proto_params *pp = &m.u.prefill.params;
    pp->grammar_kind = 2;   /* GRAMMAR_KIND_SCHEMA */
    pp->grammar = (char *)src;
    pp->grammar_len = (uint32_t)strlen(src);
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);   /* no flag: refused by the encoder */
    m.hdr.flags = PROTO_F_GRAMMAR;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.hdr.flags == PROTO_F_GRAMMAR && params_eq(&o.u.prefill.params, pp));
    CHECK(o.u.prefill.params.grammar_kind == 2 && o.u.prefill.params.grammar_len == strlen(src) &&
          !strcmp(o.u.prefill.params.grammar, src));
    CHECK(o.u.prefill.n_prompt == 3 && o.u.prefill.prompt[2] == 300);
    proto_msg_free(&o);
    /* 10 bytes (u8 kind, u32 length, u8 lazy, u32 trigger) + the source after the params;
     * nothing else changes */
    b = (bytebuf){ 0 };
    CHECK(proto_encode(&b, &m) == PROTO_OK && b.len == plain.len + 10 + strlen(src));
    bytebuf_free(&b);
    /* a lazy grammar's trigger travels; a trigger without lazy, or lazy past 1, is malformed */
    pp->grammar_lazy = 1;
    pp->grammar_trigger = 151657;
    CHECK(roundtrip(&m, &o) == PROTO_OK && o.u.prefill.params.grammar_lazy == 1 &&
          o.u.prefill.params.grammar_trigger == 151657);
    proto_msg_free(&o);
    pp->grammar_lazy = 0;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    pp->grammar_lazy = 2;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    pp->grammar_lazy = 1;
    pp->grammar_trigger = -1;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    pp->grammar_lazy = 0;
    pp->grammar_trigger = 0;
    /* the JSON kind has no source */
    pp->grammar_kind = 3;
    pp->grammar = (char *)"";
    pp->grammar_len = 0;
    CHECK(roundtrip(&m, &o) == PROTO_OK && o.u.prefill.params.grammar && o.u.prefill.params.grammar_len == 0 &&
          o.u.prefill.params.grammar_kind == 3);
    proto_msg_free(&o);
    pp->grammar_kind = PROTO_GRAMMAR_KINDS;   /* unknown kind: refused by the encoder */
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    m.hdr.flags = 0;
    pp->grammar = NULL;
    b = (bytebuf){ 0 };
    CHECK(proto_encode(&b, &m) == PROTO_OK && b.len == plain.len && !memcmp(b.p, plain.p, b.len));
    bytebuf_free(&b);
    bytebuf_free(&plain);
    /* a DECODE with THINK and GRAMMAR: the grammar after the budget */
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_DECODE;
    m.hdr.flags = PROTO_F_THINK | PROTO_F_GRAMMAR;
    m.hdr.req_id = 6;
    proto_decode_job *d = &m.u.decode;
    d->params = test_params();
    d->params.think_budget = 9; d->params.think_start = 4; d->params.think_end = 7;
    d->params.grammar_kind = 1;   /* a regex */
    d->params.grammar = (char *)"[a-z]{2,6}";
    d->params.grammar_len = 10;
    d->n_prompt = 3; d->prompt = prompt;
    d->n_gen = 2; d->gen = gen;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(params_eq(&o.u.decode.params, &d->params) && o.u.decode.params.think_budget == 9 &&
          o.u.decode.params.grammar_kind == 1 && !strcmp(o.u.decode.params.grammar, "[a-z]{2,6}"));
    CHECK(o.u.decode.n_gen == 2 && o.u.decode.gen[1] == 302);
    proto_msg_free(&o);
    /* by hand: the section sits after the params (71 bytes, test_think_budget) and the THINK
     * section (13): u8 kind at 84, u32 length at 85 */
    enum { AT = 84 };
    CHECK(patched(&m, AT + 1, 10) == PROTO_OK);
    CHECK(patched(&m, AT + 1, PROTO_MAX_GRAMMAR + 1) == PROTO_ERR_MALFORMED);
    CHECK(patched(&m, AT + 1, 0xffffffffu) == PROTO_ERR_MALFORMED);
    CHECK(patched(&m, AT + 1, 11) == PROTO_ERR_MALFORMED);   /* eats a byte of the prompt's count */
    CHECK(patched(&m, AT, 0x00000a09u) == PROTO_ERR_MALFORMED);   /* kind 9, length 10 as before */
    CHECK(patched(&m, AT, 0x00000a01u) == PROTO_OK);
    CHECK(patched(&m, AT + 5, 0x00002d61u) == PROTO_ERR_MALFORMED);   /* a NUL in the source */
    /* GRAMMAR on a frame type without it */
    uint8_t hdr[PROTO_HDR_SIZE];
    bytebuf hb = { 0 };
    proto_put_u32(&hb, PROTO_MAGIC); proto_put_u16(&hb, PROTO_VERSION); proto_put_u16(&hb, PROTO_TOKENS);
    proto_put_u32(&hb, PROTO_F_GRAMMAR); proto_put_u64(&hb, 1); proto_put_u32(&hb, 0);
    memcpy(hdr, hb.p, sizeof hdr);
    bytebuf_free(&hb);
    proto_hdr h;
    CHECK(proto_hdr_parse(hdr, sizeof hdr, &h) == PROTO_ERR_FLAGS);
}

TEST(test_roundtrip_small)
{
    proto_tok toks[3];
    memset(toks, 0, sizeof toks);
    for (int i = 0; i < 3; i++) {
        toks[i].token = 100 + i;
        toks[i].logprob = -0.25f * (float)i;
        toks[i].n_top = (uint8_t)i;
        for (int j = 0; j < i; j++) { toks[i].top_ids[j] = j; toks[i].top_lps[j] = -(float)j; }
    }
    proto_msg m, o;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_TOKENS;
    m.hdr.flags = PROTO_F_LOGPROBS;
    m.hdr.req_id = 9;
    m.u.tokens.n = 3;
    m.u.tokens.toks = toks;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.tokens.n == 3);
    for (int i = 0; i < 3 && o.u.tokens.n == 3; i++) {
        CHECK(o.u.tokens.toks[i].token == 100 + i && o.u.tokens.toks[i].logprob == -0.25f * (float)i);
        CHECK(o.u.tokens.toks[i].n_top == i);
    }
    proto_msg_free(&o);
    /* log-probs become JSON numbers: an alternative that is not finite (a token a grammar
     * ruled out) is dropped, a sampled token's that is not finite is malformed */
    toks[2].top_lps[0] = -INFINITY;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.tokens.n == 3 && o.u.tokens.toks[2].n_top == 1 && o.u.tokens.toks[2].top_ids[0] == 1 &&
          o.u.tokens.toks[2].top_lps[0] == -1.0f);
    proto_msg_free(&o);
    toks[2].top_lps[0] = NAN;
    toks[2].top_lps[1] = INFINITY;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.tokens.n == 3 && o.u.tokens.toks[2].n_top == 0 && o.u.tokens.toks[1].n_top == 1);
    proto_msg_free(&o);
    toks[1].logprob = -INFINITY;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    toks[1].logprob = NAN;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    toks[1].logprob = -0.25f;
    m.hdr.flags = 0;   /* ids only */
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.tokens.n == 3 && o.u.tokens.toks[2].token == 102 && o.u.tokens.toks[2].n_top == 0);
    proto_msg_free(&o);

    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_FINISH;
    m.hdr.req_id = 9;
    m.u.finish = (proto_finish_msg){ .reason = PROTO_FINISH_LENGTH, .prompt_tokens = 10,
                                     .cached_tokens = 2, .completion_tokens = 7, .ttft_us = 99 };
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.finish.reason == PROTO_FINISH_LENGTH && o.u.finish.prompt_tokens == 10 &&
          o.u.finish.cached_tokens == 2 && o.u.finish.completion_tokens == 7 && o.u.finish.ttft_us == 99);
    /* without DRAFTS the frame is what it was before the flag: 17 payload bytes */
    bytebuf fb = { 0 };
    CHECK(proto_encode(&fb, &m) == PROTO_OK && fb.len == PROTO_HDR_SIZE + 17);
    bytebuf_free(&fb);
    /* with it, the request's drafts on this worker: accepted at most the tokens generated,
     * rejected at most SPEC_MAX_K a token */
    m.hdr.flags = PROTO_F_DRAFTS;
    m.u.finish.accepted_drafts = 5;
    m.u.finish.rejected_drafts = 9;
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.finish.accepted_drafts == 5 && o.u.finish.rejected_drafts == 9 && o.u.finish.completion_tokens == 7);
    m.u.finish.accepted_drafts = 8;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    m.u.finish.accepted_drafts = 7;
    m.u.finish.rejected_drafts = 8 * SPEC_MAX_K;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);
    m.u.finish.rejected_drafts = 0;
    m.hdr.flags = PROTO_F_DRAFTS | 0x2u;   /* a flag FINISH does not define */
    CHECK(roundtrip(&m, &o) == PROTO_ERR_FLAGS);
    m.hdr.flags = 0;
    m.u.finish.reason = 0;
    CHECK(roundtrip(&m, &o) == PROTO_ERR_MALFORMED);

    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_CANCEL;
    m.hdr.req_id = 11;
    CHECK(roundtrip(&m, &o) == PROTO_OK && o.hdr.req_id == 11);

    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_DRAIN;
    m.u.drain.done = 0;
    m.u.drain.deadline_ms = 60000;
    CHECK(roundtrip(&m, &o) == PROTO_OK && o.u.drain.deadline_ms == 60000 && !o.u.drain.done);

    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_ERROR;
    m.hdr.req_id = 12;
    m.u.error.code = PROTO_E_BUSY;
    m.u.error.msg = "queue full";
    CHECK(roundtrip(&m, &o) == PROTO_OK);
    CHECK(o.u.error.code == PROTO_E_BUSY && !strcmp(o.u.error.msg, "queue full"));
    proto_msg_free(&o);
}

static void put_hdr(uint8_t *p, uint32_t magic, uint16_t ver, uint16_t type, uint32_t flags, uint32_t len)
{
    bytebuf b = { 0 };
    proto_put_u32(&b, magic);
    proto_put_u16(&b, ver);
    proto_put_u16(&b, type);
    proto_put_u32(&b, flags);
    proto_put_u64(&b, 1);
    proto_put_u32(&b, len);
    memcpy(p, b.p, PROTO_HDR_SIZE);
    bytebuf_free(&b);
}

TEST(test_header_checks)
{
    uint8_t p[PROTO_HDR_SIZE];
    proto_hdr h;
    put_hdr(p, PROTO_MAGIC, PROTO_VERSION, PROTO_CANCEL, 0, 0);
    CHECK(proto_hdr_parse(p, sizeof p, &h) == PROTO_OK);
    CHECK(proto_hdr_parse(p, sizeof p - 1, &h) == PROTO_ERR_SHORT);
    put_hdr(p, 0x12345678, PROTO_VERSION, PROTO_CANCEL, 0, 0);
    CHECK(proto_hdr_parse(p, sizeof p, &h) == PROTO_ERR_MAGIC);
    put_hdr(p, PROTO_MAGIC, PROTO_VERSION + 1, PROTO_CANCEL, 0, 0);
    CHECK(proto_hdr_parse(p, sizeof p, &h) == PROTO_ERR_VERSION);
    put_hdr(p, PROTO_MAGIC, 1, PROTO_CANCEL, 0, 0);   /* before the handshake existed */
    CHECK(proto_hdr_parse(p, sizeof p, &h) == PROTO_ERR_VERSION);
    put_hdr(p, PROTO_MAGIC, PROTO_VERSION, 0, 0, 0);
    CHECK(proto_hdr_parse(p, sizeof p, &h) == PROTO_ERR_TYPE);
    put_hdr(p, PROTO_MAGIC, PROTO_VERSION, PROTO_TYPE_MAX + 1, 0, 0);
    CHECK(proto_hdr_parse(p, sizeof p, &h) == PROTO_ERR_TYPE);
    put_hdr(p, PROTO_MAGIC, PROTO_VERSION, PROTO_CANCEL, 1, 0);
    CHECK(proto_hdr_parse(p, sizeof p, &h) == PROTO_ERR_FLAGS);
    put_hdr(p, PROTO_MAGIC, PROTO_VERSION, PROTO_DECODE, 32, 0);   /* 0x8 GRAMMAR, 0x10 KV_LATENT */
    CHECK(proto_hdr_parse(p, sizeof p, &h) == PROTO_ERR_FLAGS);
    put_hdr(p, PROTO_MAGIC, PROTO_VERSION, PROTO_PREFILL, PROTO_F_KV_LATENT, 0);
    CHECK(proto_hdr_parse(p, sizeof p, &h) == PROTO_ERR_FLAGS);
    put_hdr(p, PROTO_MAGIC, PROTO_VERSION, PROTO_TOKENS, 0, PROTO_MAX_PAYLOAD + 1);
    CHECK(proto_hdr_parse(p, sizeof p, &h) == PROTO_ERR_TOO_BIG);
    /* a payload with trailing bytes or short is malformed */
    put_hdr(p, PROTO_MAGIC, PROTO_VERSION, PROTO_CANCEL, 0, 1);
    CHECK(proto_hdr_parse(p, sizeof p, &h) == PROTO_OK);
    proto_msg m;
    uint8_t one = 0;
    CHECK(proto_decode(&h, &one, &m) == PROTO_ERR_MALFORMED);
}

/* Encodes a sample of every message type into frames[] (the fuzzer's seeds). */
static int seed_frames(bytebuf *bufs)
{
    static int32_t prompt[200];
    static int32_t gen[3] = { 4, 5, 6 };
    static uint8_t kvdata[8192];
    for (int i = 0; i < 200; i++) prompt[i] = i;
    int n = 0;
    proto_msg m;
    for (int t = 1; t <= PROTO_TYPE_MAX; t++) {
        memset(&m, 0, sizeof m);
        m.hdr.type = (uint16_t)t;
        m.hdr.req_id = (uint64_t)t;
        static proto_tok toks[2] = { { .token = 1, .n_top = 1 }, { .token = 2, .n_top = 0 } };
        switch (t) {
        case PROTO_HELLO: m.u.hello.role = 1; m.u.hello.listen = "a:1"; m.u.hello.name = "n"; break;
        case PROTO_PREFILL: m.hdr.flags = PROTO_F_GRAMMAR; m.u.prefill.params = test_params();
            m.u.prefill.params.grammar_kind = 0; m.u.prefill.params.grammar = "root ::= [a-z]+";
            m.u.prefill.params.grammar_len = 15; m.u.prefill.n_prompt = 200;
            m.u.prefill.prompt = prompt; break;
        case PROTO_HANDOFF: m.hdr.flags = PROTO_F_HAS_TAIL; m.u.handoff.n_prompt = 300;
            m.u.handoff.n_stored = 256; m.u.handoff.kv = test_kv(kvdata, 44); break;
        case PROTO_DECODE: m.hdr.flags = PROTO_F_HAS_TAIL | PROTO_F_THINK; m.u.decode.params = test_params();
            m.u.decode.params.think_budget = 5; m.u.decode.params.think_start = -1;
            m.u.decode.params.think_end = 7; m.u.decode.params.think_open = 1;
            m.u.decode.n_prompt = 200; m.u.decode.prompt = prompt; m.u.decode.n_gen = 3;
            m.u.decode.gen = gen; m.u.decode.kv = test_kv(kvdata, 10);
            m.u.decode.kv.start = 128; break;
        case PROTO_TOKENS: m.hdr.flags = PROTO_F_LOGPROBS; m.u.tokens.n = 2; m.u.tokens.toks = toks; break;
        case PROTO_FINISH: m.u.finish.reason = PROTO_FINISH_STOP; m.u.finish.prompt_tokens = 3; break;
        case PROTO_ERROR: m.u.error.code = 1; m.u.error.msg = "x"; break;
        case PROTO_WINDOW: {
            static proto_window_ev ev[3] = { { .op = PROTO_WIN_ADD, .ttl_ms = 5 }, { .op = PROTO_WIN_DROP }, { .op = PROTO_WIN_ADD } };
            m.u.window.n = 3; m.u.window.ev = ev; break;
        }
        case PROTO_WINSTATE: m.u.winstate.n_bytes = 64; m.u.winstate.data = kvdata; break;
        case PROTO_EXPERTS:
        case PROTO_EXPERTS_OUT: {
            static int32_t ex[2] = { 1, 5 }, nr[2] = { 2, 1 };
            static float xs[12] = { 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12 };
            m.hdr.flags = PROTO_F_LAST;
            m.u.experts = (proto_experts){ .layer = 1, .dim = 4, .n_exp = 2, .experts = ex, .n_rows = nr, .n_floats = 12, .x = xs };
            break;
        }
        case PROTO_EMBEDDING: {
            static float ev[3] = { 1, -2, 0.5f };
            m.u.embedding = (proto_embedding){ .n = 3, .v = ev };
            break;
        }
        default: break;
        }
        bufs[n] = (bytebuf){ 0 };
        if (proto_encode(&bufs[n], &m) == PROTO_OK) n++;
        else bytebuf_free(&bufs[n]);
    }
    return n;
}

/* EXPERTS frames (expert parallelism): the rows come back bit for bit; ids not ascending, an
 * empty expert or a float count that is not dim x rows is refused by the encoder and, written
 * by hand, by the decoder. */
TEST(test_experts_frames)
{
    int32_t ex[3] = { 0, 3, 9 }, nr[3] = { 1, 2, 1 };
    float xs[12];
    for (int i = 0; i < 12; i++) xs[i] = (float)i * 0.37f - 1.0f;
    xs[5] = -0.0f;
    proto_msg m = { .hdr = { .type = PROTO_EXPERTS, .flags = PROTO_F_LAST } };
    m.u.experts = (proto_experts){ .layer = 7, .dim = 3, .n_exp = 3, .experts = ex, .n_rows = nr, .n_floats = 12, .x = xs };
    bytebuf b = { 0 };
    CHECK(proto_encode(&b, &m) == PROTO_OK);
    proto_hdr h;
    CHECK(proto_hdr_parse((const uint8_t *)b.p, b.len, &h) == PROTO_OK);
    proto_msg d;
    CHECK(proto_decode(&h, (const uint8_t *)b.p + PROTO_HDR_SIZE, &d) == PROTO_OK);
    CHECK(d.hdr.flags == PROTO_F_LAST && d.u.experts.layer == 7 && d.u.experts.dim == 3 && d.u.experts.n_exp == 3);
    CHECK(!memcmp(d.u.experts.experts, ex, sizeof ex) && !memcmp(d.u.experts.n_rows, nr, sizeof nr));
    CHECK(d.u.experts.n_floats == 12 && !memcmp(d.u.experts.x, xs, sizeof xs));
    proto_msg_free(&d);
    /* a bad shape is not encoded */
    size_t n0 = b.len;
    ex[1] = 0;   /* not ascending */
    CHECK(proto_encode(&b, &m) == PROTO_ERR_MALFORMED && b.len == n0);
    ex[1] = 3;
    nr[2] = 0;   /* an expert without rows */
    CHECK(proto_encode(&b, &m) == PROTO_ERR_MALFORMED);
    nr[2] = 1;
    m.u.experts.n_floats = 11;   /* not dim x rows */
    CHECK(proto_encode(&b, &m) == PROTO_ERR_MALFORMED);
    /* nor decoded when written by hand: the second id patched below the first */
    uint8_t *p = (uint8_t *)b.p + PROTO_HDR_SIZE + 2 + 4 + 4 + 8;
    p[0] = 0;
    CHECK(proto_decode(&h, (const uint8_t *)b.p + PROTO_HDR_SIZE, &d) == PROTO_ERR_MALFORMED);
    bytebuf_free(&b);
}

TEST(test_fuzz)
{
    bytebuf seeds[PROTO_TYPE_MAX];
    int n_seeds = seed_frames(seeds);
    CHECK(n_seeds == PROTO_TYPE_MAX);
    util_rng rng;
    util_rng_seed(&rng, 42);
    int n_ok = 0, n_err = 0;
    uint8_t *buf = malloc(1 << 16);
    for (int it = 0; it < 100000; it++) {
        const bytebuf *s = &seeds[util_rng_next(&rng) % (uint64_t)n_seeds];
        size_t n = s->len;
        if (n > (1 << 16)) n = 1 << 16;
        memcpy(buf, s->p, n);
        int mode = (int)(util_rng_next(&rng) % 5);
        if (mode == 0) {                       /* truncate */
            n = util_rng_next(&rng) % (n + 1);
        } else if (mode == 1) {                /* flip a few bytes */
            int k = 1 + (int)(util_rng_next(&rng) % 4);
            for (int j = 0; j < k; j++) buf[util_rng_next(&rng) % n] ^= (uint8_t)(1 + util_rng_next(&rng) % 255);
        } else if (mode == 2) {                /* random bytes after a valid header */
            size_t m = PROTO_HDR_SIZE + util_rng_next(&rng) % 512;
            for (size_t j = PROTO_HDR_SIZE; j < m; j++) buf[j] = (uint8_t)util_rng_next(&rng);
            n = m;
        } else if (mode == 3) {                /* lie about the length */
            uint32_t len = (uint32_t)util_rng_next(&rng);
            if (util_rng_next(&rng) & 1) len %= (uint32_t)(n + 8);
            memcpy(buf + 20, &len, 4);
        } else {                               /* corrupt a count inside the payload */
            if (n > PROTO_HDR_SIZE + 4) {
                size_t at = PROTO_HDR_SIZE + util_rng_next(&rng) % (n - PROTO_HDR_SIZE - 3);
                uint32_t v = (uint32_t)util_rng_next(&rng);
                memcpy(buf + at, &v, 4);
            }
        }
        proto_hdr h;
        proto_status st = proto_hdr_parse(buf, n, &h);
        if (st == PROTO_OK) {
            if (h.len > n - PROTO_HDR_SIZE) {
                n_err++;                       /* a reader would wait for more bytes */
                continue;
            }
            /* decode from an exact-size copy so ASan sees any over-read */
            uint8_t *pl = malloc(h.len ? h.len : 1);
            memcpy(pl, buf + PROTO_HDR_SIZE, h.len);
            proto_msg m;
            st = proto_decode(&h, pl, &m);
            free(pl);
            if (st == PROTO_OK) {
                n_ok++;
                /* a decoded message re-encodes to a frame that decodes again */
                bytebuf b = { 0 };
                proto_status st2 = proto_encode(&b, &m);
                CHECK(st2 == PROTO_OK);
                bytebuf_free(&b);
                proto_msg_free(&m);
            } else {
                CHECK(st == PROTO_ERR_MALFORMED);
                n_err++;
            }
        } else {
            n_err++;
        }
    }
    free(buf);
    CHECK(n_ok > 0 && n_err > 0);
    printf("     fuzz: %d decoded, %d refused\n", n_ok, n_err);
    for (int i = 0; i < n_seeds; i++) bytebuf_free(&seeds[i]);
}

TEST(test_socketpair)
{
    int sv[2];
    CHECK(!socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    proto_msg m, o;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_ERROR;
    m.hdr.req_id = 5;
    m.u.error.code = PROTO_E_ARG;
    m.u.error.msg = "bad";
    proto_conn c0, c1;
    proto_conn_init(&c0, sv[0]);
    proto_conn_init(&c1, sv[1]);
    CHECK(proto_send_msg(&c0, &m) == PROTO_OK);
    CHECK(proto_recv(&c1, &o) == PROTO_OK);
    CHECK(o.hdr.type == PROTO_ERROR && o.hdr.req_id == 5 && !strcmp(o.u.error.msg, "bad"));
    proto_msg_free(&o);
    /* an oversized header is refused before any payload is read */
    uint8_t p[PROTO_HDR_SIZE];
    put_hdr(p, PROTO_MAGIC, PROTO_VERSION, PROTO_TOKENS, 0, 0xffffffffu);
    CHECK(proto_send(sv[0], p, sizeof p) == PROTO_OK);
    CHECK(proto_recv(&c1, &o) == PROTO_ERR_TOO_BIG);
    close(sv[0]);
    CHECK(proto_recv(&c1, &o) == PROTO_ERR_CLOSED);
    close(sv[1]);
}

/* Writes the bytes of a frame one at a time, 50 ms apart (a stranger trickling its handshake). */
typedef struct {
    int fd;
    uint8_t frame[PROTO_HDR_SIZE + AUTH_NONCE_SIZE];
} trickle_arg;

static void *trickle_thread(void *p)
{
    trickle_arg *t = p;
    for (size_t i = 0; i < sizeof t->frame; i++) {
        if (proto_send(t->fd, t->frame + i, 1) != PROTO_OK) break;
        usleep(50 * 1000);
    }
    return NULL;
}

/* Before the handshake seals a connection, a frame longer than PROTO_MAX_PREAUTH is refused from
 * its header, before a byte of its payload is read or allocated (the same length is fine once
 * sealed); and a connection's deadline bounds a whole receive however the bytes trickle in. */
TEST(test_preauth_limits)
{
    int sv[2];
    CHECK(!socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    proto_conn c;
    proto_conn_init(&c, sv[1]);
    uint8_t p[PROTO_HDR_SIZE];
    put_hdr(p, PROTO_MAGIC, PROTO_VERSION, PROTO_CHALLENGE, 0, PROTO_MAX_PREAUTH + 1);
    CHECK(proto_send(sv[0], p, sizeof p) == PROTO_OK);
    shutdown(sv[0], SHUT_WR);   /* no payload follows: a receiver that waits for it sees the end */
    proto_msg o;
    CHECK(proto_recv(&c, &o) == PROTO_ERR_TOO_BIG);
    close(sv[0]);
    close(sv[1]);
    /* a CHALLENGE trickled in at 50 ms a byte (2.8 s in all) against a 300 ms deadline */
    CHECK(!socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    proto_conn_init(&c, sv[1]);
    trickle_arg t = { .fd = sv[0] };
    put_hdr(t.frame, PROTO_MAGIC, PROTO_VERSION, PROTO_CHALLENGE, 0, AUTH_NONCE_SIZE);
    pthread_t th;
    CHECK(!pthread_create(&th, NULL, trickle_thread, &t));
    c.deadline = util_now() + 0.3;
    errno = 0;
    CHECK(proto_recv(&c, &o) == PROTO_ERR_IO && errno == ETIMEDOUT);
    shutdown(sv[1], SHUT_RDWR);
    pthread_join(th, NULL);
    close(sv[0]);
    close(sv[1]);
}

TEST(test_listen_connect)
{
    int lfd = proto_listen("127.0.0.1:0", 4);
    CHECK(lfd >= 0);
    int port = proto_local_port(lfd);
    CHECK(port > 0);
    char hp[64];
    snprintf(hp, sizeof hp, "127.0.0.1:%d", port);
    int c = proto_connect(hp, 1000);
    CHECK(c >= 0);
    char host[64];
    int a = proto_accept(lfd, host, sizeof host);
    CHECK(a >= 0);
    CHECK(!strcmp(host, "127.0.0.1"));
    /* both ends send each frame at once (no Nagle wait for the peer's delayed ACK) */
    int nd_c = 0, nd_a = 0;
    socklen_t l = sizeof nd_c;
    CHECK(!getsockopt(c, IPPROTO_TCP, TCP_NODELAY, &nd_c, &l) && nd_c == 1);
    l = sizeof nd_a;
    CHECK(!getsockopt(a, IPPROTO_TCP, TCP_NODELAY, &nd_a, &l) && nd_a == 1);
    proto_msg m, o;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_CANCEL;
    m.hdr.req_id = 77;
    proto_conn pc, pa;
    proto_conn_init(&pc, c);
    proto_conn_init(&pa, a);
    CHECK(proto_send_msg(&pc, &m) == PROTO_OK);
    CHECK(proto_recv(&pa, &o) == PROTO_OK && o.hdr.req_id == 77);
    close(a); close(c); close(lfd);
    CHECK(proto_role_parse("prefill") == PROTO_ROLE_PREFILL && proto_role_parse("x") == -1);
}

/* ---- the handshake and frame tags (cluster/auth.h) ---- */

static const auth_key key_a = { .secret = "cluster secret A 0123456789", .n = 27 };
static const auth_key key_b = { .secret = "cluster secret B 0123456789", .n = 27 };

typedef struct {
    proto_conn c;
    const auth_key *k;
    auth_side side;
    auth_status st;
    char why[160];
} hs_end;

static void *hs_thread(void *p)
{
    hs_end *e = p;
    e->st = auth_handshake(&e->c, e->k, e->side, e->why, sizeof e->why);
    return NULL;
}

static void bound_waits(int fd)
{
    struct timeval tv = { 30, 0 };   /* a bound on a hang, never a speed */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

/* A gateway end (g, key kg) and a worker end (w, key kw) on a socket pair, both handshaking. */
static void hs_pair(hs_end *g, const auth_key *kg, hs_end *w, const auth_key *kw)
{
    int sv[2];
    CHECK(!socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    bound_waits(sv[0]);
    bound_waits(sv[1]);
    memset(g, 0, sizeof *g);
    memset(w, 0, sizeof *w);
    proto_conn_init(&g->c, sv[0]);
    proto_conn_init(&w->c, sv[1]);
    g->k = kg;
    g->side = AUTH_SIDE_GATEWAY;
    w->k = kw;
    w->side = AUTH_SIDE_WORKER;
    pthread_t t;
    pthread_create(&t, NULL, hs_thread, w);
    hs_thread(g);
    pthread_join(t, NULL);
}

static void hs_close(hs_end *e)
{
    close(e->c.fd);
    proto_conn_free(&e->c);
}

static void cancel_msg(proto_msg *m, uint64_t id)
{
    memset(m, 0, sizeof *m);
    m->hdr.type = PROTO_CANCEL;
    m->hdr.req_id = id;
}

TEST(test_handshake_ok)
{
    hs_end g, w;
    hs_pair(&g, &key_a, &w, &key_a);
    CHECKF(g.st == AUTH_OK && w.st == AUTH_OK, "%s / %s", g.why, w.why);
    CHECK(g.c.sealed && w.c.sealed);
    /* the directions have their own keys */
    CHECK(memcmp(g.c.tx.key, g.c.rx.key, AUTH_MAC_SIZE) && !memcmp(g.c.tx.key, w.c.rx.key, AUTH_MAC_SIZE));
    proto_msg m, o;
    for (uint64_t i = 1; i <= 3; i++) {   /* tagged frames both ways, in sequence */
        cancel_msg(&m, i);
        CHECK(proto_send_msg(&g.c, &m) == PROTO_OK);
        CHECK(proto_recv(&w.c, &o) == PROTO_OK && o.hdr.type == PROTO_CANCEL && o.hdr.req_id == i);
        m.hdr.type = PROTO_ERROR;
        m.u.error.code = PROTO_E_BUSY;
        m.u.error.msg = "busy";
        CHECK(proto_send_msg(&w.c, &m) == PROTO_OK);
        CHECK(proto_recv(&g.c, &o) == PROTO_OK && o.hdr.req_id == i && !strcmp(o.u.error.msg, "busy"));
        proto_msg_free(&o);
    }
    CHECK(g.c.tx.seq == 3 && w.c.rx.seq == 3);
    hs_close(&g);
    hs_close(&w);
}

/* Different keys: each side finds the other's proof wrong; neither is sealed. */
TEST(test_handshake_wrong_key)
{
    hs_end g, w;
    hs_pair(&g, &key_a, &w, &key_b);
    CHECKF(g.st == AUTH_ERR_REFUSED && w.st == AUTH_ERR_REFUSED, "%s / %s", g.why, w.why);
    CHECK(!g.c.sealed && !w.c.sealed);
    hs_close(&g);
    hs_close(&w);
    /* a key that differs in its last byte only, and one that is a prefix of the other */
    auth_key k1 = key_a, k2 = key_a;
    k2.secret[26] ^= 1;
    hs_pair(&g, &k1, &w, &k2);
    CHECK(g.st == AUTH_ERR_REFUSED && w.st == AUTH_ERR_REFUSED);
    hs_close(&g);
    hs_close(&w);
    k2 = key_a;
    k2.n = 20;
    hs_pair(&g, &k1, &w, &k2);
    CHECK(g.st == AUTH_ERR_REFUSED && w.st == AUTH_ERR_REFUSED);
    hs_close(&g);
    hs_close(&w);
}

/* A peer without a key (it skips the handshake: a HELLO first, in this version or the last one)
 * is refused before anything else is read. */
/* The gateway's end of a handshake whose peer sends m first, in protocol version `version` (0:
 * this build's), and nothing else: g holds the outcome, *peer the peer's socket (the caller
 * checks g, then hs_close(g) and closes *peer). */
static void hs_first_frame(hs_end *g, int *peer, const proto_msg *m, int version)
{
    int sv[2];
    CHECK(!socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    bound_waits(sv[0]);
    memset(g, 0, sizeof *g);
    proto_conn_init(&g->c, sv[0]);
    g->k = &key_a;
    g->side = AUTH_SIDE_GATEWAY;
    bytebuf b = { 0 };
    CHECK(proto_encode(&b, m) == PROTO_OK);
    if (version) b.p[4] = (char)version;
    CHECK(proto_send(sv[1], b.p, b.len) == PROTO_OK);
    bytebuf_free(&b);
    hs_thread(g);
    *peer = sv[1];
}

TEST(test_handshake_no_key)
{
    for (int old = 0; old < 2; old++) {
        proto_msg m;
        memset(&m, 0, sizeof m);
        m.hdr.type = PROTO_HELLO;
        m.hdr.flags = PROTO_F_REGISTER;
        m.u.hello.role = PROTO_ROLE_DECODE;
        hs_end g;
        int peer;
        hs_first_frame(&g, &peer, &m, old ? 1 : 0);   /* version 1: the frames before the handshake existed */
        CHECKF(g.st == AUTH_ERR_PROTO && !g.c.sealed, "%d: %s", g.st, g.why);
        hs_close(&g);
        close(peer);
    }
}

/* An embedding travels as a PREFILL with PROTO_F_EMBED (its pooling after the prompt) and comes
 * back as EMBEDDING (the vector); a pooling other than mean / last, an empty, oversized or
 * non-finite vector, and a vector of other length than its payload are refused. */
TEST(test_roundtrip_embedding)
{
    int32_t prompt[5] = { 1, 2, 3, 4, 5 };
    proto_msg m, o;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_PREFILL;
    m.hdr.flags = PROTO_F_EMBED;
    m.hdr.req_id = 9;
    m.u.prefill.params = test_params();
    m.u.prefill.n_prompt = 5;
    m.u.prefill.prompt = prompt;
    m.u.prefill.embed = 3;   /* MODEL_POOL_LAST */
    CHECK(roundtrip(&m, &o) == PROTO_OK && o.u.prefill.embed == 3 && o.u.prefill.n_prompt == 5);
    proto_msg_free(&o);
    m.u.prefill.embed = 4;   /* rank: pooled on the gateway from the last position's vector */
    bytebuf b = { 0 };
    CHECK(proto_encode(&b, &m) == PROTO_ERR_MALFORMED && b.len == 0);
    m.u.prefill.embed = 1;
    CHECK(proto_encode(&b, &m) == PROTO_OK);
    proto_hdr h;
    CHECK(proto_hdr_parse((const uint8_t *)b.p, b.len, &h) == PROTO_OK);
    b.p[b.len - 1] = 0;   /* no pooling on the wire: an embedding names one */
    CHECK(proto_decode(&h, (const uint8_t *)b.p + PROTO_HDR_SIZE, &o) == PROTO_ERR_MALFORMED);
    bytebuf_free(&b);

    float v[4] = { 0.5f, -1.25f, 3.0f, 0.0f };
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_EMBEDDING;
    m.hdr.req_id = 9;
    m.u.embedding.n = 4;
    m.u.embedding.v = v;
    CHECK(roundtrip(&m, &o) == PROTO_OK && o.u.embedding.n == 4 && !memcmp(o.u.embedding.v, v, sizeof v));
    proto_msg_free(&o);
    b = (bytebuf){ 0 };
    CHECK(proto_encode(&b, &m) == PROTO_OK);
    CHECK(proto_hdr_parse((const uint8_t *)b.p, b.len, &h) == PROTO_OK);
    float nan = NAN;
    memcpy(b.p + PROTO_HDR_SIZE + 4 + 4, &nan, 4);   /* the second float */
    CHECK(proto_decode(&h, (const uint8_t *)b.p + PROTO_HDR_SIZE, &o) == PROTO_ERR_MALFORMED);
    uint32_t more = 5;   /* a count beyond the payload */
    memcpy(b.p + PROTO_HDR_SIZE, &more, 4);
    CHECK(proto_decode(&h, (const uint8_t *)b.p + PROTO_HDR_SIZE, &o) == PROTO_ERR_MALFORMED);
    bytebuf_free(&b);
    m.u.embedding.n = 0;
    b = (bytebuf){ 0 };
    CHECK(proto_encode(&b, &m) == PROTO_ERR_MALFORMED);
    m.u.embedding.n = 4;
    v[2] = INFINITY;
    CHECK(proto_encode(&b, &m) == PROTO_ERR_MALFORMED);
    bytebuf_free(&b);
}

/* A peer of the previous version (its HELLO lacks the model id) is refused at its first frame,
 * and the refusal says what to do: the same release everywhere. */
TEST(test_handshake_old_version)
{
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_CHALLENGE;
    hs_end g;
    int peer;
    hs_first_frame(&g, &peer, &m, 2);   /* version 2: the CHALLENGE an older build sends */
    CHECKF(g.st == AUTH_ERR_PROTO && !g.c.sealed && strstr(g.why, "protocol version") && strstr(g.why, "same tokenmill release"),
           "%d: %s", g.st, g.why);
    hs_close(&g);
    close(peer);
}

/* Copies bytes from one socket to another until the first ends (recording them in rec when
 * set), then ends the second's writing side. */
typedef struct {
    int from, to;
    bytebuf *rec;
} relay_arg;

static void *relay_thread(void *p)
{
    relay_arg *a = p;
    uint8_t buf[4096];
    for (;;) {
        ssize_t k = read(a->from, buf, sizeof buf);
        if (k <= 0) break;
        if (a->rec) proto_put_bytes(a->rec, buf, (size_t)k);
        if (proto_send(a->to, buf, (size_t)k) != PROTO_OK) break;
    }
    shutdown(a->to, SHUT_WR);
    return NULL;
}

static void *recv_one_thread(void *p)
{
    hs_end *e = p;
    proto_msg m;
    if (e->st == AUTH_OK && proto_recv(&e->c, &m) == PROTO_OK) proto_msg_free(&m);
    return NULL;
}

/* Every byte a worker sent in a successful session (CHALLENGE, PROOF, a tagged HELLO), recorded
 * on the wire and replayed to a gateway on a new connection: refused, since the gateway's nonce
 * is new and the recorded proof is over the old one. */
TEST(test_handshake_replayed)
{
    int ws[2], gs[2];   /* worker <-> relay, relay <-> gateway */
    CHECK(!socketpair(AF_UNIX, SOCK_STREAM, 0, ws) && !socketpair(AF_UNIX, SOCK_STREAM, 0, gs));
    for (int i = 0; i < 2; i++) { bound_waits(ws[i]); bound_waits(gs[i]); }
    bytebuf rec = { 0 };
    relay_arg up = { ws[1], gs[1], &rec }, down = { gs[1], ws[1], NULL };
    pthread_t tu, td, tg;
    pthread_create(&tu, NULL, relay_thread, &up);
    pthread_create(&td, NULL, relay_thread, &down);
    hs_end g, w;
    memset(&g, 0, sizeof g);
    memset(&w, 0, sizeof w);
    proto_conn_init(&g.c, gs[0]);
    proto_conn_init(&w.c, ws[0]);
    g.k = w.k = &key_a;
    g.side = AUTH_SIDE_GATEWAY;
    w.side = AUTH_SIDE_WORKER;
    pthread_create(&tg, NULL, hs_thread, &g);
    hs_thread(&w);
    pthread_join(tg, NULL);
    CHECKF(g.st == AUTH_OK && w.st == AUTH_OK, "%s / %s", g.why, w.why);
    proto_msg m;
    memset(&m, 0, sizeof m);
    m.hdr.type = PROTO_HELLO;
    m.hdr.flags = PROTO_F_REGISTER;
    m.u.hello.role = PROTO_ROLE_DECODE;
    pthread_create(&tg, NULL, recv_one_thread, &g);
    CHECK(proto_send_msg(&w.c, &m) == PROTO_OK);
    pthread_join(tg, NULL);
    shutdown(ws[0], SHUT_WR);   /* the relays end */
    shutdown(gs[0], SHUT_WR);
    pthread_join(tu, NULL);
    pthread_join(td, NULL);
    hs_close(&g);
    hs_close(&w);
    close(ws[1]);
    close(gs[1]);
    CHECK(rec.len == 2 * (PROTO_HDR_SIZE + 32) + PROTO_HDR_SIZE + 0 + AUTH_TAG_SIZE + 1 + 1 + 32 + 5 * 4 + 2 + 2 + 2);
    /* the replay */
    int sv[2];
    CHECK(!socketpair(AF_UNIX, SOCK_STREAM, 0, sv));
    bound_waits(sv[0]);
    hs_end g2;
    memset(&g2, 0, sizeof g2);
    proto_conn_init(&g2.c, sv[0]);
    g2.k = &key_a;
    g2.side = AUTH_SIDE_GATEWAY;
    CHECK(proto_send(sv[1], rec.p, rec.len) == PROTO_OK);
    hs_thread(&g2);
    CHECKF(g2.st == AUTH_ERR_REFUSED && !g2.c.sealed, "%d: %s", g2.st, g2.why);
    hs_close(&g2);
    close(sv[1]);
    bytebuf_free(&rec);
}

/* Frame bytes for m with the tag the sender's next sequence number gives (taken from its state). */
static void tagged_frame(hs_end *from, const proto_msg *m, bytebuf *out)
{
    *out = (bytebuf){ 0 };
    CHECK(proto_encode(out, m) == PROTO_OK);
    uint8_t tag[AUTH_TAG_SIZE];
    CHECK(auth_dir_tag(&from->c.tx, out->p, PROTO_HDR_SIZE, out->p + PROTO_HDR_SIZE, out->len - PROTO_HDR_SIZE, tag));
    proto_put_bytes(out, tag, sizeof tag);
}

/* After the handshake, a frame altered on the wire, a frame sent twice, frames out of order and a
 * frame sent back the way it came are all refused (PROTO_ERR_AUTH) before they are decoded. */
TEST(test_frames_tampered_replayed)
{
    proto_msg m, o;
    bytebuf f1, f2;
    for (int c = 0; c < 4; c++) {
        hs_end g, w;
        hs_pair(&g, &key_a, &w, &key_a);
        CHECK(g.st == AUTH_OK && w.st == AUTH_OK);
        cancel_msg(&m, 41);
        tagged_frame(&g, &m, &f1);
        cancel_msg(&m, 42);
        tagged_frame(&g, &m, &f2);
        switch (c) {
        case 0:   /* altered: the request id */
            f1.p[12] ^= 1;
            CHECK(proto_send(g.c.fd, f1.p, f1.len) == PROTO_OK);
            CHECK(proto_recv(&w.c, &o) == PROTO_ERR_AUTH);
            break;
        case 1:   /* the same frame twice */
            CHECK(proto_send(g.c.fd, f1.p, f1.len) == PROTO_OK);
            CHECK(proto_recv(&w.c, &o) == PROTO_OK && o.hdr.req_id == 41);
            CHECK(proto_send(g.c.fd, f1.p, f1.len) == PROTO_OK);
            CHECK(proto_recv(&w.c, &o) == PROTO_ERR_AUTH);
            break;
        case 2:   /* the second before the first */
            CHECK(proto_send(g.c.fd, f2.p, f2.len) == PROTO_OK);
            CHECK(proto_recv(&w.c, &o) == PROTO_ERR_AUTH);
            break;
        case 3: { /* a frame the worker sent, reflected back to it */
            cancel_msg(&m, 43);
            bytebuf f3;
            tagged_frame(&w, &m, &f3);
            CHECK(proto_send(g.c.fd, f3.p, f3.len) == PROTO_OK);
            CHECK(proto_recv(&w.c, &o) == PROTO_ERR_AUTH);
            bytebuf_free(&f3);
            break;
        }
        }
        bytebuf_free(&f1);
        bytebuf_free(&f2);
        hs_close(&g);
        hs_close(&w);
    }
}

/* Key files: a private regular file is read (trailing whitespace stripped, so a key written
 * with echo and one copied without the newline agree); one readable by other users, a
 * directory, an empty file and a missing one are refused with a message naming the file. With
 * no file named, a key is generated once under $XDG_CACHE_HOME (mode 0600) and read back the
 * same by the next process. */
TEST(test_key_files)
{
    char dir[] = "/tmp/tm-keys-XXXXXX", path[300], err[512];
    CHECK(mkdtemp(dir) != NULL);
    auth_key k, k2;
    snprintf(path, sizeof path, "%s/key", dir);
    FILE *f = fopen(path, "w");
    fputs("s3cret-key-with-some-length\n\n", f);
    fclose(f);
    chmod(path, 0600);
    CHECK(auth_key_load(path, &k, err, sizeof err) == AUTH_OK && k.n == 27 && !memcmp(k.secret, "s3cret-key-with-some-length", 27));
    chmod(path, 0644);
    CHECK(auth_key_load(path, &k, err, sizeof err) == AUTH_ERR_FILE && strstr(err, path) && strstr(err, "other users"));
    chmod(path, 0602);
    CHECK(auth_key_load(path, &k, err, sizeof err) == AUTH_ERR_FILE);
    chmod(path, 0640);   /* a group (the service's) may read it */
    CHECK(auth_key_load(path, &k, err, sizeof err) == AUTH_OK);
    f = fopen(path, "w");
    fputs(" \n", f);
    fclose(f);
    chmod(path, 0600);
    CHECK(auth_key_load(path, &k, err, sizeof err) == AUTH_ERR_FILE && strstr(err, "empty"));
    CHECK(auth_key_load(dir, &k, err, sizeof err) == AUTH_ERR_FILE && strstr(err, "not a regular file"));
    snprintf(path, sizeof path, "%s/missing", dir);
    CHECK(auth_key_load(path, &k, err, sizeof err) == AUTH_ERR_FILE && strstr(err, path));
    /* the generated default */
    char *old = getenv("XDG_CACHE_HOME") ? strdup(getenv("XDG_CACHE_HOME")) : NULL;
    snprintf(path, sizeof path, "%s/cache", dir);
    setenv("XDG_CACHE_HOME", path, 1);
    char used[4096], used2[4096];
    CHECKF(auth_key_default(&k, used, sizeof used, err, sizeof err) == AUTH_OK, "%s", err);
    CHECK(strstr(used, "/cache/tokenmill/cluster.key") != NULL && k.n == 64);
    struct stat sb;
    CHECK(!stat(used, &sb) && (sb.st_mode & 0777) == 0600);
    CHECK(auth_key_default(&k2, used2, sizeof used2, err, sizeof err) == AUTH_OK);
    CHECK(!strcmp(used, used2) && k2.n == k.n && !memcmp(k.secret, k2.secret, k.n));
    if (old) setenv("XDG_CACHE_HOME", old, 1);
    else unsetenv("XDG_CACHE_HOME");
    free(old);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) {}
}

int main(void)
{
    RUN(test_roundtrip_hello_heartbeat);
    RUN(test_roundtrip_jobs);
    RUN(test_decoder_ranges);
    RUN(test_window_frames);
    RUN(test_grammar_section);
    RUN(test_think_budget);
    RUN(test_roundtrip_small);
    RUN(test_header_checks);
    RUN(test_experts_frames);
    RUN(test_fuzz);
    RUN(test_socketpair);
    RUN(test_listen_connect);
    RUN(test_preauth_limits);
    RUN(test_handshake_ok);
    RUN(test_handshake_wrong_key);
    RUN(test_handshake_no_key);
    RUN(test_handshake_old_version);
    RUN(test_roundtrip_embedding);
    RUN(test_handshake_replayed);
    RUN(test_frames_tampered_replayed);
    RUN(test_key_files);
    HARNESS_END();
}
