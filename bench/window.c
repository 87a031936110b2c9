/*
 * bench/window: the window cache and the cost and error of replaying a missing window state
 * (a benchmark, not a test). Built and run by bench/window. On a model with sliding-window
 * layers (or one with a window forced onto its even layers by --force-window, an option for this
 * measurement only, to get a real-weights figure from a model without windows):
 *
 * 1. Error of bounded replay. For each prompt and depth P: the reference computes the P + tail
 *    prompt tokens and G greedy tokens; a second sequence attaches the P positions' blocks and
 *    replays the window layers over the last 128 positions only (bounded), a third replays them
 *    exactly. Reported: KL(reference || bounded) of the next-token distribution after the
 *    prompt, top-1 agreement, the length of the identical greedy continuation (of G), and that
 *    the exact replay and the window-cache restore are bit-identical to the reference.
 * 2. A multi-turn agent workload: a conversation that grows by --turn-tokens per turn, each
 *    turn a request for the whole of it that attaches the previous turns' blocks, with the
 *    window cache (the state at the attached prefix restored), bounded replay only, exact
 *    replay only: cached tokens (at most L - 134), positions computed, prefill seconds.
 *
 * Prompts are random token ids, or (--sampled) text sampled from the model itself at
 * temperature 1, which for a real model is text it finds likely. Random weights understate a
 * real model's structure (attention that reaches far back for a reason).
 * Usage: window -m MODEL [--force-window W] [--depths 256,512,1024] [--prompts N] [--tail N]
 *        [--greedy G] [--turns T] [--turn-tokens K] [--threads N] [--sampled] [--json]
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "model/model.h"
#include "util/util.h"

#define MAXD 8

typedef struct {
    engine *e;
    kvpool *kv;
    int V;
    float *lg;                   /* (max batch, V) logits scratch */
    uint8_t *state;              /* a captured window state */
    int batch;
    bool captured;               /* the last wb_run captured the state at its cap */
} wb;

/* Computes tokens [from, n) of s in steps of the engine's batch, committing blocks; the logits
 * of position n - 1 into last (if set); the state captured at cap (if > 0) into w->state.
 * Returns seconds. */
static double wb_run(wb *w, kvpool_seq *s, const int32_t *toks, int from, int n, float *last, int cap)
{
    engine_tok *bt = xmalloc((size_t)w->batch * sizeof *bt);
    double t0 = util_now();
    w->captured = false;
    for (int p = from; p < n;) {
        int m = TM_MIN(w->batch, n - p);
        for (int k = 0; k < m; k++) bt[k] = (engine_tok){ toks[p + k], p + k, s, p + k == n - 1 };
        engine_batch b = { m, bt };
        if (engine_step(w->e, &b, w->lg) != ENGINE_OK) {
            fprintf(stderr, "window: engine step failed (KV pool too small?)\n");
            exit(1);
        }
        p += m;
        kvpool_seq_commit_full_blocks(w->kv, s, toks, p);
        const engine_window_state *ws;
        int ns = engine_window_states(w->e, &ws);
        for (int i = 0; i < ns; i++)
            if (ws[i].seq == s && ws[i].end == cap) {
                memcpy(w->state, ws[i].state, kvpool_window_state_bytes(w->kv));
                w->captured = true;
            }
    }
    double dt = util_now() - t0;
    if (last) memcpy(last, w->lg, (size_t)w->V * sizeof(float));
    free(bt);
    return dt;
}

static int wb_argmax(const float *x, int n)
{
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* G greedy tokens after position n - 1 (whose logits are last) into out; toks must have room. */
static void wb_greedy(wb *w, kvpool_seq *s, int32_t *toks, int n, const float *last, int G, int32_t *out)
{
    int32_t t = wb_argmax(last, w->V);
    for (int g = 0; g < G; g++) {
        out[g] = t;
        toks[n + g] = t;
        if (g + 1 == G) break;
        engine_tok bt = { t, n + g, s, true };
        engine_batch b = { 1, &bt };
        if (engine_step(w->e, &b, w->lg) != ENGINE_OK) exit(1);
        t = wb_argmax(w->lg, w->V);
    }
}

static double wb_kl(const float *a, const float *b, int n)
{
    double ma = a[wb_argmax(a, n)], mb = b[wb_argmax(b, n)], za = 0, zb = 0;
    for (int i = 0; i < n; i++) {
        za += exp(a[i] - ma);
        zb += exp(b[i] - mb);
    }
    double kl = 0;
    for (int i = 0; i < n; i++) {
        double lp = a[i] - ma - log(za), lq = b[i] - mb - log(zb);
        kl += exp(lp) * (lp - lq);
    }
    return kl;
}

static void wb_prompt(wb *w, int32_t *toks, int n, unsigned seed, bool sampled)
{
    uint64_t x = 0x9E3779B97F4A7C15ull * (seed + 1);
    for (int i = 0; i < n; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        toks[i] = (int32_t)(x % (uint64_t)w->V);
    }
    if (!sampled) return;
    /* the model's own text: each token sampled at temperature 1 from the logits before it */
    kvpool_seq *s = kvpool_seq_new(w->kv);
    toks[0] = 1 % w->V;
    for (int i = 0; i + 1 < n; i++) {
        engine_tok bt = { toks[i], i, s, true };
        engine_batch b = { 1, &bt };
        if (engine_step(w->e, &b, w->lg) != ENGINE_OK) exit(1);
        double mx = w->lg[wb_argmax(w->lg, w->V)], z = 0;
        for (int k = 0; k < w->V; k++) z += exp(w->lg[k] - mx);
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double u = (double)(x >> 11) / 9007199254740992.0 * z, c = 0;
        int k = 0;
        for (; k + 1 < w->V; k++) {
            c += exp(w->lg[k] - mx);
            if (c >= u) break;
        }
        toks[i + 1] = k;
    }
    kvpool_seq_free(w->kv, s);
}

int main(int argc, char **argv)
{
    const char *path = NULL, *depths_z = "256,512,1024";
    int force = 0, n_prompts = 8, tail = 16, G = 32, turns = 8, turn_tok = 300, threads = 0;
    bool sampled = false, json = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--sampled")) sampled = true;
        else if (!strcmp(a, "--json")) json = true;
        else if (!v) { fprintf(stderr, "window: %s needs a value\n", a); return 2; }
        else if (!strcmp(a, "-m")) path = v, i++;
        else if (!strcmp(a, "--force-window")) force = atoi(v), i++;
        else if (!strcmp(a, "--depths")) depths_z = v, i++;
        else if (!strcmp(a, "--prompts")) n_prompts = atoi(v), i++;
        else if (!strcmp(a, "--tail")) tail = atoi(v), i++;
        else if (!strcmp(a, "--greedy")) G = atoi(v), i++;
        else if (!strcmp(a, "--turns")) turns = atoi(v), i++;
        else if (!strcmp(a, "--turn-tokens")) turn_tok = atoi(v), i++;
        else if (!strcmp(a, "--threads")) threads = atoi(v), i++;
        else { fprintf(stderr, "window: unknown option %s\n", a); return 2; }
    }
    int depths[MAXD], nd = 0;
    for (const char *z = depths_z; *z && nd < MAXD;) {
        depths[nd] = (int)strtol(z, (char **)&z, 10) / 128 * 128;
        if (depths[nd] >= 128) nd++;
        if (*z == ',') z++;
        else break;
    }
    if (!path || nd == 0 || n_prompts < 1 || tail < 1 || G < 1 || turns < 1 || turn_tok < 1) {
        fprintf(stderr, "usage: window -m MODEL [--force-window W] [--depths 256,512] [--prompts N] [--tail N] "
                        "[--greedy G] [--turns T] [--turn-tokens K] [--threads N] [--sampled] [--json]\n");
        return 2;
    }
    char err[256];
    model *m = NULL;
    if (model_load(path, NULL, &m, err, sizeof err) != GGUF_OK) {
        fprintf(stderr, "window: %s\n", err);
        return 1;
    }
    if (force > 0)   /* this measurement only: a window on the even layers of any model */
        for (int il = 0; il < m->hp.n_layers; il += 2) m->layers[il].window = force;
    int maxd = 0;
    for (int i = 0; i < nd; i++) maxd = TM_MAX(maxd, depths[i]);
    int n_max = TM_MAX(maxd + tail + G, turns * turn_tok + G) + 1;
    if (n_max > m->hp.n_ctx_train) fprintf(stderr, "window: note: %d positions exceed the model's context %d\n", n_max, m->hp.n_ctx_train);
    engine_opts eo = { .n_threads = threads, .max_batch_tokens = 512, .n_kv_blocks = 4 * (n_max / 128 + 2) };
    wb w = { .V = m->hp.n_vocab, .batch = 512 };
    if (engine_new(m, &eo, &w.e, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "window: %s\n", err);
        return 1;
    }
    w.kv = engine_kvpool(w.e);
    if (kvpool_n_window_layers(w.kv) == 0) {
        fprintf(stderr, "window: the model has no window layers (--force-window W)\n");
        return 2;
    }
    w.lg = xmalloc((size_t)512 * w.V * sizeof(float));
    w.state = xmalloc(kvpool_window_state_bytes(w.kv));
    const int span = kvpool_window_exact_span(w.kv);
    int32_t *toks = xmalloc((size_t)n_max * sizeof *toks), *cont = xmalloc((size_t)G * sizeof *cont);
    int32_t *cref = xmalloc((size_t)G * sizeof *cref);
    float *lref = xmalloc((size_t)w.V * sizeof(float)), *lx = xmalloc((size_t)w.V * sizeof(float));

    printf("%s%s: %d layers, %d of them window layers (window %d), exact replay span %d positions%s\n",
           json ? "# " : "", path, m->hp.n_layers, kvpool_n_window_layers(w.kv), kvpool_window(w.kv), span,
           force ? " (window forced on the even layers for this measurement)" : "");
    if (!json) printf("%6s %8s %10s %8s %9s %9s %8s %8s\n", "depth", "prompts", "KL mean", "KL max", "top-1",
                      "greedy=", "exact==", "restore==");
    for (int di = 0; di < nd; di++) {
        int P = depths[di], n = P + tail, top1 = 0, exact_ok = 0, restore_ok = 0;
        double kl_sum = 0, kl_max = 0, same_sum = 0;
        for (int pi = 0; pi < n_prompts; pi++) {
            wb_prompt(&w, toks, n, (unsigned)(pi * 1000 + P), sampled);
            kvpool_seq *r = kvpool_seq_new(w.kv);
            wb_run(&w, r, toks, 0, n, lref, P);
            wb_greedy(&w, r, toks, n, lref, G, cref);
            kvpool_seq_free(w.kv, r);
            /* restore: the window cache's hit */
            kvpool_seq *s = kvpool_seq_new(w.kv);
            if (kvpool_seq_attach_prefix(w.kv, s, toks, n) != P) fprintf(stderr, "window: prefix not attached\n");
            kvpool_seq_window_restore(w.kv, s, P, w.state);
            wb_run(&w, s, toks, P, n, lx, 0);
            restore_ok += !memcmp(lx, lref, (size_t)w.V * sizeof(float));
            kvpool_seq_free(w.kv, s);
            /* exact replay */
            s = kvpool_seq_new(w.kv);
            kvpool_seq_attach_prefix(w.kv, s, toks, n);
            int from = kvpool_seq_window_replay(w.kv, s, P, true);
            wb_run(&w, s, toks, from, n, lx, 0);
            exact_ok += !memcmp(lx, lref, (size_t)w.V * sizeof(float));
            kvpool_seq_free(w.kv, s);
            /* bounded replay */
            s = kvpool_seq_new(w.kv);
            kvpool_seq_attach_prefix(w.kv, s, toks, n);
            from = kvpool_seq_window_replay(w.kv, s, P, false);
            wb_run(&w, s, toks, from, n, lx, 0);
            double kl = wb_kl(lref, lx, w.V);
            kl_sum += kl;
            kl_max = TM_MAX(kl_max, kl);
            top1 += wb_argmax(lref, w.V) == wb_argmax(lx, w.V);
            wb_greedy(&w, s, toks, n, lx, G, cont);
            int same = 0;
            while (same < G && cont[same] == cref[same]) same++;
            same_sum += same;
            kvpool_seq_free(w.kv, s);
        }
        if (json)
            printf("{\"depth\": %d, \"prompts\": %d, \"kl_mean\": %.6g, \"kl_max\": %.6g, \"top1\": %.4f, "
                   "\"greedy_same_mean\": %.2f, \"greedy\": %d, \"exact_identical\": %d, \"restore_identical\": %d}\n",
                   P, n_prompts, kl_sum / n_prompts, kl_max, (double)top1 / n_prompts, same_sum / n_prompts, G,
                   exact_ok, restore_ok);
        else
            printf("%6d %8d %10.4g %8.4g %8.0f%% %6.1f/%d %5d/%d %6d/%d\n", P, n_prompts, kl_sum / n_prompts, kl_max,
                   100.0 * top1 / n_prompts, same_sum / n_prompts, G, exact_ok, n_prompts, restore_ok, n_prompts);
        fflush(stdout);
    }

    /* the agent workload: turns of turn_tok tokens, each request the whole conversation */
    static const char *pol[3] = { "window cache", "bounded only", "exact only" };
    if (!json) printf("\nagent workload: %d turns of %d tokens\n%-14s %8s %10s %10s %10s\n", turns, turn_tok,
                      "policy", "hit rate", "computed", "replayed", "prefill s");
    for (int pz = 0; pz < 3; pz++) {
        /* a conversation of its own per policy: the pool still holds the others' blocks */
        wb_prompt(&w, toks, turns * turn_tok, 4242u + (unsigned)pz, sampled);
        long prompt = 0, cached = 0, computed = 0, replayed = 0;
        double secs = 0;
        bool have = false;   /* a captured state at the attached prefix (the window cache) */
        for (int t = 1; t <= turns; t++) {
            int n = t * turn_tok;
            kvpool_seq *s = kvpool_seq_new(w.kv);
            int att = kvpool_seq_attach_prefix(w.kv, s, toks, n), from = att;
            if (att > 0 && pz == 0 && have) kvpool_seq_window_restore(w.kv, s, att, w.state);
            else if (att > 0) from = kvpool_seq_window_replay(w.kv, s, att, pz == 2);
            /* capture the state where the next turn's attached prefix will end: this turn's
             * last full block */
            secs += wb_run(&w, s, toks, from, n, NULL, n / 128 * 128);
            have = w.captured;
            prompt += n;
            cached += TM_MAX(0, TM_MIN(att, n - 134));
            computed += n - from;
            replayed += att - from;
            kvpool_seq_free(w.kv, s);
        }
        if (json)
            printf("{\"policy\": \"%s\", \"turns\": %d, \"turn_tokens\": %d, \"hit_rate\": %.4f, \"computed\": %ld, "
                   "\"replayed\": %ld, \"prefill_s\": %.4f}\n", pol[pz], turns, turn_tok, (double)cached / prompt,
                   computed, replayed, secs);
        else
            printf("%-14s %7.1f%% %10ld %10ld %10.3f\n", pol[pz], 100.0 * cached / prompt, computed, replayed, secs);
    }
    free(toks), free(cont), free(cref), free(lref), free(lx), free(w.lg), free(w.state);
    engine_free(w.e);
    model_free(m);
    return 0;
}
