/*
 * cmd_eval: `tokenmill eval -m MODEL --input IN.json [--threads N] [--kv f16|f32|q8_0|q4_0] [--batch N]`
 * for the oracle tests: the next-token distribution at every prompt position and a greedy
 * continuation, for token ids given as JSON (no tokenizer involved).
 *
 * IN.json:  {"seqs": [[id, ...], ...], "top": K, "greedy": G, "batched": true|false}
 * stdout:   {"seqs": [{"top": [[[id, logprob] x K, best first] per position i (the
 *            distribution after tokens 0..i)], "greedy": [G ids]}, ...]}
 * A MoE model's sequences also carry "route_margin": [n + G - 1 values], the routing margin
 * of the token fed at each position (engine_route_margins: its smallest over the layers;
 * null when no layer dropped an expert): a divergence from another engine right after a
 * token whose margin is within rounding is a routing near-tie, not a bug.
 * logprob = log_softmax(logits) computed in double. batched = true: every sequence's prompt
 * goes into the same engine steps (one step if the total fits --batch, else chunked steps
 * that each hold tokens of every unfinished sequence), then all sequences decode together,
 * one token each per step. batched = false: one sequence after the other.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cmd.h"
#include "cli/cmd_eval_dflash.h"
#include "cli/cmd_opts.h"
#include "engine/engine.h"
#include "model/model.h"
#include "util/util.h"

typedef struct {
    int32_t *toks;       /* (n + greedy) prompt then generated ids */
    int n;               /* prompt length */
    int n_fed;           /* prompt tokens already stepped */
    int n_gen;           /* greedy tokens produced */
    int32_t *top_id;     /* (n, K) */
    double *top_lp;      /* (n, K) */
    float *margin;       /* (n + greedy) routing margin of the token fed at each position */
    kvpool_seq *seq;
} cmd_eval_seq;

typedef struct {
    engine *e;
    int n_vocab;
    int K, G;
    float *logits;       /* (max_batch, n_vocab) */
    engine_tok *bt;      /* (max_batch) */
    cmd_eval_seq **owner;/* (max_batch) sequence of each batch entry with logits */
    cmd_eval_seq **ent;  /* (max_batch) sequence of each batch entry */
    int *opos;           /* (max_batch) prompt position of each entry with logits, -1 = greedy */
} cmd_eval_ctx;

/* top-K of one logits row into ids/lps (best first) */
static void cmd_eval_topk(cmd_eval_ctx *c, const float *l, int32_t *ids, double *lps)
{
    int V = c->n_vocab, K = c->K;
    double mx = l[0];
    for (int i = 1; i < V; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += exp((double)l[i] - mx);
    double lse = mx + log(sum);
    /* insertion into a sorted list of K: K is small */
    int n = 0;
    for (int i = 0; i < V; i++) {
        if (n == K && !(l[i] > l[ids[K - 1]])) continue;
        int j = n < K ? n++ : K - 1;
        while (j > 0 && l[ids[j - 1]] < l[i]) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = i;
    }
    for (int j = 0; j < n; j++) lps[j] = (double)l[ids[j]] - lse;
}

static int32_t cmd_eval_argmax(const float *l, int V)
{
    int b = 0;
    for (int i = 1; i < V; i++)
        if (l[i] > l[b]) b = i;
    return b;
}

/* Runs the batch of n entries and distributes the results. Returns false on engine error. */
static bool cmd_eval_run(cmd_eval_ctx *c, int n)
{
    engine_batch b = { n, c->bt };
    engine_status st = engine_step(c->e, &b, c->logits);
    if (st != ENGINE_OK) {
        fprintf(stderr, "tokenmill eval: step: %s\n", engine_status_name(st));
        return false;
    }
    const float *mg = engine_route_margins(c->e);
    if (mg)
        for (int t = 0; t < n; t++) c->ent[t]->margin[c->bt[t].pos] = mg[t];
    int r = 0;
    for (int t = 0; t < n; t++) {
        if (!c->bt[t].want_logits) continue;
        const float *l = c->logits + (size_t)r * c->n_vocab;
        cmd_eval_seq *s = c->owner[r];
        int p = c->opos[r];
        r++;
        if (p >= 0 && c->K > 0) cmd_eval_topk(c, l, s->top_id + (size_t)p * c->K, s->top_lp + (size_t)p * c->K);
        bool last_prompt = p == s->n - 1 || p < 0;
        if (last_prompt && s->n_gen < c->G) s->toks[s->n + s->n_gen++] = cmd_eval_argmax(l, c->n_vocab);
    }
    return true;
}

/* Adds one entry to the batch being built. */
static void cmd_eval_add(cmd_eval_ctx *c, int *n, cmd_eval_seq *s, int32_t token, int pos,
                         int prompt_pos, int *n_out)
{
    bool want = prompt_pos >= 0 ? (c->K > 0 || (prompt_pos == s->n - 1 && c->G > 0)) : true;
    c->bt[*n] = (engine_tok){ .token = token, .pos = pos, .seq = s->seq, .want_logits = want };
    c->ent[*n] = s;
    if (want) {
        c->owner[*n_out] = s;
        c->opos[*n_out] = prompt_pos;
        (*n_out)++;
    }
    (*n)++;
}

/* Feeds prompts (of seqs[0..ns)) in steps holding tokens of every unfinished sequence, then
 * decodes them together. */
static bool cmd_eval_group(cmd_eval_ctx *c, cmd_eval_seq **seqs, int ns)
{
    int maxb = engine_max_batch(c->e);
    for (;;) {
        int left = 0, active = 0;
        for (int i = 0; i < ns; i++) {
            left += seqs[i]->n - seqs[i]->n_fed;
            active += seqs[i]->n_fed < seqs[i]->n;
        }
        if (left == 0) break;
        int quota = TM_MAX(1, maxb / active), n = 0, n_out = 0;
        for (int pass = 0; pass < 2 && n < maxb; pass++) {
            for (int i = 0; i < ns && n < maxb; i++) {
                cmd_eval_seq *s = seqs[i];
                int take = TM_MIN(s->n - s->n_fed, pass == 0 ? quota : maxb - n);
                take = TM_MIN(take, maxb - n);
                for (int k = 0; k < take; k++, s->n_fed++)
                    cmd_eval_add(c, &n, s, s->toks[s->n_fed], s->n_fed, s->n_fed, &n_out);
            }
        }
        if (!cmd_eval_run(c, n)) return false;
    }
    /* greedy decoding: the first token came from the last prompt position */
    for (;;) {
        int n = 0, n_out = 0;
        for (int i = 0; i < ns; i++) {
            cmd_eval_seq *s = seqs[i];
            if (s->n_gen >= c->G || n >= maxb) continue;
            int pos = s->n + s->n_gen - 1;
            cmd_eval_add(c, &n, s, s->toks[pos], pos, -1, &n_out);
        }
        if (n == 0) break;
        if (!cmd_eval_run(c, n)) return false;
    }
    return true;
}

/* The result as JSON on stdout: per sequence the top K per position, the greedy ids, and for
 * an MoE the routing margins. */
static void cmd_eval_print(const cmd_eval_seq *seqs, int ns, int K, bool moe)
{
    FILE *f = stdout;
    fputs("{\"seqs\": [", f);
    for (int i = 0; i < ns; i++) {
        const cmd_eval_seq *s = &seqs[i];
        fprintf(f, "%s\n{\"top\": [", i ? "," : "");
        for (int p = 0; p < s->n; p++) {
            fputs(p ? ",\n[" : "[", f);
            for (int k = 0; k < K; k++)
                fprintf(f, "%s[%d, %.9g]", k ? ", " : "", s->top_id[(size_t)p * K + k], s->top_lp[(size_t)p * K + k]);
            fputc(']', f);
        }
        fputs("], \"greedy\": [", f);
        for (int g = 0; g < s->n_gen; g++) fprintf(f, "%s%d", g ? ", " : "", s->toks[s->n + g]);
        fputc(']', f);
        if (moe) {
            fputs(", \"route_margin\": [", f);
            for (int p = 0; p < s->n + TM_MAX(s->n_gen - 1, 0); p++) {
                if (isinf(s->margin[p])) fprintf(f, "%snull", p ? ", " : "");
                else fprintf(f, "%s%.3e", p ? ", " : "", (double)s->margin[p]);
            }
            fputc(']', f);
        }
        fputc('}', f);
    }
    fputs("]}\n", f);
    fflush(f);
}

int cmd_eval(int argc, char **argv)
{
    const char *model_path = NULL, *input = NULL, *draft = NULL;
    long threads = 0, maxb = 512;
    int kv_type = ENGINE_KV_F16;
    const cmd_opt opts[] = {
        { "--model", "-m", CMD_OPT_STR, &model_path, .arg = "MODEL", .help = "the GGUF", .required = true },
        { "--input", NULL, CMD_OPT_STR, &input, .arg = "IN.json", .help = "sequences, top-K and greedy length", .required = true },
        { "--threads", "-t", CMD_OPT_LONG, &threads, 0, 1024, .arg = "N", .help = "kernel threads (default: one per core)" },
        { "--batch", NULL, CMD_OPT_LONG, &maxb, 1, 1 << 16, .arg = "N", .help = "engine batch in tokens (default 512)" },
        { "--kv", NULL, CMD_OPT_CHOICE, &kv_type, .choices = "f16|f32|q8_0|q4_0", .help = "KV cache type (default f16)" },
        { "--draft", NULL, CMD_OPT_STR, &draft, .arg = "DRAFTER", .help = "a dflash drafter or a deepseek4 MTP-only file: its drafting rounds instead (cmd_eval_dflash.c)" },
        { 0 },
    };
    const char *synopsis = "eval -m MODEL --input IN.json [options]: top log-probs at every position as JSON";
    cmd_opts_status ost = cmd_opts_parse("eval", synopsis, opts, argc, argv, 1, NULL, 0, NULL);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);
    json_error_t jerr;
    json_t *root = json_load_file(input, 0, &jerr);
    if (!root) {
        fprintf(stderr, "tokenmill eval: %s: %s (line %d)\n", input, jerr.text, jerr.line);
        return 1;
    }
    if (draft) {
        char derr[512];
        model *t = NULL;
        int drc = 1;
        if (model_load(model_path, NULL, &t, derr, sizeof derr) != GGUF_OK)
            fprintf(stderr, "tokenmill eval: cannot load %s: %s\n", model_path, derr);
        else
            drc = cmd_eval_dflash(t, draft, root, (int)threads, kv_type);
        model_free(t);
        json_decref(root);
        return drc;
    }
    json_t *jseqs = json_object_get(root, "seqs");
    int K = (int)json_integer_value(json_object_get(root, "top"));
    int G = (int)json_integer_value(json_object_get(root, "greedy"));
    bool batched = json_is_true(json_object_get(root, "batched"));
    if (!json_is_array(jseqs) || json_array_size(jseqs) == 0 || K < 0 || G < 0) {
        fprintf(stderr, "tokenmill eval: %s: need {\"seqs\": [[ids]...], \"top\": K, \"greedy\": G}\n", input);
        json_decref(root);
        return 1;
    }
    char err[512];
    model *m = NULL;
    if (model_load(model_path, NULL, &m, err, sizeof err) != GGUF_OK) {
        fprintf(stderr, "tokenmill eval: cannot load %s: %s\n", model_path, err);
        json_decref(root);
        return 1;
    }
    if (m->hp.bidirectional) {
        fprintf(stderr, "tokenmill eval: %s: '%s' is an embedding model: it has no logits\n", model_path, m->hp.arch_name);
        json_decref(root);
        model_free(m);
        return 1;
    }
    int V = m->hp.n_vocab;
    K = TM_MIN(K, V);
    int ns = (int)json_array_size(jseqs);
    cmd_eval_seq *seqs = xcalloc((size_t)ns, sizeof *seqs);
    int rc = 1, blocks = 0;
    for (int i = 0; i < ns; i++) {
        json_t *a = json_array_get(jseqs, (size_t)i);
        int n = json_is_array(a) ? (int)json_array_size(a) : 0;
        if (n == 0) {
            fprintf(stderr, "tokenmill eval: sequence %d is empty or not an array\n", i);
            goto out;
        }
        seqs[i].n = n;
        seqs[i].toks = xmalloc((size_t)(n + G + 1) * sizeof(int32_t));
        for (int k = 0; k < n; k++) {
            json_t *x = json_array_get(a, (size_t)k);
            json_int_t id = json_integer_value(x);
            if (!json_is_integer(x) || id < 0 || id >= V) {
                fprintf(stderr, "tokenmill eval: sequence %d token %d is not an id below %d\n", i, k, V);
                goto out;
            }
            seqs[i].toks[k] = (int32_t)id;
        }
        seqs[i].top_id = xcalloc((size_t)n * (size_t)TM_MAX(K, 1), sizeof(int32_t));
        seqs[i].top_lp = xcalloc((size_t)n * (size_t)TM_MAX(K, 1), sizeof(double));
        seqs[i].margin = xcalloc((size_t)(n + G + 1), sizeof(float));
        blocks += (n + G + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK;
    }

    engine *e = NULL;
    engine_opts eo = { .n_threads = threads, .n_kv_blocks = blocks, .max_batch_tokens = maxb, .kv_type = (engine_kv_type)kv_type };
    if (engine_new(m, &eo, &e, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "tokenmill eval: %s\n", err);
        goto out;
    }
    cmd_eval_ctx c = { .e = e, .n_vocab = V, .K = K, .G = G };
    c.logits = malloc((size_t)maxb * (size_t)V * sizeof(float));
    c.bt = xmalloc((size_t)maxb * sizeof *c.bt);
    c.owner = xmalloc((size_t)maxb * sizeof *c.owner);
    c.opos = xmalloc((size_t)maxb * sizeof *c.opos);
    c.ent = xmalloc((size_t)maxb * sizeof *c.ent);
    bool ok = c.logits != NULL;
    if (!ok) fprintf(stderr, "tokenmill eval: out of memory for logits\n");
    for (int i = 0; i < ns; i++) seqs[i].seq = kvpool_seq_new(engine_kvpool(e));
    if (ok && batched) {
        cmd_eval_seq **ps = xmalloc((size_t)ns * sizeof *ps);
        for (int i = 0; i < ns; i++) ps[i] = &seqs[i];
        ok = cmd_eval_group(&c, ps, ns);
        free(ps);
    } else if (ok) {
        for (int i = 0; i < ns && ok; i++) {
            cmd_eval_seq *p1 = &seqs[i];
            ok = cmd_eval_group(&c, &p1, 1);
            kvpool_seq_reset(engine_kvpool(e), seqs[i].seq);
        }
    }
    if (ok) {
        cmd_eval_print(seqs, ns, K, m->hp.n_expert > 0);
        rc = 0;
    }
    for (int i = 0; i < ns; i++) kvpool_seq_free(engine_kvpool(e), seqs[i].seq), seqs[i].seq = NULL;
    free(c.logits);
    free(c.bt);
    free(c.owner);
    free(c.opos);
    free(c.ent);
    engine_free(e);
out:
    for (int i = 0; i < ns; i++) {
        free(seqs[i].toks);
        free(seqs[i].top_id);
        free(seqs[i].top_lp);
        free(seqs[i].margin);
    }
    free(seqs);
    model_free(m);
    json_decref(root);
    return rc;
}
