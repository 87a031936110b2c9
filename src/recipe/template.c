/*
 * template: the chat templates. See template.h for the families and the token rules.
 *
 * Rendering goes through a builder holding segments (control token ids, text runs) and the
 * rendered text. tmpl_scaffold() takes the template's own strings and emits every special
 * token found in them by id; tmpl_text() takes content and never looks for specials. Each
 * family's function follows its reference Jinja file statement by statement; comments name
 * the Jinja conditions they mirror. Where @huggingface/jinja and Python Jinja disagree
 * (str.strip('\n') strips all blanks in the former), Python's meaning is used, as the models
 * were trained with it.
 *
 * Plain tokenisation: the tokenizer never matches control tokens without parse_special but
 * always matches user-defined ones (llama.cpp's rule). To keep "<think>" typed by a user as
 * text, template_tokenize_plain() finds the leftmost user-defined token text of two or more characters and
 * cuts the text one character into it, tokenising the pieces separately (the cut changes the
 * tokens only around such text, which a real prompt of the family never contains).
 */
#define _GNU_SOURCE /* memmem */
#include "recipe/template.h"
#include "recipe/template_int.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/jsonfmt.h"
#include "util/unicode.h"
#include "util/sha256.h"
#include "util/threadpool.h"
#include "util/util.h"

#define TMPL_PARALLEL_MIN_BYTES (32 * 1024)  /* tokenise runs on the pool above this much text */
#define TMPL_MAX_GROUPS 16                   /* most groups the runs are split into */

typedef struct {
    int32_t id;          /* token id */
    const char *text;    /* its vocabulary text (inside the tokenizer) */
    uint32_t len;        /* bytes */
} tmpl_special;

struct template {
    template_family family;
    const tokenizer *tok;
    tmpl_special *specials;   /* control/user-defined/unknown tokens, grouped by first byte, longest first */
    int32_t n_specials;
    int32_t first[257];       /* specials[first[b] .. first[b+1]) start with byte b */
    tmpl_special *udef;       /* user-defined tokens of 2+ characters (matched even without parse_special) */
    int32_t n_udef;
    int32_t udef_first[257];  /* same grouping for udef */
    tmpl_jinja *jinja;        /* TEMPLATE_JINJA: the parsed template (template_jinja.c) */
};

static const char *const template_names[] = {
    [TEMPLATE_PLAIN] = "plain", [TEMPLATE_CHATML] = "chatml", [TEMPLATE_QWEN25] = "qwen2.5",
    [TEMPLATE_QWEN2] = "qwen2", [TEMPLATE_QWEN3] = "qwen3", [TEMPLATE_LLAMA3] = "llama3", [TEMPLATE_DEEPSEEK3] = "deepseek3",
    [TEMPLATE_DEEPSEEK_R1] = "deepseek-r1", [TEMPLATE_HARMONY] = "harmony", [TEMPLATE_DEEPSEEK4] = "deepseek4",
    [TEMPLATE_DEEPSEEK4_FLASH] = "deepseek4-flash-0731", [TEMPLATE_JINJA] = "jinja",
};

static bool tmpl_blank(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

int template_family_by_name(const char *name)
{
    for (size_t i = 0; i < TM_ARRAY_LEN(template_names); i++)
        if (!strcmp(name, template_names[i])) return (int)i;
    if (!strcmp(name, "qwen25")) return TEMPLATE_QWEN25;
    if (!strcmp(name, "llama3.1") || !strcmp(name, "llama31")) return TEMPLATE_LLAMA3;
    if (!strcmp(name, "deepseek-r1") || !strcmp(name, "r1")) return TEMPLATE_DEEPSEEK_R1;
    if (!strcmp(name, "gpt-oss")) return TEMPLATE_HARMONY;
    if (!strcmp(name, "interpreter")) return TEMPLATE_JINJA;
    if (!strcmp(name, "deepseek-v4") || !strcmp(name, "dsv4")) return TEMPLATE_DEEPSEEK4;
    if (!strcmp(name, "deepseek") || !strcmp(name, "deepseek3.1") || !strcmp(name, "deepseek-v3")) return TEMPLATE_DEEPSEEK3;
    return -1;
}

const char *template_name(const template *t) { return template_names[t->family]; }
const tokenizer *template_tokenizer(const template *t) { return t->tok; }
template_family template_get_family(const template *t) { return t->family; }

int32_t tmpl_find(const tokenizer *tok, const char *z)
{
    int32_t id = tokenizer_find(tok, z, strlen(z));
    if (id < 0) return -1;
    uint32_t a = tokenizer_attr(tok, id);
    return (a & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_USER_DEFINED)) ? id : -1;
}

/* The template texts tokenmill renders, by the SHA-256 of the text with leading and trailing
 * blanks removed. Only these are recognised: a text that merely resembles one (another
 * model's ChatML variant, a newer release of the family) renders differently, and the model
 * would be prompted in a way it was not trained on. */
static const struct {
    template_family family;
    const char *sha256;   /* hex digest of the trimmed text */
    const char *source;   /* where the text comes from */
} tmpl_known[] = {
    { TEMPLATE_QWEN3, "87a2728cb8dc9fe424d624542f6060ec05a1d285ebbec578bb078900e33396b5", "Qwen3 (Qwen/Qwen3-0.6B)" },
    { TEMPLATE_QWEN25, "55b2f4a26ac9ee719330a61a0c39d9e538b0e9322212f048326318cff4f8674a", "Qwen2.5 (Qwen/Qwen2.5-7B-Instruct)" },
    { TEMPLATE_QWEN2, "af9c0233881b083b52ff773580215222b5440ac3d0beeeca99b76329b048f8db", "Qwen2 (llama.cpp's ggml-vocab-qwen2.gguf)" },
    { TEMPLATE_CHATML, "fcf7a096fe99a48fd9ad2b250bf9237e96e8f48bffec1c7ea4d3f225176cd40e", "ChatML (llama.cpp's chatml test template)" },
    { TEMPLATE_LLAMA3, "93c0e9aa3629bbd77e68dbc0f5621f6e6b23aa8d74b932595cdb8d64684526d7", "Llama 3.1 and 3.3 Instruct" },
    { TEMPLATE_DEEPSEEK3, "d9f5f351b276cf9e81d009db08830db7d38e94927aecd09a7beb43e2aafee94e", "DeepSeek V3.1" },
    { TEMPLATE_DEEPSEEK_R1, "bbe594884b44d740667ee65a70bc8d333a565eab3d63ea59f291ea73ada84ba6", "DeepSeek R1 distills (llama.cpp's copy)" },
    { TEMPLATE_HARMONY, "a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146", "gpt-oss (openai-gpt-oss-120b)" },
    { TEMPLATE_DEEPSEEK4, "f8b442fab67e75b3aa468334b5cdda671003b852ffd71f23cb23377d31d9c7be", "DeepSeek V4" },
    { TEMPLATE_DEEPSEEK4_FLASH, "8b6f730567ea3e0a994ce80ac79c18a4d49716e821fd13ad7a2c061b712e3520", "DeepSeek V4-Flash-0731" },
};

/* The family whose reference text z[0..n) is; -1 if none. */
static int tmpl_known_family(const char *z, size_t n)
{
    while (n && tmpl_blank(*z)) { z++; n--; }
    while (n && tmpl_blank(z[n - 1])) n--;
    uint8_t md[32];
    sha256_digest(z, n, md);
    char hex[65];
    util_hex(md, 32, hex);
    for (size_t i = 0; i < TM_ARRAY_LEN(tmpl_known); i++)
        if (!strcmp(hex, tmpl_known[i].sha256)) return (int)tmpl_known[i].family;
    return -1;
}

/* "plain, chatml, ..." into buf. */
static void tmpl_family_list(char *buf, size_t n)
{
    size_t k = 0;
    buf[0] = 0;
    for (size_t i = 0; i < TM_ARRAY_LEN(template_names) && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? ", " : "", template_names[i]);
}

/* The family of the template text ct[0..ctn) or, without one, of the vocabulary; -1 if the
 * text is none of the reference texts. */
static int tmpl_detect_text(const tokenizer *tok, const gguf *g, const char *ct, size_t ctn)
{
    if (ct && ctn > 0) return tmpl_known_family(ct, ctn);
    /* no template text (vocabulary files, base models): the special tokens present, then
       the architecture */
    if (tmpl_find(tok, "<｜User｜>") >= 0 && tmpl_find(tok, "<｜Assistant｜>") >= 0) return TEMPLATE_DEEPSEEK3;
    if (tmpl_find(tok, "<|start|>") >= 0 && tmpl_find(tok, "<|channel|>") >= 0 && tmpl_find(tok, "<|message|>") >= 0)
        return TEMPLATE_HARMONY;
    if (tmpl_find(tok, "<|start_header_id|>") >= 0 && tmpl_find(tok, "<|eot_id|>") >= 0) return TEMPLATE_LLAMA3;
    if (tmpl_find(tok, "<|im_start|>") >= 0) {
        if (tmpl_find(tok, "<think>") >= 0) return TEMPLATE_QWEN3;
        const char *arch = NULL;
        size_t an = 0;
        if (g && gguf_get_str(g, "general.architecture", &arch, &an) && an >= 4 && !memcmp(arch, "qwen", 4))
            return TEMPLATE_QWEN25;
        return TEMPLATE_CHATML;
    }
    return TEMPLATE_PLAIN;
}

int template_detect(const tokenizer *tok, const gguf *g)
{
    const char *ct = NULL;
    size_t ctn = 0;
    if (g) gguf_get_str(g, "tokenizer.chat_template", &ct, &ctn);
    return tmpl_detect_text(tok, g, ct, ctn);
}

static int tmpl_cmp_special(const void *a, const void *b)
{
    const tmpl_special *x = a, *y = b;
    unsigned char fx = (unsigned char)x->text[0], fy = (unsigned char)y->text[0];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

static void tmpl_index(tmpl_special *v, int32_t n, int32_t *first)
{
    qsort(v, (size_t)n, sizeof *v, tmpl_cmp_special);
    int32_t k = 0;
    for (int b = 0; b <= 256; b++) {
        while (k < n && (unsigned char)v[k].text[0] < b) k++;
        first[b] = k;
    }
}

template_status template_new(const tokenizer *tok, const gguf *g, const char *name, template **out,
                             char *err, size_t errsz)
{
    return template_open(tok, g, name, NULL, 0, out, err, errsz);
}

template_status template_open_file(const tokenizer *tok, const gguf *g, const char *name, const char *path,
                                   template **out, char *err, size_t errsz)
{
    if (!path) return template_open(tok, g, name, NULL, 0, out, err, errsz);
    size_t n = 0;
    char *text = util_read_file(path, &n);
    if (!text) {
        *out = NULL;
        snprintf(err, errsz, "cannot read the template file %s", path);
        return TEMPLATE_ERR_NAME;
    }
    template_status st = template_open(tok, g, name, text, n, out, err, errsz);
    free(text);
    return st;
}

template_status template_open(const tokenizer *tok, const gguf *g, const char *name, const char *text, size_t text_len,
                              template **out, char *err, size_t errsz)
{
    *out = NULL;
    char names[160];
    tmpl_family_list(names, sizeof names);
    const char *ct = text;
    size_t ctn = text_len;
    if (!ct && g) gguf_get_str(g, "tokenizer.chat_template", &ct, &ctn);
    if (!ct) ctn = 0;
    int fam;
    if (name && strcmp(name, "auto")) {
        fam = template_family_by_name(name);
        if (fam < 0) {
            snprintf(err, errsz, "unknown template '%s' (known: auto, %s)", name, names);
            return TEMPLATE_ERR_NAME;
        }
        if (fam == TEMPLATE_JINJA && !ctn) {
            snprintf(err, errsz, "--template jinja needs a template text: the model has none (give one with --template-file)");
            return TEMPLATE_ERR_NAME;
        }
    } else if ((fam = tmpl_detect_text(tok, g, ct, ctn)) < 0) {
        fam = TEMPLATE_JINJA;  /* a template text tokenmill has no renderer of its own for */
    }
    template *t = xcalloc(1, sizeof *t);
    t->family = (template_family)fam;
    t->tok = tok;
    int32_t nv = tokenizer_n_vocab(tok);
    int32_t ns = 0, nu = 0;
    for (int32_t id = 0; id < nv; id++) {
        uint32_t a = tokenizer_attr(tok, id);
        size_t len;
        const char *p = tokenizer_piece(tok, id, &len);
        if (!p || !len) continue;
        if (a & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_USER_DEFINED | TOKENIZER_ATTR_UNKNOWN)) ns++;
        if ((a & TOKENIZER_ATTR_USER_DEFINED) && unicode_len_utf8((uint8_t)p[0]) < len) nu++;
    }
    t->specials = xmalloc((size_t)(ns ? ns : 1) * sizeof *t->specials);
    t->udef = xmalloc((size_t)(nu ? nu : 1) * sizeof *t->udef);
    for (int32_t id = 0; id < nv; id++) {
        uint32_t a = tokenizer_attr(tok, id);
        size_t len;
        const char *p = tokenizer_piece(tok, id, &len);
        if (!p || !len) continue;
        tmpl_special s = { id, p, (uint32_t)len };
        if (a & (TOKENIZER_ATTR_CONTROL | TOKENIZER_ATTR_USER_DEFINED | TOKENIZER_ATTR_UNKNOWN))
            t->specials[t->n_specials++] = s;
        if ((a & TOKENIZER_ATTR_USER_DEFINED) && unicode_len_utf8((uint8_t)p[0]) < len) t->udef[t->n_udef++] = s;
    }
    tmpl_index(t->specials, t->n_specials, t->first);
    tmpl_index(t->udef, t->n_udef, t->udef_first);
    if (fam == TEMPLATE_JINJA) {
        template_status st = tmpl_jinja_new(t, ct, ctn, &t->jinja, err, errsz);
        if (st != TEMPLATE_OK) {
            template_free(t);
            return st;
        }
    }
    *out = t;
    return TEMPLATE_OK;
}

void template_free(template *t)
{
    if (!t) return;
    tmpl_jinja_free(t->jinja);
    free(t->specials);
    free(t->udef);
    free(t);
}

void template_prompt_free(template_prompt *p)
{
    free(p->ids);
    free(p->text);
    memset(p, 0, sizeof *p);
}

/* Longest special starting at s[0..n) from the table; -1 if none. */
static int32_t tmpl_match(const tmpl_special *v, const int32_t *first, const char *s, size_t n)
{
    unsigned char b = (unsigned char)s[0];
    for (int32_t k = first[b]; k < first[b + 1]; k++)
        if (v[k].len <= n && !memcmp(v[k].text, s, v[k].len)) return k;
    return -1;
}

/* ---- plain tokenisation -------------------------------------------------------------- */

static int64_t tmpl_encode_raw(const tokenizer *tok, const char *s, size_t n, int32_t **ids, size_t *nids, size_t *cap)
{
    if (n == 0) return 0;
    size_t want = n + 16;
    for (;;) {
        if (*cap - *nids < want) {
            *cap = TM_MAX(*cap * 2, *nids + want);
            *ids = xrealloc(*ids, *cap * sizeof **ids);
        }
        int32_t room = (int32_t)TM_MIN(*cap - *nids, (size_t)INT32_MAX);
        int32_t k = tokenizer_encode(tok, s, n, false, false, *ids + *nids, room);
        if (k < 0) return -1;
        if (k <= room) {
            *nids += (size_t)k;
            return k;
        }
        want = (size_t)k;
    }
}

int64_t template_tokenize_plain(const template *t, const char *s, size_t n, int32_t **ids, size_t *nids, size_t *cap)
{
    int64_t total = 0;
    while (n > 0) {
        /* leftmost multi-character user-defined token text */
        size_t cut = n;
        if (t->n_udef) {
            for (size_t i = 0; i < n; i++) {
                unsigned char b = (unsigned char)s[i];
                if (t->udef_first[b] == t->udef_first[b + 1]) continue;
                if (tmpl_match(t->udef, t->udef_first, s + i, n - i) >= 0) {
                    cut = i + unicode_len_utf8(b);
                    if (cut > n) cut = n;
                    break;
                }
            }
        }
        int64_t k = tmpl_encode_raw(t->tok, s, cut, ids, nids, cap);
        if (k < 0) return -1;
        total += k;
        s += cut;
        n -= cut;
    }
    return total;
}

/* ---- builder ------------------------------------------------------------------------- */

static tmpl_seg *tmpl_push_seg(tmpl_b *b)
{
    if (b->n_segs == b->cap_segs) {
        b->cap_segs = b->cap_segs ? b->cap_segs * 2 : 64;
        b->segs = xrealloc(b->segs, b->cap_segs * sizeof *b->segs);
    }
    return &b->segs[b->n_segs++];
}

/* Content text: never searched for specials. */
void tmpl_text(tmpl_b *b, const char *s, size_t n)
{
    if (b->rstrip_next) {
        while (n && tmpl_blank(*s)) { s++; n--; }
        if (n) b->rstrip_next = false;
    }
    if (!n) return;
    if (!b->raw_shown) bytebuf_append(&b->shown, s, n);
    if (b->n_segs && b->segs[b->n_segs - 1].id < 0) {
        b->segs[b->n_segs - 1].len += n;
    } else {
        tmpl_seg *g = tmpl_push_seg(b);
        g->id = -1;
        g->off = b->runs.len;
        g->len = n;
    }
    bytebuf_append(&b->runs, s, n);
}

static void tmpl_special_id(tmpl_b *b, int32_t id)
{
    uint32_t a = tokenizer_attr(b->t->tok, id);
    if ((a & TOKENIZER_ATTR_LSTRIP) && b->n_segs && b->segs[b->n_segs - 1].id < 0) {
        tmpl_seg *g = &b->segs[b->n_segs - 1];
        while (g->len && tmpl_blank(b->runs.p[g->off + g->len - 1])) g->len--;
        b->runs.len = g->off + g->len;
        if (!g->len) b->n_segs--;
    }
    tmpl_seg *g = tmpl_push_seg(b);
    g->id = id;
    g->off = g->len = 0;
    size_t len;
    const char *p = tokenizer_piece(b->t->tok, id, &len);
    if (p && !b->raw_shown) bytebuf_append(&b->shown, p, len);
    b->rstrip_next = (a & TOKENIZER_ATTR_RSTRIP) != 0;
}

/* Template text: special tokens in it are emitted by id. */
void tmpl_scaffold(tmpl_b *b, const char *z) { tmpl_scaffold_n(b, z, strlen(z)); }

void tmpl_scaffold_n(tmpl_b *b, const char *z, size_t n)
{
    const template *t = b->t;
    size_t i = 0, st = 0;
    while (i < n) {
        unsigned char c = (unsigned char)z[i];
        int32_t k = t->first[c] == t->first[c + 1] ? -1 : tmpl_match(t->specials, t->first, z + i, n - i);
        if (k < 0) {
            i++;
            continue;
        }
        tmpl_text(b, z + st, i - st);
        tmpl_special_id(b, t->specials[k].id);
        i += t->specials[k].len;
        st = i;
    }
    tmpl_text(b, z + st, n - st);
}

void tmpl_bos(tmpl_b *b)
{
    int32_t bos = tokenizer_bos(b->t->tok);
    if (bos >= 0) tmpl_special_id(b, bos);
}

void tmpl_fail(tmpl_b *b, template_status st, const char *fmt, const char *arg)
{
    if (b->st != TEMPLATE_OK) return;
    b->st = st;
    snprintf(b->err, b->errsz, fmt, arg);
}

/* Content as printed by Jinja's tojson (style), into b->json; false (and error) if invalid. */
bool tmpl_json(tmpl_b *b, const char *src, size_t n, jsonfmt_style style, int indent, const char *what)
{
    b->json.len = 0;
    if (b->json.p) b->json.p[0] = 0;
    if (jsonfmt_write(&b->json, src, n, style, indent)) return true;
    tmpl_fail(b, TEMPLATE_ERR_JSON, "%s is not valid JSON", what);
    return false;
}

void tmpl_tool_openai(bytebuf *o, const conv_tool *tl)
{
    bytebuf_puts(o, "{\"type\":\"function\",\"function\":{\"name\":");
    jsonfmt_write_string(o, tl->name, strlen(tl->name));
    if (tl->description) {
        bytebuf_puts(o, ",\"description\":");
        jsonfmt_write_string(o, tl->description, strlen(tl->description));
    }
    if (tl->parameters) {
        bytebuf_puts(o, ",\"parameters\":");
        bytebuf_puts(o, tl->parameters);
    }
    bytebuf_puts(o, "}}");
}

/* A tool definition as OpenAI shapes it, formatted in style, into the prompt. */
static void tmpl_tool_text(tmpl_b *b, const conv_tool *tl, jsonfmt_style style, int indent)
{
    bytebuf *s = &b->json_src;
    s->len = 0;
    tmpl_tool_openai(s, tl);
    if (tmpl_json(b, s->p, s->len, style, indent, "a tool's parameters")) tmpl_text(b, b->json.p, b->json.len);
}

void tmpl_call_args(tmpl_b *b, const conv_part *p)
{
    if (tmpl_json(b, p->args, p->args_len, JSONFMT_SPACED, 0, "tool call arguments")) tmpl_text(b, b->json.p, b->json.len);
}

/* ---- messages ------------------------------------------------------------------------ */

static void tmpl_join(bytebuf *store, const conv_turn *t, conv_part_kind kind, size_t *off, size_t *len, bool *present)
{
    *off = store->len;
    *present = false;
    for (int i = 0; i < t->n_parts; i++) {
        if (t->parts[i].kind != kind) continue;
        *present = true;
        bytebuf_append(store, t->parts[i].text, t->parts[i].len);
    }
    *len = store->len - *off;
}

static tmpl_msg *tmpl_msgs(tmpl_b *b, const conv *c)
{
    tmpl_msg *m = xcalloc((size_t)(c->n_turns ? c->n_turns : 1), sizeof *m);
    b->store.len = 0;
    bytebuf_putc(&b->store, 0);
    for (int i = 0; i < c->n_turns; i++) {
        const conv_turn *t = &c->turns[i];
        bool present;
        m[i].turn = t;
        m[i].role = t->role == CONV_ROLE_DEVELOPER ? CONV_ROLE_SYSTEM : t->role;
        if (t->role == CONV_ROLE_TOOL && conv_turn_count(t, CONV_PART_TOOL_RESULT))
            tmpl_join(&b->store, t, CONV_PART_TOOL_RESULT, &m[i].c_off, &m[i].c_len, &present);
        else
            tmpl_join(&b->store, t, CONV_PART_TEXT, &m[i].c_off, &m[i].c_len, &present);
        bytebuf_putc(&b->store, 0);
        tmpl_join(&b->store, t, CONV_PART_REASONING, &m[i].r_off, &m[i].r_len, &m[i].has_reason);
        bytebuf_putc(&b->store, 0);
        m[i].n_calls = conv_turn_count(t, CONV_PART_TOOL_CALL);
    }
    for (int i = 0; i < c->n_turns; i++) {
        m[i].content = b->store.p + m[i].c_off;
        m[i].reason = b->store.p + m[i].r_off;
    }
    return m;
}

const conv_part *tmpl_call(const tmpl_msg *m, int k)
{
    for (int i = 0; i < m->turn->n_parts; i++)
        if (m->turn->parts[i].kind == CONV_PART_TOOL_CALL && k-- == 0) return &m->turn->parts[i];
    return NULL;
}

/* Python str helpers on (pointer, length) views. */
static void tmpl_strip_nl(const char **s, size_t *n, bool left, bool right)
{
    while (left && *n && **s == '\n') { (*s)++; (*n)--; }
    while (right && *n && (*s)[*n - 1] == '\n') (*n)--;
}

static const char *tmpl_rfind(const char *s, size_t n, const char *pat)
{
    size_t pn = strlen(pat);
    if (pn > n) return NULL;
    for (size_t i = n - pn + 1; i-- > 0;)
        if (!memcmp(s + i, pat, pn)) return s + i;
    return NULL;
}

/* JavaScript/Python whitespace for Jinja's trim: ASCII blanks, NBSP, U+1680, U+2000-200A,
 * U+2028/2029, U+202F, U+205F, U+3000, U+FEFF. Returns the byte length of a blank at s. */
static size_t tmpl_ws_at(const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    if (!n) return 0;
    if (tmpl_blank(s[0]) || u[0] == 0x1c || u[0] == 0x1d || u[0] == 0x1e || u[0] == 0x1f) return 1;
    if (n >= 2 && u[0] == 0xC2 && (u[1] == 0xA0 || u[1] == 0x85)) return 2;
    return unicode_space3_at(s, n);
}

static void tmpl_trim(const char **s, size_t *n)
{
    size_t k;
    while ((k = tmpl_ws_at(*s, *n)) > 0) { *s += k; *n -= k; }
    for (;;) {
        size_t cut = 0;
        for (size_t back = 1; back <= 3 && back <= *n; back++)
            if (tmpl_ws_at(*s + *n - back, back) == back) { cut = back; break; }
        if (!cut) break;
        *n -= cut;
    }
}

/* ---- families ------------------------------------------------------------------------ */

static void tmpl_qwen_call(tmpl_b *b, const conv_part *p)
{
    /* '<tool_call>\n{"name": "' + name + '", "arguments": ' + arguments|tojson + '}\n</tool_call>' */
    tmpl_scaffold(b, "<tool_call>\n{\"name\": \"");
    tmpl_text(b, p->name, strlen(p->name));
    tmpl_scaffold(b, "\", \"arguments\": ");
    tmpl_call_args(b, p);
    tmpl_scaffold(b, "}\n</tool_call>");
}

static const char tmpl_qwen_tools_head[] =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>";
static const char tmpl_qwen_tools_tail[] =
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
    "<args-json-object>}\n</tool_call><|im_end|>\n";

static void tmpl_qwen_tools(tmpl_b *b, const conv *c)
{
    for (int i = 0; i < c->n_tools; i++) {
        tmpl_scaffold(b, "\n");
        tmpl_tool_text(b, &c->tools[i], JSONFMT_SPACED, 0);
    }
    tmpl_scaffold(b, tmpl_qwen_tools_tail);
}

/* Consecutive tool turns share one user turn (both Qwen templates). */
static void tmpl_qwen_tool_turn(tmpl_b *b, const tmpl_msg *m, int i, int n)
{
    if (i == 0 || m[i - 1].role != CONV_ROLE_TOOL) tmpl_scaffold(b, "<|im_start|>user");
    tmpl_scaffold(b, "\n<tool_response>\n");
    tmpl_text(b, m[i].content, m[i].c_len);
    tmpl_scaffold(b, "\n</tool_response>");
    if (i == n - 1 || m[i + 1].role != CONV_ROLE_TOOL) tmpl_scaffold(b, "<|im_end|>\n");
}

static void tmpl_role_turn(tmpl_b *b, const tmpl_msg *m)
{
    tmpl_scaffold(b, "<|im_start|>");
    tmpl_scaffold(b, m->role == CONV_ROLE_SYSTEM ? "system\n" : m->role == CONV_ROLE_USER ? "user\n" : "assistant\n");
    tmpl_text(b, m->content, m->c_len);
    tmpl_scaffold(b, "<|im_end|>\n");
}

static void tmpl_render_qwen3(tmpl_b *b, const conv *c, const tmpl_msg *m)
{
    int n = c->n_turns;
    bool first_sys = n > 0 && m[0].role == CONV_ROLE_SYSTEM;
    if (c->n_tools) {
        tmpl_scaffold(b, "<|im_start|>system\n");
        if (first_sys) {
            tmpl_text(b, m[0].content, m[0].c_len);
            tmpl_scaffold(b, "\n\n");
        }
        tmpl_scaffold(b, tmpl_qwen_tools_head);
        tmpl_qwen_tools(b, c);
    } else if (first_sys) {
        tmpl_role_turn(b, &m[0]);
    }
    /* ns.last_query_index: the last user turn that is not a wrapped tool response */
    int last_query = n - 1;
    for (int i = n - 1; i >= 0; i--) {
        if (m[i].role != CONV_ROLE_USER) continue;
        size_t l = m[i].c_len;
        const char *s = m[i].content;
        bool wrapped = l >= 15 && !memcmp(s, "<tool_response>", 15) && l >= 16 && !memcmp(s + l - 16, "</tool_response>", 16);
        if (!wrapped) {
            last_query = i;
            break;
        }
    }
    for (int i = 0; i < n; i++) {
        const tmpl_msg *x = &m[i];
        if (x->role == CONV_ROLE_USER || (x->role == CONV_ROLE_SYSTEM && i > 0)) {
            tmpl_role_turn(b, x);
        } else if (x->role == CONV_ROLE_ASSISTANT) {
            const char *content = x->content, *reason = "";
            size_t cn = x->c_len, rn = 0;
            if (x->has_reason) {
                reason = x->reason;
                rn = x->r_len;
            } else {
                const char *e = memmem(content, cn, "</think>", 8);
                if (e) {
                    /* content.split('</think>')[-1].lstrip('\n') */
                    const char *last = tmpl_rfind(content, cn, "</think>");
                    const char *nc = last + 8;
                    size_t ncn = cn - (size_t)(nc - content);
                    tmpl_strip_nl(&nc, &ncn, true, false);
                    /* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') */
                    const char *r = content;
                    size_t r0 = (size_t)(e - content);
                    tmpl_strip_nl(&r, &r0, false, true);
                    const char *o = tmpl_rfind(r, r0, "<think>");
                    if (o) {
                        r0 -= (size_t)(o + 7 - r);
                        r = o + 7;
                    }
                    tmpl_strip_nl(&r, &r0, true, false);
                    reason = r;
                    rn = r0;
                    content = nc;
                    cn = ncn;
                }
            }
            if (i > last_query && (i == n - 1 || rn > 0)) {
                tmpl_scaffold(b, "<|im_start|>assistant\n<think>\n");
                tmpl_strip_nl(&reason, &rn, true, true);
                tmpl_text(b, reason, rn);
                tmpl_scaffold(b, "\n</think>\n\n");
                tmpl_strip_nl(&content, &cn, true, false);
                tmpl_text(b, content, cn);
            } else {
                tmpl_scaffold(b, "<|im_start|>assistant\n");
                tmpl_text(b, content, cn);
            }
            for (int k = 0; k < x->n_calls; k++) {
                if ((k == 0 && cn > 0) || k > 0) tmpl_scaffold(b, "\n");
                tmpl_qwen_call(b, tmpl_call(x, k));
            }
            tmpl_scaffold(b, "<|im_end|>\n");
        } else if (x->role == CONV_ROLE_TOOL) {
            tmpl_qwen_tool_turn(b, m, i, n);
        }
    }
    if (c->add_generation_prompt) {
        tmpl_scaffold(b, "<|im_start|>assistant\n");
        if (c->thinking == CONV_THINKING_OFF) tmpl_scaffold(b, "<think>\n\n</think>\n\n");
    }
}

/* Qwen2.5: dflt is its default system prompt; tools are listed in the system turn. */
static void tmpl_render_qwen25(tmpl_b *b, const conv *c, const tmpl_msg *m, const char *dflt)
{
    int n = c->n_turns;
    bool first_sys = n > 0 && m[0].role == CONV_ROLE_SYSTEM;
    if (c->n_tools) {
        tmpl_scaffold(b, "<|im_start|>system\n");
        if (first_sys) tmpl_text(b, m[0].content, m[0].c_len);
        else tmpl_scaffold(b, dflt);
        tmpl_scaffold(b, "\n\n");
        tmpl_scaffold(b, tmpl_qwen_tools_head);
        tmpl_qwen_tools(b, c);
    } else if (first_sys) {
        tmpl_role_turn(b, &m[0]);
    } else {
        tmpl_scaffold(b, "<|im_start|>system\n");
        tmpl_scaffold(b, dflt);
        tmpl_scaffold(b, "<|im_end|>\n");
    }
    for (int i = 0; i < n; i++) {
        const tmpl_msg *x = &m[i];
        if (x->role == CONV_ROLE_USER || (x->role == CONV_ROLE_SYSTEM && i > 0) ||
            (x->role == CONV_ROLE_ASSISTANT && x->n_calls == 0)) {
            tmpl_role_turn(b, x);
        } else if (x->role == CONV_ROLE_ASSISTANT) {
            tmpl_scaffold(b, "<|im_start|>assistant");
            if (x->c_len) {
                tmpl_scaffold(b, "\n");
                tmpl_text(b, x->content, x->c_len);
            }
            for (int k = 0; k < x->n_calls; k++) {
                tmpl_scaffold(b, "\n");
                tmpl_qwen_call(b, tmpl_call(x, k));
            }
            tmpl_scaffold(b, "<|im_end|>\n");
        } else if (x->role == CONV_ROLE_TOOL) {
            tmpl_qwen_tool_turn(b, m, i, n);
        }
    }
    if (c->add_generation_prompt) tmpl_scaffold(b, "<|im_start|>assistant\n");
}

/* Qwen2 (dflt: its default system prompt, written when the first message is not a system
 * one) and plain ChatML (dflt NULL). Their reference templates write every message as
 * <|im_start|>ROLE\nCONTENT<|im_end|>\n and know nothing of tools: tool definitions and tool
 * calls are not written and a tool result is a "tool" turn. Writing calls without the
 * definitions (or in another family's format) would show the model a prompt it was never
 * trained on; a model that does know a tool format is served with that family's --template. */
static void tmpl_render_chatml(tmpl_b *b, const conv *c, const tmpl_msg *m, const char *dflt)
{
    int n = c->n_turns;
    if (dflt && n > 0 && m[0].role != CONV_ROLE_SYSTEM) {
        tmpl_scaffold(b, "<|im_start|>system\n");
        tmpl_scaffold(b, dflt);
        tmpl_scaffold(b, "<|im_end|>\n");
    }
    for (int i = 0; i < n; i++) {
        if (m[i].role == CONV_ROLE_TOOL) {
            tmpl_scaffold(b, "<|im_start|>tool\n");
            tmpl_text(b, m[i].content, m[i].c_len);
            tmpl_scaffold(b, "<|im_end|>\n");
        } else {
            tmpl_role_turn(b, &m[i]);
        }
    }
    if (c->add_generation_prompt) tmpl_scaffold(b, "<|im_start|>assistant\n");
}

static void tmpl_llama3_header(tmpl_b *b, const char *role)
{
    tmpl_scaffold(b, "<|start_header_id|>");
    tmpl_scaffold(b, role);
    tmpl_scaffold(b, "<|end_header_id|>\n\n");
}

static void tmpl_render_llama3(tmpl_b *b, const conv *c, const tmpl_msg *m)
{
    int n = c->n_turns, i = 0;
    bool tools = c->n_tools > 0;
    tmpl_bos(b);
    const char *sys = "";
    size_t sysn = 0;
    if (n > 0 && m[0].role == CONV_ROLE_SYSTEM) {
        sys = m[0].content;
        sysn = m[0].c_len;
        tmpl_trim(&sys, &sysn);
        i = 1;
    }
    tmpl_llama3_header(b, "system");
    if (tools) tmpl_scaffold(b, "Environment: ipython\n");
    tmpl_scaffold(b, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
    tmpl_text(b, sys, sysn);
    tmpl_scaffold(b, "<|eot_id|>");
    if (tools) {
        /* tools_in_user_message: the first remaining message (whatever its role) carries them */
        if (i >= n) {
            tmpl_fail(b, TEMPLATE_ERR_CONV, "%s", "llama3: tools need a first user message to be put in");
            return;
        }
        const char *u = m[i].content;
        size_t un = m[i].c_len;
        tmpl_trim(&u, &un);
        i++;
        tmpl_llama3_header(b, "user");
        tmpl_scaffold(b, "Given the following functions, please respond with a JSON for a function call "
                         "with its proper arguments that best answers the given prompt.\n\n"
                         "Respond in the format {\"name\": function name, \"parameters\": dictionary of "
                         "argument name and its value}.Do not use variables.\n\n");
        for (int k = 0; k < c->n_tools; k++) {
            tmpl_tool_text(b, &c->tools[k], JSONFMT_INDENT, 4);
            tmpl_scaffold(b, "\n\n");
        }
        tmpl_text(b, u, un);
        tmpl_scaffold(b, "<|eot_id|>");
    }
    for (; i < n; i++) {
        const tmpl_msg *x = &m[i];
        if (x->role == CONV_ROLE_TOOL) {
            /* content is a string, which Jinja's "is iterable" accepts: printed via tojson */
            tmpl_llama3_header(b, "ipython");
            b->json.len = 0;
            jsonfmt_write_string(&b->json, x->content, x->c_len);
            tmpl_text(b, b->json.p, b->json.len);
            tmpl_scaffold(b, "<|eot_id|>");
        } else if (x->role == CONV_ROLE_ASSISTANT && x->n_calls > 0) {
            /* the reference accepts exactly one call per message; several are written as
               consecutive assistant messages */
            for (int k = 0; k < x->n_calls; k++) {
                const conv_part *p = tmpl_call(x, k);
                tmpl_llama3_header(b, "assistant");
                tmpl_scaffold(b, "{\"name\": \"");
                tmpl_text(b, p->name, strlen(p->name));
                tmpl_scaffold(b, "\", \"parameters\": ");
                tmpl_call_args(b, p);
                tmpl_scaffold(b, "}<|eot_id|>");
            }
        } else {
            const char *s = x->content;
            size_t sn = x->c_len;
            tmpl_trim(&s, &sn);
            tmpl_llama3_header(b, x->role == CONV_ROLE_SYSTEM ? "system" : x->role == CONV_ROLE_USER ? "user" : "assistant");
            tmpl_text(b, s, sn);
            tmpl_scaffold(b, "<|eot_id|>");
        }
    }
    if (c->add_generation_prompt) tmpl_llama3_header(b, "assistant");
}

/* DeepSeek V3.1's thinking default is off; returns whether the generation prompt opens it. */
static bool tmpl_ds_thinking(const conv *c) { return c->thinking == CONV_THINKING_ON; }

static void tmpl_ds_call(tmpl_b *b, const conv_part *p)
{
    tmpl_text(b, p->name, strlen(p->name));
    tmpl_scaffold(b, "<｜tool▁sep｜>");
    tmpl_call_args(b, p);
    tmpl_scaffold(b, "<｜tool▁call▁end｜>");
}

/* Walks the DeepSeek state flags; *open_think says whether the prompt ends inside <think>. */
static void tmpl_render_deepseek3(tmpl_b *b, const conv *c, const tmpl_msg *m, bool *open_think)
{
    int n = c->n_turns;
    bool thinking = tmpl_ds_thinking(c);
    tmpl_bos(b);
    bool first_sp = true;
    for (int i = 0; i < n; i++) {
        if (m[i].role != CONV_ROLE_SYSTEM) continue;
        if (!first_sp) tmpl_scaffold(b, "\n\n");
        tmpl_text(b, m[i].content, m[i].c_len);
        first_sp = false;
    }
    bool is_tool = false, is_last_user = false;
    for (int i = 0; i < n; i++) {
        const tmpl_msg *x = &m[i];
        if (x->role == CONV_ROLE_USER) {
            is_tool = false;
            is_last_user = true;
            tmpl_scaffold(b, "<｜User｜>");
            tmpl_text(b, x->content, x->c_len);
        } else if (x->role == CONV_ROLE_ASSISTANT && x->n_calls > 0) {
            if (is_last_user) tmpl_scaffold(b, "<｜Assistant｜><think></think>");
            is_last_user = false;
            is_tool = false;
            for (int k = 0; k < x->n_calls; k++) {
                if (k == 0) {
                    tmpl_text(b, x->content, x->c_len);
                    tmpl_scaffold(b, "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>");
                } else {
                    tmpl_scaffold(b, "<｜tool▁call▁begin｜>");
                }
                tmpl_ds_call(b, tmpl_call(x, k));
            }
            tmpl_scaffold(b, "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>");
        } else if (x->role == CONV_ROLE_ASSISTANT) {
            if (is_last_user) tmpl_scaffold(b, "<｜Assistant｜><think></think>");
            is_last_user = false;
            const char *s = x->content;
            size_t sn = x->c_len;
            if (is_tool) {
                is_tool = false;
            } else {
                /* content.split('</think>', 1)[1] */
                const char *e = memmem(s, sn, "</think>", 8);
                if (e) {
                    sn -= (size_t)(e + 8 - s);
                    s = e + 8;
                }
            }
            tmpl_text(b, s, sn);
            tmpl_scaffold(b, "<｜end▁of▁sentence｜>");
        } else if (x->role == CONV_ROLE_TOOL) {
            is_last_user = false;
            is_tool = true;
            tmpl_scaffold(b, "<｜tool▁output▁begin｜>");
            tmpl_text(b, x->content, x->c_len);
            tmpl_scaffold(b, "<｜tool▁output▁end｜>");
        }
    }
    *open_think = false;
    if (c->add_generation_prompt && is_last_user && !is_tool) {
        tmpl_scaffold(b, "<｜Assistant｜>");
        tmpl_scaffold(b, thinking ? "<think>" : "<think></think>");
        *open_think = thinking;
    }
}

/* DeepSeek R1 (llama.cpp's copy of the R1-Distill template). Its flags is_first and
 * is_output_first are never reset, as in the reference. An assistant turn with tool calls and
 * no text has no content (Jinja none); *open_think: the prompt ends inside <think>. */
static void tmpl_render_deepseek_r1(tmpl_b *b, const conv *c, const tmpl_msg *m, bool *open_think)
{
    int n = c->n_turns;
    tmpl_bos(b);
    int last_sys = -1;
    for (int i = 0; i < n; i++)
        if (m[i].role == CONV_ROLE_SYSTEM) last_sys = i;
    if (last_sys >= 0) tmpl_text(b, m[last_sys].content, m[last_sys].c_len);
    bool is_first = false, is_tool = false, output_first = true;
    for (int i = 0; i < n; i++) {
        const tmpl_msg *x = &m[i];
        if (x->role == CONV_ROLE_USER) {
            is_tool = false;
            tmpl_scaffold(b, "<｜User｜>");
            tmpl_text(b, x->content, x->c_len);
        } else if (x->role == CONV_ROLE_ASSISTANT) {
            if (x->n_calls > 0) {
                is_tool = false;
                for (int k = 0; k < x->n_calls; k++) {
                    const conv_part *p = tmpl_call(x, k);
                    if (!is_first) {
                        tmpl_scaffold(b, "<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>");
                        is_first = true;
                    } else {
                        tmpl_scaffold(b, "\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>");
                    }
                    tmpl_text(b, p->name, strlen(p->name));
                    tmpl_scaffold(b, "\n```json\n");
                    tmpl_call_args(b, p);
                    tmpl_scaffold(b, "\n```<｜tool▁call▁end｜>");
                }
                tmpl_scaffold(b, "<｜tool▁calls▁end｜><｜end▁of▁sentence｜>");
            }
            if (x->n_calls > 0 && x->c_len == 0) continue; /* content is none */
            if (is_tool) {
                tmpl_scaffold(b, "<｜tool▁outputs▁end｜>");
                tmpl_text(b, x->content, x->c_len);
                tmpl_scaffold(b, "<｜end▁of▁sentence｜>");
                is_tool = false;
            } else {
                /* content.split('</think>')[-1] */
                const char *s = x->content;
                size_t sn = x->c_len;
                const char *e = tmpl_rfind(s, sn, "</think>");
                if (e) {
                    sn -= (size_t)(e + 8 - s);
                    s = e + 8;
                }
                tmpl_scaffold(b, "<｜Assistant｜>");
                tmpl_text(b, s, sn);
                tmpl_scaffold(b, "<｜end▁of▁sentence｜>");
            }
        } else if (x->role == CONV_ROLE_TOOL) {
            is_tool = true;
            tmpl_scaffold(b, output_first ? "<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>" : "\n<｜tool▁output▁begin｜>");
            output_first = false;
            tmpl_text(b, x->content, x->c_len);
            tmpl_scaffold(b, "<｜tool▁output▁end｜>");
        }
    }
    if (is_tool) tmpl_scaffold(b, "<｜tool▁outputs▁end｜>");
    *open_think = false;
    if (c->add_generation_prompt && !is_tool) {
        tmpl_scaffold(b, "<｜Assistant｜><think>\n");
        if (c->thinking == CONV_THINKING_ON) *open_think = true;
        else tmpl_scaffold(b, "</think>");
    }
}

static void tmpl_render_plain(tmpl_b *b, const conv *c, const tmpl_msg *m)
{
    if (tokenizer_add_bos(b->t->tok)) tmpl_bos(b);
    bool first = true;
    for (int i = 0; i < c->n_turns; i++) {
        if (!m[i].c_len) continue;
        if (!first) tmpl_text(b, "\n", 1);
        tmpl_text(b, m[i].content, m[i].c_len);
        first = false;
    }
}

static bool tmpl_render(tmpl_b *b, const conv *c, bool *open_think)
{
    tmpl_msg *m = tmpl_msgs(b, c);
    *open_think = false;
    switch (b->t->family) {
    case TEMPLATE_QWEN3: tmpl_render_qwen3(b, c, m); break;
    case TEMPLATE_QWEN25: tmpl_render_qwen25(b, c, m, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."); break;
    case TEMPLATE_QWEN2: tmpl_render_chatml(b, c, m, "You are a helpful assistant"); break;
    case TEMPLATE_CHATML: tmpl_render_chatml(b, c, m, NULL); break;
    case TEMPLATE_LLAMA3: tmpl_render_llama3(b, c, m); break;
    case TEMPLATE_DEEPSEEK3: tmpl_render_deepseek3(b, c, m, open_think); break;
    case TEMPLATE_DEEPSEEK_R1: tmpl_render_deepseek_r1(b, c, m, open_think); break;
    case TEMPLATE_HARMONY: tmpl_render_harmony(b, c, m); break;
    case TEMPLATE_DEEPSEEK4:
    case TEMPLATE_DEEPSEEK4_FLASH: tmpl_render_deepseek4(b, c, m, b->t->family == TEMPLATE_DEEPSEEK4_FLASH, open_think); break;
    case TEMPLATE_PLAIN: tmpl_render_plain(b, c, m); break;
    case TEMPLATE_JINJA: tmpl_render_jinja(b, c, b->t->jinja); break;
    }
    free(m);
    return b->st == TEMPLATE_OK;
}

static void tmpl_b_free(tmpl_b *b)
{
    free(b->segs);
    bytebuf_free(&b->runs);
    bytebuf_free(&b->shown);
    bytebuf_free(&b->store);
    bytebuf_free(&b->json);
    bytebuf_free(&b->json_src);
}

/* ---- tokenising the runs --------------------------------------------------------------- */

typedef struct {
    const template *t;
    const tmpl_b *b;
    size_t *run_seg;      /* (n_runs) segment index of each text run */
    size_t n_runs;
    int32_t **ids;        /* (n_runs) token ids of each run */
    size_t *n_ids;        /* (n_runs) */
    int n_groups;         /* contiguous groups of runs, of about equal bytes */
    size_t bounds[TMPL_MAX_GROUPS + 1]; /* (n_groups + 1) run index where each group starts */
    bool failed[TMPL_MAX_GROUPS];       /* (n_groups) a run of the group did not tokenise */
} tmpl_job;

/* A pool job: groups ith, ith+nth, ... of the runs. */
static void tmpl_tokenize_part(void *ctx, int ith, int nth)
{
    tmpl_job *j = ctx;
    for (int k = ith; k < j->n_groups; k += nth)
        for (size_t r = j->bounds[k]; r < j->bounds[k + 1]; r++) {
            const tmpl_seg *g = &j->b->segs[j->run_seg[r]];
            size_t cap = 0;
            j->n_ids[r] = 0;
            j->ids[r] = NULL;
            if (template_tokenize_plain(j->t, j->b->runs.p + g->off, g->len, &j->ids[r], &j->n_ids[r], &cap) < 0)
                j->failed[k] = true;
        }
}

static bool tmpl_tokenize(const template *t, const tmpl_b *b, threadpool *tp, template_prompt *out)
{
    size_t n_runs = 0, total = 0;
    for (size_t i = 0; i < b->n_segs; i++)
        if (b->segs[i].id < 0) {
            n_runs++;
            total += b->segs[i].len;
        }
    size_t *run_seg = xmalloc((n_runs ? n_runs : 1) * sizeof *run_seg);
    int32_t **ids = xcalloc(n_runs ? n_runs : 1, sizeof *ids);
    size_t *n_ids = xcalloc(n_runs ? n_runs : 1, sizeof *n_ids);
    for (size_t i = 0, r = 0; i < b->n_segs; i++)
        if (b->segs[i].id < 0) run_seg[r++] = i;
    tmpl_job job = { .t = t, .b = b, .run_seg = run_seg, .n_runs = n_runs, .ids = ids, .n_ids = n_ids, .n_groups = 1 };
    int n_threads = threadpool_size(tp);
    if (n_threads > 1 && total >= TMPL_PARALLEL_MIN_BYTES && n_runs > 1)
        job.n_groups = (int)TM_MIN((size_t)TM_MIN(n_threads, TMPL_MAX_GROUPS), n_runs);
    /* split the runs into n_groups contiguous groups of about equal bytes */
    size_t acc = 0, r = 0;
    for (int k = 1; k < job.n_groups; k++) {
        size_t goal = total * (size_t)k / (size_t)job.n_groups;
        while (r < n_runs && acc < goal) acc += b->segs[run_seg[r++]].len;
        job.bounds[k] = r;
    }
    job.bounds[job.n_groups] = n_runs;
    /* the pool is shared by every request's handler: one that finds it busy tokenises alone */
    if (job.n_groups == 1 || !threadpool_try_run(tp, tmpl_tokenize_part, &job)) tmpl_tokenize_part(&job, 0, 1);
    bool ok = true;
    for (int k = 0; k < job.n_groups; k++) ok = ok && !job.failed[k];
    size_t count = 0;
    for (size_t i = 0; i < b->n_segs; i++) count += b->segs[i].id >= 0 ? 1 : 0;
    for (size_t k = 0; k < n_runs; k++) count += n_ids[k];
    out->ids = xmalloc((count ? count : 1) * sizeof *out->ids);
    out->n_ids = 0;
    for (size_t i = 0, k = 0; i < b->n_segs; i++) {
        if (b->segs[i].id >= 0) {
            out->ids[out->n_ids++] = b->segs[i].id;
        } else {
            if (n_ids[k]) memcpy(out->ids + out->n_ids, ids[k], n_ids[k] * sizeof *out->ids);
            out->n_ids += n_ids[k];
            k++;
        }
    }
    for (size_t k = 0; k < n_runs; k++) free(ids[k]);
    free(ids);
    free(n_ids);
    free(run_seg);
    return ok;
}

template_status template_apply(const template *t, const conv *c, threadpool *tp, template_prompt *out,
                               char *err, size_t errsz)
{
    memset(out, 0, sizeof *out);
    char dummy[1];
    tmpl_b b = { .t = t, .err = err ? err : dummy, .errsz = err ? errsz : sizeof dummy };
    bool open_think;
    if (!tmpl_render(&b, c, &open_think)) {
        template_status st = b.st;
        tmpl_b_free(&b);
        return st;
    }
    if (!tmpl_tokenize(t, &b, tp, out)) {
        snprintf(b.err, b.errsz, "the tokenizer failed");
        tmpl_b_free(&b);
        template_prompt_free(out);
        return TEMPLATE_ERR_TOKENIZE;
    }
    bytebuf_putc(&b.shown, 0);
    out->text = b.shown.p;
    out->text_len = b.shown.len - 1;
    b.shown.p = NULL;
    tmpl_b_free(&b);
    return TEMPLATE_OK;
}

void tmpl_tool_markers(const tokenizer *tok, events_toolfmt fmt, events_markers *m)
{
    m->toolfmt = fmt;
    switch (fmt) {
    case EVENTS_TOOLFMT_QWEN:
        m->tool_start = tmpl_find(tok, "<tool_call>");
        m->tool_end = tmpl_find(tok, "</tool_call>");
        break;
    case EVENTS_TOOLFMT_DEEPSEEK:
        m->tools_begin = tmpl_find(tok, "<｜tool▁calls▁begin｜>");
        m->tools_end = tmpl_find(tok, "<｜tool▁calls▁end｜>");
        m->tool_start = tmpl_find(tok, "<｜tool▁call▁begin｜>");
        m->tool_end = tmpl_find(tok, "<｜tool▁call▁end｜>");
        m->tool_sep = tmpl_find(tok, "<｜tool▁sep｜>");
        break;
    case EVENTS_TOOLFMT_LLAMA3:
        m->tool_start = tmpl_find(tok, "<|python_tag|>");
        break;
    case EVENTS_TOOLFMT_MISTRAL:
        m->tool_start = tmpl_find(tok, "[TOOL_CALLS]");
        m->tool_sep = tmpl_find(tok, "[ARGS]");
        m->call_id = tmpl_find(tok, "[CALL_ID]");
        break;
    case EVENTS_TOOLFMT_XML:
        m->tool_start = tmpl_find(tok, "<tool_call>");
        m->tool_end = tmpl_find(tok, "</tool_call>");
        break;
    case EVENTS_TOOLFMT_GLM:
        m->tool_start = tmpl_find(tok, "<tool_call>");
        m->tool_end = tmpl_find(tok, "</tool_call>");
        m->arg_key = tmpl_find(tok, "<arg_key>");
        m->arg_key_end = tmpl_find(tok, "</arg_key>");
        m->arg_val = tmpl_find(tok, "<arg_value>");
        m->arg_val_end = tmpl_find(tok, "</arg_value>");
        break;
    case EVENTS_TOOLFMT_HARMONY:
        m->h_start = tmpl_find(tok, "<|start|>");
        m->h_channel = tmpl_find(tok, "<|channel|>");
        m->h_message = tmpl_find(tok, "<|message|>");
        m->h_constrain = tmpl_find(tok, "<|constrain|>");
        m->h_end = tmpl_find(tok, "<|end|>");
        m->h_call = tmpl_find(tok, "<|call|>");
        m->h_return = tmpl_find(tok, "<|return|>");
        break;
    case EVENTS_TOOLFMT_DSML:
        m->tool_start = tmpl_find(tok, "｜DSML｜");
        break;
    default:
        break;
    }
}

void template_markers(const template *t, const conv *c, events_markers *m)
{
    const tokenizer *tok = t->tok;
    events_markers_none(m);
    m->tools_enabled = c->n_tools > 0;
    m->trim = t->family != TEMPLATE_PLAIN;
    switch (t->family) {
    case TEMPLATE_QWEN3:
    case TEMPLATE_QWEN25:
    case TEMPLATE_QWEN2:
    case TEMPLATE_CHATML:
        m->think_start = tmpl_find(tok, "<think>");
        m->think_end = tmpl_find(tok, "</think>");
        tmpl_tool_markers(tok, EVENTS_TOOLFMT_QWEN, m);
        break;
    case TEMPLATE_LLAMA3:
        tmpl_tool_markers(tok, EVENTS_TOOLFMT_LLAMA3, m);
        break;
    case TEMPLATE_DEEPSEEK_R1:
    case TEMPLATE_DEEPSEEK3: {
        m->think_start = tmpl_find(tok, "<think>");
        m->think_end = tmpl_find(tok, "</think>");
        tmpl_tool_markers(tok, EVENTS_TOOLFMT_DEEPSEEK, m);
        /* the generation prompt ends with an open <think> when thinking is on */
        bool last_user = false, is_tool = false;
        for (int i = 0; i < c->n_turns; i++) {
            conv_role r = c->turns[i].role;
            if (r == CONV_ROLE_USER) { last_user = true; is_tool = false; }
            else if (r == CONV_ROLE_ASSISTANT) { last_user = false; is_tool = false; }
            else if (r == CONV_ROLE_TOOL) { last_user = false; is_tool = true; }
        }
        if (t->family == TEMPLATE_DEEPSEEK_R1) /* R1 opens the block after any turn but a tool's */
            m->starts_in_reasoning = c->add_generation_prompt && !is_tool && tmpl_ds_thinking(c);
        else
            m->starts_in_reasoning = c->add_generation_prompt && last_user && !is_tool && tmpl_ds_thinking(c);
        break;
    }
    case TEMPLATE_HARMONY:
        tmpl_tool_markers(tok, EVENTS_TOOLFMT_HARMONY, m);
        if (c->add_generation_prompt) m->h_forced = c->forced_call;
        break;
    case TEMPLATE_DEEPSEEK4:
    case TEMPLATE_DEEPSEEK4_FLASH:
        tmpl_deepseek4_markers(tok, c, m);
        break;
    case TEMPLATE_PLAIN:
        break;
    case TEMPLATE_JINJA:
        tmpl_jinja_markers(t, t->jinja, c, m);
        break;
    }
}

const char *template_tool_format(const template *t)
{
    static const char *const names[] = { [EVENTS_TOOLFMT_NONE] = "none", [EVENTS_TOOLFMT_QWEN] = "qwen",
                                         [EVENTS_TOOLFMT_DEEPSEEK] = "deepseek", [EVENTS_TOOLFMT_LLAMA3] = "llama3",
                                         [EVENTS_TOOLFMT_HARMONY] = "harmony", [EVENTS_TOOLFMT_MISTRAL] = "mistral",
                                         [EVENTS_TOOLFMT_GLM] = "glm", [EVENTS_TOOLFMT_DSML] = "dsml",
                                         [EVENTS_TOOLFMT_XML] = "xml" };
    conv c;
    conv_init(&c);
    events_markers m;
    template_markers(t, &c, &m);
    conv_free(&c);
    return (size_t)m.toolfmt < TM_ARRAY_LEN(names) ? names[m.toolfmt] : "none";
}
