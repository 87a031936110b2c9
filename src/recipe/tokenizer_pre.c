/*
 * tokenizer_pre: the pre-tokenizers of byte-level BPE vocabularies, as llama.cpp's
 * llm_tokenizer_bpe picks them by tokenizer.ggml.pre: a list of regexes, each splitting every
 * word the previous one produced into matches and the gaps between them.
 *
 * The regexes run on PCRE2 over llama.cpp's collapsed class representation (one byte per code
 * point, non-ASCII letters -> 0xD2, digits -> 0xD1, ...), so that the splits equal std::regex's
 * on the same text; regexes without \p{..} run on UTF-8 with non-ASCII spaces as \v, and
 * "\s+$" is done by hand. Compiled once at load; the match data lives in the caller's scratch.
 */
#include "recipe/tokenizer_int.h"
#include "util/unicode.h"
#include "util/util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------------------------------- */
/* pre-tokenizers                                                                            */

#define RE_CONTRACTIONS "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
#define RE_LLAMA3 RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_QWEN2 RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"
#define RE_GPT2 "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)"
#define RE_GPT4O_MAIN "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+" RE_CONTRACTIONS "?|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*" RE_CONTRACTIONS "?|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"

/* The pre-tokenizers of llama.cpp (llm_tokenizer_bpe), by tokenizer.ggml.pre. Names are
 * '|'-separated. Only those llama.cpp runs as plain regex lists are here. */
static const struct {
    const char *names;
    bool ignore_merges, add_bos, no_bos;
    const char *re[TOKENIZER_MAX_REGEX];
} tokenizer_pres[] = {
    { "|llama3|llama-v3|llama-bpe|falcon3|falcon-h1|pixtral|midm-2.0|lfm2|jina-v5-nano|", true, true, false,
      { RE_LLAMA3 } },
    { "|dbrx|smaug-bpe|", false, false, false, { RE_LLAMA3 } },
    { "|jais-2|", false, false, false,
      { RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s{512}(?!\\S)|\\s{256}(?!\\S)|\\s{128}(?!\\S)|\\s{64}(?!\\S)|\\s{32}(?!\\S)|\\s{16}(?!\\S)|\\s{8}(?!\\S)|\\s{4}(?!\\S)|\\s{1,2}(?!\\S)|\\s{1}" } },
    { "|deepseek-llm|", false, false, false,
      { "[\r\n]",
        "\\s?[A-Za-z\xc2\xb5\xc3\x80-\xc3\x96\xc3\x98-\xc3\xb6\xc3\xb8-\xc6\xba\xc6\xbc-\xc6\xbf\xc7\x84-\xca\x93\xca\x95-\xca\xaf\xcd\xb0-\xcd\xb3\xcd\xb6\xcd\xb7\xcd\xbb-\xcd\xbd\xcd\xbf\xce\x86\xce\x88-\xce\x8a\xce\x8c\xce\x8e-\xce\xa1\xce\xa3-\xcf\xb5\xcf\xb7-\xd2\x81\xd2\x8a-\xd4\xaf\xd4\xb1-\xd5\x96\xe1\x82\xa0-\xe1\x83\x85\xe1\x8e\xa0-\xe1\x8f\xb5\xe1\x8f\xb8-\xe1\x8f\xbd\xe1\xb2\x90-\xe1\xb2\xba\xe1\xb2\xbd-\xe1\xb2\xbf\xe1\xb4\x80-\xe1\xb4\xab\xe1\xb5\xab-\xe1\xb5\xb7\xe1\xb5\xb9-\xe1\xb6\x9a\xe1\xb8\x80-\xe1\xbc\x95\xe1\xbc\x98-\xe1\xbc\x9d\xe1\xbc\xa0-\xe1\xbd\x85\xe1\xbd\x88-\xe1\xbd\x8d\xe1\xbd\x90-\xe1\xbd\x97\xe1\xbd\x99\xe1\xbd\x9b\xe1\xbd\x9d\xe1\xbd\x9f-\xe1\xbd\xbd\xe1\xbe\x80-\xe1\xbe\xb4\xe1\xbe\xb6-\xe1\xbe\xbc\xe1\xbe\xbe\xe1\xbf\x82-\xe1\xbf\x84\xe1\xbf\x86-\xe1\xbf\x8c\xe1\xbf\x90-\xe1\xbf\x93\xe1\xbf\x96-\xe1\xbf\x9b\xe1\xbf\xa0-\xe1\xbf\xac\xe1\xbf\xb2-\xe1\xbf\xb4\xe1\xbf\xb6-\xe1\xbf\xbc\xe2\x84\x82\xe2\x84\x87\xe2\x84\x8a-\xe2\x84\x93\xe2\x84\x95\xe2\x84\x99-\xe2\x84\x9d\xe2\x84\xa4\xe2\x84\xa6\xe2\x84\xa8\xe2\x84\xaa-\xe2\x84\xad\xe2\x84\xaf-\xe2\x84\xb4\xe2\x84\xb9\xe2\x84\xbc-\xe2\x84\xbf\xe2\x85\x85-\xe2\x85\x89\xe2\x85\x8e\xe2\x86\x83\xe2\x86\x84\xe2\xb0\x80-\xe2\xb1\xbb\xe2\xb1\xbe-\xe2\xb3\xa4\xe2\xb3\xab-\xe2\xb3\xae\xe2\xb3\xb2\xe2\xb3\xb3\xea\x99\x80-\xea\x99\xad\xea\x9a\x80-\xea\x9a\x9b\xea\x9c\xa2-\xea\x9d\xaf\xea\x9d\xb1-\xea\x9e\x87\xea\x9e\x8b-\xea\x9e\x8e\xea\xad\xb0-\xea\xae\xbf\xef\xac\x80-\xef\xac\x86\xef\xac\x93-\xef\xac\x97\xef\xbc\xa1-\xef\xbc\xba\xef\xbd\x81-\xef\xbd\x9a\xf0\x90\x90\x80-\xf0\x90\x91\x8f\xf0\x90\x92\xb0-\xf0\x90\x93\x93\xf0\x90\x93\x98-\xf0\x90\x93\xbb\xf0\x90\xb2\x80-\xf0\x90\xb2\xb2\xf0\x90\xb3\x80-\xf0\x90\xb3\xb2\xf0\x91\xa2\xa0-\xf0\x91\xa3\x9f\xf0\x9e\xa4\x80-\xf0\x9e\xa5\x83]+",
        "\\s?[!-/:-~\xef\xbc\x81-\xef\xbc\x8f\xef\xbc\x9a-\xef\xbd\x9e\xe2\x80\x98-\xe2\x80\x9f\xe3\x80\x80-\xe3\x80\x82]+",
        "\\s+$",
        "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+",
        "\\p{N}+" } },
    { "|deepseek-v3|hunyuan-dense|joyai-llm|", false, false, false,
      { "\\p{N}{1,3}",
        "[\xe4\xb8\x80-\xe9\xbe\xa5\xe3\x81\x80-\xe3\x82\x9f\xe3\x82\xa0-\xe3\x83\xbf]+",
        "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+" } },
    { "|deepseek-coder|", false, false, false,
      { "[\r\n]", "\\s?\\p{L}+", "\\s?\\p{P}+", "[\xe4\xb8\x80-\xe9\xbe\xa5\xe0\xa0\x80-\xe4\xb8\x80\xea\xb0\x80-\xed\x9f\xbf]+", "\\p{N}" } },
    { "|falcon|", false, false, false,
      { "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "[0-9][0-9][0-9]" } },
    { "|starcoder|refact|command-r|smollm|codeshell|exaone|minerva-7b|mellum2|", false, false, false,
      { "\\p{N}", RE_GPT2 } },
    { "|gpt-2|phi-2|jina-es|jina-de|gigachat|jina-v2-es|jina-v2-de|a.x-4.0|mellum|modern-bert|mpt|olmo|jais|trillion|granite-docling|exaone4|jina-v1-en|jina-v2-code|roberta-bpe|",
      false, false, false, { RE_GPT2 } },
    { "|qwen2|deepseek-r1-qwen|kormo|f2llmv2|stablelm2|hunyuan|solar-open|megrez|", false, false, false,
      { RE_QWEN2 } },
    { "|qwen35|", false, false, false,
      { RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+|\\p{N}| ?[^\\s\\p{L}\\p{M}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
    { "|poro-chat|bloom|gpt3-finnish|", false, false, false, { " ?[^(\\s|.,!?\xe2\x80\xa6\xe3\x80\x82\xef\xbc\x8c\xe3\x80\x81\xe0\xa5\xa4\xdb\x94\xd8\x8c)]+" } },
    { "|glm4|chatglm-bpe|", false, false, true, { RE_LLAMA3 } },
    { "|viking|", false, false, false, { " ?[^(\\s|.,!?\xe2\x80\xa6\xe3\x80\x82\xef\xbc\x8c\xe3\x80\x81\xe0\xa5\xa4\xdb\x94\xd8\x8c)]+", "\\p{N}" } },
    { "|tekken|", true, true, false,
      { "[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))*((?=[\\p{L}])([^A-Z]))+|[^\\r\\n\\p{L}\\p{N}]?((?=[\\p{L}])([^a-z]))+((?=[\\p{L}])([^A-Z]))*|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n/]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
    { "|chameleon|", false, true, false,
      { "<sentinel:[0-9]+>", "(IMGIMG)((A|B|C|D|E|F|G|H|I){1,4})Z", "([\\t\\n]|    |  )", "\\p{N}",
        "[\\p{P}!-/:-@\\[-`{-~]", RE_GPT2 } },
    { "|gpt-4o|llama4|kanana2|talkie|minimax-m2|", false, false, false, { RE_GPT4O_MAIN } },
    { "|bailingmoe|bailingmoe2|llada-moe|", false, false, false,
      { "'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]|\\s+(?!\\S)|\\s+" } },
    { "|seed-coder|", false, false, false,
      { RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1}| ?[^\\s\\p{L}\\p{N}\\r\\n]+|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
    { "|grok-2|", false, false, false, { RE_QWEN2 } },
    { "|laguna|", false, false, false, { "[^\\n]+|[\\n]+", RE_QWEN2 } },
    { "|minicpm5|", true, false, false,
      { "\\p{N}{1,3}",
        RE_CONTRACTIONS "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}+| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+" } },
    { "|default|", false, false, false,
      { "[\\p{P}\\$\\+<=>\\^~\\|]+", RE_GPT2, "\\p{N}+", "[0-9][0-9][0-9]" } },
};

/* Unicode classes llama.cpp's regex splitter knows, the byte that stands for a non-ASCII code
 * point of that class in the collapsed text, and the ASCII members to keep in the class. */
static const struct {
    const char *name;
    uint32_t flag;
} tokenizer_ucat[] = {
    { "\\p{N}", UNICODE_FLAG_NUMBER }, { "\\p{L}", UNICODE_FLAG_LETTER },
    { "\\p{P}", UNICODE_FLAG_PUNCTUATION }, { "\\p{M}", UNICODE_FLAG_MARK },
    { "\\p{S}", UNICODE_FLAG_SYMBOL }, { "\\p{Lu}", UNICODE_FLAG_LETTER },
    { "\\p{Ll}", UNICODE_FLAG_LETTER }, { "\\p{Lt}", UNICODE_FLAG_LETTER },
    { "\\p{Lm}", UNICODE_FLAG_LETTER }, { "\\p{Lo}", UNICODE_FLAG_LETTER },
};

static uint8_t tokenizer_collapsed_byte(uint32_t flag)
{
    switch (flag) {
    case UNICODE_FLAG_NUMBER: return 0xD1;
    case UNICODE_FLAG_LETTER: return 0xD2;
    case UNICODE_FLAG_PUNCTUATION: return 0xD3;
    case UNICODE_FLAG_MARK: return 0xD4;
    case UNICODE_FLAG_SYMBOL: return 0xD5;
    default: return 0xD0;
    }
}

static const char *tokenizer_collapsed_ascii(uint32_t flag)
{
    switch (flag) {
    case UNICODE_FLAG_NUMBER: return "0-9";
    case UNICODE_FLAG_LETTER: return "A-Za-z";
    case UNICODE_FLAG_PUNCTUATION: return "!-#%-*,-/:-;?-@\\[-\\]_\\{\\}";
    case UNICODE_FLAG_SYMBOL: return "\\$\\+<->^`\\|\\~";
    default: return "";
    }
}

/* Rewrites a regex using \p{..} for the collapsed text, exactly as llama.cpp does. */
static bool tokenizer_collapse_regex(const char *re, bytebuf *out)
{
    size_t n = strlen(re);
    bool inside = false;
    for (size_t i = 0; i < n; i++) {
        if (re[i] == '[' && (i == 0 || re[i - 1] != '\\')) {
            inside = true;
            if (!bytebuf_try_append(out, "[", 1)) return false;
            continue;
        }
        if (inside && re[i] == ']' && re[i - 1] != '\\') {
            inside = false;
            if (!bytebuf_try_append(out, "]", 1)) return false;
            continue;
        }
        if (re[i] == '\\' && i + 3 < n && re[i + 1] == 'p' && re[i + 2] == '{') {
            const char *close = strchr(re + i + 3, '}');
            if (close && (size_t)(close - re) <= i + 10) {
                size_t plen = (size_t)(close - re) - i + 1;
                for (size_t k = 0; k < TM_ARRAY_LEN(tokenizer_ucat); k++) {
                    if (strlen(tokenizer_ucat[k].name) == plen && !memcmp(re + i, tokenizer_ucat[k].name, plen)) {
                        uint8_t cb = tokenizer_collapsed_byte(tokenizer_ucat[k].flag);
                        const char *ascii = tokenizer_collapsed_ascii(tokenizer_ucat[k].flag);
                        if (!inside && !bytebuf_try_append(out, "[", 1)) return false;
                        if (!bytebuf_try_append(out, &cb, 1) || !bytebuf_try_append(out, ascii, strlen(ascii))) return false;
                        if (!inside && !bytebuf_try_append(out, "]", 1)) return false;
                        i = (size_t)(close - re);
                        goto next;
                    }
                }
            }
        }
        if (!bytebuf_try_append(out, re + i, 1)) return false;
    next:;
    }
    return true;
}

static bool tokenizer_regex_uses_ucat(const char *re)
{
    for (size_t k = 0; k < TM_ARRAY_LEN(tokenizer_ucat); k++)
        if (strstr(re, tokenizer_ucat[k].name)) return true;
    return false;
}

static bool tokenizer_regex_compile(tokenizer_regex *r, const char *re, char *err, size_t errsz)
{
    if (!strcmp(re, "\\s+$")) {
        r->mode = TOKENIZER_RE_TRAILING_SPACE;
        return true;
    }
    bytebuf pat = { 0 };
    uint32_t opts = PCRE2_DOLLAR_ENDONLY;
    bool ok;
    if (tokenizer_regex_uses_ucat(re)) {
        r->mode = TOKENIZER_RE_COLLAPSED;
        ok = tokenizer_collapse_regex(re, &pat);
    } else {
        r->mode = TOKENIZER_RE_WIDE;
        opts |= PCRE2_UTF;
        ok = bytebuf_try_append(&pat, re, strlen(re));
    }
    if (!ok) {
        bytebuf_free(&pat);
        snprintf(err, errsz, "out of memory");
        return false;
    }
    int ec;
    PCRE2_SIZE eo;
    r->code = pcre2_compile((PCRE2_SPTR)pat.p, pat.len, opts, &ec, &eo, NULL);
    bytebuf_free(&pat);
    if (!r->code) {
        PCRE2_UCHAR msg[128];
        pcre2_get_error_message(ec, msg, sizeof msg);
        snprintf(err, errsz, "pre-tokenizer regex does not compile at %zu: %s", (size_t)eo, (char *)msg);
        return false;
    }
    r->jit = pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE) == 0;
    return true;
}

static bool tokenizer_segs_push(tokenizer_segs *s, uint32_t start, uint32_t n)
{
    if (n == 0) return true;
    if (!tokenizer_grow((void **)&s->v, &s->cap, s->n + 1, sizeof *s->v)) return false;
    s->v[s->n++] = (tokenizer_seg){ start, n };
    return true;
}

/* Runs a PCRE2 regex over subject[0..len) the way std::regex_iterator walks a range: every
 * match and every gap between matches becomes a segment (offsets are in subject units). */
static bool tokenizer_regex_run(const tokenizer_regex *r, tokenizer_scratch *s, const char *subject,
                                size_t len, size_t *bounds, size_t *nb, size_t cap_bounds)
{
    size_t pos = 0, last = 0;
    *nb = 0;
    while (pos <= len) {
        int rc;
        if (r->jit) {
            rc = pcre2_jit_match(r->code, (PCRE2_SPTR)subject, len, pos, PCRE2_NO_UTF_CHECK, s->md, s->mctx);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
                if (!s->jstack) {
                    s->jstack = pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, NULL);
                    if (!s->jstack) return false;
                    pcre2_jit_stack_assign(s->mctx, NULL, s->jstack);
                    continue;
                }
                rc = pcre2_match(r->code, (PCRE2_SPTR)subject, len, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, s->md, s->mctx);
            }
        } else {
            rc = pcre2_match(r->code, (PCRE2_SPTR)subject, len, pos, PCRE2_NO_UTF_CHECK, s->md, s->mctx);
        }
        if (rc < 0) break;  /* no match (or a resource error: the rest stays one segment) */
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(s->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) {  /* empty match: step one character */
            pos = ms + 1;
            if (r->mode == TOKENIZER_RE_WIDE)
                while (pos < len && ((uint8_t)subject[pos] & 0xC0) == 0x80) pos++;
            continue;
        }
        if (*nb + 4 > cap_bounds) return false;
        if (ms > last) bounds[(*nb)++] = ms;  /* gap [last, ms) ends */
        bounds[(*nb)++] = me;                 /* match [ms, me) ends */
        last = me;
        pos = me;
    }
    return true;
}

/* Splits code points cpts[0..n) into words with the tokenizer's regex list. */
bool tokenizer_pre_split(const tokenizer *t, tokenizer_scratch *s, const uint32_t *cpts, size_t n)
{
    s->segs.n = 0;
    if (!tokenizer_segs_push(&s->segs, 0, (uint32_t)n)) return false;
    size_t *bounds = NULL;
    size_t cap_bounds = 0;
    bool ok = true;
    for (int ri = 0; ri < t->n_regex && ok; ri++) {
        const tokenizer_regex *r = &t->regex[ri];
        s->segs2.n = 0;
        if (r->mode == TOKENIZER_RE_COLLAPSED && !s->coll) {
            s->coll = malloc(n + 1);
            if (!s->coll) { ok = false; break; }
            for (size_t i = 0; i < n; i++) {
                uint32_t c = cpts[i];
                if (c < 128) { s->coll[i] = (char)c; continue; }
                uint32_t f = unicode_flags(c);
                s->coll[i] = (f & UNICODE_FLAG_WHITESPACE) ? '\v' : (char)tokenizer_collapsed_byte(f & UNICODE_FLAG_CATEGORIES);
            }
        }
        if (r->mode == TOKENIZER_RE_WIDE && !s->wide) {
            s->wide = malloc(4 * n + 1);
            s->wide_off = malloc((n + 1) * sizeof *s->wide_off);
            if (!s->wide || !s->wide_off) { ok = false; break; }
            uint32_t off = 0;
            for (size_t i = 0; i < n; i++) {
                uint32_t c = cpts[i];
                if (c > 0x7F && (unicode_flags(c) & UNICODE_FLAG_WHITESPACE)) c = '\v';
                s->wide_off[i] = off;
                off += (uint32_t)unicode_encode(c, s->wide + off);
            }
            s->wide_off[n] = off;
        }
        for (size_t si = 0; si < s->segs.n && ok; si++) {
            tokenizer_seg g = s->segs.v[si];
            if (r->mode == TOKENIZER_RE_TRAILING_SPACE) {
                uint32_t k = g.n;
                while (k > 0 && (unicode_flags(cpts[g.start + k - 1]) & UNICODE_FLAG_WHITESPACE)) k--;
                ok = tokenizer_segs_push(&s->segs2, g.start, k) && tokenizer_segs_push(&s->segs2, g.start + k, g.n - k);
                continue;
            }
            const char *subj;
            size_t len;
            if (r->mode == TOKENIZER_RE_COLLAPSED) {
                subj = s->coll + g.start;
                len = g.n;
            } else {
                subj = s->wide + s->wide_off[g.start];
                len = s->wide_off[g.start + g.n] - s->wide_off[g.start];
            }
            size_t nb;
            if (!tokenizer_grow((void **)&bounds, &cap_bounds, 2 * len + 8, sizeof *bounds) ||
                !tokenizer_regex_run(r, s, subj, len, bounds, &nb, cap_bounds)) {
                ok = false;
                break;
            }
            /* bounds are segment ends in subject units; convert to code points */
            uint32_t prev = g.start;
            size_t wi = g.start;  /* wide: code point index being located */
            for (size_t b = 0; b <= nb && ok; b++) {
                uint32_t end;
                if (b == nb) {
                    end = g.start + g.n;
                } else if (r->mode == TOKENIZER_RE_COLLAPSED) {
                    end = g.start + (uint32_t)bounds[b];
                } else {
                    uint32_t target = s->wide_off[g.start] + (uint32_t)bounds[b];
                    while (s->wide_off[wi] < target) wi++;
                    end = (uint32_t)wi;
                }
                ok = tokenizer_segs_push(&s->segs2, prev, end - prev);
                prev = end;
            }
        }
        tokenizer_segs tmp = s->segs;
        s->segs = s->segs2;
        s->segs2 = tmp;
    }
    free(bounds);
    return ok;
}

/* BPE: tokenizer.ggml.pre chooses the pre-tokenizer (its regexes, BOS handling, whether
 * whole-token words skip merging). */
tokenizer_status tokenizer_pre_load(tokenizer *t, const gguf *g, char *err, size_t errsz)
{
    const char *pre = NULL;
    size_t npre = 0;
    if (!gguf_get_str(g, "tokenizer.ggml.pre", &pre, &npre)) pre = "default", npre = 7;
    char pname[80];
    if (npre == 0 || npre >= sizeof pname - 2) pre = "default", npre = 7;
    snprintf(pname, sizeof pname, "|%.*s|", (int)npre, pre);
    size_t k;
    for (k = 0; k < TM_ARRAY_LEN(tokenizer_pres); k++)
        if (strstr(tokenizer_pres[k].names, pname)) break;
    if (k == TM_ARRAY_LEN(tokenizer_pres)) {
        tokenizer_err(err, errsz, "unsupported pre-tokenizer tokenizer.ggml.pre = '%.*s'", (int)TM_MIN(npre, 64), pre);
        return TOKENIZER_ERR_UNSUPPORTED;
    }
    t->ignore_merges = tokenizer_pres[k].ignore_merges;
    t->add_bos = tokenizer_pres[k].add_bos;
    if (tokenizer_pres[k].no_bos) t->bos = -1;
    for (int r = 0; r < TOKENIZER_MAX_REGEX && tokenizer_pres[k].re[r]; r++) {
        if (!tokenizer_regex_compile(&t->regex[r], tokenizer_pres[k].re[r], err, errsz)) return TOKENIZER_ERR_FORMAT;
        t->n_regex = r + 1;
    }
    return TOKENIZER_OK;
}
