// dflash_llama: llama.cpp's own DFlash / DSpark drafting (the prebuilt library of the pinned
// node-llama-cpp, called through its C API as common/speculative.cpp's draft-dflash and
// draft-dspark do), for the oracle tests. node-llama-cpp's JavaScript API cannot feed a
// drafter the target's layer inputs (an embeddings batch into a second context that borrows
// the target's embedding and head through ctx_other), so this calls the library directly.
//
//   dflash_llama TARGET.gguf DRAFT.gguf N_DRAFT ROUNDS TOK,TOK,... dspark|dflash
//
// Round 0 runs the prompt through the target (extracting the inputs of the drafter's target
// layers), injects them into the drafter at positions 0..n-1, and drafts a block after the
// target's greedy next token (anchor-first for a drafter with a Markov head, as draft-dspark;
// [last, mask...] otherwise, as draft-dflash). Each later round accepts the target's greedy
// token and the drafts it agrees with (one token at least, then whatever the target's own
// greedy choices confirm, up to the block), removes the draft's block from the drafter's KV
// and injects the accepted positions, as a server does after verification. Every round
// prints one JSON line: the anchor token, its position, and per drafted slot the argmax token
// of the (Markov-biased) logits, its log-probability, and the confidence head's value (-1
// without one). A drafter whose width is not the target's is refused by llama.cpp's loader
// (fc's shape), which this reports as "cannot load the models" (DFLASH_LLAMA_LOG=1 shows why).
// F32 KV caches, flash attention off (the comparison is then free of f16 K/V).
// Built against the library's headers in tests/data/llama.cpp as docs/spec.md shows; the
// ext functions are C++ symbols declared in src/llama-ext.h.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama_driver.h"

void llama_set_embeddings_nextn(struct llama_context *ctx, bool value, bool masked);
float *llama_get_embeddings_nextn(struct llama_context *ctx);
void llama_set_embeddings_layer_inp(struct llama_context *ctx, uint32_t lid, bool value);
float *llama_get_embeddings_layer_inp(struct llama_context *ctx, uint32_t lid);
const int32_t *llama_model_target_layer_ids(const struct llama_model *model);
uint32_t llama_model_target_layer_ids_n(const struct llama_model *model);

int main(int argc, char **argv) {
    drv_name = "dflash_llama";
    if (argc != 7) die("usage: TARGET DRAFT N_DRAFT ROUNDS TOKENS dspark|dflash");
    int n_draft = atoi(argv[3]), rounds = atoi(argv[4]);
    std::vector<llama_token> toks = drv_tokens(argv[5]);
    drv_init("DFLASH_LLAMA_LOG");
    llama_model_params mp = llama_model_default_params();
    llama_model *mt = llama_model_load_from_file(argv[1], mp);
    llama_model *md = llama_model_load_from_file(argv[2], mp);
    if (!mt || !md) die("cannot load the models");
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(mt));
    const int n_embd_t = llama_model_n_embd(mt), n_embd_d = llama_model_n_embd(md);
    const int32_t *tl = llama_model_target_layer_ids(md);
    const int n_tl = (int)llama_model_target_layer_ids_n(md);
    const llama_token mask = llama_vocab_mask(llama_model_get_vocab(md));
    // draft-dspark when the file has a Markov head (the caller says so: speculative.cpp looks
    // for markov_w1.weight), with its anchor-first block unless sample_from_anchor is false
    const bool dspark = !strcmp(argv[6], "dspark");
    bool anchor = true;
    char buf[64];
    if (llama_model_meta_val_str(md, "dflash.sample_from_anchor", buf, sizeof buf) >= 0) anchor = !strcmp(buf, "true");
    // without the confidence head the nextn rows hold no confidence (zeros): print -1
    const bool has_conf = llama_model_meta_val_str(md, "dflash.has_confidence_head", buf, sizeof buf) >= 0 &&
                          !strcmp(buf, "true");

    llama_context_params cp = drv_ctx_params();
    llama_context *ct = llama_init_from_model(mt, cp);
    if (!ct) die("target context");
    for (int k = 0; k < n_tl; k++) llama_set_embeddings_layer_inp(ct, (uint32_t)tl[k], true);
    llama_context_params cd = cp;
    cd.ctx_other = ct;
    llama_context *cx = llama_init_from_model(md, cd);
    if (!cx) die("draft context");
    llama_set_embeddings_nextn(cx, true, true);
    llama_set_causal_attn(cx, false);

    const int n_enc = n_tl * n_embd_t;
    llama_batch bt = llama_batch_init(512, 0, 1), bi = llama_batch_init(512, n_enc, 1), bd = llama_batch_init(64, 0, 1);
    // target step over toks[from..), then the drafter's injection of those positions
    auto feed = [&](int from) -> llama_token {
        const int n = drv_batch_fill(bt, toks, from);
        if (llama_decode(ct, bt)) die("target decode");
        llama_token next = argmax(llama_get_logits_ith(ct, n - 1), n_vocab);
        bi.n_tokens = n;
        for (int k = 0; k < n_tl; k++) {
            const float *src = llama_get_embeddings_layer_inp(ct, (uint32_t)tl[k]);
            for (int i = 0; i < n; i++)
                memcpy(bi.embd + (size_t)i * n_enc + (size_t)k * n_embd_t, src + (size_t)i * n_embd_t,
                       (size_t)n_embd_t * sizeof(float));
        }
        for (int i = 0; i < n; i++) drv_batch_set(bi, i, 0, from + i, false);
        if (llama_decode(cx, bi)) die("draft injection");
        return next;
    };
    llama_token last = feed(0);
    for (int r = 0; r < rounds; r++) {
        const int n = (int)toks.size();
        const int n_block = n_draft + (dspark && anchor ? 0 : 1);
        bd.n_tokens = n_block;
        for (int i = 0; i < n_block; i++) drv_batch_set(bd, i, i == 0 ? last : mask, n + i, true);
        if (llama_decode(cx, bd)) die("draft decode");
        const float *conf = llama_get_embeddings_nextn(cx);
        std::string out = "{\"round\":" + std::to_string(r) + ",\"pos\":" + std::to_string(n) +
                          ",\"anchor\":" + std::to_string(last) + ",\"slots\":[";
        std::vector<llama_token> drafts;
        for (int i = (dspark && anchor) ? 0 : 1; i < n_block; i++) {
            const float *l = llama_get_logits_ith(cx, i);
            int t = argmax(l, n_vocab);
            double c = dspark && has_conf && conf ? conf[(size_t)i * n_embd_d] : -1.0;
            char s[160];
            snprintf(s, sizeof s, "%s{\"token\":%d,\"logprob\":%.6f,\"conf\":%.6f}", drafts.empty() ? "" : ",", t,
                     logprob(l, n_vocab, t), c);
            out += s;
            drafts.push_back(t);
        }
        printf("%s]}\n", out.c_str());
        fflush(stdout);
        // the draft block leaves the drafter's KV; the target verifies greedily
        llama_memory_seq_rm(llama_get_memory(cx), 0, n, -1);
        toks.push_back(last);
        int from = n;
        last = feed(from);
        for (size_t j = 0; j < drafts.size() && drafts[j] == last && (int)toks.size() < 900; j++) {
            toks.push_back(last);
            last = feed((int)toks.size() - 1);
        }
    }
    llama_batch_free(bt);
    llama_batch_free(bi);
    llama_batch_free(bd);
    llama_free(cx);
    llama_free(ct);
    llama_model_free(md);
    llama_model_free(mt);
    return 0;
}
