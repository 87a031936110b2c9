/*
 * fuzz_template: the chat template renderer on conversations built from the input, for every
 * built-in family over a vocabulary that has its special tokens (qwen2's for the ChatML
 * families, llama-bpe's for llama3, deepseek-llm's for the DeepSeek families and, with V4's
 * ｜DSML｜ added, the template e2e test's vocab-deepseek4 for deepseek4-flash-0731, stories260K
 * for plain; files that are absent are skipped).
 *
 * Input: byte 0 picks the family, byte 1 holds the flags (bit 0: add_generation_prompt,
 * bits 1-2: thinking default/off/on); the rest is records separated by 0xFF (a byte no UTF-8
 * text holds). A record's first byte is the operation, the rest its payload; payload fields
 * are separated by 0xFE:
 *   0 turn(role byte)   1 text   2 reasoning   3 tool call(name, arguments)
 *   4 tool result(content)   5 tool definition(name, description, parameters)
 * A payload that is not valid UTF-8 is dropped, as the APIs (jansson) never let one through.
 *
 * Checks beyond the sanitizers: the ids are inside the vocabulary and decode (control tokens
 * rendered) to exactly the rendered text.
 */
#include "fuzz.h"

#include "model/gguf.h"
#include "recipe/api.h"
#include "recipe/conv.h"
#include "recipe/template.h"
#include "util/unicode.h"
#include "recipe/tokenizer.h"

#define VOCABS "tests/data/llama.cpp/models/ggml-vocab-"

static const struct {
    const char *path;
    const char *family;
} families[] = {
    { "models/stories260K.gguf", "plain" },
    { VOCABS "qwen2.gguf", "qwen3" },
    { VOCABS "qwen2.gguf", "qwen2.5" },
    { VOCABS "qwen2.gguf", "qwen2" },
    { VOCABS "qwen2.gguf", "chatml" },
    { VOCABS "llama-bpe.gguf", "llama3" },
    { VOCABS "deepseek-llm.gguf", "deepseek3" },
    { VOCABS "deepseek-llm.gguf", "deepseek-r1" },
    { "tests/data/gen/vocab-gptoss.gguf", "harmony" },  /* made by the template e2e test */
    { VOCABS "deepseek-llm.gguf", "deepseek4" },
    { "tests/data/gen/vocab-deepseek4.gguf", "deepseek4-flash-0731" },  /* with ｜DSML｜: the template e2e test's */
};
#define N_FAMILIES (int)(sizeof families / sizeof families[0])

typedef struct {
    const char *path;      /* vocabulary file */
    gguf *g;
    tokenizer *tok;
} vocab;

static vocab vocabs[N_FAMILIES];
static int n_vocabs;
static template *tmpls[N_FAMILIES];
static const tokenizer *tmpl_tok[N_FAMILIES];
static int n_tmpls;

static const tokenizer *vocab_get(const char *path)
{
    for (int i = 0; i < n_vocabs; i++)
        if (!strcmp(vocabs[i].path, path)) return vocabs[i].tok;
    if (access(path, R_OK) != 0) return NULL;
    char err[256];
    vocab *v = &vocabs[n_vocabs];
    v->path = path;
    if (gguf_open(path, &v->g, err, sizeof err) != GGUF_OK || tokenizer_load(v->g, &v->tok, err, sizeof err) != TOKENIZER_OK)
        fuzz_die(path, err);
    n_vocabs++;
    return v->tok;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    fuzz_quiet();
    for (int i = 0; i < N_FAMILIES; i++) {
        const tokenizer *tok = vocab_get(families[i].path);
        if (!tok) continue;
        char err[256];
        if (template_new(tok, NULL, families[i].family, &tmpls[n_tmpls], err, sizeof err) != TEMPLATE_OK)
            fuzz_die(families[i].family, err);
        tmpl_tok[n_tmpls++] = tok;
    }
    if (n_tmpls == 0) fuzz_die("no vocabulary", families[0].path);
    return 0;
}

/* The next 0xFE-separated field of [*p, end); advances *p past it. */
static size_t field(const uint8_t **p, const uint8_t *end, const char **out)
{
    const uint8_t *s = *p, *q = memchr(s, 0xFE, (size_t)(end - s));
    if (!q) q = end;
    *out = (const char *)s;
    *p = q < end ? q + 1 : end;
    return (size_t)(q - s);
}

static void record(conv *c, const uint8_t *p, size_t n, int *n_calls)
{
    if (n == 0) return;
    int op = p[0] % 6;
    const uint8_t *s = p + 1, *end = p + n;
    if (!unicode_utf8_valid((const char *)s, (size_t)(end - s)) && op != 0) return;
    if (op != 0 && op != 5 && c->n_turns == 0) conv_add_turn(c, CONV_ROLE_USER);
    const char *a, *b, *d;
    size_t la, lb, ld;
    char id[32];
    switch (op) {
    case 0: conv_add_turn(c, s < end ? (conv_role)(*s % 5) : CONV_ROLE_USER); break;
    case 1: conv_add_text(c, (const char *)s, (size_t)(end - s)); break;
    case 2: conv_add_reasoning(c, (const char *)s, (size_t)(end - s)); break;
    case 3:
        la = field(&s, end, &a);
        lb = field(&s, end, &b);
        snprintf(id, sizeof id, "call_%d", (*n_calls)++);
        conv_add_tool_call(c, id, conv_strdup(c, a, la), b, lb);
        break;
    case 4:
        snprintf(id, sizeof id, "call_%d", *n_calls > 0 ? *n_calls - 1 : 0);
        conv_add_tool_result(c, id, "", (const char *)s, (size_t)(end - s));
        break;
    default:
        la = field(&s, end, &a);
        lb = field(&s, end, &b);
        ld = field(&s, end, &d);
        conv_add_tool(c, conv_strdup(c, a, la), lb ? conv_strdup(c, b, lb) : NULL, ld ? conv_strdup(c, d, ld) : NULL);
        break;
    }
}

static void check_prompt(const tokenizer *tok, const template_prompt *p)
{
    size_t cap = p->text_len + 64, len = 0;
    char *buf = malloc(cap);
    bool ok = true;
    for (size_t i = 0; i < p->n_ids && ok; i++) {
        if (p->ids[i] < 0 || p->ids[i] >= tokenizer_n_vocab(tok)) abort();
        int k = tokenizer_token_to_piece(tok, p->ids[i], buf + len, (int)(cap - len), true);
        if (k < 0 || (size_t)k > cap - len) ok = false;
        else len += (size_t)k;
    }
    if (!ok || len != p->text_len || memcmp(buf, p->text, len)) {
        fprintf(stderr, "template: %zu ids decode to %zu bytes, the rendering has %zu\n", p->n_ids, len, p->text_len);
        abort();
    }
    free(buf);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2) return 0;
    int fi = data[0] % n_tmpls;
    conv c;
    conv_init(&c);
    c.add_generation_prompt = data[1] & 1;
    c.thinking = (conv_thinking)((data[1] >> 1) % 3);
    int n_calls = 0;
    const uint8_t *p = data + 2, *end = data + size;
    while (p < end) {
        const uint8_t *q = memchr(p, 0xFF, (size_t)(end - p));
        if (!q) q = end;
        record(&c, p, (size_t)(q - p), &n_calls);
        p = q < end ? q + 1 : end;
    }
    template_prompt out;
    char err[256];
    if (template_apply(tmpls[fi], &c, NULL, &out, err, sizeof err) == TEMPLATE_OK) {
        if (fi != 0) check_prompt(tmpl_tok[fi], &out);   /* plain: SentencePiece's leading space */
        template_prompt_free(&out);
    }
    events_markers m;
    template_markers(tmpls[fi], &c, &m);
    conv_free(&c);
    return 0;
}
