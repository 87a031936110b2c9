/*
 * cmd_run: `tokenmill run`: generate text from a prompt and stream it to stdout.
 *
 * The prompt is tokenised with the model's own rules (BOS prepended when the model asks for
 * it; control-token text in the prompt is plain text), prefilled in chunks of the engine's
 * batch size, and then tokens are sampled one at a time until an end-of-generation token,
 * N generated tokens, or the context is full.
 *
 * -n N counts GENERATED tokens (the prompt and BOS excluded), as llama.cpp's -n does. With an
 * empty prompt this equals llama2.c's `-n` steps, whose loop runs from the BOS at position 0
 * and prints one token per step: `run -p "" --temp 0 -n 200` prints the same 200 tokens as
 * llama2.c's `run stories260K.bin -t 0 -n 200`.
 *
 * After generation one line goes to stderr: prompt tokens and their tokens/s (prefill), then
 * generated tokens and their tokens/s (from the end of prefill to the last token).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "cli/cmd_opts.h"
#include "engine/engine.h"
#include "engine/sample.h"
#include "model/model.h"
#include "recipe/tokenizer.h"
#include "util/util.h"

int cmd_run(int argc, char **argv)
{
    const char *model_path = NULL, *prompt = NULL;
    long n_gen = 256, threads = 0, ctx = 0;
    cmd_opt_u64 seed = { 0 };
    sample_params sp = sample_params_default();
    const cmd_opt opts[] = {
        { "--model", "-m", CMD_OPT_STR, &model_path, .arg = "MODEL", .help = "the GGUF", .required = true },
        { "--prompt", "-p", CMD_OPT_STR, &prompt, .arg = "PROMPT", .help = "the text to continue (\"\" starts from BOS)", .required = true },
        { "--n-predict", "-n", CMD_OPT_LONG, &n_gen, 0, 1e9, .arg = "N", .help = "tokens to generate (default 256; the prompt is not counted)" },
        { "--temp", NULL, CMD_OPT_FLOAT, &sp.temp, 0, 1e9, .arg = "T", .help = "temperature, 0 = greedy (default 0.8)" },
        { "--top-k", NULL, CMD_OPT_INT, &sp.top_k, 0, 1e9, .arg = "K", .help = "default 40" },
        { "--top-p", NULL, CMD_OPT_FLOAT, &sp.top_p, 0, 1, .arg = "P", .help = "default 0.95" },
        { "--min-p", NULL, CMD_OPT_FLOAT, &sp.min_p, 0, 1, .arg = "P", .help = "default 0.05" },
        { "--repeat-penalty", NULL, CMD_OPT_FLOAT, &sp.repeat_penalty, 0, 1e9, .arg = "R", .help = "default 1 (off)" },
        { "--repeat-last-n", NULL, CMD_OPT_INT, &sp.penalty_last_n, 0, 1e6, .arg = "N", .help = "penalty window (default 64)" },
        { "--presence-penalty", NULL, CMD_OPT_FLOAT, &sp.presence_penalty, -1e9, 1e9, .arg = "P", .help = "default 0" },
        { "--frequency-penalty", NULL, CMD_OPT_FLOAT, &sp.frequency_penalty, -1e9, 1e9, .arg = "F", .help = "default 0" },
        { "--seed", NULL, CMD_OPT_U64, &seed, .arg = "S", .help = "same seed, same text (default: from the clock)" },
        { "--threads", "-t", CMD_OPT_LONG, &threads, 1, 1024, .arg = "N", .help = "kernel threads (default: one per core)" },
        { "--ctx", "-c", CMD_OPT_LONG, &ctx, 1, 1 << 24, .arg = "N", .help = "context size in tokens (default: the model's, at most 4096)" },
        { 0 },
    };
    const char *synopsis = "run -m MODEL -p PROMPT [options]: generate text";
    cmd_opts_status ost = cmd_opts_parse("run", synopsis, opts, argc, argv, 1, NULL, 0, NULL);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);
    sp.seed = seed.given ? seed.value : (uint64_t)(util_now() * 1e9);

    char err[512];
    model *m = NULL;
    tokenizer *tok = NULL;
    engine *e = NULL;
    sampler *smp = NULL;
    kvpool_seq *seq = NULL;
    int32_t *toks = NULL;
    float *logits = NULL;
    int rc = 1;
    if (model_load(model_path, NULL, &m, err, sizeof err) != GGUF_OK) {
        fprintf(stderr, "tokenmill run: cannot load %s: %s\n", model_path, err);
        return 1;
    }
    if (tokenizer_load(m->g, &tok, err, sizeof err) != TOKENIZER_OK) {
        fprintf(stderr, "tokenmill run: %s: vocabulary: %s\n", model_path, err);
        goto out;
    }
    if (m->hp.bidirectional) {
        fprintf(stderr, "tokenmill run: %s: '%s' is an embedding model (no text to generate): serve it and ask "
                "/v1/embeddings\n", model_path, m->hp.arch_name);
        goto out;
    }
    int n_ctx = ctx > 0 ? (int)ctx : TM_MIN(m->hp.n_ctx_train, 4096);
    engine_opts eo = { .n_threads = (int)threads, .n_kv_blocks = (n_ctx + KVPOOL_BLOCK - 1) / KVPOOL_BLOCK };
    if (engine_new(m, &eo, &e, err, sizeof err) != ENGINE_OK) {
        fprintf(stderr, "tokenmill run: %s\n", err);
        goto out;
    }
    size_t plen = strlen(prompt);
    int32_t n_prompt = tokenizer_encode(tok, prompt, plen, true, false, NULL, 0);
    if (n_prompt < 0) {
        fprintf(stderr, "tokenmill run: cannot tokenize the prompt\n");
        goto out;
    }
    if (n_prompt == 0) {
        fprintf(stderr, "tokenmill run: the prompt is empty and the model has no BOS token\n");
        goto out;
    }
    if (n_prompt >= n_ctx) {
        fprintf(stderr, "tokenmill run: the prompt has %d tokens, the context %d\n", n_prompt, n_ctx);
        goto out;
    }
    int n_total = n_prompt + (int)n_gen;
    if (n_total > n_ctx) n_total = n_ctx;
    toks = xmalloc((size_t)(n_total + 1) * sizeof *toks);
    tokenizer_encode(tok, prompt, plen, true, false, toks, n_prompt);
    int n_vocab = m->hp.n_vocab;
    logits = xmalloc((size_t)n_vocab * sizeof *logits);
    smp = sample_new(n_vocab, &sp);
    for (int i = 0; i < n_prompt; i++) sample_accept(smp, toks[i]);
    kvpool *kv = engine_kvpool(e);
    seq = kvpool_seq_new(kv);

    /* prefill */
    int maxb = engine_max_batch(e);
    engine_tok *bt = xmalloc((size_t)maxb * sizeof *bt);
    double t0 = util_now();
    for (int p0 = 0; p0 < n_prompt; p0 += maxb) {
        int n = TM_MIN(maxb, n_prompt - p0);
        for (int i = 0; i < n; i++)
            bt[i] = (engine_tok){ .token = toks[p0 + i], .pos = p0 + i, .seq = seq,
                                  .want_logits = p0 + i == n_prompt - 1 };
        engine_batch b = { n, bt };
        engine_status st = engine_step(e, &b, logits);
        if (st != ENGINE_OK) {
            fprintf(stderr, "tokenmill run: prefill: %s\n", engine_status_name(st));
            free(bt);
            goto out;
        }
    }
    double t1 = util_now();

    /* generation */
    tokenizer_stream ts;
    tokenizer_stream_init(&ts, tok);
    ts.prev = toks[n_prompt - 1];  /* the stream drops the space prefix right after BOS */
    size_t cap = tokenizer_max_piece(tok) + 8;
    char *piece = xmalloc(cap);
    int n_done = 0;
    int pos = n_prompt;
    while (pos < n_total) {
        int32_t next = sample_token(smp, logits);
        if (tokenizer_is_eog(tok, next)) break;
        sample_accept(smp, next);
        toks[pos] = next;
        n_done++;
        size_t np = tokenizer_stream_push(&ts, next, piece, cap);
        if (np) {
            fwrite(piece, 1, np, stdout);
            fflush(stdout);
        }
        if (pos + 1 >= n_total) break;
        engine_tok one = { .token = next, .pos = pos, .seq = seq, .want_logits = true };
        engine_batch b = { 1, &one };
        engine_status st = engine_step(e, &b, logits);
        if (st != ENGINE_OK) {
            fprintf(stderr, "\ntokenmill run: decode: %s\n", engine_status_name(st));
            free(piece);
            free(bt);
            goto out;
        }
        pos++;
    }
    size_t np = tokenizer_stream_flush(&ts, piece, cap);
    if (np) fwrite(piece, 1, np, stdout);
    fflush(stdout);
    double t2 = util_now();
    fprintf(stderr, "\nprompt: %d tokens, %.2f tokens/s | generation: %d tokens, %.2f tokens/s | seed %llu, %d threads\n",
            n_prompt, n_prompt / TM_MAX(t1 - t0, 1e-9), n_done, n_done / TM_MAX(t2 - t1, 1e-9),
            (unsigned long long)sp.seed, engine_n_threads(e));
    free(piece);
    free(bt);
    rc = 0;
out:
    if (seq) kvpool_seq_free(engine_kvpool(e), seq);
    sample_free(smp);
    engine_free(e);
    tokenizer_free(tok);
    model_free(m);
    free(toks);
    free(logits);
    return rc;
}
