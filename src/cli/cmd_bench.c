/*
 * cmd_bench: `tokenmill bench -m MODEL [--threads N] [--pp 512] [--tg 128] [--seqs 1,4,16]
 * [--reps R] [--batch N] [--depth D]`: engine timings as one JSON object on stdout, for
 * bench/engine.
 *
 *   pp:      prefill of --pp random token ids in one sequence (llama-bench's ppN: chunks of
 *            the engine batch, logits for the last token only), tokens/s per repetition;
 *   tg:      --tg tokens decoded one per step (llama-bench's tgN), tokens/s per repetition;
 *   depth:   pp and tg start after an untimed prefill of D tokens in the same sequence
 *            (llama-bench's -d): what a request costs that finds D tokens of its prompt
 *            already cached, the prefix cache's case (pp fills the depth once; each
 *            repetition rewrites the same positions after it);
 *   batched: S sequences, each first prefilled with a 32-token random prompt (not timed),
 *            then decoding together for --tg steps of S tokens: aggregate generated tokens/s.
 *
 * One untimed warm-up run of each kind precedes the repetitions (as llama-bench does).
 * Sequences are reset between runs, so the KV cache is empty at the start of each.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "cli/cmd_common.h"
#include "cli/cmd_opts.h"
#include "engine/engine.h"
#include "model/model.h"
#include "util/util.h"

#define CMD_BENCH_MAX_SEQS 64
#define CMD_BENCH_PROMPT 32

typedef struct {
    engine *e;
    int n_vocab;
    float *logits;       /* (max(S, 1), n_vocab) */
    engine_tok *bt;      /* (max_batch) */
    util_rng rng;
} cmd_bench_ctx;

static int32_t cmd_bench_tok(cmd_bench_ctx *c)
{
    return (int32_t)(util_rng_next(&c->rng) % (uint64_t)c->n_vocab);
}

static bool cmd_bench_step(cmd_bench_ctx *c, int n)
{
    engine_batch b = { n, c->bt };
    engine_status st = engine_step(c->e, &b, c->logits);
    if (st != ENGINE_OK) fprintf(stderr, "tokenmill bench: step: %s\n", engine_status_name(st));
    return st == ENGINE_OK;
}

/* prefill positions [from, to) of s in chunks of the engine batch; false on error */
static bool cmd_bench_fill(cmd_bench_ctx *c, kvpool_seq *s, int from, int to)
{
    int maxb = engine_max_batch(c->e);
    for (int p0 = from; p0 < to; p0 += maxb) {
        int m = TM_MIN(maxb, to - p0);
        for (int i = 0; i < m; i++)
            c->bt[i] = (engine_tok){ cmd_bench_tok(c), p0 + i, s, p0 + i == to - 1 };
        if (!cmd_bench_step(c, m)) return false;
    }
    return true;
}

/* prefill positions [depth, depth + n) of s, whose first `depth` positions are already
 * filled (a rerun overwrites the same positions); returns seconds or -1 */
static double cmd_bench_pp(cmd_bench_ctx *c, kvpool_seq *s, int depth, int n)
{
    double t0 = util_now();
    if (!cmd_bench_fill(c, s, depth, depth + n)) return -1;
    return util_now() - t0;
}

/* S sequences: untimed prompt of `prompt` tokens each (skipped when 0), then `steps` decode
 * steps of one token per sequence; returns the decode seconds or -1 */
static double cmd_bench_decode(cmd_bench_ctx *c, kvpool_seq **seqs, int S, int prompt, int steps)
{
    for (int i = 0; i < S; i++) {
        kvpool_seq_reset(engine_kvpool(c->e), seqs[i]);
        if (!cmd_bench_fill(c, seqs[i], 0, prompt)) return -1;
    }
    double t0 = util_now();
    for (int k = 0; k < steps; k++) {
        for (int i = 0; i < S; i++)
            c->bt[i] = (engine_tok){ cmd_bench_tok(c), prompt + k, seqs[i], true };
        if (!cmd_bench_step(c, S)) return -1;
    }
    return util_now() - t0;
}

static void cmd_bench_print_arr(const double *v, int n)
{
    putchar('[');
    for (int i = 0; i < n; i++) printf("%s%.3f", i ? ", " : "", v[i]);
    putchar(']');
}

/* A MoE model's expert figures: the weight bytes one token reads (the active experts), and
 * per layer the imbalance over G contiguous expert groups of the tokens routed during the
 * whole run (its random prompts), with their mean and max over the layers. */
static void cmd_bench_moe(engine *e, int groups)
{
    const model *m = engine_model(e);
    const model_hparams *hp = &m->hp;
    if (hp->n_expert == 0) return;
    uint64_t tot[MODEL_MAX_EXPERTS];
    double sum = 0, max = 0;
    printf(", \"moe\": {\"experts\": %d, \"used\": %d, \"active_weight_bytes\": %zu, \"groups\": %d, \"imbalance\": [",
           hp->n_expert, hp->n_expert_used, model_active_weight_bytes(m), TM_MIN(groups, hp->n_expert));
    for (int il = 0; il < hp->n_layers && engine_moe_load(e, il, NULL, tot, NULL); il++) {
        double im = engine_moe_imbalance(tot, hp->n_expert, groups);
        printf("%s%.4f", il ? ", " : "", im);
        sum += im;
        max = im > max ? im : max;
    }
    printf("], \"imbalance_mean\": %.4f, \"imbalance_max\": %.4f}", sum / hp->n_layers, max);
}

int cmd_bench(int argc, char **argv)
{
    const char *model_path = NULL, *seqs_arg = "1,4,16";
    long threads = 0, pp = 512, tg = 128, reps = 3, maxb = 512, depth = 0, groups = 8;
    const cmd_opt opts[] = {
        { "--model", "-m", CMD_OPT_STR, &model_path, .arg = "MODEL", .help = "the GGUF to time (required)" },
        { "--threads", "-t", CMD_OPT_LONG, &threads, 0, 1024, .arg = "N", .help = "kernel threads (default: one per core)" },
        { "--pp", NULL, CMD_OPT_LONG, &pp, 0, 1 << 24, .arg = "N", .help = "prompt tokens to prefill (default 512)" },
        { "--tg", NULL, CMD_OPT_LONG, &tg, 0, 1 << 24, .arg = "N", .help = "tokens to decode (default 128)" },
        { "--seqs", NULL, CMD_OPT_STR, &seqs_arg, .arg = "S,S,..", .help = "batched decode sequence counts (default 1,4,16)" },
        { "--reps", NULL, CMD_OPT_LONG, &reps, 1, 100, .arg = "R", .help = "repetitions of each run (default 3)" },
        { "--batch", NULL, CMD_OPT_LONG, &maxb, 1, 1 << 16, .arg = "N", .help = "engine batch in tokens (default 512)" },
        { "--groups", NULL, CMD_OPT_LONG, &groups, 1, 1024, .arg = "G", .help = "MoE: expert groups of the imbalance figure (default 8)" },
        { "--depth", "-d", CMD_OPT_LONG, &depth, 0, 1 << 24, .arg = "D", .help = "tokens already in the sequence before pp and tg (default 0)" },
        { 0 },
    };
    const char *synopsis = "bench -m MODEL [options]: engine timings as JSON";
    cmd_opts_status ost = cmd_opts_parse("bench", synopsis, opts, argc, argv, 1, NULL, 0, NULL);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);
    int seqs[16], n_seqs = 0;
    for (const char *p = seqs_arg; *p && n_seqs < 16;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > CMD_BENCH_MAX_SEQS || (*end && *end != ',')) {
            fprintf(stderr, "tokenmill bench: --seqs wants numbers 1..%d separated by commas\n", CMD_BENCH_MAX_SEQS);
            return 2;
        }
        seqs[n_seqs++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!model_path) {
        fprintf(stderr, "tokenmill bench: -m MODEL is required\n");
        cmd_opts_hint("bench", synopsis);
        return 2;
    }
    char err[512];
    model *m = NULL;
    if (model_load(model_path, NULL, &m, err, sizeof err) != GGUF_OK) {
        fprintf(stderr, "tokenmill bench: cannot load %s: %s\n", model_path, err);
        return 1;
    }
    int max_s = 1;
    for (int i = 0; i < n_seqs; i++) max_s = TM_MAX(max_s, seqs[i]);
    int prompt_b = TM_MAX(CMD_BENCH_PROMPT, depth);  /* batched: each sequence's prompt */
    int blk_pp = (depth + pp + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK;
    int blk_tg = (depth + tg + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK;
    int blk_b = max_s * ((prompt_b + tg + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK);
    engine_opts eo = { .n_threads = threads, .max_batch_tokens = TM_MAX(maxb, max_s),
                       .n_kv_blocks = TM_MAX(1, TM_MAX(blk_pp, TM_MAX(blk_tg, blk_b))) };
    engine *e = NULL;
    if (engine_new(m, &eo, &e, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "tokenmill bench: %s\n", err);
        model_free(m);
        return 1;
    }
    cmd_bench_ctx c = { .e = e, .n_vocab = m->hp.n_vocab };
    util_rng_seed(&c.rng, 1234);
    c.logits = xmalloc((size_t)max_s * (size_t)m->hp.n_vocab * sizeof(float));
    c.bt = xmalloc((size_t)engine_max_batch(e) * sizeof *c.bt);
    kvpool_seq *sq[CMD_BENCH_MAX_SEQS];
    for (int i = 0; i < max_s; i++) sq[i] = kvpool_seq_new(engine_kvpool(e));
    double *pp_r = xcalloc((size_t)reps, sizeof(double)), *tg_r = xcalloc((size_t)reps, sizeof(double));
    double *b_r = xcalloc((size_t)reps * (size_t)n_seqs, sizeof(double));
    int rc = 1;
    if (pp > 0) {
        kvpool_seq_reset(engine_kvpool(e), sq[0]);
        if (!cmd_bench_fill(&c, sq[0], 0, depth) || cmd_bench_pp(&c, sq[0], depth, pp) < 0) goto out;
        for (int r = 0; r < reps; r++) {
            double t = cmd_bench_pp(&c, sq[0], depth, pp);
            if (t < 0) goto out;
            pp_r[r] = pp / t;
        }
    }
    if (tg > 0) {
        if (cmd_bench_decode(&c, sq, 1, depth, TM_MIN(tg, 16)) < 0) goto out;
        for (int r = 0; r < reps; r++) {
            double t = cmd_bench_decode(&c, sq, 1, depth, tg);
            if (t < 0) goto out;
            tg_r[r] = tg / t;
        }
        for (int i = 0; i < n_seqs; i++) {
            if (cmd_bench_decode(&c, sq, seqs[i], prompt_b, TM_MIN(tg, 8)) < 0) goto out;
            for (int r = 0; r < reps; r++) {
                double t = cmd_bench_decode(&c, sq, seqs[i], prompt_b, tg);
                if (t < 0) goto out;
                b_r[i * reps + r] = (double)seqs[i] * tg / t;
            }
        }
    }
    printf("{\"model\": \"");
    for (const char *p = model_path; *p; p++) {
        if (*p == '"' || *p == '\\') putchar('\\');
        if ((unsigned char)*p >= 0x20) putchar(*p);
    }
    printf("\", \"threads\": %d, \"simd\": \"%s\", \"depth\": %ld, \"pp\": {\"n\": %ld, \"tok_s\": ",
           engine_n_threads(e), ops_level_name(), depth, pp);
    cmd_bench_print_arr(pp_r, pp > 0 ? reps : 0);
    printf("}, \"tg\": {\"n\": %ld, \"tok_s\": ", tg);
    cmd_bench_print_arr(tg_r, tg > 0 ? reps : 0);
    printf("}, \"batched\": [");
    for (int i = 0; i < n_seqs; i++) {
        printf("%s{\"seqs\": %d, \"tok_s\": ", i ? ", " : "", seqs[i]);
        cmd_bench_print_arr(b_r + i * reps, tg > 0 ? reps : 0);
        putchar('}');
    }
    printf("], \"weight_bytes\": %zu", model_weight_bytes(m));
    cmd_bench_moe(e, (int)groups);
    printf("}\n");
    fflush(stdout);
    rc = 0;
out:
    for (int i = 0; i < max_s; i++) kvpool_seq_free(engine_kvpool(e), sq[i]);
    free(pp_r);
    free(tg_r);
    free(b_r);
    free(c.logits);
    free(c.bt);
    engine_free(e);
    model_free(m);
    return rc;
}
