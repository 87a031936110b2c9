/*
 * fuzz_gguf: the GGUF reader on arbitrary files. The bytes become an in-memory file that
 * gguf_open maps; when it opens, every accessor is walked (keys of each type, arrays, string
 * arrays, tensors' first and last data bytes), then the vocabulary and the model loaders
 * (tokenizer_load, template_detect, model_load) read what they need from it. After a
 * successful open no accessor may read past the mapping; a loader must refuse, not crash.
 */
#include "fuzz.h"

#include "model/gguf.h"
#include "model/model.h"
#include "recipe/template.h"
#include "recipe/tokenizer.h"

static fuzz_file file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    fuzz_file_init(&file, "fuzz_gguf");
    return 0;
}

static volatile uint8_t sink;

static void walk(const gguf *g)
{
    for (int ki = 0; ki < gguf_n_keys(g); ki++) {
        const char *key = gguf_key_name(g, ki);
        if (gguf_find_key(g, key) < 0) abort();   /* a listed key is found by name */
        int64_t iv;
        double fv;
        bool bv;
        const char *s;
        size_t len;
        gguf_get_int(g, key, &iv);
        gguf_get_float(g, key, &fv);
        gguf_get_bool(g, key, &bv);
        if (gguf_get_str(g, key, &s, &len) && len) sink ^= (uint8_t)(s[0] ^ s[len - 1]);
        gguf_vtype elt;
        uint64_t n;
        const void *p;
        if (!gguf_get_arr(g, key, &elt, &n, &p)) continue;
        if (elt == GGUF_VT_STRING) {
            for (uint64_t i = 0; i < n && i < 256; i++)
                if (gguf_arr_str(g, key, i, &s, &len) && len) sink ^= (uint8_t)(s[0] ^ s[len - 1]);
            gguf_arr_str(g, key, n, &s, &len);   /* one past the end: refused */
        } else if (n && p) {
            sink ^= *(const uint8_t *)p;
        }
    }
    for (int i = 0; i < gguf_n_tensors(g); i++) {
        const gguf_tensor *t = gguf_tensor_at(g, i);
        if (gguf_find_tensor(g, t->name) == NULL) abort();
        if (t->nbytes) sink ^= (uint8_t)(((const uint8_t *)t->data)[0] ^ ((const uint8_t *)t->data)[t->nbytes - 1]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_file_set(&file, data, size);
    char err[256];
    gguf *g;
    if (gguf_open(file.path, &g, err, sizeof err) != GGUF_OK) return 0;
    walk(g);
    tokenizer *tok;
    if (tokenizer_load(g, &tok, err, sizeof err) == TOKENIZER_OK) {
        template_detect(tok, g);
        int32_t ids[64];
        tokenizer_encode(tok, "Hello world <|im_end|>", 22, true, true, ids, 64);
        tokenizer_free(tok);
    }
    gguf_close(g);
    model *m;
    if (model_load(file.path, NULL, &m, err, sizeof err) == GGUF_OK) model_free(m);
    return 0;
}
