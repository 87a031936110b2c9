/*
 * fuzz_tokenizer: tokenizer_encode on arbitrary bytes, over the vocabularies made once at
 * start: models/stories260K.gguf (SentencePiece) and, when scripts/fetch-testdata.sh has run,
 * llama.cpp's test vocabularies of the BPE pre-tokenizers we implement. The first input byte
 * picks the vocabulary and the flags (add_special, parse_special); the rest is the text.
 *
 * Checks beyond the sanitizers: every id is inside the vocabulary; the count is the same
 * whatever the output capacity; and, for valid UTF-8 encoded without special tokens, the
 * pieces decode back to the text (SentencePiece may add one leading space) when the vocabulary
 * has a token for every byte (falcon's and starcoder's lack some: text made of those bytes is
 * dropped, as llama.cpp drops it).
 */
#include "fuzz.h"

#include "model/gguf.h"
#include "recipe/tokenizer.h"
#include "recipe/api.h"
#include "util/unicode.h"

#define VOCABS "tests/data/llama.cpp/models/ggml-vocab-"

static const char *const paths[] = {
    "models/stories260K.gguf",
    VOCABS "llama-spm.gguf",
    VOCABS "qwen2.gguf",
    VOCABS "llama-bpe.gguf",
    VOCABS "deepseek-llm.gguf",
    VOCABS "deepseek-coder.gguf",
    VOCABS "gpt-2.gguf",
    VOCABS "phi-3.gguf",
    VOCABS "starcoder.gguf",
    VOCABS "falcon.gguf",
    VOCABS "command-r.gguf",
};
#define N_PATHS (int)(sizeof paths / sizeof paths[0])

static gguf *files[N_PATHS];
static tokenizer *toks[N_PATHS];
static bool lossless[N_PATHS];   /* the vocabulary has a token for every byte */
static int n_toks;

static bool has_every_byte(const tokenizer *tok)
{
    for (int b = 0; b < 256; b++) {
        char s[8];
        int n = tokenizer_get_kind(tok) == TOKENIZER_KIND_SPM ? snprintf(s, sizeof s, "<0x%02X>", b)
                                                               : unicode_encode(unicode_byte_to_cpt((uint8_t)b), s);
        if (tokenizer_find(tok, s, (size_t)n) < 0) return false;
    }
    return true;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    for (int i = 0; i < N_PATHS; i++) {
        char err[256];
        if (access(paths[i], R_OK) != 0) continue;
        if (gguf_open(paths[i], &files[n_toks], err, sizeof err) != GGUF_OK) fuzz_die(paths[i], err);
        if (tokenizer_load(files[n_toks], &toks[n_toks], err, sizeof err) != TOKENIZER_OK) {
            gguf_close(files[n_toks]);   /* a pre-tokenizer we do not implement */
            continue;
        }
        lossless[n_toks] = has_every_byte(toks[n_toks]);
        n_toks++;
    }
    if (n_toks == 0) fuzz_die("no vocabulary", paths[0]);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    int vi = (data[0] >> 2) % n_toks;
    const tokenizer *tok = toks[vi];
    bool add_special = data[0] & 1, parse_special = data[0] & 2;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;

    int32_t small[8];
    int32_t n = tokenizer_encode(tok, text, len, add_special, parse_special, small, 8);
    if (n < 0) abort();   /* any bytes are text */
    int32_t *ids = malloc(((size_t)n + 1) * sizeof *ids);
    if (tokenizer_encode(tok, text, len, add_special, parse_special, ids, n) != n) abort();
    int32_t n_vocab = tokenizer_n_vocab(tok);
    for (int32_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= n_vocab) abort();

    /* plain text round trip */
    if (lossless[vi] && !add_special && !parse_special && unicode_utf8_valid(text, len)) {
        size_t cap = len + 16 + (size_t)n * 8, out = 0;
        char *buf = malloc(cap);
        bool fits = true;
        for (int32_t i = 0; i < n && fits; i++) {
            int k = tokenizer_token_to_piece(tok, ids[i], buf + out, (int)(cap - out), false);
            if (k < 0) abort();
            if ((size_t)k > cap - out) fits = false;
            else out += (size_t)k;
        }
        size_t skip = tokenizer_get_kind(tok) == TOKENIZER_KIND_SPM && out == len + 1 && buf[0] == ' ' ? 1 : 0;
        if (!fits || out - skip != len || memcmp(buf + skip, text, len)) {
            fprintf(stderr, "tokenizer: %zu bytes of text decode to %zu bytes\n", len, out);
            abort();
        }
        free(buf);
    }
    free(ids);
    return 0;
}
