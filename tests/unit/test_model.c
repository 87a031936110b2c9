/*
 * test_model: loading llama / qwen2 / qwen3 GGUF files: hyper-parameters, tied output, and
 * a clear error (right status, tensor or key named) for every missing tensor, wrong shape,
 * unsupported architecture and missing key; the fingerprint tells models apart.
 */
#include "harness.h"

#include <unistd.h>

#include "model/model.h"
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

TEST(test_bad_arch_and_keys)
{
    tiny_cfg c = base("gptj");
    model *m = (model *)1;
    char err[256] = "";
    CHECK(load(&c, &m, err, sizeof err) == GGUF_ERR_TYPE && m == NULL);
    CHECKF(strstr(err, "gptj") != NULL, "%s", err);

    /* a file without general.architecture */
    char path[256];
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

int main(void)
{
    if (!mkdtemp(tmpdir)) return 1;
    RUN(test_load_archs);
    RUN(test_tied_output);
    RUN(test_missing_tensors);
    RUN(test_bad_shapes);
    RUN(test_bad_arch_and_keys);
    RUN(test_fingerprint);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) return 1;
    HARNESS_END();
}
