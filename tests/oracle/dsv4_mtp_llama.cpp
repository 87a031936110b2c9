// dsv4_mtp_llama: llama.cpp's own DeepSeek V4 MTP drafting (the prebuilt library of the pinned
// node-llama-cpp, called through its C API as common/speculative.cpp's draft-mtp does with a
// separate MTP file: a draft context of type LLAMA_CONTEXT_TYPE_MTP on the MTP-only model,
// loaded with load_mtp), for the oracle test. node-llama-cpp's JavaScript API has no MTP
// context and cannot pass a batch holding both tokens and states, so this calls the library.
//
//   dsv4_mtp_llama TARGET.gguf MTP.gguf N_DRAFT ROUNDS TOK,TOK,...
//
// As draft-mtp's process(): every target step's positions are decoded by the MTP context too,
// entry p being token p with the target's h_nextn row of position p - 1 (the residual streams
// after the last layer, hc * n_embd; zeros for p = 0). A round drafts N_DRAFT tokens as its
// draft(): the target's greedy token at n_past with the streams of the position before, then
// each drafted token with the MTP context's own h_nextn row. Each later round accepts the
// target's greedy token and the drafts it agrees with (as dflash_llama does); the drafted rows
// leave the MTP context's KV first. One JSON line per round, tokenmill eval's format:
// {"seq":0,"round","pos","anchor","slots":[{"token","logprob","conf":-1}...]}.
// F32 KV caches, flash attention off. Built against the library's headers in
// tests/data/llama.cpp; the ext functions are C++ symbols declared in src/llama-ext.h.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama_driver.h"

void llama_set_embeddings_nextn(struct llama_context *ctx, bool value, bool masked);
float *llama_get_embeddings_nextn(struct llama_context *ctx);
float *llama_get_embeddings_nextn_ith(struct llama_context *ctx, int32_t i);

int main(int argc, char **argv) {
    drv_name = "dsv4_mtp_llama";
    if (argc != 6) die("usage: TARGET MTP N_DRAFT ROUNDS TOKENS");
    int n_draft = atoi(argv[3]), rounds = atoi(argv[4]);
    std::vector<llama_token> toks = drv_tokens(argv[5]);
    drv_init("DSV4_MTP_LLAMA_LOG");
    llama_model_params mp = llama_model_default_params();
    llama_model *mt = llama_model_load_from_file(argv[1], mp);
    llama_model_params mpd = mp;
    mpd.load_mtp = true;
    llama_model *md = llama_model_load_from_file(argv[2], mpd);
    if (!mt || !md) die("cannot load the models");
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(mt));
    const int H = llama_model_n_embd_out(mt);
    if (H != llama_model_n_embd_out(md)) die("the MTP file's state width is not the target's");

    llama_context_params cp = drv_ctx_params();
    llama_context *ct = llama_init_from_model(mt, cp);
    if (!ct) die("target context");
    llama_set_embeddings_nextn(ct, true, false);
    llama_context_params cd = cp;
    cd.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
    cd.ctx_other = ct;
    llama_context *cx = llama_init_from_model(md, cd);
    if (!cx) die("MTP context");
    llama_set_embeddings_nextn(cx, true, true);

    llama_batch bt = llama_batch_init(512, 0, 1), bm = llama_batch_init(512, H, 1);
    bm.token = (llama_token *)malloc(sizeof(llama_token) * 512);   // the MTP batch has both
    std::vector<float> pend(H, 0.0f);
    // target step over toks[from..), then the MTP context's catch-up of those positions
    auto feed = [&](int from) -> llama_token {
        const int n = drv_batch_fill(bt, toks, from);
        if (llama_decode(ct, bt)) die("target decode");
        llama_token next = argmax(llama_get_logits_ith(ct, n - 1), n_vocab);
        const float *h = llama_get_embeddings_nextn(ct);
        llama_memory_seq_rm(llama_get_memory(cx), 0, from, -1);
        drv_batch_fill(bm, toks, from);
        for (int i = 0; i < n; i++)
            memcpy(bm.embd + (size_t)i * H, i == 0 ? pend.data() : h + (size_t)(i - 1) * H, (size_t)H * sizeof(float));
        memcpy(pend.data(), h + (size_t)(n - 1) * H, (size_t)H * sizeof(float));
        if (llama_decode(cx, bm)) die("MTP catch-up");
        return next;
    };
    llama_token last = feed(0);
    for (int r = 0; r < rounds; r++) {
        const int n = (int)toks.size();
        std::string out = "{\"seq\":0,\"round\":" + std::to_string(r) + ",\"pos\":" + std::to_string(n) +
                          ",\"anchor\":" + std::to_string(last) + ",\"slots\":[";
        std::vector<llama_token> drafts;
        std::vector<float> h(pend);
        for (int j = 0; j < n_draft; j++) {
            bm.n_tokens = 1;
            drv_batch_set(bm, 0, j ? drafts.back() : last, n + j, true);
            memcpy(bm.embd, h.data(), (size_t)H * sizeof(float));
            if (llama_decode(cx, bm)) die("MTP draft");
            const float *l = llama_get_logits_ith(cx, 0);
            int t = argmax(l, n_vocab);
            memcpy(h.data(), llama_get_embeddings_nextn_ith(cx, 0), (size_t)H * sizeof(float));
            char s[160];
            snprintf(s, sizeof s, "%s{\"token\":%d,\"logprob\":%.6f,\"conf\":-1}", j ? "," : "", t,
                     logprob(l, n_vocab, t));
            out += s;
            drafts.push_back(t);
        }
        printf("%s]}\n", out.c_str());
        fflush(stdout);
        toks.push_back(last);
        last = feed(n);
        for (size_t j = 0; j < drafts.size() && drafts[j] == last && (int)toks.size() < 900; j++) {
            toks.push_back(last);
            last = feed((int)toks.size() - 1);
        }
    }
    free(bm.token);
    bm.token = nullptr;
    llama_batch_free(bt);
    llama_batch_free(bm);
    llama_free(cx);
    llama_free(ct);
    llama_model_free(md);
    llama_model_free(mt);
    return 0;
}
