/*
 * test_model: loading llama / qwen2 / qwen3 (and bert) GGUF files: hyper-parameters, tied output, and
 * a clear error (right status, tensor or key named) for every missing tensor, wrong shape,
 * unsupported architecture and missing key; the fingerprint tells models apart, down to one
 * byte in the middle of the embedding, and its cache never vouches for a changed file.
 */
#include "harness.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/blockkey.h"
#include "model/model.h"
#include "model/modelhash.h"
#include "tinymodel.h"

static char tmpdir[] = "/tmp/tm_test_model_XXXXXX";

static tiny_cfg base(const char *arch)
{
    return (tiny_cfg){ .arch = arch, .dim = 64, .n_layers = 2, .n_heads = 4, .n_kv_heads = 2,
                       .head_dim = 16, .ffn = 96, .vocab = 100, .seed = 1 };
}

static gguf_status load(const tiny_cfg *c, model **m, char *err, size_t errsz)
{
    char path[256];
    snprintf(path, sizeof path, "%s/m.gguf", tmpdir);
    if (tiny_write(c, path)) return GGUF_ERR_IO;
    return model_load(path, NULL, m, err, errsz);
}

TEST(test_load_archs)
{
    const char *archs[] = { "llama", "qwen2", "qwen3" };
    for (int i = 0; i < 3; i++) {
        tiny_cfg c = base(archs[i]);
        model *m = NULL;
        char err[256];
        gguf_status st = load(&c, &m, err, sizeof err);
        CHECKF(st == GGUF_OK, "%s: %s", archs[i], err);
        if (!m) continue;
        CHECK(m->hp.dim == 64 && m->hp.n_layers == 2 && m->hp.n_heads == 4 && m->hp.n_kv_heads == 2);
        CHECK(m->hp.head_dim == 16 && m->hp.ffn_dim == 96 && m->hp.n_vocab == 100 && m->hp.n_rot == 16);
        CHECK(m->hp.rope_neox == (i > 0));
        CHECK(fabsf(m->hp.rms_eps - 1e-6f) < 1e-9f);
        CHECK((m->layers[0].bq != NULL) == (i == 1));
        CHECK((m->layers[1].q_norm != NULL) == (i == 2));
        CHECK(!m->tied_output && m->output.data != m->tok_embd.data);
        CHECK(fabsf(m->hp.rope_inv_freq[1] - powf(10000.0f, -2.0f / 16)) < 1e-6f);
        CHECK(m->hp.rope_freq_factors == NULL);
        model_free(m);
    }
}

TEST(test_tied_output)
{
    tiny_cfg c = base("qwen3");
    c.tied = true;
    model *m = NULL;
    char err[256];
    CHECK(load(&c, &m, err, sizeof err) == GGUF_OK);
    if (m) CHECK(m->tied_output && m->output.data == m->tok_embd.data);
    model_free(m);
}

/* Q8_0 / Q4_0 / MXFP4 / Q4_K / Q6_K matrices with rows a multiple of 16 are repacked at load on AVX-512 (not
 * with no_repack, nor others); a repacked matrix multiplies to the same bits as the file's, at
 * the scalar level and at the active one (which is bit-identical to scalar for these layouts). */
TEST(test_repacked_weights)
{
    static const qtype ts[] = { QTYPE_Q4_K, QTYPE_Q6_K, QTYPE_Q8_0, QTYPE_Q4_0, QTYPE_MXFP4 };
    for (int ti = 0; ti < 5; ti++) {
        tiny_cfg c = { .arch = "qwen3", .dim = 256, .n_layers = 1, .n_heads = 4, .n_kv_heads = 2,
                       .head_dim = 64, .ffn = 256, .vocab = 136, .seed = 3, .wtype = ts[ti] };
        char path[256], err[256];
        snprintf(path, sizeof path, "%s/r.gguf", tmpdir);
        CHECK(tiny_write(&c, path) == 0);
        model *m = NULL, *f = NULL;
        model_opts keep = { .no_repack = true };
        CHECKF(model_load(path, NULL, &m, err, sizeof err) == GGUF_OK, "%s", err);
        CHECKF(model_load(path, &keep, &f, err, sizeof err) == GGUF_OK, "%s", err);
        if (!m || !f) continue;
        qtype rt = quant_repack_type(ts[ti]);
        bool want = ops_get_level() == CPU_LEVEL_AVX512 && !getenv("TOKENMILL_REPACK");
        CHECK(m->layers[0].wq.type == (want ? rt : ts[ti]));
        CHECK(m->layers[0].down.type == (want ? rt : ts[ti]));
        CHECK(m->output.type == ts[ti]); /* 136 rows: not a multiple of 16 */
        CHECK(f->layers[0].wq.type == ts[ti] && f->repacked == NULL);
        CHECK((m->repacked != NULL) == want);
        CHECK(m->tok_embd.type == QTYPE_F32);
        float x[2 * 256], y0[2 * 256], y1[2 * 256];
        for (int i = 0; i < 2 * 256; i++) x[i] = sinf(0.37f * (float)i);
        void *scratch = malloc(ops_matmul_scratch_bytes(ts[ti], 256, 2));
        cpu_level lvl = ops_get_level();
        ops_force_level(CPU_LEVEL_SCALAR);
        ops_matmul(NULL, &f->layers[0].wq, x, 2, y0, scratch);
        ops_matmul(NULL, &m->layers[0].wq, x, 2, y1, scratch);
        CHECK(!memcmp(y0, y1, sizeof y0));
        ops_force_level(lvl);
        ops_matmul(NULL, &m->layers[0].wq, x, 2, y1, scratch);
        if (want) CHECK(!memcmp(y0, y1, sizeof y0));
        free(scratch);
        model_free(m);
        model_free(f);
    }
}

TEST(test_missing_tensors)
{
    const char *names[][2] = {
        { "llama", "blk.1.attn_k.weight" }, { "llama", "output_norm.weight" },
        { "llama", "token_embd.weight" }, { "llama", "blk.0.ffn_down.weight" },
        { "qwen2", "blk.0.attn_v.bias" }, { "qwen3", "blk.1.attn_k_norm.weight" },
    };
    for (size_t i = 0; i < TM_ARRAY_LEN(names); i++) {
        tiny_cfg c = base(names[i][0]);
        c.skip = names[i][1];
        model *m = (model *)1;
        char err[256] = "";
        gguf_status st = load(&c, &m, err, sizeof err);
        CHECKF(st == GGUF_ERR_MISSING && m == NULL, "%s: status %d", names[i][1], st);
        CHECKF(strstr(err, names[i][1]) != NULL, "message '%s' does not name %s", err, names[i][1]);
    }
}

TEST(test_bad_shapes)
{
    const char *names[] = { "blk.0.attn_q.weight", "blk.1.ffn_gate.weight", "output.weight",
                            "blk.0.attn_output.weight" };
    for (size_t i = 0; i < TM_ARRAY_LEN(names); i++) {
        tiny_cfg c = base("llama");
        c.bad_shape = names[i];
        model *m = (model *)1;
        char err[256] = "";
        gguf_status st = load(&c, &m, err, sizeof err);
        CHECKF(st == GGUF_ERR_SHAPE && m == NULL, "%s: status %d (%s)", names[i], st, err);
        CHECKF(strstr(err, names[i]) != NULL, "message '%s' does not name %s", err, names[i]);
    }
}

/* bert / nomic-bert (model_bert.c): a decoder's tensors under an encoder's name are refused
 * naming the first encoder tensor missing, and a causal bert is refused before any tensor. */
TEST(test_bert_errors)
{
    model *m = (model *)1;
    char err[256] = "", path[256];
    tiny_cfg c = base("bert");
    CHECK(load(&c, &m, err, sizeof err) == GGUF_ERR_MISSING && m == NULL);
    CHECKF(strstr(err, "position_embd.weight") != NULL, "%s", err);
    c = base("nomic-bert");   /* RoPE: no position table, but the embedding's LayerNorm */
    CHECK(load(&c, &m, err, sizeof err) == GGUF_ERR_MISSING && m == NULL);
    CHECKF(strstr(err, "token_embd_norm.weight") != NULL, "%s", err);
    snprintf(path, sizeof path, "%s/causal.gguf", tmpdir);
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "bert");
    gguf_writer_set_u32(w, "bert.embedding_length", 64);
    gguf_writer_set_u32(w, "bert.block_count", 1);
    gguf_writer_set_u32(w, "bert.attention.head_count", 4);
    gguf_writer_set_u32(w, "bert.feed_forward_length", 96);
    gguf_writer_set_bool(w, "bert.attention.causal", true);
    CHECK(gguf_writer_write(w, path, err, sizeof err) == GGUF_OK);
    gguf_writer_free(w);
    CHECK(model_load(path, NULL, &m, err, sizeof err) == GGUF_ERR_FORMAT && m == NULL);
    CHECKF(strstr(err, "bert.attention.causal") != NULL, "%s", err);
}

TEST(test_bad_arch_and_keys)
{
    tiny_cfg c = base("gptj");
    model *m = (model *)1;
    char err[256] = "";
    CHECK(load(&c, &m, err, sizeof err) == GGUF_ERR_TYPE && m == NULL);
    CHECKF(strstr(err, "gptj") != NULL, "%s", err);
    /* families not in the engine yet are refused by name, before any key or tensor */
    static const char *const later[] = { "nomic-bert-moe" };
    for (size_t i = 0; i < sizeof later / sizeof later[0]; i++) {
        tiny_cfg cl = base(later[i]);
        CHECK(load(&cl, &m, err, sizeof err) == GGUF_ERR_TYPE && m == NULL);
        CHECKF(strstr(err, later[i]) != NULL && strstr(err, "not supported yet") != NULL, "%s", err);
    }
    /* glm4moe and mistral4 are read: a llama file under their names lacks their expert keys */
    static const char *const moe_named[] = { "glm4moe", "mistral4" };
    for (size_t i = 0; i < sizeof moe_named / sizeof moe_named[0]; i++) {
        tiny_cfg cm = base(moe_named[i]);
        CHECK(load(&cm, &m, err, sizeof err) == GGUF_ERR_MISSING && m == NULL);
        CHECKF(strstr(err, moe_named[i]) != NULL && strstr(err, "expert_count") != NULL, "%s", err);
    }
    /* gemma3 is read: llama's tensors lack its head norms, and the error names the first */
    tiny_cfg cg = base("gemma3");
    CHECK(load(&cg, &m, err, sizeof err) == GGUF_ERR_MISSING && m == NULL);
    CHECKF(strstr(err, "blk.0.attn_q_norm.weight") != NULL, "%s", err);

    /* gemma4 is read; a bad key of its experts, per-layer embeddings or shared KV layers is
     * refused naming it (the tensors' refusals: oracle_arch.test.mjs) */
    static const struct { const char *key; uint32_t v; const char *want; } g4[] = {
        { "gemma4.embedding_length_per_layer_input", 1u << 20, "gemma4.embedding_length_per_layer_input" },
        { "gemma4.attention.shared_kv_layers", 1, "gemma4.attention.shared_kv_layers" },   /* 2 layers: at most 0 */
        { "gemma4.expert_count", 8, "gemma4.expert_used_count" },                          /* absent */
        { "gemma4.expert_count", MODEL_MAX_EXPERTS + 1, "expert_count 1025" },
        { NULL, 0, "gemma4.attention.sliding_window" },
    };
    char path[256];
    snprintf(path, sizeof path, "%s/g4.gguf", tmpdir);
    for (size_t i = 0; i < sizeof g4 / sizeof g4[0]; i++) {
        gguf_writer *w = gguf_writer_new();
        gguf_writer_set_str(w, "general.architecture", "gemma4");
        gguf_writer_set_u32(w, "gemma4.embedding_length", 64);
        gguf_writer_set_u32(w, "gemma4.block_count", 2);
        gguf_writer_set_u32(w, "gemma4.context_length", 256);
        gguf_writer_set_u32(w, "gemma4.feed_forward_length", 128);
        gguf_writer_set_u32(w, "gemma4.attention.head_count", 4);
        if (g4[i].key) gguf_writer_set_u32(w, g4[i].key, g4[i].v);
        if (g4[i].v == MODEL_MAX_EXPERTS + 1) {   /* too many experts: refused by their keys' check */
            gguf_writer_set_u32(w, "gemma4.expert_used_count", 2);
            gguf_writer_set_u32(w, "gemma4.expert_feed_forward_length", 64);
        }
        CHECK(gguf_writer_write(w, path, err, sizeof err) == GGUF_OK);
        gguf_writer_free(w);
        CHECK(model_load(path, NULL, &m, err, sizeof err) != GGUF_OK && m == NULL);
        CHECKF(strstr(err, g4[i].want) != NULL, "%s", err);
    }

    /* a file without general.architecture */
    snprintf(path, sizeof path, "%s/empty.gguf", tmpdir);
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_u32(w, "llama.block_count", 1);
    CHECK(gguf_writer_write(w, path, err, sizeof err) == GGUF_OK);
    gguf_writer_free(w);
    CHECK(model_load(path, NULL, &m, err, sizeof err) == GGUF_ERR_MISSING);
    CHECKF(strstr(err, "general.architecture") != NULL, "%s", err);

    /* missing hyper-parameter */
    w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "qwen2");
    gguf_writer_set_u32(w, "qwen2.embedding_length", 64);
    CHECK(gguf_writer_write(w, path, err, sizeof err) == GGUF_OK);
    gguf_writer_free(w);
    CHECK(model_load(path, NULL, &m, err, sizeof err) == GGUF_ERR_MISSING);
    CHECKF(strstr(err, "qwen2.block_count") != NULL, "%s", err);

    /* not a file at all */
    CHECK(model_load("/nonexistent/x.gguf", NULL, &m, err, sizeof err) == GGUF_ERR_IO && m == NULL);
}

TEST(test_fingerprint)
{
    tiny_cfg c = base("llama");
    model *a = NULL, *b = NULL, *d = NULL;
    char err[256];
    CHECK(load(&c, &a, err, sizeof err) == GGUF_OK);
    CHECK(load(&c, &b, err, sizeof err) == GGUF_OK);
    c.seed = 2;  /* same shapes, different weights */
    CHECK(load(&c, &d, err, sizeof err) == GGUF_OK);
    if (a && b && d) {
        CHECK(!memcmp(a->fingerprint, b->fingerprint, 32));
        CHECK(memcmp(a->fingerprint, d->fingerprint, 32) != 0);
        CHECK(strlen(a->fingerprint_hex) == 64);
    }
    model_free(a);
    model_free(b);
    model_free(d);
}

/* Writes src's bytes to dst with the byte at off flipped (off < 0: unchanged). In place when
 * dst exists (same inode). Returns 0 on success. */
static int copy_flip(const char *src, const char *dst, long off)
{
    size_t n = 0;
    char *d = util_read_file(src, &n);
    if (!d) return -1;
    if (off >= 0 && (size_t)off < n) d[off] ^= 0x40;
    int fd = open(dst, O_WRONLY | O_CREAT, 0600);
    int rc = fd >= 0 && write(fd, d, n) == (ssize_t)n ? 0 : -1;
    if (fd >= 0) close(fd);
    free(d);
    return rc;
}

/* Two models identical but for one embedding row in the middle of the tensor (away from its
 * first, middle and last 4 KiB) must have different fingerprints, so different block keys. */
TEST(test_fingerprint_every_byte)
{
    tiny_cfg c = base("qwen3");
    char pa[256], pb[256], err[256];
    snprintf(pa, sizeof pa, "%s/a.gguf", tmpdir);
    snprintf(pb, sizeof pb, "%s/b.gguf", tmpdir);
    CHECK(tiny_write(&c, pa) == 0);
    model *a = NULL, *b = NULL, *b2 = NULL;
    CHECKF(model_load(pa, NULL, &a, err, sizeof err) == GGUF_OK, "%s", err);
    if (!a) return;
    const gguf_tensor *t = gguf_find_tensor(a->g, "token_embd.weight");
    CHECK(t != NULL);
    if (!t) return;
    size_t embd_off = (size_t)((const uint8_t *)t->data - (const uint8_t *)gguf_file_map(a->g));
    size_t row_bytes = t->nbytes / (size_t)a->hp.n_vocab;
    CHECKF(t->nbytes > 3 * 4096, "embedding of %zu bytes is too small for the case", t->nbytes);
    size_t row = (4096 + t->nbytes / 2) / 2 / row_bytes;  /* between the first and middle 4 KiB */
    long off = (long)(embd_off + row * row_bytes + 5);
    CHECK(copy_flip(pa, pb, off) == 0);
    CHECKF(model_load(pb, NULL, &b, err, sizeof err) == GGUF_OK, "%s", err);
    if (b) {
        CHECK(memcmp(a->fingerprint, b->fingerprint, 32) != 0);
        uint8_t fa[32], fb[32];
        blockkey_pool_fp(a->fingerprint, QTYPE_F32, fa);
        blockkey_pool_fp(b->fingerprint, QTYPE_F32, fb);
        CHECK(memcmp(fa, fb, 32) != 0);
    }
    /* the same bytes in another file fingerprint the same */
    CHECK(copy_flip(pa, pb, -1) == 0);
    CHECKF(model_load(pb, NULL, &b2, err, sizeof err) == GGUF_OK, "%s", err);
    if (b2) CHECK(!memcmp(a->fingerprint, b2->fingerprint, 32));
    model_free(a);
    model_free(b);
    model_free(b2);
}

/* The digest cache: a settled file's digest is kept and reused; an entry is never trusted for
 * a file changed since (same size, mtime put back), nor when it is damaged. */
TEST(test_fingerprint_cache)
{
    tiny_cfg c = base("llama");
    char p[256], err[256], dir[256];
    snprintf(p, sizeof p, "%s/c.gguf", tmpdir);
    CHECK(tiny_write(&c, p) == 0);
    usleep(50 * 1000);  /* let the file's ctime fall before the hash starts (one clock tick) */
    model *m1 = NULL, *m2 = NULL, *m3 = NULL, *m4 = NULL;
    model_opts fresh = { .no_fingerprint_cache = true };
    CHECKF(model_load(p, NULL, &m1, err, sizeof err) == GGUF_OK, "%s", err);
    if (!m1) return;
    struct stat st;
    CHECK(stat(p, &st) == 0);
    CHECK(modelhash_cache_dir(dir, sizeof dir));
    char entry[600];
    snprintf(entry, sizeof entry, "%s/fp/%llx-%llx", dir, (unsigned long long)st.st_dev, (unsigned long long)st.st_ino);
    struct stat es;
    CHECKF(stat(entry, &es) == 0 && (es.st_mode & 077) == 0, "no private cache entry %s", entry);
    CHECKF(model_load(p, NULL, &m2, err, sizeof err) == GGUF_OK, "%s", err);
    if (m2) CHECK(!memcmp(m1->fingerprint, m2->fingerprint, 32));

    /* rewrite one middle embedding byte in place, then put the times back */
    const gguf_tensor *t = gguf_find_tensor(m1->g, "token_embd.weight");
    CHECK(t != NULL);
    if (!t) return;
    long off = (long)((size_t)((const uint8_t *)t->data - (const uint8_t *)gguf_file_map(m1->g)) + t->nbytes / 3);
    CHECK(copy_flip(p, p, off) == 0);
    struct timespec times[2] = { st.st_atim, st.st_mtim };
    CHECK(utimensat(AT_FDCWD, p, times, 0) == 0);
    CHECKF(model_load(p, NULL, &m3, err, sizeof err) == GGUF_OK, "%s", err);
    if (m3) CHECK(memcmp(m1->fingerprint, m3->fingerprint, 32) != 0);

    /* a damaged entry is ignored */
    FILE *f = fopen(entry, "w");
    if (f) {
        fputs("tokenmill-modelhash-v1 garbage\n", f);
        fclose(f);
    }
    CHECKF(model_load(p, NULL, &m4, err, sizeof err) == GGUF_OK, "%s", err);
    model *ref = NULL;
    CHECKF(model_load(p, &fresh, &ref, err, sizeof err) == GGUF_OK, "%s", err);
    if (m3 && m4 && ref) CHECK(!memcmp(m4->fingerprint, ref->fingerprint, 32) && !memcmp(m3->fingerprint, ref->fingerprint, 32));
    model_free(m1);
    model_free(m2);
    model_free(m3);
    model_free(m4);
    model_free(ref);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) return 1;
    char cache[300];
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
    setenv("TOKENMILL_CACHE_DIR", cache, 1);
    RUN(test_load_archs);
    RUN(test_tied_output);
    RUN(test_repacked_weights);
    RUN(test_missing_tensors);
    RUN(test_bad_shapes);
    RUN(test_bert_errors);
    RUN(test_bad_arch_and_keys);
    RUN(test_fingerprint);
    RUN(test_fingerprint_every_byte);
    RUN(test_fingerprint_cache);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) return 1;
    HARNESS_END();
}
