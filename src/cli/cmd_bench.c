/*
 * cmd_bench: `tokenmill bench -m MODEL [--threads N] [--cpus LIST] [--pp 512] [--tg 128] [--seqs 1,4,16]
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
 *
 * MoE models: "moe" has the expert imbalance over the run's random tokens; with --prompts FILE
 * (real text, one prompt per line, e.g. bench/moe_prompts.txt) each prompt is also prefilled
 * once, untimed, and "moe_prompts" has the imbalance over those tokens only: what a real
 * distribution of tokens does to the experts' load, per layer and over all MoE layers.
 *
 * `tokenmill bench curves -m MODEL [--prefill-steps 16,..] [--streams 1,..] [--tg N]
 * [--svg PATH]`: the two curves that set a host's price, on this machine: (1) prefill tokens
 * per engine step against prefill throughput and step latency (one sequence prefilled in
 * chunks of that size, --steps of them), (2) concurrent decoding streams against aggregate and
 * per-user tokens/s and step latency (each stream after a 32-token prompt). JSON on stdout;
 * --svg writes the four charts (drawn with the status page's status_svg_line) as one SVG.
 *
 * `tokenmill bench profile -m MODEL [--threads N] [--cpus LIST] [--tg N] [--depth D] [--json]`: where a
 * single-sequence decode step spends its time: --tg steps (default 64) after an untimed
 * prompt of D tokens (default 32) with the engine's profile on (engine_profile), printed per
 * stage (ms per token, share of the step, GB/s of the stage's weights, pool rounds, and the
 * pool's thread-time split into work, wake-up and barrier waits; the rest is threads idle
 * while the stage runs, e.g. the tail of an uneven round or a stage run by the step thread
 * alone), then per layer. --json prints the same as one JSON object instead of the table.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "cli/cmd_common.h"
#include "cli/cmd_opts.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/model_dsv4.h"
#include "recipe/tokenizer.h"
#include "util/jsonfmt.h"
#include "recipe/status.h"
#include "util/bytebuf.h"
#include "util/topo.h"
#include "util/util.h"

#define CMD_BENCH_MAX_SEQS 64
#define CMD_BENCH_PROMPT 32
#define CMD_BENCH_MAX_PROMPTS 1024   /* --prompts: lines used at most */
#define CMD_BENCH_PROMPT_MAX_TOK 2048 /* --prompts: tokens per prompt at most (the rest is cut) */

typedef struct {
    engine *e;
    int n_vocab;
    float *logits;       /* (max(S, 1), n_vocab) */
    engine_tok *bt;      /* (max_batch) */
    util_rng rng;
} cmd_bench_ctx;


/* Loads the model a benchmark runs; NULL (said on stderr) when it cannot, or when it is an
 * encoder, which has no decode steps to time. */
static model *cmd_bench_load(const char *prog, const char *path)
{
    char err[512];
    model *m = NULL;
    if (model_load(path, NULL, &m, err, sizeof err) != GGUF_OK) {
        fprintf(stderr, "%s: cannot load %s: %s\n", prog, path, err);
        return NULL;
    }
    if (m->hp.bidirectional) {
        fprintf(stderr, "%s: %s: '%s' is an embedding model (no decode steps to time)\n", prog, path, m->hp.arch_name);
        model_free(m);
        return NULL;
    }
    return m;
}
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

/* prefill positions [from, to) of s in chunks of the engine batch with random tokens, or
 * with toks[from..to) when toks is not NULL; false on error */
static bool cmd_bench_fill_toks(cmd_bench_ctx *c, kvpool_seq *s, const int32_t *toks, int from, int to)
{
    int maxb = engine_max_batch(c->e);
    for (int p0 = from; p0 < to; p0 += maxb) {
        int m = TM_MIN(maxb, to - p0);
        for (int i = 0; i < m; i++)
            c->bt[i] = (engine_tok){ toks ? toks[p0 + i] : cmd_bench_tok(c), p0 + i, s, p0 + i == to - 1 };
        if (!cmd_bench_step(c, m)) return false;
    }
    return true;
}

static bool cmd_bench_fill(cmd_bench_ctx *c, kvpool_seq *s, int from, int to)
{
    return cmd_bench_fill_toks(c, s, NULL, from, to);
}

/* prefill positions [depth, depth + n) of s, whose first `depth` positions are already
 * filled (a rerun overwrites the same positions); returns seconds or -1 */
static double cmd_bench_pp(cmd_bench_ctx *c, kvpool_seq *s, int depth, int n)
{
    /* window layers keep only a ring: going back means computing the depth again (untimed) */
    if (kvpool_seq_ring_next(s) > depth + KVPOOL_RING_SPARE) {
        kvpool_seq_reset(engine_kvpool(c->e), s);
        if (!cmd_bench_fill(c, s, 0, depth)) return -1;
    }
    double t0 = util_now();
    if (!cmd_bench_fill(c, s, depth, depth + n)) return -1;
    return util_now() - t0;
}

/* --limit: the bandwidth limit measured beside each decode step rather than once for a run.
 * On a shared host the read rate moves by 2x within seconds, and a reading taken before a run
 * says little about the moments its steps ran in. */
typedef struct {
    int steps;                  /* decode steps measured */
    size_t bytes;               /* weight bytes a step reads, and each read between steps */
    double tok_s;               /* the steps' own rate (the reads not counted) */
    double read_gb_s;           /* median rate of the reads */
    double share[3];            /* quartiles (25, 50, 75 %) of a read's time over its step's */
} cmd_bench_limit_res;

/* Decodes `steps` tokens of sequence s after an untimed prompt of `prompt` tokens, and after
 * each step reads as many bytes as a step reads (model_active_weight_bytes) on the engine's own
 * threads, from a buffer of that size on huge pages like the repacked weights
 * (ops_stream_read). Each step is held against the read right after it: a step at 100 % would
 * stream its weights as fast as a bare read loop does at that moment. The read evicts what
 * the step left in the caches, which if anything slows the next step. false after a message
 * on stderr (out of memory, an engine error). */
static bool cmd_bench_limit(cmd_bench_ctx *c, kvpool_seq *s, int prompt, int steps, cmd_bench_limit_res *res)
{
    const size_t bytes = model_active_weight_bytes(engine_model(c->e)) / 64 * 64;
    char *buf = util_huge_alloc(bytes);
    double *share = xcalloc((size_t)steps, sizeof *share), *gbs = xcalloc((size_t)steps, sizeof *gbs);
    bool ok = buf != NULL;
    if (!ok) fprintf(stderr, "tokenmill bench: --limit: cannot allocate %zu bytes to read\n", bytes);
    if (ok) memset(buf, 0x5a, bytes);   /* every page in before the first read */
    kvpool_seq_reset(engine_kvpool(c->e), s);
    ok = ok && cmd_bench_fill(c, s, 0, prompt);
    double sum_step = 0;
    for (int k = 0; ok && k < steps; k++) {
        c->bt[0] = (engine_tok){ cmd_bench_tok(c), prompt + k, s, true };
        double t0 = util_now();
        if (!(ok = cmd_bench_step(c, 1))) break;
        double t1 = util_now();
        (void)ops_stream_read(engine_threadpool(c->e), buf, bytes);
        double t2 = util_now();
        sum_step += t1 - t0;
        share[k] = (t2 - t1) / (t1 - t0);
        gbs[k] = (double)bytes / (t2 - t1) * 1e-9;
    }
    if (ok) {
        util_sort_doubles(share, (size_t)steps);
        util_sort_doubles(gbs, (size_t)steps);
        *res = (cmd_bench_limit_res){ steps, bytes, steps / sum_step, gbs[steps / 2],
                                      { share[steps / 4], share[steps / 2], share[3 * steps / 4] } };
    }
    free(buf);
    free(share);
    free(gbs);
    return ok;
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

/* The engine for a run, its scratch (logits for max_s sequences, one batch) and max_s
 * sequences; false after "tokenmill PROG: why" on stderr. */
static bool cmd_bench_start(const char *prog, model *m, const engine_opts *eo, int max_s, cmd_bench_ctx *c,
                            kvpool_seq **sq)
{
    char err[512];
    engine *e = NULL;
    if (engine_new(m, eo, &e, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "tokenmill %s: %s\n", prog, err);
        return false;
    }
    *c = (cmd_bench_ctx){ .e = e, .n_vocab = m->hp.n_vocab };
    util_rng_seed(&c->rng, 1234);
    c->logits = xmalloc((size_t)max_s * (size_t)m->hp.n_vocab * sizeof(float));
    c->bt = xmalloc((size_t)engine_max_batch(e) * sizeof *c->bt);
    for (int i = 0; i < max_s; i++) sq[i] = kvpool_seq_new(engine_kvpool(e));
    return true;
}

static void cmd_bench_print_arr(const double *v, int n)
{
    putchar('[');
    for (int i = 0; i < n; i++) printf("%s%.3f", i ? ", " : "", v[i]);
    putchar(']');
}

/* "a,b,c" into out (at most max values in [lo, hi]); the count, or -1 after a message. */
static int cmd_bench_list(const char *opt, const char *z, int *out, int max, long lo, long hi)
{
    int n = 0;
    for (const char *p = z; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < lo || v > hi || (*end && *end != ',') || n == max) {
            fprintf(stderr, "tokenmill bench: %s wants at most %d numbers %ld..%ld separated by commas\n", opt, max, lo, hi);
            return -1;
        }
        out[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (!n) fprintf(stderr, "tokenmill bench: %s is empty\n", opt);
    return n ? n : -1;
}

static int cmd_bench_curves(int argc, char **argv);
static int cmd_bench_profile(int argc, char **argv);

/* Tokens each expert of each layer received since the engine started: (n_layers, n_expert). */
static void cmd_bench_moe_totals(engine *e, uint64_t *tot)
{
    const model_hparams *hp = &engine_model(e)->hp;
    for (int il = 0; il < hp->n_layers; il++)
        if (!engine_moe_load(e, il, NULL, tot + (size_t)il * hp->n_expert, NULL))
            memset(tot + (size_t)il * hp->n_expert, 0, (size_t)hp->n_expert * sizeof *tot);
}

/* The imbalance fields of counts (n_layers, n_expert) over G contiguous expert groups: per
 * layer (0 for a dense layer: nothing routed), the mean and max over the routed layers, and
 * "overall": the same figure for each group's load summed over the layers (G devices each
 * holding one group of every layer). */
static void cmd_bench_moe_imbalance(const model_hparams *hp, const uint64_t *counts, int groups)
{
    uint64_t sum_x[MODEL_MAX_EXPERTS] = { 0 };
    double sum = 0, max = 0;
    int n_routed = 0;
    printf("\"groups\": %d, \"imbalance\": [", TM_MIN(groups, hp->n_expert));
    for (int il = 0; il < hp->n_layers; il++) {
        const uint64_t *c = counts + (size_t)il * hp->n_expert;
        double im = engine_moe_imbalance(c, hp->n_expert, groups);
        printf("%s%.4f", il ? ", " : "", im);
        for (int x = 0; x < hp->n_expert; x++) sum_x[x] += c[x];
        if (im > 0) n_routed++, sum += im;
        max = im > max ? im : max;
    }
    printf("], \"imbalance_mean\": %.4f, \"imbalance_max\": %.4f, \"imbalance_overall\": %.4f",
           n_routed ? sum / n_routed : 0.0, max, engine_moe_imbalance(sum_x, hp->n_expert, groups));
}

/* A MoE model's expert figures: the weight bytes one token reads (the active experts), and
 * the imbalance of the tokens routed during the whole run (its random prompts). */
static void cmd_bench_moe(engine *e, int groups)
{
    const model *m = engine_model(e);
    const model_hparams *hp = &m->hp;
    if (hp->n_expert == 0) return;
    uint64_t *tot = xmalloc((size_t)hp->n_layers * (size_t)hp->n_expert * sizeof *tot);
    cmd_bench_moe_totals(e, tot);
    printf(", \"moe\": {\"experts\": %d, \"used\": %d, \"active_weight_bytes\": %zu, ", hp->n_expert,
           hp->n_expert_used, model_active_weight_bytes(m));
    cmd_bench_moe_imbalance(hp, tot, groups);
    putchar('}');
    free(tot);
}

/* --prompts: the file's non-empty lines (at most CMD_BENCH_MAX_PROMPTS), tokenised with the
 * model's own tokenizer and cut at CMD_BENCH_PROMPT_MAX_TOK tokens. */
typedef struct {
    int32_t *toks;               /* (n_tok) all prompts' tokens, one after the other */
    int *off;                    /* (n + 1) prompt i is toks[off[i] .. off[i + 1]) */
    int n;                       /* prompts */
    int n_tok;                   /* tokens in all */
    int max_len;                 /* tokens of the longest prompt */
} cmd_bench_prompts;

static void cmd_bench_prompts_free(cmd_bench_prompts *p)
{
    free(p->toks);
    free(p->off);
}

/* false after a message on stderr (unreadable file, no tokenizer, no prompt). */
static bool cmd_bench_prompts_load(const model *m, const char *path, cmd_bench_prompts *p)
{
    memset(p, 0, sizeof *p);
    size_t len;
    char *text = util_read_file(path, &len), err[256];
    if (!text) {
        fprintf(stderr, "tokenmill bench: cannot read --prompts %s\n", path);
        return false;
    }
    tokenizer *tok = NULL;
    if (tokenizer_load(m->g, &tok, err, sizeof err) != TOKENIZER_OK) {
        fprintf(stderr, "tokenmill bench: --prompts needs the model's tokenizer: %s\n", err);
        free(text);
        return false;
    }
    int cap = 0;
    p->off = xmalloc((CMD_BENCH_MAX_PROMPTS + 1) * sizeof *p->off);
    p->off[0] = 0;
    for (size_t i = 0; i < len && p->n < CMD_BENCH_MAX_PROMPTS;) {
        size_t j = i;
        while (j < len && text[j] != '\n') j++;
        size_t e = j;
        while (e > i && (text[e - 1] == '\r' || text[e - 1] == ' ' || text[e - 1] == '\t')) e--;
        if (e > i) {
            if (cap - p->n_tok < CMD_BENCH_PROMPT_MAX_TOK) {
                cap = TM_MAX(2 * cap, p->n_tok + CMD_BENCH_PROMPT_MAX_TOK);
                p->toks = xrealloc(p->toks, (size_t)cap * sizeof *p->toks);
            }
            int32_t n = tokenizer_encode(tok, text + i, e - i, true, false, p->toks + p->n_tok,
                                         CMD_BENCH_PROMPT_MAX_TOK);
            if (n > 0) {
                n = TM_MIN(n, CMD_BENCH_PROMPT_MAX_TOK);
                p->n_tok += n;
                p->max_len = TM_MAX(p->max_len, n);
                p->off[++p->n] = p->n_tok;
            }
        }
        i = j + 1;
    }
    tokenizer_free(tok);
    free(text);
    if (!p->n) {
        fprintf(stderr, "tokenmill bench: --prompts %s has no prompt (one per line)\n", path);
        cmd_bench_prompts_free(p);
        return false;
    }
    return true;
}

/* Prefills every prompt once (untimed) and prints "moe_prompts": the imbalance of the tokens
 * they routed (the totals' difference over the run). false on an engine error. */
static bool cmd_bench_moe_prompts(cmd_bench_ctx *c, kvpool_seq *s, const cmd_bench_prompts *p, const char *path,
                                  int groups)
{
    const model_hparams *hp = &engine_model(c->e)->hp;
    size_t nc = (size_t)hp->n_layers * (size_t)hp->n_expert;
    uint64_t *before = xmalloc(nc * sizeof *before), *after = xmalloc(nc * sizeof *after);
    cmd_bench_moe_totals(c->e, before);
    bool ok = true;
    for (int i = 0; i < p->n && ok; i++) {
        kvpool_seq_reset(engine_kvpool(c->e), s);
        ok = cmd_bench_fill_toks(c, s, p->toks + p->off[i], 0, p->off[i + 1] - p->off[i]);
    }
    if (ok) {
        cmd_bench_moe_totals(c->e, after);
        for (size_t k = 0; k < nc; k++) after[k] -= before[k];
        bytebuf b = { 0 };
        jsonfmt_write_string(&b, path, strlen(path));
        printf(", \"moe_prompts\": {\"file\": %s, \"prompts\": %d, \"tokens\": %d, ", b.p, p->n, p->n_tok);
        bytebuf_free(&b);
        cmd_bench_moe_imbalance(hp, after, groups);
        putchar('}');
    }
    free(before);
    free(after);
    return ok;
}

int cmd_bench(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "curves")) return cmd_bench_curves(argc - 1, argv + 1);
    if (argc > 1 && !strcmp(argv[1], "profile")) return cmd_bench_profile(argc - 1, argv + 1);
    const char *model_path = NULL, *seqs_arg = "1,4,16", *prompts_path = NULL, *cpus_list = NULL;
    long threads = 0, pp = 512, tg = 128, reps = 3, maxb = 512, depth = 0, groups = 8;
    bool limit = false;
    cmd_bench_limit_res lim = { 0 };
    cmd_opt place[CMD_PLACE_TABLE_N];
    const cmd_opt opts[] = {
        { "--model", "-m", CMD_OPT_STR, &model_path, .arg = "MODEL", .help = "the GGUF to time", .required = true },
        { .kind = CMD_OPT_TABLE, .dst = (void *)cmd_common_place_table(&threads, &cpus_list, place) },
        { "--pp", NULL, CMD_OPT_LONG, &pp, 0, 1 << 24, .arg = "N", .help = "prompt tokens to prefill (default 512)" },
        { "--tg", NULL, CMD_OPT_LONG, &tg, 0, 1 << 24, .arg = "N", .help = "tokens to decode (default 128)" },
        { "--seqs", NULL, CMD_OPT_STR, &seqs_arg, .arg = "S,S,..", .help = "batched decode sequence counts (default 1,4,16)" },
        { "--reps", NULL, CMD_OPT_LONG, &reps, 1, 100, .arg = "R", .help = "repetitions of each run (default 3)" },
        { "--batch", NULL, CMD_OPT_LONG, &maxb, 1, 1 << 16, .arg = "N", .help = "engine batch in tokens (default 512)" },
        { "--groups", NULL, CMD_OPT_LONG, &groups, 1, 1024, .arg = "G", .help = "MoE: expert groups of the imbalance figure (default 8)" },
        { "--prompts", NULL, CMD_OPT_STR, &prompts_path, .arg = "FILE", .help = "MoE: real prompts, one per line (bench/moe_prompts.txt): the imbalance over their tokens too" },
        { "--depth", "-d", CMD_OPT_LONG, &depth, 0, 1 << 24, .arg = "D", .help = "tokens already in the sequence before pp and tg (default 0)" },
        { "--limit", NULL, CMD_OPT_FLAG, &limit, .help = "tg again, each step followed by a read of the bytes it reads: the share of that limit (\"tg_limit\")" },
        { 0 },
    };
    const char *synopsis = "bench -m MODEL [options]: engine timings as JSON";
    cmd_opts_status ost = cmd_opts_parse("bench", synopsis, opts, argc, argv, 1, NULL, 0, NULL);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);
    int seqs[16];
    int n_seqs = cmd_bench_list("--seqs", seqs_arg, seqs, 16, 1, CMD_BENCH_MAX_SEQS);
    if (n_seqs < 0) return 2;
    model *m = cmd_bench_load("tokenmill bench", model_path);
    if (!m) return 1;
    cmd_bench_prompts prompts = { 0 };
    if (prompts_path && m->hp.n_expert > 0 && !cmd_bench_prompts_load(m, prompts_path, &prompts)) {
        model_free(m);
        return 1;
    }
    int max_s = 1;
    for (int i = 0; i < n_seqs; i++) max_s = TM_MAX(max_s, seqs[i]);
    int prompt_b = TM_MAX(CMD_BENCH_PROMPT, depth);  /* batched: each sequence's prompt */
    int blk_pp = (depth + pp + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK;
    int blk_tg = (depth + tg + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK;
    int blk_b = max_s * ((prompt_b + tg + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK);
    static int cpus[TOPO_MAX_CPUS];
    int n_threads;
    bool pinned;
    if (!cmd_common_place("bench", threads, cpus_list, &n_threads, cpus, &pinned)) {
        model_free(m);
        return 2;
    }
    engine_opts eo = { .n_threads = n_threads, .cpus = pinned ? cpus : NULL, .max_batch_tokens = TM_MAX(maxb, max_s),
                       .n_kv_blocks = TM_MAX(1, TM_MAX(blk_pp, TM_MAX(blk_tg, blk_b))) };
    eo.n_kv_blocks = TM_MAX(eo.n_kv_blocks, (prompts.max_len + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK);
    cmd_bench_ctx c;
    kvpool_seq *sq[CMD_BENCH_MAX_SEQS];
    if (!cmd_bench_start("bench", m, &eo, max_s, &c, sq)) {
        cmd_bench_prompts_free(&prompts);
        model_free(m);
        return 1;
    }
    engine *e = c.e;
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
        if (limit && !cmd_bench_limit(&c, sq[0], (int)depth, (int)tg, &lim)) goto out;
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
    putchar('}');
    if (lim.steps)
        printf(", \"tg_limit\": {\"steps\": %d, \"bytes\": %zu, \"tok_s\": %.3f, \"read_gb_s\": %.3f, \"share\": [%.4f, %.4f, %.4f]}",
               lim.steps, lim.bytes, lim.tok_s, lim.read_gb_s, lim.share[0], lim.share[1], lim.share[2]);
    printf(", \"batched\": [");
    for (int i = 0; i < n_seqs; i++) {
        printf("%s{\"seqs\": %d, \"tok_s\": ", i ? ", " : "", seqs[i]);
        cmd_bench_print_arr(b_r + i * reps, tg > 0 ? reps : 0);
        putchar('}');
    }
    printf("], \"weight_bytes\": %zu", model_weight_bytes(m));
    cmd_bench_moe(e, (int)groups);
    if (prompts.n && !cmd_bench_moe_prompts(&c, sq[0], &prompts, prompts_path, (int)groups)) goto out;
    printf("}\n");
    fflush(stdout);
    rc = 0;
out:
    for (int i = 0; i < max_s; i++) kvpool_seq_free(engine_kvpool(e), sq[i]);
    free(pp_r);
    free(tg_r);
    free(b_r);
    cmd_bench_prompts_free(&prompts);
    free(c.logits);
    free(c.bt);
    engine_free(e);
    model_free(m);
    return rc;
}

/* The curves' engine and buffers for the largest point of each sweep. */
static int cmd_bench_curves(int argc, char **argv)
{
    const char *model_path = NULL, *steps_arg = "16,32,64,128,256,512", *streams_arg = "1,2,4,8,16,32", *svg_path = NULL;
    long threads = 0, tg = 32, n_steps = 4;
    const cmd_opt opts[] = {
        { "--model", "-m", CMD_OPT_STR, &model_path, .arg = "MODEL", .help = "the GGUF to measure", .required = true },
        { "--threads", "-t", CMD_OPT_LONG, &threads, 0, 1024, .arg = "N", .help = "kernel threads (default: one per core)" },
        { "--prefill-steps", NULL, CMD_OPT_STR, &steps_arg, .arg = "P,P,..", .help = "prefill tokens per step to sweep (default 16,32,64,128,256,512)" },
        { "--steps", NULL, CMD_OPT_LONG, &n_steps, 1, 1000, .arg = "K", .help = "prefill steps timed per point (default 4)" },
        { "--streams", NULL, CMD_OPT_STR, &streams_arg, .arg = "S,S,..", .help = "concurrent decoding streams to sweep (default 1,2,4,8,16,32)" },
        { "--tg", NULL, CMD_OPT_LONG, &tg, 1, 1 << 20, .arg = "N", .help = "decode steps timed per point (default 32)" },
        { "--svg", NULL, CMD_OPT_STR, &svg_path, .arg = "PATH", .help = "also write the charts as one SVG file" },
        { 0 },
    };
    const char *synopsis = "bench curves -m MODEL [options]: prefill step size and concurrent streams against throughput and latency, as JSON (and SVG)";
    cmd_opts_status ost = cmd_opts_parse("bench curves", synopsis, opts, argc, argv, 1, NULL, 0, NULL);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);
    int psz[16], ssz[16];
    int n_p = cmd_bench_list("--prefill-steps", steps_arg, psz, 16, 1, 1 << 16);
    int n_s = cmd_bench_list("--streams", streams_arg, ssz, 16, 1, CMD_BENCH_MAX_SEQS);
    if (n_p < 0 || n_s < 0) return 2;
    model *m = cmd_bench_load("tokenmill bench curves", model_path);
    if (!m) return 1;
    int max_p = 1, max_s = 1;
    for (int i = 0; i < n_p; i++) max_p = TM_MAX(max_p, psz[i]);
    for (int i = 0; i < n_s; i++) max_s = TM_MAX(max_s, ssz[i]);
    int blk_p = (int)((max_p * n_steps + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK);
    int blk_s = max_s * (int)((CMD_BENCH_PROMPT + tg + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK);
    engine_opts eo = { .n_threads = threads, .max_batch_tokens = TM_MAX(max_p, TM_MAX(max_s, CMD_BENCH_PROMPT)),
                       .n_kv_blocks = TM_MAX(blk_p, blk_s) };
    cmd_bench_ctx c;
    kvpool_seq *sq[CMD_BENCH_MAX_SEQS];
    if (!cmd_bench_start("bench curves", m, &eo, max_s, &c, sq)) {
        model_free(m);
        return 1;
    }
    engine *e = c.e;
    double p_x[16], p_tps[16], p_ms[16], s_x[16], s_tps[16], s_user[16], s_ms[16];
    int rc = 1;
    /* (1) prefill: K steps of P tokens in one sequence, after an untimed warm-up of the same */
    for (int i = 0; i < n_p; i++) {
        int total = psz[i] * (int)n_steps;
        double t = 0;
        for (int rep = 0; rep < 2; rep++) {
            kvpool_seq_reset(engine_kvpool(e), sq[0]);
            double t0 = util_now();
            for (int p0 = 0; p0 < total; p0 += psz[i]) {
                for (int k = 0; k < psz[i]; k++)
                    c.bt[k] = (engine_tok){ cmd_bench_tok(&c), p0 + k, sq[0], p0 + k == total - 1 };
                if (!cmd_bench_step(&c, psz[i])) goto out;
            }
            t = util_now() - t0;
        }
        p_x[i] = psz[i];
        p_tps[i] = t > 0 ? total / t : 0;
        p_ms[i] = t * 1e3 / (double)n_steps;
    }
    /* (2) decode: S streams together, tg steps, after a warm-up of 4 */
    for (int i = 0; i < n_s; i++) {
        if (cmd_bench_decode(&c, sq, ssz[i], CMD_BENCH_PROMPT, 4) < 0) goto out;
        double t = cmd_bench_decode(&c, sq, ssz[i], CMD_BENCH_PROMPT, (int)tg);
        if (t < 0) goto out;
        s_x[i] = ssz[i];
        s_tps[i] = t > 0 ? (double)ssz[i] * (double)tg / t : 0;
        s_user[i] = t > 0 ? (double)tg / t : 0;
        s_ms[i] = t * 1e3 / (double)tg;
    }
    bytebuf b = { 0 };
    bytebuf_printf(&b, "{\"model\": ");
    jsonfmt_write_string(&b, model_path, strlen(model_path));
    bytebuf_printf(&b, ", \"threads\": %d, \"simd\": \"%s\", \"prefill\": [", engine_n_threads(e), ops_level_name());
    for (int i = 0; i < n_p; i++)
        bytebuf_printf(&b, "%s{\"step_tokens\": %d, \"tok_s\": %.3f, \"step_ms\": %.4f}", i ? ", " : "", psz[i], p_tps[i], p_ms[i]);
    bytebuf_puts(&b, "], \"decode\": [");
    for (int i = 0; i < n_s; i++)
        bytebuf_printf(&b, "%s{\"streams\": %d, \"tok_s\": %.3f, \"per_user_tok_s\": %.3f, \"step_ms\": %.4f}", i ? ", " : "",
                       ssz[i], s_tps[i], s_user[i], s_ms[i]);
    bytebuf_puts(&b, "]}\n");
    fwrite(b.p, 1, b.len, stdout);
    fflush(stdout);
    if (svg_path) {
        bytebuf v = { 0 };
        bytebuf_puts(&v, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"840\" height=\"440\" viewBox=\"0 0 840 440\">"
                         "<rect width=\"840\" height=\"440\" fill=\"#fff\"/><g>");
        status_svg_line(&v, "prefill_throughput", "Prefill throughput", "prefill tokens per step", "tokens/s", n_p, p_x, p_tps);
        bytebuf_puts(&v, "</g><g transform=\"translate(420 0)\">");
        status_svg_line(&v, "prefill_latency", "Prefill step latency", "prefill tokens per step", "ms per step", n_p, p_x, p_ms);
        bytebuf_puts(&v, "</g><g transform=\"translate(0 220)\">");
        status_svg_line(&v, "decode_aggregate", "Decode: aggregate tokens/s", "concurrent streams", "tokens/s", n_s, s_x, s_tps);
        bytebuf_puts(&v, "</g><g transform=\"translate(420 220)\">");
        status_svg_line(&v, "decode_per_user", "Decode: tokens/s per user", "concurrent streams", "tokens/s", n_s, s_x, s_user);
        bytebuf_puts(&v, "</g></svg>\n");
        FILE *f = fopen(svg_path, "w");
        bool ok = f && fwrite(v.p, 1, v.len, f) == v.len;
        if (f && fclose(f)) ok = false;
        bytebuf_free(&v);
        if (!ok) {
            fprintf(stderr, "tokenmill bench curves: cannot write %s\n", svg_path);
            bytebuf_free(&b);
            goto out;
        }
    }
    bytebuf_free(&b);
    rc = 0;
out:
    for (int i = 0; i < max_s; i++) kvpool_seq_free(engine_kvpool(e), sq[i]);
    free(c.logits);
    free(c.bt);
    engine_free(e);
    model_free(m);
    return rc;
}

static size_t cmd_bench_wbytes(const ops_weight *w)
{
    return w->data ? quant_row_bytes(w->type, w->cols) * (size_t)w->rows : 0;
}

/* Weight bytes a decode token reads in stage op of layer il (il == n_layers: outside). */
static size_t cmd_bench_op_bytes(const model *m, int il, engine_prof_op op)
{
    const model_dsv4 *v4 = m->dsv4;
    if (il == m->hp.n_layers)
        return op == ENGINE_PROF_OUTPUT ? cmd_bench_wbytes(&m->output)
               : op == ENGINE_PROF_OUT_NORM && v4 ? cmd_bench_wbytes(&v4->out_hc_fn) : 0;
    const model_layer *L = &m->layers[il];
    size_t own = 0;   /* V4's own matrices of this stage */
    if (v4 && (op == ENGINE_PROF_QKV || op == ENGINE_PROF_WO || op == ENGINE_PROF_HC)) {
        const model_dsv4_use use = op == ENGINE_PROF_QKV ? MODEL_DSV4_USE_ATT_IN
                                   : op == ENGINE_PROF_WO ? MODEL_DSV4_USE_ATT_OUT
                                                          : MODEL_DSV4_USE_HC;
        model_dsv4_mat dm[MODEL_DSV4_LAYER_MATS];
        int nd = model_dsv4_layer_matrices(m->dsv4, il, dm);
        for (int i = 0; i < nd; i++)
            if (dm[i].use == use) own += cmd_bench_wbytes(dm[i].w);
    }
    switch (op) {
    case ENGINE_PROF_QKV:
        return cmd_bench_wbytes(&L->wq) + cmd_bench_wbytes(&L->wk) + cmd_bench_wbytes(&L->wv) +
               cmd_bench_wbytes(&L->wq_a) + cmd_bench_wbytes(&L->wq_b) + cmd_bench_wbytes(&L->wkv_a) +
               cmd_bench_wbytes(&L->wk_b) + own;
    case ENGINE_PROF_WO: return cmd_bench_wbytes(&L->wo) + cmd_bench_wbytes(&L->wv_b) + own;
    case ENGINE_PROF_FFN_UP: return cmd_bench_wbytes(&L->gate) + cmd_bench_wbytes(&L->up);
    case ENGINE_PROF_FFN_DOWN: return cmd_bench_wbytes(&L->down);
    case ENGINE_PROF_HC: return own;
    case ENGINE_PROF_MOE: {   /* the router, the used share of the routed experts, the shared ones */
        if (!L->gate_inp.data) return 0;
        size_t ex = cmd_bench_wbytes(&L->gate_exps) + cmd_bench_wbytes(&L->up_exps) + cmd_bench_wbytes(&L->down_exps);
        return cmd_bench_wbytes(&L->gate_inp) + ex / (size_t)m->hp.n_expert * (size_t)m->hp.n_expert_used +
               cmd_bench_wbytes(&L->gate_shexp) + cmd_bench_wbytes(&L->up_shexp) + cmd_bench_wbytes(&L->down_shexp);
    }
    default: return 0;
    }
}

static int cmd_bench_profile(int argc, char **argv)
{
    const char *model_path = NULL, *cpus_list = NULL;
    long threads = 0, tg = 64, depth = 32;
    bool json = false, limit = false;
    cmd_bench_limit_res lim = { 0 };
    cmd_opt place[CMD_PLACE_TABLE_N];
    const cmd_opt opts[] = {
        { "--model", "-m", CMD_OPT_STR, &model_path, .arg = "MODEL", .help = "the GGUF to profile", .required = true },
        { .kind = CMD_OPT_TABLE, .dst = (void *)cmd_common_place_table(&threads, &cpus_list, place) },
        { "--tg", NULL, CMD_OPT_LONG, &tg, 1, 1 << 20, .arg = "N", .help = "decode steps profiled (default 64)" },
        { "--depth", "-d", CMD_OPT_LONG, &depth, 0, 1 << 20, .arg = "D", .help = "prompt tokens before them (default 32)" },
        { "--json", NULL, CMD_OPT_FLAG, &json, .help = "print JSON instead of the table" },
        { "--limit", NULL, CMD_OPT_FLAG, &limit, .help = "then the steps again, each followed by a read of the bytes it reads: the share of that limit" },
        { 0 },
    };
    const char *synopsis = "bench profile -m MODEL [options]: where a single-sequence decode step spends its time";
    cmd_opts_status ost = cmd_opts_parse("bench profile", synopsis, opts, argc, argv, 1, NULL, 0, NULL);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);
    model *m = cmd_bench_load("tokenmill bench profile", model_path);
    if (!m) return 1;
    const int nl = m->hp.n_layers;
    static int cpus[TOPO_MAX_CPUS];
    int n_threads;
    bool pinned;
    if (!cmd_common_place("bench profile", threads, cpus_list, &n_threads, cpus, &pinned)) {
        model_free(m);
        return 2;
    }
    engine_opts eo = { .n_threads = n_threads, .cpus = pinned ? cpus : NULL, .max_batch_tokens = 512,
                       .n_kv_blocks = (int)((depth + tg + 16 + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK) };
    cmd_bench_ctx c;
    kvpool_seq *sq[1];
    if (!cmd_bench_start("bench profile", m, &eo, 1, &c, sq)) {
        model_free(m);
        return 1;
    }
    engine *e = c.e;
    int rc = 1;
    double wall = 0;
    /* an untimed warm-up of 16 steps, then the prompt again and the profiled steps */
    if (cmd_bench_decode(&c, sq, 1, (int)depth, 16) < 0) goto out;
    kvpool_seq_reset(engine_kvpool(e), sq[0]);
    if (!cmd_bench_fill(&c, sq[0], 0, (int)depth)) goto out;
    if (!engine_profile(e, true)) {
        fprintf(stderr, "tokenmill bench profile: out of memory\n");
        goto out;
    }
    double t0 = util_now();
    for (int k = 0; k < tg; k++) {
        c.bt[0] = (engine_tok){ cmd_bench_tok(&c), (int)depth + k, sq[0], true };
        if (!cmd_bench_step(&c, 1)) goto out;
    }
    wall = util_now() - t0;
    engine_profile(e, false);
    if (limit && !cmd_bench_limit(&c, sq[0], (int)depth, (int)tg, &lim)) goto out;

    int64_t n_steps;
    const engine_prof_cell *cells = engine_profile_cells(e, &n_steps);
    const int nth = engine_n_threads(e);
    engine_prof_cell tot[ENGINE_PROF_N] = { 0 };
    size_t bytes[ENGINE_PROF_N] = { 0 };
    double sum_s = 0;
    for (int il = 0; il <= nl; il++)
        for (int op = 0; op < ENGINE_PROF_N; op++) {
            const engine_prof_cell *x = &cells[(size_t)il * ENGINE_PROF_N + op];
            tot[op].s += x->s, tot[op].work_s += x->work_s, tot[op].wake_s += x->wake_s;
            tot[op].barrier_s += x->barrier_s, tot[op].rounds += x->rounds, tot[op].calls += x->calls;
            bytes[op] += cmd_bench_op_bytes(m, il, op);
            sum_s += x->s;
        }
    const double per = 1.0 / (double)n_steps;
    size_t wb = model_active_weight_bytes(m);
    bytebuf b = { 0 };
    if (json) {
        bytebuf_puts(&b, "{\"model\": ");
        jsonfmt_write_string(&b, model_path, strlen(model_path));
        bytebuf_printf(&b, ", \"threads\": %d, \"simd\": \"%s\", \"depth\": %ld, \"steps\": %lld, \"step_ms\": %.4f, "
                       "\"staged_ms\": %.4f, \"weight_bytes\": %zu, \"ops\": [",
                       nth, ops_level_name(), depth, (long long)n_steps, wall * 1e3 / tg, sum_s * 1e3 * per, wb);
        bool first = true;
        for (int op = 0; op < ENGINE_PROF_N; op++) {
            const engine_prof_cell *x = &tot[op];
            if (!x->calls) continue;
            double ts = x->s * nth;
            bytebuf_printf(&b, "%s{\"op\": \"%s\", \"ms\": %.4f, \"share\": %.4f, \"rounds\": %.2f, \"bytes\": %zu, "
                           "\"gb_s\": %.3f, \"work\": %.4f, \"wake\": %.4f, \"barrier\": %.4f}",
                           first ? "" : ", ", engine_prof_op_name(op), x->s * 1e3 * per, sum_s > 0 ? x->s / sum_s : 0,
                           (double)x->rounds * per, bytes[op], x->s > 0 ? (double)bytes[op] / (x->s * per) * 1e-9 : 0,
                           ts > 0 ? (x->rounds ? x->work_s - x->barrier_s : x->s) / ts : 0, ts > 0 ? x->wake_s / ts : 0,
                           ts > 0 ? x->barrier_s / ts : 0);
            first = false;
        }
        bytebuf_puts(&b, "]");
        if (lim.steps)
            bytebuf_printf(&b, ", \"limit\": {\"steps\": %d, \"bytes\": %zu, \"tok_s\": %.3f, \"read_gb_s\": %.3f, "
                           "\"share\": [%.4f, %.4f, %.4f]}",
                           lim.steps, lim.bytes, lim.tok_s, lim.read_gb_s, lim.share[0], lim.share[1], lim.share[2]);
        bytebuf_puts(&b, ", \"layers\": [");
        for (int il = 0; il <= nl; il++) {
            double ls = 0;
            for (int op = 0; op < ENGINE_PROF_N; op++) ls += cells[(size_t)il * ENGINE_PROF_N + op].s;
            if (il < nl) bytebuf_printf(&b, "%s{\"layer\": %d", il ? ", " : "", il);
            else bytebuf_puts(&b, ", {\"layer\": \"outside\"");
            bytebuf_printf(&b, ", \"ms\": %.4f, \"ops\": {", ls * 1e3 * per);
            first = true;
            for (int op = 0; op < ENGINE_PROF_N; op++) {
                const engine_prof_cell *x = &cells[(size_t)il * ENGINE_PROF_N + op];
                if (!x->calls) continue;
                bytebuf_printf(&b, "%s\"%s\": %.4f", first ? "" : ", ", engine_prof_op_name(op), x->s * 1e3 * per);
                first = false;
            }
            bytebuf_puts(&b, "}}");
        }
        bytebuf_puts(&b, "]}\n");
    } else {
        bytebuf_printf(&b, "%s: %d threads, %s, %lld decode steps after %ld tokens: %.3f ms/token (%.1f tokens/s), "
                       "%.3f ms in the stages\n",
                       model_path, nth, ops_level_name(), (long long)n_steps, depth, wall * 1e3 / tg, tg / wall,
                       sum_s * 1e3 * per);
        bytebuf_printf(&b, "weights read per token: %.1f MB, %.2f GB/s over the whole step\n", wb * 1e-6,
                       (double)wb / (wall / tg) * 1e-9);
        if (lim.steps)
            bytebuf_printf(&b, "--limit: %d steps again (%.1f tokens/s), each followed by a read of %.1f MB on the same threads "
                           "(median %.1f GB/s): a step streams at %.1f %% of the read after it (quartiles %.1f-%.1f %%)\n",
                           lim.steps, lim.tok_s, lim.bytes * 1e-6, lim.read_gb_s, 100 * lim.share[1], 100 * lim.share[0],
                           100 * lim.share[2]);
        bytebuf_puts(&b, "\n");
        bytebuf_puts(&b, "stage        ms/token  share  rounds   GB/s   work   wake  barrier  idle\n");
        for (int op = 0; op < ENGINE_PROF_N; op++) {
            const engine_prof_cell *x = &tot[op];
            if (!x->calls) continue;
            double ts = x->s * nth, work = ts > 0 ? (x->rounds ? x->work_s - x->barrier_s : x->s) / ts : 0;
            double wake = ts > 0 ? x->wake_s / ts : 0, bar = ts > 0 ? x->barrier_s / ts : 0;
            bytebuf_printf(&b, "%-12s %8.3f %5.1f%% %7.1f ", engine_prof_op_name(op), x->s * 1e3 * per,
                           sum_s > 0 ? 100 * x->s / sum_s : 0, (double)x->rounds * per);
            if (bytes[op]) bytebuf_printf(&b, "%6.1f ", (double)bytes[op] / (x->s * per) * 1e-9);
            else bytebuf_puts(&b, "     - ");
            bytebuf_printf(&b, "%5.1f%% %5.1f%% %6.1f%% %5.1f%%\n", 100 * work, 100 * wake, 100 * bar,
                           100 * TM_MAX(0.0, 1 - work - wake - bar));
        }
        bytebuf_puts(&b, "\nper layer, ms/token:");
        for (int il = 0; il < nl; il++) {
            double ls = 0;
            for (int op = 0; op < ENGINE_PROF_N; op++) ls += cells[(size_t)il * ENGINE_PROF_N + op].s;
            bytebuf_printf(&b, "%s%d: %.3f", il % 8 ? "  " : "\n  ", il, ls * 1e3 * per);
        }
        bytebuf_puts(&b, "\n");
    }
    fwrite(b.p, 1, b.len, stdout);
    fflush(stdout);
    bytebuf_free(&b);
    rc = 0;
out:
    kvpool_seq_free(engine_kvpool(e), sq[0]);
    free(c.logits);
    free(c.bt);
    engine_free(e);
    model_free(m);
    return rc;
}
