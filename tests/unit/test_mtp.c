/*
 * test_mtp: multi-token prediction layers (DeepSeek-V3's MTP, llama.cpp's "nextn" layers) on a
 * tiny deepseek2 file from mkmodel --nextn 1: the model loads them apart and computes the same
 * logits as the file without them; the MTP forward (engine_forward over model_mtp_view) equals
 * a reference that builds the layer input eh_proj([enorm(e); hnorm(h)]) by hand (double) and
 * runs the MTP block as an ordinary one-layer model whose embedding rows are those inputs; and
 * specdraft's MTP drafts are the argmax of that forward, chained on the layer's own hidden state;
 * broken MTP blocks are refused with a message, and mkmodel --nextn on another architecture.
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli/cmd.h"
#include "engine/engine.h"
#include "engine/sched.h"
#include "engine/specdraft.h"
#include "model/model.h"
#include "model/ops.h"
#include "util/util.h"

static char tmpdir[] = "/tmp/tm_test_mtp_XXXXXX";
static char plain_path[256], mtp_path[256];

#define T 12      /* MTP entries checked */

/* A V3-like deepseek2 in small: q-LoRA, a dense layer then MoE with a shared expert and the
 * sigmoid router with groups; f32 so that the reference's arithmetic is plain. */
static bool mtp_write(const char *path, bool nextn)
{
    char *argv[] = { "mkmodel", "--arch", "deepseek2", "--layers", "2", "--dim", "64", "--ffn", "128", "--heads", "2",
                     "--q-lora", "32", "--kv-lora", "32", "--nope-dim", "16", "--rope-dim", "16", "--v-dim", "16",
                     "--experts", "4", "--experts-used", "2", "--expert-ffn", "32", "--shared-experts", "1",
                     "--dense-layers", "1", "--router", "sigmoid", "--expert-groups", "2", "--groups-used", "1",
                     "--vocab-size", "300", "--untied", "--type", "f32", "--seed", "5", "--threads", "1", "-o",
                     (char *)path, nextn ? "--nextn" : NULL, "1", NULL };
    int argc = 0;
    while (argv[argc]) argc++;
    return cmd_mkmodel(argc, argv) == 0;
}

static const int32_t toks[T + 1] = { 1, 17, 42, 99, 5, 250, 7, 7, 61, 130, 8, 201, 33 };

TEST(test_load_apart)
{
    char err[256];
    model *a = NULL, *b = NULL;
    CHECKF(model_load(plain_path, NULL, &a, err, sizeof err) == GGUF_OK, "%s", err);
    CHECKF(model_load(mtp_path, NULL, &b, err, sizeof err) == GGUF_OK, "%s", err);
    if (!a || !b) goto out;
    CHECK(a->hp.n_layers == 2 && a->hp.n_nextn == 0 && !a->mtp);
    CHECK(b->hp.n_layers == 2 && b->hp.n_nextn == 1 && b->mtp == b->layers + 2);
    const model_layer *L = &b->mtp[0];
    CHECK(L->eh_proj.rows == 64 && L->eh_proj.cols == 128 && L->enorm && L->hnorm && L->head_norm);
    CHECK(L->embed.rows == 300 && L->head.rows == 300 && L->gate_inp.data && L->gate_shexp.data && L->wq_a.data);
    /* the model's logits: those of the file without the MTP layer, bit for bit */
    float la[T * 300], lb[T * 300];
    model *ms[2] = { a, b };
    float *out[2] = { la, lb };
    for (int k = 0; k < 2; k++) {
        engine_opts o = { .n_threads = 2, .n_kv_blocks = 2, .max_batch_tokens = 32 };
        engine *e = NULL;
        CHECK(engine_new(ms[k], &o, &e, err, sizeof err) == ENGINE_OK);
        if (!e) goto out;
        kvpool_seq *s = kvpool_seq_new(engine_kvpool(e));
        engine_tok bt[T];
        for (int i = 0; i < T; i++) bt[i] = (engine_tok){ toks[i], i, s, true };
        engine_batch bb = { T, bt };
        CHECK(engine_step(e, &bb, out[k]) == ENGINE_OK);
        CHECK(engine_forward(e, &bb, la, out[k]) == ENGINE_ERR_ARG);   /* not an MTP view */
        kvpool_seq_free(engine_kvpool(e), s);
        engine_free(e);
    }
    CHECK(!memcmp(la, lb, sizeof la));
out:
    model_free(a);
    model_free(b);
}

/* rmsnorm(x) * w in double, into out (n). */
static void ref_norm(const float *x, const float *w, int n, float eps, double *out)
{
    double ss = 0;
    for (int i = 0; i < n; i++) ss += (double)x[i] * x[i];
    double sc = 1.0 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++) out[i] = x[i] * sc * w[i];
}

static int argmax(const float *l, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

TEST(test_forward_and_drafts)
{
    char err[256];
    model *m = NULL;
    CHECKF(model_load(mtp_path, NULL, &m, err, sizeof err) == GGUF_OK, "%s", err);
    if (!m) return;
    const int dim = m->hp.dim, V = m->hp.n_vocab;
    engine_opts o = { .n_threads = 2, .kv_type = ENGINE_KV_F32, .n_kv_blocks = 4, .max_batch_tokens = 32 };
    /* the model's hidden states h_0..h_{T-1}: h_j predicted toks[j + 1] */
    static float h[(T + 1) * 64], lg[(T + 1) * 300];
    engine *e = NULL;
    CHECK(engine_new(m, &o, &e, err, sizeof err) == ENGINE_OK);
    if (!e) goto out;
    kvpool_seq *s = kvpool_seq_new(engine_kvpool(e));
    engine_tok bt[T + 1];
    for (int i = 0; i < T; i++) bt[i] = (engine_tok){ toks[i], i, s, false };
    engine_batch bb = { T, bt };
    CHECK(engine_step(e, &bb, NULL) == ENGINE_OK);
    /* what the MTP layer reads (and specdraft feeds it): the states after the model's output
     * norm; entry 0 has no state before it: zeros */
    static float hraw[T * 64];
    memcpy(hraw, engine_hidden(e), (size_t)T * dim * sizeof(float));
    memset(h, 0, sizeof h);
    for (int p = 0; p < T; p++)
        ops_rmsnorm(NULL, h + (size_t)(p + 1) * dim, hraw + (size_t)p * dim, m->output_norm, 1, dim, m->hp.rms_eps);
    kvpool_seq_free(engine_kvpool(e), s);
    engine_free(e);

    /* the MTP forward: entry p is toks[p] with h_{p-1} */
    model *view = xmalloc(sizeof *view);
    model_mtp_view(m, 0, view);
    CHECK(view->hp.n_layers == 1 && view->mtp_view && view->output.data == m->mtp[0].head.data);
    CHECK(memcmp(view->fingerprint, m->fingerprint, 32) != 0);
    engine *d = NULL;
    CHECK(engine_new(view, &o, &d, err, sizeof err) == ENGINE_OK);
    if (!d) goto out_view;
    kvpool_seq *ds = kvpool_seq_new(engine_kvpool(d));
    for (int i = 0; i <= T; i++) bt[i] = (engine_tok){ toks[i], i, ds, true };
    engine_batch db = { T + 1, bt };
    CHECK(engine_step(d, &db, lg) == ENGINE_ERR_ARG);   /* an MTP view needs hidden states */
    CHECK(engine_forward(d, &db, h, lg) == ENGINE_OK);
    static float hmtp[(T + 1) * 64];
    memcpy(hmtp, engine_hidden(d), sizeof hmtp);

    /* the reference: the layer input by hand, then the block as a plain one-layer model whose
     * embedding row p is that input */
    static float x0[(T + 1) * 64], want[(T + 1) * 300];
    const model_layer *L = &m->mtp[0];
    for (int p = 0; p <= T; p++) {
        float emb[64];
        double cat[128];
        model_embed_row(view, toks[p], emb);
        ref_norm(emb, L->enorm, dim, m->hp.rms_eps, cat);
        ref_norm(h + (size_t)p * dim, L->hnorm, dim, m->hp.rms_eps, cat + dim);
        const float *W = L->eh_proj.data;   /* f32 (dim, 2 dim) */
        for (int r = 0; r < dim; r++) {
            double acc = 0;
            for (int c = 0; c < 2 * dim; c++) acc += (double)W[(size_t)r * 2 * dim + c] * cat[c];
            x0[(size_t)p * dim + r] = (float)acc;
        }
    }
    model *ref = xmalloc(sizeof *ref);
    *ref = *view;
    ref->mtp_view = false;
    ref->tok_embd = (ops_weight){ QTYPE_F32, T + 1, dim, x0 };
    engine *re = NULL;
    CHECK(engine_new(ref, &o, &re, err, sizeof err) == ENGINE_OK);
    if (re) {
        kvpool_seq *rs = kvpool_seq_new(engine_kvpool(re));
        engine_tok rt[T + 1];
        for (int i = 0; i <= T; i++) rt[i] = (engine_tok){ i, i, rs, true };
        engine_batch rb = { T + 1, rt };
        CHECK(engine_step(re, &rb, want) == ENGINE_OK);
        float worst = 0, worst_h = 0;
        for (int i = 0; i < (T + 1) * V; i++) worst = fmaxf(worst, fabsf(want[i] - lg[i]));
        for (int i = 0; i < (T + 1) * dim; i++) worst_h = fmaxf(worst_h, fabsf(engine_hidden(re)[i] - hmtp[i]));
        CHECKF(worst < 2e-3f && worst_h < 2e-3f, "max |logit diff| %g, |hidden diff| %g", worst, worst_h);
        kvpool_seq_free(engine_kvpool(re), rs);
        engine_free(re);
    }
    free(ref);

    /* the chained entry: toks[T + 1] would be argmax(row T); the entry after continues the
     * layer's own hidden state of entry T */
    int32_t d1 = argmax(lg + (size_t)T * V, V);
    engine_tok ct = { d1, T + 1, ds, true };
    engine_batch cb = { 1, &ct };
    float lg2[300];
    float hc[64];   /* chained on the layer's state after its head norm, as llama.cpp does */
    ops_rmsnorm(NULL, hc, hmtp + (size_t)T * dim, view->output_norm, 1, dim, m->hp.rms_eps);
    CHECK(engine_forward(d, &cb, hc, lg2) == ENGINE_OK);
    int32_t d2 = argmax(lg2, V);
    kvpool_seq_free(engine_kvpool(d), ds);

    /* specdraft: the same drafts from the same states, its KV left at the entries computed
     * from the model's states */
    specdraft *sd = specdraft_new(d, 2);
    CHECK(sd && specdraft_is_mtp(sd));
    if (sd) {
        specdraft_seq q = { .seq = kvpool_seq_new(engine_kvpool(d)), .tokens = toks, .n_tokens = T + 1, .n_done = 0,
                            .k_max = 2, .hid = hraw, .hid_pos = 0, .n_hid = T };
        CHECK(specdraft_run(sd, &q, 1) == 2);
        CHECKF(q.n_draft == 2 && q.draft[0] == d1 && q.draft[1] == d2, "drafts %d: %d %d, want %d %d", q.n_draft,
               q.draft[0], q.draft[1], d1, d2);
        /* the same logits, not only the same argmax: the states went through the same norms */
        double s1 = 0, s2 = 0;
        for (int i = 0; i < V; i++) {
            s1 += exp((double)(lg[(size_t)T * V + i] - lg[(size_t)T * V + d1]));
            s2 += exp((double)(lg2[i] - lg2[d2]));
        }
        CHECKF(q.prob[0] == (float)(1.0 / s1) && q.prob[1] == (float)(1.0 / s2), "probs %.9g %.9g, want %.9g %.9g",
               q.prob[0], q.prob[1], 1.0 / s1, 1.0 / s2);
        CHECK(q.n_done == T + 1);
        kvpool_seq_free(engine_kvpool(d), q.seq);
        specdraft_free(sd);
    }
    engine_free(d);
out_view:
    free(view);
out:
    model_free(m);
}

/* An "echo" MTP file: a one-layer all-MoE model whose embedding rows have an RMS of 1, and an
 * MTP block that is a copy of its layer with eh_proj = [I 0], unit enorm/hnorm and the model's
 * head norm and head. MTP entry p (token t_p at position p) then computes what the model
 * computes at position p, up to rounding: its draft is the model's next token, so drafts are
 * accepted when positions, tokens and the drafter's KV line up. */
static bool mtp_write_echo(const char *src_path, const char *out)
{
    char err[256];
    gguf *g = NULL;
    if (gguf_open(src_path, &g, err, sizeof err) != GGUF_OK) return false;
    gguf_writer *w = gguf_writer_new();
    for (int k = 0; k < gguf_n_keys(g); k++) gguf_writer_copy_key(w, g, gguf_key_name(g, k));
    gguf_writer_set_u32(w, "deepseek2.block_count", 2);
    gguf_writer_set_u32(w, "deepseek2.nextn_predict_layers", 1);
    const gguf_tensor *te = gguf_find_tensor(g, "token_embd.weight"), *on = gguf_find_tensor(g, "output_norm.weight");
    const int64_t dim = te->ne[0], nv = te->ne[1];
    float *emb = xmalloc((size_t)(dim * nv) * sizeof(float));
    memcpy(emb, te->data, (size_t)(dim * nv) * sizeof(float));
    for (int64_t r = 0; r < nv; r++) {
        double ss = 0;
        for (int64_t i = 0; i < dim; i++) ss += (double)emb[r * dim + i] * emb[r * dim + i];
        float sc = (float)(1.0 / sqrt(ss / (double)dim));
        for (int64_t i = 0; i < dim; i++) emb[r * dim + i] *= sc;
    }
    float *eh = xcalloc((size_t)(2 * dim * dim), sizeof(float)), *ones = xmalloc((size_t)dim * sizeof(float));
    for (int64_t r = 0; r < dim; r++) eh[r * 2 * dim + r] = 1.0f, ones[r] = 1.0f;
    static char names[64][96];
    int nn = 0;
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        gguf_writer_add_tensor(w, t->name, t->type, t->n_dims, t->ne, t == te ? emb : t->data, t->nbytes);
        if (strncmp(t->name, "blk.0.", 6) || nn == 64) continue;
        snprintf(names[nn], sizeof names[nn], "blk.1.%s", t->name + 6);
        gguf_writer_add_tensor(w, names[nn++], t->type, t->n_dims, t->ne, t->data, t->nbytes);
    }
    const int64_t ne_eh[2] = { 2 * dim, dim }, ne_v[1] = { dim };
    gguf_writer_add_tensor(w, "blk.1.nextn.eh_proj.weight", QTYPE_F32, 2, ne_eh, eh, (size_t)(2 * dim * dim) * 4);
    gguf_writer_add_tensor(w, "blk.1.nextn.enorm.weight", QTYPE_F32, 1, ne_v, ones, (size_t)dim * 4);
    gguf_writer_add_tensor(w, "blk.1.nextn.hnorm.weight", QTYPE_F32, 1, ne_v, ones, (size_t)dim * 4);
    gguf_writer_add_tensor(w, "blk.1.nextn.shared_head_norm.weight", QTYPE_F32, 1, ne_v, on->data, on->nbytes);
    bool ok = gguf_writer_write(w, out, err, sizeof err) == GGUF_OK;
    gguf_writer_free(w);
    gguf_close(g);
    free(emb);
    free(eh);
    free(ones);
    return ok;
}

#define NREQ 3
#define GEN 40

/* NREQ greedy requests at once on m, with the MTP draft when d (its MTP engine) is given, and
 * a draft model's when dm is: 3 drafts verified each step (from the source each request
 * accepts best). */
static bool mtp_adaptive;   /* mtp_run: the adaptive draft count instead of 3 verified */

static void mtp_run(model *m, engine *d, engine *dm, int32_t out[NREQ][GEN], sched_stats *st)
{
    char err[256];
    engine_opts eo = { .n_threads = 2, .n_kv_blocks = 16, .max_batch_tokens = 64 };
    engine *e = NULL;
    CHECKF(engine_new(m, &eo, &e, err, sizeof err) == ENGINE_OK, "%s", err);
    if (!e) return;
    /* small steps: prompts are read in chunks, the drafter catching up on each */
    sched_opts so = { .max_seqs = NREQ, .max_queue = 8, .step_tokens = 24, .prefill_step_tokens = 24, .n_ctx = 256,
                      .spec_sources = (d ? SPEC_SRC_MTP : 0) | (dm ? SPEC_SRC_MODEL : 0), .spec_max = 3,
                      .spec_fixed = (d || dm) && !mtp_adaptive ? 3 : 0, .mtp = d, .draft = dm };
    for (int i = 0; i < 4; i++) so.eos_ids[i] = -1;
    sched *s = NULL;
    CHECK(sched_new(e, &so, &s) == SCHED_OK);
    static int32_t prompts[NREQ][64];
    sched_req *r[NREQ] = { 0 };
    for (int i = 0; i < NREQ && s; i++) {
        for (int k = 0; k < 30 + 9 * i; k++) prompts[i][k] = (int32_t)((i * 31 + k * 17 + k / 5) % 299 + 1);
        sched_params p = { .prompt = prompts[i], .n_prompt = 30 + 9 * i, .max_tokens = GEN };
        p.sample = sample_params_default();
        p.sample.temp = 0;
        p.think_start = p.think_end = -1;
        CHECK(sched_submit(s, &p, &r[i]) == SCHED_OK);
    }
    for (int i = 0; i < NREQ; i++) {
        int n = 0;
        sched_output o[16];
        while (r[i] && !sched_done(r[i])) {
            int k = sched_poll(r[i], o, 16, 30000);
            if (k == 0) break;
            for (int j = 0; j < k; j++)
                if (o[j].kind == SCHED_OUT_TOKEN && n < GEN) out[i][n++] = o[j].token;
        }
        CHECK(n == GEN);
        if (r[i]) sched_release(r[i]);
    }
    if (s) sched_get_stats(s, st);
    sched_free(s);
    engine_free(e);
}

/* The set-up of the scheduler tests on m: the output without drafts (want, its statistics
 * st0), then m's MTP layer as an engine of its own (*d, over view, which the caller frees after
 * *d). False when that engine cannot be made. */
static bool mtp_setup(model *m, model *view, int32_t want[NREQ][GEN], sched_stats *st0, engine **d)
{
    char err[256];
    memset(st0, 0, sizeof *st0);
    mtp_run(m, NULL, NULL, want, st0);
    model_mtp_view(m, 0, view);
    engine_opts eo = { .n_threads = 2, .n_kv_blocks = 16, .max_batch_tokens = 64 + NREQ };
    CHECKF(engine_new(view, &eo, d, err, sizeof err) == ENGINE_OK, "%s", err);
    return *d != NULL;
}

/* Through the scheduler, on the echo file: greedy output with MTP drafts (3 each, chained)
 * equals the output without, concurrent requests read in chunks, and nearly every draft is
 * accepted (the statistics /metrics shows): an entry at the wrong position or with the wrong
 * token is rejected. */
TEST(test_sched_echo)
{
    char src[300], echo[300], err[256];
    snprintf(src, sizeof src, "%s/one.gguf", tmpdir);
    snprintf(echo, sizeof echo, "%s/echo.gguf", tmpdir);
    char *argv[] = { "mkmodel", "--arch", "deepseek2", "--layers", "1", "--dim", "64", "--ffn", "128", "--heads", "2",
                     "--q-lora", "32", "--kv-lora", "32", "--nope-dim", "16", "--rope-dim", "16", "--v-dim", "16",
                     "--experts", "4", "--experts-used", "2", "--expert-ffn", "32", "--shared-experts", "1",
                     "--dense-layers", "0", "--router", "sigmoid", "--vocab-size", "300", "--untied", "--type", "f32",
                     "--seed", "9", "--threads", "1", "-o", src, NULL };
    CHECK(cmd_mkmodel((int)(sizeof argv / sizeof argv[0]) - 1, argv) == 0);
    CHECK(mtp_write_echo(src, echo));
    model *m = NULL;
    CHECKF(model_load(echo, NULL, &m, err, sizeof err) == GGUF_OK, "%s", err);
    unlink(src);
    unlink(echo);
    if (!m) return;
    CHECK(m->hp.n_layers == 1 && m->hp.n_nextn == 1);
    static int32_t want[NREQ][GEN], got[NREQ][GEN];
    sched_stats st0, st;
    memset(&st, 0, sizeof st);
    model *view = xmalloc(sizeof *view);
    engine *d = NULL;
    if (mtp_setup(m, view, want, &st0, &d)) {
        mtp_run(m, d, NULL, got, &st);
        CHECK(!memcmp(got, want, sizeof want));
        CHECKF(st.spec_verified > 40 && st.spec_accepted + 2 >= st.spec_verified && st.spec_k_hist[3] > 10,
               "drafted %llu verified %llu accepted %llu", (unsigned long long)st.spec_drafted,
               (unsigned long long)st.spec_verified, (unsigned long long)st.spec_accepted);
        CHECK(st0.spec_drafted == 0 && st.n_steps < st0.n_steps);
        CHECK(st.spec_src_drafted[2] == st.spec_drafted && st.spec_src_accepted[2] == st.spec_accepted);
        /* the MTP layer and a draft model together (a random model of the same vocabulary,
         * whose drafts the echo model hardly accepts): the output is the same and the requests
         * draft from the MTP layer (ranked before the draft model on a tie: it is cheaper) */
        char dpath[300];
        snprintf(dpath, sizeof dpath, "%s/draft.gguf", tmpdir);
        char *dargv[] = { "mkmodel", "--arch", "llama", "--layers", "1", "--dim", "32", "--ffn", "64", "--heads", "2",
                          "--vocab-size", "300", "--type", "f32", "--seed", "3", "--threads", "1", "-o", dpath, NULL };
        CHECK(cmd_mkmodel((int)(sizeof dargv / sizeof dargv[0]) - 1, dargv) == 0);
        model *poor = NULL;
        CHECKF(model_load(dpath, NULL, &poor, err, sizeof err) == GGUF_OK, "%s", err);
        unlink(dpath);
        engine *pe = NULL;
        engine_opts peo = { .n_threads = 1, .n_kv_blocks = 16, .max_batch_tokens = 64 };
        if (poor) CHECKF(engine_new(poor, &peo, &pe, err, sizeof err) == ENGINE_OK, "%s", err);
        if (pe) {
            memset(&st, 0, sizeof st);
            mtp_run(m, d, pe, got, &st);
            CHECK(!memcmp(got, want, sizeof want));
            CHECKF(st.spec_src_accepted[2] > 20 && st.spec_src_drafted[1] == 0 && st.spec_src_verified[1] == 0,
                   "MTP drafted %llu accepted %llu; draft model drafted %llu accepted %llu",
                   (unsigned long long)st.spec_src_drafted[2], (unsigned long long)st.spec_src_accepted[2],
                   (unsigned long long)st.spec_src_drafted[1], (unsigned long long)st.spec_src_accepted[1]);
            CHECK(st.n_steps < st0.n_steps);
            engine_free(pe);
        }
        model_free(poor);
        engine_free(d);
    }
    free(view);
    model_free(m);
}

/* The MTP layer and a draft model together, the other way round: on the random MTP file the
 * MTP layer's drafts are hardly ever accepted and the draft model (the same weights without the
 * MTP layer, so every draft but a near-tie is right) is good. Each request tries the MTP layer
 * first (the cheaper on a tie), then drafts from the draft model once the MTP layer's rate has
 * fallen below it; the output is the same as without speculation. */
TEST(test_mtp_and_draft_model)
{
    char err[256];
    model *m = NULL, *plain = NULL;
    CHECKF(model_load(mtp_path, NULL, &m, err, sizeof err) == GGUF_OK, "%s", err);
    CHECKF(model_load(plain_path, NULL, &plain, err, sizeof err) == GGUF_OK, "%s", err);
    model *view = xmalloc(sizeof *view);
    engine *d = NULL, *pe = NULL;
    if (!m || !plain) goto out;
    static int32_t want[NREQ][GEN], got[NREQ][GEN];
    sched_stats st0, st;
    memset(&st, 0, sizeof st);
    if (!mtp_setup(m, view, want, &st0, &d)) goto out;
    engine_opts peo = { .n_threads = 2, .n_kv_blocks = 16, .max_batch_tokens = 64 };
    CHECKF(engine_new(plain, &peo, &pe, err, sizeof err) == ENGINE_OK, "%s", err);
    if (!pe) goto out;
    mtp_run(m, d, pe, got, &st);
    CHECK(!memcmp(got, want, sizeof want));
    CHECKF(st.spec_src_drafted[2] >= NREQ && st.spec_src_accepted[1] > 40 &&
           st.spec_src_drafted[1] > 4 * st.spec_src_drafted[2] && st.spec_src_drafted[0] == 0,
           "MTP drafted %llu accepted %llu; draft model drafted %llu accepted %llu",
           (unsigned long long)st.spec_src_drafted[2], (unsigned long long)st.spec_src_accepted[2],
           (unsigned long long)st.spec_src_drafted[1], (unsigned long long)st.spec_src_accepted[1]);
    CHECK(st.spec_src_drafted[1] + st.spec_src_drafted[2] == st.spec_drafted);
    CHECK(st.n_steps < st0.n_steps);
out:
    engine_free(pe);
    engine_free(d);
    free(view);
    model_free(plain);
    model_free(m);
}

/* Adaptive speculation on the random MTP file (drafts never accepted): the output equals the
 * output without, and once adaptive stops drafting with the layer it stops running it for
 * those requests: its KV advances over far fewer positions than verifying 3 every step, which
 * follows every position. */
TEST(test_mtp_skip_when_not_drafting)
{
    char err[256];
    model *m = NULL;
    CHECKF(model_load(mtp_path, NULL, &m, err, sizeof err) == GGUF_OK, "%s", err);
    model *view = xmalloc(sizeof *view);
    engine *d = NULL;
    if (!m) goto out;
    static int32_t want[NREQ][GEN], got[NREQ][GEN], fixed[NREQ][GEN];
    sched_stats st0, st, stf;
    memset(&st, 0, sizeof st);
    memset(&stf, 0, sizeof stf);
    if (!mtp_setup(m, view, want, &st0, &d)) goto out;
    mtp_run(m, d, NULL, fixed, &stf);
    mtp_adaptive = true;
    mtp_run(m, d, NULL, got, &st);
    mtp_adaptive = false;
    CHECK(!memcmp(fixed, want, sizeof want));
    CHECK(!memcmp(got, want, sizeof want));
    printf("  MTP positions caught up: verify 3 %llu, adaptive %llu (drafted %llu, accepted %llu)\n",
           (unsigned long long)stf.spec_src_caught_up[2], (unsigned long long)st.spec_src_caught_up[2],
           (unsigned long long)st.spec_src_drafted[2], (unsigned long long)st.spec_src_accepted[2]);
    CHECK(stf.spec_src_caught_up[2] >= (uint64_t)NREQ * GEN);
    /* at most the prompts (30 + 39 + 48 positions: skipped too when the layer's prior does not
     * pay for its step) and, of the NREQ * GEN generated positions, those up to adaptive's
     * giving up and a probe's catch-up */
    CHECKF(st.spec_src_caught_up[2] < 117 + NREQ * GEN / 2, "adaptive caught up %llu of verify-3's %llu",
           (unsigned long long)st.spec_src_caught_up[2], (unsigned long long)stf.spec_src_caught_up[2]);
out:
    engine_free(d);
    free(view);
    model_free(m);
}

/* Writes a copy of the MTP file with the bytes after the first occurrence of what patched (at
 * offset at from it, n bytes): a broken file of the same layout. */
static bool mtp_patch(const char *out, const char *what, size_t at, const void *bytes, size_t n)
{
    FILE *f = fopen(mtp_path, "rb");
    if (!f) return false;
    static char buf[4 << 20];
    size_t len = fread(buf, 1, sizeof buf, f);
    fclose(f);
    size_t wl = strlen(what);
    char *p = NULL;
    for (size_t i = 0; !p && i + wl <= len; i++)
        if (!memcmp(buf + i, what, wl)) p = buf + i;
    if (!p || p + at + n > buf + len) return false;
    memcpy(p + at, bytes, n);
    f = fopen(out, "wb");
    if (!f) return false;
    bool ok = fwrite(buf, 1, len, f) == len;
    return fclose(f) == 0 && ok;
}

/* A broken MTP block is refused with a message naming it, not read out of bounds. */
TEST(test_bad_files)
{
    char path[300], err[256];
    snprintf(path, sizeof path, "%s/bad.gguf", tmpdir);
    const uint32_t three = 3;     /* nextn_predict_layers = block_count: no layer left */
    const uint64_t half = 32;     /* hnorm of 32 values, not dim */
    const struct { const char *what; size_t at; const void *bytes; size_t n; gguf_status st; const char *msg; } cases[] = {
        { "deepseek2.nextn_predict_layers", 30 + 4, &three, 4, GGUF_ERR_FORMAT, "nextn_predict_layers" },
        { "blk.2.nextn.eh_proj.weight", 15, "X", 1, GGUF_ERR_MISSING, "blk.2.nextn.eh_proj.weight" },
        { "blk.2.nextn.hnorm.weight", 24 + 4, &half, 8, GGUF_ERR_SHAPE, "blk.2.nextn.hnorm.weight" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(mtp_patch(path, cases[i].what, cases[i].at, cases[i].bytes, cases[i].n));
        model *m = NULL;
        gguf_status st = model_load(path, NULL, &m, err, sizeof err);
        CHECKF(st == cases[i].st && !m && strstr(err, cases[i].msg), "case %zu: status %d, %s", i, (int)st, err);
        model_free(m);
    }
    unlink(path);
    /* mkmodel writes MTP layers for deepseek2 only */
    char *argv[] = { "mkmodel", "--arch", "qwen3", "--preset", "tiny", "--nextn", "1", "--type", "f32", "--seed", "1",
                     "-o", path, NULL };
    CHECK(cmd_mkmodel((int)(sizeof argv / sizeof argv[0]) - 1, argv) == 2);
    CHECK(access(path, F_OK) != 0);
}

int main(void)
{
    if (!mkdtemp(tmpdir)) return 1;
    snprintf(plain_path, sizeof plain_path, "%s/plain.gguf", tmpdir);
    snprintf(mtp_path, sizeof mtp_path, "%s/mtp.gguf", tmpdir);
    if (!mtp_write(plain_path, false) || !mtp_write(mtp_path, true)) {
        fprintf(stderr, "mkmodel failed\n");
        return 1;
    }
    RUN(test_load_apart);
    RUN(test_forward_and_drafts);
    RUN(test_bad_files);
    RUN(test_sched_echo);
    RUN(test_mtp_and_draft_model);
    RUN(test_mtp_skip_when_not_drafting);
    unlink(plain_path);
    unlink(mtp_path);
    rmdir(tmpdir);
    HARNESS_END();
}
