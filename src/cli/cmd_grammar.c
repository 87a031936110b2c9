/*
 * cmd_grammar: `tokenmill grammar print|check|sample`: the structured-output compiler and
 * matcher from the command line, for tests and tools.
 *
 *   grammar print  (--schema F | --regex R | --gbnf F | --json)   the GBNF it compiles to
 *   grammar check  (...) --input DOCS.json    DOCS.json is a JSON array of strings (the
 *                  documents' text); prints a JSON array of booleans: accepted or not
 *   grammar sample -m MODEL (...) [-n N] [--max-tokens T] [--temp T] [--seed S] [--prompt P]
 *                  N constrained generations through the scheduler, all in flight at once;
 *                  prints a JSON array of {"text", "finish", "tokens"}. Without a grammar
 *                  option the generations are unconstrained (to compare).
 *   grammar bench  -m MODEL|VOCAB (...) [-n DOCS] [--max-tokens T] [--seed S]
 *                  the matcher alone (no model compute): DOCS documents one after another,
 *                  each token drawn uniformly from the allowed ones (as a random-weight model
 *                  at temperature 1 does), the time of each mask; prints JSON: per-token mask
 *                  microseconds (mean, p50, p99, max) overall, for the first document (cold
 *                  memos) and for the second half of the documents (warm), by the wall clock
 *                  (mask*) and in CPU time (cpu*), tokens, documents completed.
 *
 * A grammar that does not compile is exit status 1 with "tokenmill grammar: <why>".
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <jansson.h>

#include "cli/cmd.h"
#include "cli/cmd_common.h"
#include "cli/cmd_opts.h"
#include "engine/sched.h"
#include "grammar/grammar.h"
#include "util/jsonfmt.h"
#include "util/util.h"

typedef struct {
    const char *schema, *regex, *gbnf;  /* file, text, file */
    bool json;
} cmd_grammar_src;

/* Compiles the grammar the options name; *g NULL when none was given. Returns false after a
 * message. */
static bool cmd_grammar_load(const cmd_grammar_src *o, grammar **g, char **gbnf_out, bool stats)
{
    *g = NULL;
    int n = !!o->schema + !!o->regex + !!o->gbnf + o->json;
    if (n > 1) {
        fprintf(stderr, "tokenmill grammar: give one of --schema, --regex, --gbnf, --json\n");
        return false;
    }
    if (n == 0) return true;
    grammar_kind kind = o->schema ? GRAMMAR_KIND_SCHEMA : o->regex ? GRAMMAR_KIND_REGEX
                      : o->gbnf ? GRAMMAR_KIND_GBNF : GRAMMAR_KIND_JSON;
    char *text = NULL;
    size_t len = 0;
    if (o->schema || o->gbnf) {
        const char *path = o->schema ? o->schema : o->gbnf;
        text = util_read_file(path, &len);
        if (!text) {
            fprintf(stderr, "tokenmill grammar: cannot read %s\n", path);
            return false;
        }
    } else if (o->regex) {
        text = xstrdup(o->regex);
        len = strlen(text);
    } else text = xstrdup("");
    char err[512] = "";
    grammar_status st;
    bool ok = true;
    if (gbnf_out) {
        *gbnf_out = grammar_to_gbnf(kind, text, len, &st, err, sizeof err);
        if (!*gbnf_out) ok = false;
        else fputs(*gbnf_out, stdout);  /* before compiling: shows what a compile error is about */
    }
    double t0 = util_now();
    if (ok && grammar_compile(kind, text, len, g, err, sizeof err) != GRAMMAR_OK) ok = false;
    if (ok && stats)
        fprintf(stderr, "compiled in %.3f ms: %d rules\n", (util_now() - t0) * 1e3, grammar_n_rules(*g));
    if (!ok) fprintf(stderr, "tokenmill grammar: %s\n", err);
    free(text);
    return ok;
}

static int cmd_grammar_check(grammar *g, const char *input)
{
    json_error_t je;
    json_t *docs = json_load_file(input, 0, &je);
    if (!docs || !json_is_array(docs)) {
        fprintf(stderr, "tokenmill grammar: %s: %s\n", input, docs ? "not a JSON array" : je.text);
        json_decref(docs);
        return 1;
    }
    size_t i;
    json_t *d;
    printf("[");
    json_array_foreach(docs, i, d) {
        if (!json_is_string(d)) {
            fprintf(stderr, "tokenmill grammar: %s: element %zu is not a string\n", input, i);
            json_decref(docs);
            return 1;
        }
        bool ok = grammar_accepts(g, json_string_value(d), json_string_length(d));
        printf("%s%s", i ? "," : "", ok ? "true" : "false");
    }
    printf("]\n");
    json_decref(docs);
    return 0;
}

static int cmd_grammar_sample(grammar *g, const char *model_path, const char *prompt, long n,
                              long max_tokens, const sample_params *sp, cmd_engine_opts *eo, bool stats)
{
    model *m = NULL;
    tokenizer *tok = NULL;
    if (!cmd_common_load_model("grammar", model_path, &m, &tok)) return 1;
    int rc = 1;
    engine *e = NULL;
    sched *s = NULL;
    grammar_vocab *v = NULL;
    sched_req **reqs = xcalloc((size_t)n, sizeof *reqs);
    int32_t *ptoks = NULL;
    eo->max_seqs = TM_MAX(eo->max_seqs, TM_MIN(n, 16));
    e = cmd_common_engine_new("grammar", m, eo);
    if (!e) goto out;
    sched_opts so = cmd_common_sched_opts(eo, NULL, tok);
    if (sched_new(e, &so, &s) != SCHED_OK) {
        fprintf(stderr, "tokenmill grammar: cannot start the scheduler\n");
        goto out;
    }
    v = tokenizer_grammar_vocab(tok);
    size_t plen = strlen(prompt);
    int32_t np = tokenizer_encode(tok, prompt, plen, true, false, NULL, 0);
    if (np <= 0) {
        fprintf(stderr, "tokenmill grammar: the prompt has no tokens\n");
        goto out;
    }
    ptoks = xmalloc((size_t)np * sizeof *ptoks);
    tokenizer_encode(tok, prompt, plen, true, false, ptoks, np);
    double t_start = util_now();
    for (long i = 0; i < n; i++) {
        sched_params p = { .prompt = ptoks, .n_prompt = np, .sample = *sp, .max_tokens = (int)max_tokens,
                           .grammar = g, .grammar_vocab = v };
        p.sample.seed = sp->seed + (uint64_t)i;
        sched_status st = sched_submit(s, &p, &reqs[i]);
        if (st != SCHED_OK) {
            fprintf(stderr, "tokenmill grammar: submit: %s\n", sched_status_name(st));
            goto out;
        }
    }
    bytebuf out = { 0 };
    bytebuf text = { 0 };
    long long n_total = 0;
    int cap = (int)tokenizer_max_piece(tok) + 8;
    char *piece = xmalloc((size_t)cap);
    bytebuf_putc(&out, '[');
    for (long i = 0; i < n; i++) {
        text.len = 0;
        int n_tok = 0;
        sched_finish fin = SCHED_FINISH_NONE;
        sched_output o[16];
        while (!sched_done(reqs[i])) {
            int k = sched_poll(reqs[i], o, 16, -1);
            for (int j = 0; j < k; j++) {
                if (o[j].kind == SCHED_OUT_FINISH) fin = o[j].finish;
                else if (!o[j].is_stop) {
                    int len = tokenizer_token_to_piece(tok, o[j].token, piece, cap, false);
                    if (len > 0 && len <= cap) bytebuf_append(&text, piece, (size_t)len);
                    n_tok++;
                    n_total++;
                }
            }
        }
        if (i) bytebuf_putc(&out, ',');
        bytebuf_puts(&out, "{\"text\":");
        jsonfmt_write_string(&out, text.p ? text.p : "", text.len);
        char tail[96];
        snprintf(tail, sizeof tail, ",\"finish\":\"%s\",\"tokens\":%d}", sched_finish_name(fin), n_tok);
        bytebuf_puts(&out, tail);
    }
    bytebuf_puts(&out, "]\n");
    fwrite(out.p, 1, out.len, stdout);
    if (stats) fprintf(stderr, "decode: %lld tokens in %.3f s\n", n_total, util_now() - t_start);
    if (g && stats) {
        uint64_t n_hit, n_comp;
        double walk_s;
        grammar_match_stats(g, &n_hit, &n_comp, &walk_s);
        fprintf(stderr, "masks: %llu from the cache, %llu computed (%.1f us each on average, %d tokens)\n",
                (unsigned long long)n_hit, (unsigned long long)n_comp, n_comp ? walk_s / (double)n_comp * 1e6 : 0.0,
                grammar_vocab_n(v));
    }
    bytebuf_free(&out);
    bytebuf_free(&text);
    free(piece);
    rc = 0;
out:
    for (long i = 0; i < n; i++)
        if (reqs[i]) sched_release(reqs[i]);
    free(reqs);
    free(ptoks);
    if (s) sched_free(s);
    grammar_vocab_free(v);
    engine_free(e);
    tokenizer_free(tok);
    model_free(m);
    return rc;
}

/* Mean, p50, p99 and max of v[0..n) in microseconds as JSON fields (v is sorted). */
static void cmd_grammar_dist(bytebuf *b, const char *name, double *v, long n)
{
    double sum = 0;
    for (long i = 0; i < n; i++) sum += v[i];
    util_sort_doubles(v, (size_t)n);
    bytebuf_printf(b, "\"%s\":{\"mean_us\":%.2f,\"p50_us\":%.2f,\"p99_us\":%.2f,\"max_us\":%.2f}", name,
                   n ? sum / (double)n * 1e6 : 0.0, n ? v[n / 2] * 1e6 : 0.0, n ? v[(n * 99) / 100] * 1e6 : 0.0,
                   n ? v[n - 1] * 1e6 : 0.0);
}

/* This thread's CPU seconds: on a shared machine the work a mask took, where the wall
 * clock also counts the time other processes held the core. */
static double cmd_grammar_cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmd_grammar_bench(grammar *g, const char *vocab_path, long n_docs, long max_tokens, uint64_t seed)
{
    tokenizer *tok;
    if (!cmd_common_load_vocab("grammar", vocab_path, &tok)) return 1;
    double t0 = util_now();
    grammar_vocab *v = tokenizer_grammar_vocab(tok);
    double vocab_s = util_now() - t0;
    int n_vocab = grammar_vocab_n(v);
    int32_t stop = tokenizer_eos(tok);
    uint32_t *mask = xmalloc(((size_t)n_vocab + 31) / 32 * sizeof *mask);
    double *dt = xmalloc((size_t)(n_docs * max_tokens) * sizeof *dt);
    double *dc = xmalloc((size_t)(n_docs * max_tokens) * sizeof *dc);  /* CPU seconds */
    long n = 0, n_first = 0, n_half = 0, n_complete = 0;
    util_rng rng;
    util_rng_seed(&rng, seed);
    for (long d = 0; d < n_docs; d++) {
        grammar_match *m = grammar_match_new(g, v, &stop, stop >= 0);
        for (long k = 0; k < max_tokens; k++) {
            double a = util_now(), ac = cmd_grammar_cpu_now();
            int n_allowed = grammar_match_mask(m, mask);
            dc[n] = cmd_grammar_cpu_now() - ac;
            dt[n++] = util_now() - a;
            if (n_allowed <= 0) break;
            long pick = (long)(util_rng_uniform(&rng) * n_allowed), t = -1;
            for (int w = 0; t < 0; w++) {  /* the pick-th allowed token */
                int c = __builtin_popcount(mask[w]);
                if (pick >= c) {
                    pick -= c;
                    continue;
                }
                uint32_t bits = mask[w];
                while (pick--) bits &= bits - 1;
                t = 32L * w + __builtin_ctz(bits);
            }
            if (t == stop) {
                n_complete++;
                break;
            }
            grammar_match_accept(m, (int32_t)t);
        }
        grammar_match_free(m);
        if (d == 0) n_first = n;
        if (d == (n_docs - 1) / 2) n_half = n;
    }
    double *part = xmalloc((size_t)(n ? n : 1) * sizeof *part);
    bytebuf b = {0};
    bytebuf_printf(&b, "{\"n_vocab\":%d,\"vocab_ms\":%.1f,\"documents\":%ld,\"completed\":%ld,\"tokens\":%ld,", n_vocab,
                   vocab_s * 1e3, n_docs, n_complete, n);
    /* wall clock, then CPU time; all documents, the first (cold), the second half (warm) */
    const char *names[2][3] = { { "mask", "mask_first_document", "mask_second_half" },
                                { "cpu", "cpu_first_document", "cpu_second_half" } };
    for (int c = 0; c < 2; c++) {
        const double *src = c ? dc : dt;
        long from[3] = { 0, 0, n_half }, to[3] = { n, n_first, n };
        for (int k = 0; k < 3; k++) {
            memcpy(part, src + from[k], (size_t)(to[k] - from[k]) * sizeof *part);
            if (c || k) bytebuf_putc(&b, ',');
            cmd_grammar_dist(&b, names[c][k], part, to[k] - from[k]);
        }
    }
    bytebuf_puts(&b, "}\n");
    fwrite(b.p, 1, b.len, stdout);
    bytebuf_free(&b);
    free(part);
    free(dc);
    free(dt);
    free(mask);
    grammar_vocab_free(v);
    tokenizer_free(tok);
    return 0;
}

int cmd_grammar(int argc, char **argv)
{
    cmd_grammar_src src = { 0 };
    bool stats = false;
    const char *input = NULL, *model_path = NULL, *prompt = "";
    long n = 1, max_tokens = 256;
    cmd_opt_u64 seed = { 0 };
    sample_params sp = sample_params_default();
    sp.temp = 1.0f;
    sp.top_k = 0;
    sp.top_p = 1.0f;
    sp.min_p = 0.0f;
    cmd_engine_opts eo = CMD_ENGINE_OPTS_DEFAULT;
    eo.max_seqs = 1;
    eo.ctx = 2048;
    cmd_opt gram[CMD_GRAMMAR_TABLE_N];
    grammar_limits gl = grammar_limits_get();
    const cmd_opt opts[] = {
        { "--schema", NULL, CMD_OPT_STR, &src.schema, .arg = "FILE", .help = "a JSON Schema" },
        { "--regex", NULL, CMD_OPT_STR, &src.regex, .arg = "RE", .help = "a regular expression (matched in full)" },
        { "--gbnf", NULL, CMD_OPT_STR, &src.gbnf, .arg = "FILE", .help = "a GBNF grammar (llama.cpp syntax, start rule root)" },
        { "--json", NULL, CMD_OPT_FLAG, &src.json, .help = "a JSON object (response_format json_object)" },
        { "--input", NULL, CMD_OPT_STR, &input, .arg = "DOCS.json", .help = "check: a JSON array of documents (strings)" },
        { "--model", "-m", CMD_OPT_STR, &model_path, .arg = "MODEL", .help = "sample: the GGUF; bench: a GGUF with the vocabulary" },
        { "--prompt", "-p", CMD_OPT_STR, &prompt, .arg = "TEXT", .help = "sample: the prompt (default: empty, BOS only)" },
        { "--samples", "-n", CMD_OPT_LONG, &n, 1, 1024, .arg = "N", .help = "sample: generations; bench: documents (default 1)" },
        { "--max-tokens", NULL, CMD_OPT_LONG, &max_tokens, 1, 1 << 20, .arg = "N", .help = "sample: tokens per generation (default 256)" },
        { "--temp", NULL, CMD_OPT_FLOAT, &sp.temp, 0, 1e9, .arg = "T", .help = "sample: temperature (default 1; 0 greedy; no top-k/p, min-p)" },
        { "--seed", NULL, CMD_OPT_U64, &seed, .arg = "S", .help = "sample: seed of the first generation (+1 per next)" },
        { "--threads", "-t", CMD_OPT_LONG, &eo.threads, 1, 1024, .arg = "N", .help = "sample: kernel threads" },
        { "--ctx", "-c", CMD_OPT_LONG, &eo.ctx, 16, 1 << 20, .arg = "N", .help = "sample: context per sequence (default 2048)" },
        { "--stats", NULL, CMD_OPT_FLAG, &stats, .help = "timings on stderr: compile; sample: decode and mask work" },
        { .kind = CMD_OPT_TABLE, .dst = (void *)cmd_common_grammar_table(&gl, gram) },
        { 0 },
    };
    const char *synopsis = "grammar print|check|sample|bench (--schema F | --regex R | --gbnf F | --json) [options]";
    const char *pos[1];
    int n_pos = 0;
    cmd_opts_status ost = cmd_opts_parse("grammar", synopsis, opts, argc, argv, 1, pos, 1, &n_pos);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);
    grammar_limits_set(&gl);
    const char *what = n_pos ? pos[0] : "";
    bool is_print = !strcmp(what, "print"), is_check = !strcmp(what, "check"), is_sample = !strcmp(what, "sample");
    bool is_bench = !strcmp(what, "bench");
    if (!is_print && !is_check && !is_sample && !is_bench) {
        fprintf(stderr, "tokenmill grammar: say print, check, sample or bench\n");
        cmd_opts_hint("grammar", synopsis);
        return 2;
    }
    if (is_check && !input) {
        fprintf(stderr, "tokenmill grammar: check needs --input DOCS.json\n");
        return 2;
    }
    if ((is_sample || is_bench) && !model_path) {
        fprintf(stderr, "tokenmill grammar: %s needs -m MODEL\n", what);
        return 2;
    }
    if (!is_sample && !src.schema && !src.regex && !src.gbnf && !src.json) {
        fprintf(stderr, "tokenmill grammar: give one of --schema, --regex, --gbnf, --json\n");
        return 2;
    }
    sp.seed = seed.given ? seed.value : 0;
    grammar *g;
    char *gbnf = NULL;
    if (!cmd_grammar_load(&src, &g, is_print ? &gbnf : NULL, stats)) return 1;
    int rc;
    if (is_print) rc = 0;  /* printed by cmd_grammar_load */
    else if (is_check) rc = cmd_grammar_check(g, input);
    else if (is_bench) rc = g ? cmd_grammar_bench(g, model_path, n, max_tokens, sp.seed) : 2;
    else rc = cmd_grammar_sample(g, model_path, prompt, n, max_tokens, &sp, &eo, stats);
    free(gbnf);
    grammar_free(g);
    return rc;
}
