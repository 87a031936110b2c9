/*
 * seeds: writes the binary seed files of the fuzz corpora (tests/fuzz/corpus/{gguf,proto,
 * block,template}) with the project's own writers, so that the seeds follow the formats when
 * they change: `make fuzz-seeds`, then commit what changed. The JSON request seeds of the API
 * targets are written by hand.
 *
 *   gguf      a tiny llama model (tests/unit/tinymodel.h), stories260K's vocabulary without
 *             its tensors, a file with one key of every value type
 *   proto     one valid frame of each type (several frames per seed file for a few)
 *   block     a sealed block file of a small geometry (flag byte 0 and 1, see fuzz_block.c)
 *   template  a conversation with tools, a tool call and its result, reasoning
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "../unit/tinymodel.h"
#include "cache/block.h"
#include "cluster/proto.h"
#include "model/gguf.h"

#define CORPUS "tests/fuzz/corpus/"

static void put(const char *target, const char *name, const void *p, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, CORPUS "%s", target);
    mkdir(path, 0755);
    snprintf(path, sizeof path, CORPUS "%s/%s", target, name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(p, 1, n, f) != n || fclose(f) != 0) {
        fprintf(stderr, "seeds: %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

static void put_file(const char *target, const char *name, const char *src, size_t prefix, size_t max)
{
    size_t n;
    char *p = util_read_file(src, &n);
    if (!p) { fprintf(stderr, "seeds: %s unreadable\n", src); exit(1); }
    if (n > max) { fprintf(stderr, "seeds: %s is %zu bytes, more than %zu\n", src, n, max); exit(1); }
    char *q = xmalloc(n + prefix);
    memset(q, 0, prefix);
    memcpy(q + prefix, p, n);
    put(target, name, q, n + prefix);
    free(q);
    free(p);
}

static void gguf_seeds(void)
{
    const char *tmp = "build/fuzz/seed.gguf";
    tiny_cfg c = { .arch = "llama", .dim = 8, .n_layers = 1, .n_heads = 2, .n_kv_heads = 1, .head_dim = 4,
                   .ffn = 16, .vocab = 16, .tied = true, .seed = 1 };
    if (tiny_write(&c, tmp) != 0) exit(1);
    put_file("gguf", "tiny-llama.gguf", tmp, 0, 1 << 16);

    char err[256];
    gguf *g;
    if (gguf_open("models/stories260K.gguf", &g, err, sizeof err) != GGUF_OK) { fprintf(stderr, "%s\n", err); exit(1); }
    gguf_writer *w = gguf_writer_new();
    for (int i = 0; i < gguf_n_keys(g); i++) gguf_writer_copy_key(w, g, gguf_key_name(g, i));
    if (gguf_writer_write(w, tmp, err, sizeof err) != GGUF_OK) { fprintf(stderr, "%s\n", err); exit(1); }
    gguf_writer_free(w);
    gguf_close(g);
    put_file("gguf", "stories260K-vocab.gguf", tmp, 0, 1 << 16);

    w = gguf_writer_new();
    for (int t = GGUF_VT_UINT8; t <= GGUF_VT_FLOAT64; t++) {
        if (t == GGUF_VT_STRING || t == GGUF_VT_ARRAY) continue;
        char key[32];
        uint64_t v[2] = { 0x0102030405060708ull, 1 };
        snprintf(key, sizeof key, "k.scalar%d", t);
        gguf_writer_set_scalar(w, key, (gguf_vtype)t, v);
        snprintf(key, sizeof key, "k.array%d", t);
        gguf_writer_set_arr(w, key, (gguf_vtype)t, v, 2);
    }
    gguf_writer_set_str(w, "k.string", "text");
    const char *strs[] = { "a", "bc" };
    size_t lens[] = { 1, 2 };
    gguf_writer_set_arr_str(w, "k.strings", strs, lens, 2);
    gguf_writer_set_u32(w, "general.alignment", 64);
    float f[32] = { 1 };
    int64_t ne[2] = { 32, 1 };
    gguf_writer_add_tensor(w, "t.f32", QTYPE_F32, 2, ne, f, sizeof f);
    if (gguf_writer_write(w, tmp, err, sizeof err) != GGUF_OK) { fprintf(stderr, "%s\n", err); exit(1); }
    gguf_writer_free(w);
    put_file("gguf", "every-type.gguf", tmp, 0, 1 << 16);
    remove(tmp);
}

static void proto_seed(bytebuf *b, const char *name, proto_msg *m)
{
    if (proto_encode(b, m) != PROTO_OK) { fprintf(stderr, "seeds: %s does not encode\n", name); exit(1); }
    put("proto", name, b->p, b->len);
}

static void proto_seeds(void)
{
    int32_t prompt[4] = { 1, 2, 3, 4 }, gen[2] = { 5, 6 };
    uint8_t kv[2 * 1 * 1 * 2 * 4 * 2] = { 1 };
    proto_tok toks[2] = { { .token = 7, .logprob = -0.5f, .n_top = 1, .top_ids = { 8 }, .top_lps = { -1 } }, { .token = 9 } };
    proto_params params = { .sample = sample_params_default(), .max_tokens = 16, .stop_ids = { 2 }, .n_stop_ids = 1,
                            .logprobs = 1, .top_logprobs = 1, .salt = "salt" };
    proto_kv tail = { .dtype = QTYPE_F16, .n_parts = 2, .n_layers = 1, .n_kv_heads = 1, .head_dim = 4, .start = 0, .n = 2,
                      .n_bytes = sizeof kv, .data = kv };
    bytebuf b = { 0 };
    proto_msg m = { .hdr = { .type = PROTO_HELLO, .flags = PROTO_F_REGISTER },
                    .u.hello = { .role = PROTO_ROLE_MIXED, .kv_dtype = QTYPE_F16, .max_seqs = 4, .kv_blocks = 8,
                                 .max_batch_tokens = 64, .n_ctx = 256, .n_vocab = 512, .listen = "127.0.0.1:9000",
                                 .name = "w1" } };
    proto_seed(&b, "hello", &m);
    m = (proto_msg){ .hdr = { .type = PROTO_HEARTBEAT }, .u.heartbeat = { .n_running = 1, .kv_blocks_total = 8 } };
    proto_seed(&b, "hello-heartbeat", &m);   /* a connection's first two frames */
    b.len = 0;
    m = (proto_msg){ .hdr = { .type = PROTO_PREFILL, .req_id = 1 },
                     .u.prefill = { .params = params, .hit_len = 0, .n_prompt = 4, .prompt = prompt } };
    proto_seed(&b, "prefill", &m);
    b.len = 0;
    m.hdr.flags = PROTO_F_THINK;
    m.u.prefill.params.think_budget = 8;
    m.u.prefill.params.think_start = 3;
    m.u.prefill.params.think_end = 4;
    proto_seed(&b, "prefill-think", &m);
    b.len = 0;
    m.hdr.flags = PROTO_F_THINK | PROTO_F_GRAMMAR;   /* a grammar's source after the budget */
    m.u.prefill.params.grammar_kind = 2;
    m.u.prefill.params.grammar = "{\"type\":\"object\",\"properties\":{\"a\":{\"enum\":[1,2]}}}";
    m.u.prefill.params.grammar_len = (uint32_t)strlen(m.u.prefill.params.grammar);
    proto_seed(&b, "prefill-think-grammar", &m);
    b.len = 0;
    m = (proto_msg){ .hdr = { .type = PROTO_HANDOFF, .flags = PROTO_F_HAS_TAIL, .req_id = 1 },
                     .u.handoff = { .first = toks[0], .n_prompt = 2, .n_computed = 2, .kv = tail } };
    proto_seed(&b, "handoff", &m);
    b.len = 0;
    m = (proto_msg){ .hdr = { .type = PROTO_DECODE, .flags = PROTO_F_HAS_TAIL, .req_id = 1 },
                     .u.decode = { .params = params, .n_prompt = 4, .prompt = prompt, .n_gen = 2, .gen = gen,
                                   .kv = tail } };
    m.u.decode.kv.n = 2;
    proto_seed(&b, "decode", &m);
    b.len = 0;
    m = (proto_msg){ .hdr = { .type = PROTO_TOKENS, .flags = PROTO_F_LOGPROBS, .req_id = 1 },
                     .u.tokens = { .n = 2, .toks = toks } };
    proto_seed(&b, "tokens", &m);
    m = (proto_msg){ .hdr = { .type = PROTO_FINISH, .req_id = 1 },
                     .u.finish = { .reason = PROTO_FINISH_STOP, .prompt_tokens = 4, .completion_tokens = 3 } };
    proto_seed(&b, "tokens-finish", &m);
    b.len = 0;
    m = (proto_msg){ .hdr = { .type = PROTO_CANCEL, .req_id = 1 } };
    proto_seed(&b, "cancel", &m);
    b.len = 0;
    m = (proto_msg){ .hdr = { .type = PROTO_DRAIN }, .u.drain = { .deadline_ms = 1000 } };
    proto_seed(&b, "drain", &m);
    b.len = 0;
    m = (proto_msg){ .hdr = { .type = PROTO_ERROR, .req_id = 0 }, .u.error = { .code = PROTO_E_MALFORMED, .msg = "bad" } };
    proto_seed(&b, "error", &m);
    b.len = 0;
    proto_window_ev ev[2] = { { .op = PROTO_WIN_ADD, .key = { 1, 2, 3 }, .ttl_ms = 180000 }, { .op = PROTO_WIN_DROP, .key = { 4 } } };
    m = (proto_msg){ .hdr = { .type = PROTO_WINDOW }, .u.window = { .n = 2, .ev = ev } };
    proto_seed(&b, "window", &m);
    b.len = 0;
    m = (proto_msg){ .hdr = { .type = PROTO_WINFETCH, .req_id = 2 }, .u.winfetch = { .key = { 1, 2, 3 } } };
    proto_seed(&b, "winfetch", &m);
    uint8_t state[16] = { 9, 8, 7 };
    m = (proto_msg){ .hdr = { .type = PROTO_WINSTATE, .req_id = 2 }, .u.winstate = { .key = { 1, 2, 3 }, .n_bytes = 16, .data = state } };
    proto_seed(&b, "winfetch-winstate", &m);   /* a fetch and its answer */
    b.len = 0;
    m = (proto_msg){ .hdr = { .type = PROTO_WINSTATE, .req_id = 3 }, .u.winstate = { .key = { 5 } } };
    proto_seed(&b, "winstate-empty", &m);
    bytebuf_free(&b);
}

static void block_seeds(void)
{
    uint8_t key[32], fp[32];
    for (int i = 0; i < 32; i++) key[i] = (uint8_t)i, fp[i] = (uint8_t)(255 - i);
    block_header h;
    block_header_init(&h, key, fp, QTYPE_F16, 2 * 2, 1, 1, 2, 2);
    uint8_t *file = block_alloc(&h);
    for (size_t i = 0; i < h.payload_bytes; i++) ((uint8_t *)block_payload(file))[i] = (uint8_t)i;
    block_seal(&h, file);
    size_t n = block_file_bytes(&h);
    uint8_t *seed = xmalloc(n + 1);
    memcpy(seed + 1, file, n);
    seed[0] = 0;
    put("block", "sealed", seed, n + 1);
    seed[0] = 1;
    put("block", "sealed-reseal", seed, n + 1);
    put("block", "header-only", seed, BLOCK_HEADER_BYTES + 1);
    free(seed);
    free(file);
}

/* Records of fuzz_template.c: 0xFF between records, 0xFE between fields. */
static void template_seeds(void)
{
    static const char conv[] =
        "\x05get_weather\xfe" "Current weather\xfe{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\"}}}\xff"
        "\x00\x00\xff\x01You are brief.\xff"
        "\x00\x02\xff\x01What is the weather in Paris?\xff"
        "\x00\x03\xff\x02The user wants the weather.\xff\x03get_weather\xfe{\"city\":\"Paris\"}\xff"
        "\x00\x04\xff\x04{\"temp\":21}\xff"
        "\x00\x03\xff\x01It is 21 degrees.\xff"
        "\x00\x02\xff\x01Thanks! <|im_end|> </think>";
    for (int fam = 0; fam < 8; fam++) {
        char name[32], buf[sizeof conv + 2];
        buf[0] = (char)fam;
        buf[1] = 1;
        memcpy(buf + 2, conv, sizeof conv - 1);
        snprintf(name, sizeof name, "tools-%d", fam);
        put("template", name, buf, sizeof conv + 1);
    }
}

int main(void)
{
    mkdir("build", 0755);
    mkdir("build/fuzz", 0755);
    mkdir(CORPUS, 0755);
    gguf_seeds();
    proto_seeds();
    block_seeds();
    template_seeds();
    return 0;
}
