// dump_llama: every F32 tensor llama.cpp's graph computes for one prompt, written to a folder,
// for finding the first op where tokenmill and llama.cpp part (docs/architectures.md's Gemma 4
// section shows it used). Not run by the tests; built by hand against the prebuilt libllama as
// oracle_common.mjs's llamaDriver builds the others:
//
//   B=$(realpath node_modules/@node-llama-cpp/linux-x64/bins/linux-x64)
//   g++ -O1 -std=c++17 -DLIBDIR="\"$B\"" -Itests/data/llama.cpp/include
//     -Itests/data/llama.cpp/ggml/include tests/oracle/dump_llama.cpp -o dump_llama -L$B
//     -l:libllama.v0.4.0.so -l:libggml.v0.4.0.so -l:libggml-base.so -Wl,-rpath,$B   (one line)
//   dump_llama MODEL.gguf TOK,TOK,... DIR
//
// One sequence in one ubatch at positions 0..n-1, one thread, F32 KV cache, flash attention
// off (oracle_arch's setting). Each contiguous F32 tensor the eval callback sees becomes
// DIR/NAME#K.bin (NAME the graph's name with '/' and ' ' as '_', K counting repeats of a
// name): its four int64 dims ne[0..3], then its floats in ggml's order (ne[0] fastest).
// DIR/logits_all.bin holds every position's logits, n_vocab floats each.
#include <cstring>
#include <map>
#include <string>

#include "ggml.h"
#include "llama_driver.h"

static std::string dump_dir;
static std::map<std::string, int> dump_seen;

static bool dump_tensor(struct ggml_tensor *t, bool ask, void *) {
    if (ask) return true;   // every tensor
    if (t->type != GGML_TYPE_F32 || !ggml_is_contiguous(t)) return true;
    std::string n = t->name;
    for (auto &c : n) if (c == '/' || c == ' ') c = '_';
    const std::string f = dump_dir + "/" + n + "#" + std::to_string(dump_seen[n]++) + ".bin";
    FILE *fp = fopen(f.c_str(), "wb");
    if (!fp) die("cannot write into the dump folder");
    std::vector<float> buf(ggml_nelements(t));
    ggml_backend_tensor_get(t, buf.data(), 0, ggml_nbytes(t));
    const int64_t ne[4] = {t->ne[0], t->ne[1], t->ne[2], t->ne[3]};
    fwrite(ne, sizeof ne, 1, fp);
    fwrite(buf.data(), sizeof(float), buf.size(), fp);
    fclose(fp);
    return true;
}

int main(int argc, char **argv) {
    drv_name = "dump_llama";
    if (argc != 4) die("usage: MODEL TOKENS DIR");
    dump_dir = argv[3];
    std::vector<llama_token> toks = drv_tokens(argv[2]);
    if (toks.empty() || toks.size() > 512) die("1..512 tokens");
    drv_init("DUMP_LLAMA_LOG");
    llama_model *m = llama_model_load_from_file(argv[1], llama_model_default_params());
    if (!m) die("cannot load the model");
    llama_context_params cp = drv_ctx_params();
    cp.cb_eval = dump_tensor;
    llama_context *c = llama_init_from_model(m, cp);
    if (!c) die("cannot make a context");
    llama_batch b = llama_batch_init((int)toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); i++) drv_batch_set(b, (int)i, toks[i], (llama_pos)i, true);
    b.n_tokens = (int)toks.size();
    if (llama_decode(c, b)) die("decode failed");
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(m));
    FILE *fp = fopen((dump_dir + "/logits_all.bin").c_str(), "wb");
    if (!fp) die("cannot write into the dump folder");
    for (size_t i = 0; i < toks.size(); i++) fwrite(llama_get_logits_ith(c, (int)i), sizeof(float), n_vocab, fp);
    fclose(fp);
    llama_batch_free(b);
    llama_free(c);
    llama_model_free(m);
    return 0;
}
