// llama_driver: what the C++ drivers of the prebuilt libllama (tests/oracle/*_llama.cpp, built
// by oracle_common.mjs's llamaDriver) share: a fatal message, the argmax and log-probability
// of a logits row, the comma-separated prompt argument, the batch rows of sequence 0, the
// library's start-up (its log silenced unless the driver's log variable is set; the CPU
// backends from -DLIBDIR) and the context every driver compares under.
#ifndef TM_LLAMA_DRIVER_H
#define TM_LLAMA_DRIVER_H

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ggml-backend.h"
#include "llama.h"

static const char *drv_name = "llama_driver";

static void die(const char *m) { fprintf(stderr, "%s: %s\n", drv_name, m); exit(1); }

static int argmax(const float *l, int n) {
    int b = 0;
    for (int i = 1; i < n; i++) if (l[i] > l[b]) b = i;
    return b;
}

static double logprob(const float *l, int n, int t) {
    double mx = l[argmax(l, n)], s = 0;
    for (int i = 0; i < n; i++) s += exp((double)l[i] - mx);
    return (double)l[t] - mx - log(s);
}

// "1,2,3" -> tokens
static std::vector<llama_token> drv_tokens(char *p) {
    std::vector<llama_token> toks;
    while (*p) {
        toks.push_back((llama_token)strtol(p, &p, 10));
        if (*p == ',') p++;
    }
    return toks;
}

// row i of b: token t (where b carries tokens: an embeddings batch has none) at pos in
// sequence 0, its logits wanted or not
static void drv_batch_set(llama_batch &b, int i, llama_token t, llama_pos pos, bool logits) {
    if (b.token) b.token[i] = t;
    b.pos[i] = pos;
    b.n_seq_id[i] = 1;
    b.seq_id[i][0] = 0;
    b.logits[i] = logits;
}

// b := toks[from..) at their positions in sequence 0, the logits of the last only; their count
static int drv_batch_fill(llama_batch &b, const std::vector<llama_token> &toks, int from) {
    const int n = (int)toks.size() - from;
    b.n_tokens = n;
    for (int i = 0; i < n; i++) drv_batch_set(b, i, toks[from + i], from + i, i == n - 1);
    return n;
}

// the library up, quiet unless getenv(log_var) is set (drv_name set first: die's prefix)
static void drv_init(const char *log_var) {
    if (!getenv(log_var)) llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    ggml_backend_load_all_from_path(LIBDIR);   // the prebuilt CPU backends (-DLIBDIR=...)
}

// The drivers' context: 1024 positions, one sequence in ubatches of up to 512, one thread (a
// loaded test machine descheduled the second at every barrier), F32 KV cache and flash
// attention off (oracle_arch's setting)
static llama_context_params drv_ctx_params() {
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 1024;
    cp.n_batch = cp.n_ubatch = 512;
    cp.n_seq_max = 1;
    cp.n_threads = cp.n_threads_batch = 1;
    cp.type_k = cp.type_v = GGML_TYPE_F32;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
    return cp;
}

#endif
