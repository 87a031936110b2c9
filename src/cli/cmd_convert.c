/*
 * cmd_convert: `tokenmill convert llama2c WEIGHTS.bin TOKENIZER.bin -o OUT.gguf [--name NAME]`.
 *
 * Turns a llama2.c checkpoint (Karpathy's run.c format: a 28-byte header of seven int32
 * (dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len; vocab_size < 0 means
 * an unshared classifier follows), then float32 weights) and its tokenizer.bin into a GGUF
 * file of llama.cpp's `llama` architecture in F32, with the metadata and tensor names that
 * llama.cpp's own converters write.
 *
 * No weight permutation is needed: llama2.c's wq/wk rows are in the interleaved (GPT-J,
 * original Meta) RoPE layout, which is what llama.cpp's LLAMA_ROPE_TYPE_NORM applies. A
 * llama2.c matrix (rows, cols) row-major is a ggml tensor ne = {cols, rows}: same bytes.
 *
 * The vocabulary becomes SentencePiece-style: spaces as U+2581, <unk>/<s>/</s> renamed as
 * SentencePiece names them, token types UNKNOWN/CONTROL/BYTE/NORMAL.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "cli/cmd_opts.h"
#include "model/gguf.h"
#include "util/util.h"

enum { CONVERT_TT_NORMAL = 1, CONVERT_TT_UNKNOWN = 2, CONVERT_TT_CONTROL = 3, CONVERT_TT_BYTE = 6 };

typedef struct {
    int32_t dim;            /* model width */
    int32_t hidden_dim;     /* FFN width */
    int32_t n_layers;
    int32_t n_heads;
    int32_t n_kv_heads;
    int32_t vocab_size;     /* < 0 in the file when the classifier is unshared; stored positive */
    int32_t seq_len;        /* context length */
    bool shared;            /* output classifier == token embedding */
} convert_config;

typedef struct {
    char **text;            /* (n) token pieces, NUL-terminated, spaces as U+2581 */
    size_t *len;            /* (n) their byte lengths */
    float *score;           /* (n) merge scores */
    int32_t *type;          /* (n) llama token types */
    int n;
} convert_vocab;

static void convert_vocab_free(convert_vocab *v)
{
    if (v->text)
        for (int i = 0; i < v->n; i++) free(v->text[i]);
    free(v->text);
    free(v->len);
    free(v->score);
    free(v->type);
}

/* Replaces every ' ' by U+2581 (3 bytes). */
static char *convert_escape_spaces(const char *s, size_t n, size_t *out_len)
{
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += s[i] == ' ' ? 3 : 1;
    char *o = xmalloc(k + 1), *p = o;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == ' ') {
            memcpy(p, "\xe2\x96\x81", 3);
            p += 3;
        } else {
            *p++ = s[i];
        }
    }
    *p = 0;
    *out_len = k;
    return o;
}

static bool convert_is_byte_token(const char *s, size_t n)
{
    static const char hex[] = "0123456789ABCDEFabcdef";
    return n == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && s[3] && s[4] && strchr(hex, s[3]) && strchr(hex, s[4]);
}

static bool convert_read_vocab(const char *path, int n_vocab, convert_vocab *v)
{
    size_t sz;
    char *buf = util_read_file(path, &sz);
    if (!buf) {
        fprintf(stderr, "tokenmill convert: %s: cannot read: %m\n", path);
        return false;
    }
    v->n = n_vocab;
    v->text = xcalloc((size_t)n_vocab, sizeof *v->text);
    v->len = xcalloc((size_t)n_vocab, sizeof *v->len);
    v->score = xcalloc((size_t)n_vocab, sizeof *v->score);
    v->type = xcalloc((size_t)n_vocab, sizeof *v->type);
    size_t pos = 4; /* max_token_length, unused */
    bool ok = sz >= 4;
    for (int i = 0; ok && i < n_vocab; i++) {
        int32_t len;
        if (sz - pos < 8) { ok = false; break; }
        memcpy(&v->score[i], buf + pos, 4);
        memcpy(&len, buf + pos + 4, 4);
        pos += 8;
        if (len < 0 || (size_t)len > sz - pos) { ok = false; break; }
        const char *s = buf + pos;
        pos += (size_t)len;
        if (i == 0) {
            s = "<unk>", len = 5;
            v->type[i] = CONVERT_TT_UNKNOWN;
        } else if (i == 1 || i == 2) {
            s = i == 1 ? "<s>" : "</s>";
            len = (int32_t)strlen(s);
            v->type[i] = CONVERT_TT_CONTROL;
        } else if (len == 0) {
            v->type[i] = CONVERT_TT_CONTROL;
        } else if (convert_is_byte_token(s, (size_t)len)) {
            v->type[i] = CONVERT_TT_BYTE;
        } else {
            v->type[i] = CONVERT_TT_NORMAL;
        }
        v->text[i] = convert_escape_spaces(s, (size_t)len, &v->len[i]);
    }
    free(buf);
    if (!ok) fprintf(stderr, "tokenmill convert: %s: truncated or malformed tokenizer file\n", path);
    return ok;
}

static const char *convert_basename(const char *path, char *out, size_t outsz)
{
    const char *b = strrchr(path, '/');
    b = b ? b + 1 : path;
    snprintf(out, outsz, "%s", b);
    char *dot = strrchr(out, '.');
    if (dot && dot != out) *dot = 0;
    return out;
}

static int convert_llama2c(const char *wpath, const char *tpath, const char *out, const char *name)
{
    size_t sz;
    char *buf = util_read_file(wpath, &sz);
    if (!buf) {
        fprintf(stderr, "tokenmill convert: %s: cannot read: %m\n", wpath);
        return 1;
    }
    convert_config c;
    int32_t hdr[7];
    if (sz < sizeof hdr) {
        fprintf(stderr, "tokenmill convert: %s: truncated header\n", wpath);
        free(buf);
        return 1;
    }
    memcpy(hdr, buf, sizeof hdr);
    c.dim = hdr[0], c.hidden_dim = hdr[1], c.n_layers = hdr[2], c.n_heads = hdr[3], c.n_kv_heads = hdr[4];
    c.shared = hdr[5] > 0;
    c.vocab_size = hdr[5] > 0 ? hdr[5] : -hdr[5];
    c.seq_len = hdr[6];
    if (c.dim <= 0 || c.hidden_dim <= 0 || c.n_layers <= 0 || c.n_heads <= 0 || c.n_kv_heads <= 0 ||
        c.vocab_size <= 0 || c.seq_len <= 0 || c.dim % c.n_heads || c.n_heads % c.n_kv_heads || c.dim > 65536 ||
        c.hidden_dim > 1 << 20 || c.n_layers > 1024 || c.vocab_size > 1 << 24 || c.seq_len > 1 << 24) {
        fprintf(stderr, "tokenmill convert: %s: implausible header (dim %d, hidden %d, layers %d, heads %d/%d, vocab %d, ctx %d)\n",
                wpath, c.dim, c.hidden_dim, c.n_layers, c.n_heads, c.n_kv_heads, hdr[5], c.seq_len);
        free(buf);
        return 1;
    }
    int64_t dim = c.dim, hid = c.hidden_dim, L = c.n_layers, V = c.vocab_size;
    int64_t head = dim / c.n_heads, kv_dim = head * c.n_kv_heads;
    /* float offsets of each weight array, in file order */
    const float *f = (const float *)(buf + sizeof hdr);
    int64_t o = 0;
    int64_t o_emb = o; o += V * dim;
    int64_t o_att = o; o += L * dim;
    int64_t o_wq = o; o += L * dim * dim;
    int64_t o_wk = o; o += L * kv_dim * dim;
    int64_t o_wv = o; o += L * kv_dim * dim;
    int64_t o_wo = o; o += L * dim * dim;
    int64_t o_ffn = o; o += L * dim;
    int64_t o_w1 = o; o += L * hid * dim;
    int64_t o_w2 = o; o += L * dim * hid;
    int64_t o_w3 = o; o += L * hid * dim;
    int64_t o_fin = o; o += dim;
    o += (int64_t)c.seq_len * head; /* freq_cis_real + imag: seq_len * head/2 each */
    int64_t o_cls = o;
    if (!c.shared) o += V * dim;
    if ((uint64_t)o * 4 > sz - sizeof hdr) {
        fprintf(stderr, "tokenmill convert: %s: truncated: %zu bytes, header says %lld\n", wpath, sz,
                (long long)(o * 4 + (int64_t)sizeof hdr));
        free(buf);
        return 1;
    }

    convert_vocab v = { 0 };
    if (!convert_read_vocab(tpath, c.vocab_size, &v)) {
        convert_vocab_free(&v);
        free(buf);
        return 1;
    }

    char namebuf[256];
    gguf_writer *w = gguf_writer_new();
    gguf_writer_set_str(w, "general.architecture", "llama");
    gguf_writer_set_str(w, "general.name", name ? name : convert_basename(wpath, namebuf, sizeof namebuf));
    gguf_writer_set_u32(w, "general.file_type", 0); /* LLAMA_FTYPE_ALL_F32 */
    gguf_writer_set_u32(w, "llama.context_length", (uint32_t)c.seq_len);
    gguf_writer_set_u32(w, "llama.embedding_length", (uint32_t)c.dim);
    gguf_writer_set_u32(w, "llama.block_count", (uint32_t)c.n_layers);
    gguf_writer_set_u32(w, "llama.feed_forward_length", (uint32_t)c.hidden_dim);
    gguf_writer_set_u32(w, "llama.attention.head_count", (uint32_t)c.n_heads);
    gguf_writer_set_u32(w, "llama.attention.head_count_kv", (uint32_t)c.n_kv_heads);
    gguf_writer_set_u32(w, "llama.rope.dimension_count", (uint32_t)head);
    gguf_writer_set_f32(w, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    gguf_writer_set_f32(w, "llama.rope.freq_base", 10000.0f);
    gguf_writer_set_u32(w, "llama.vocab_size", (uint32_t)c.vocab_size);
    gguf_writer_set_str(w, "tokenizer.ggml.model", "llama");
    gguf_writer_set_arr_str(w, "tokenizer.ggml.tokens", (const char *const *)v.text, v.len, (uint64_t)v.n);
    gguf_writer_set_arr_f32(w, "tokenizer.ggml.scores", v.score, (uint64_t)v.n);
    gguf_writer_set_arr_i32(w, "tokenizer.ggml.token_type", v.type, (uint64_t)v.n);
    gguf_writer_set_u32(w, "tokenizer.ggml.bos_token_id", 1);
    gguf_writer_set_u32(w, "tokenizer.ggml.eos_token_id", 2);
    gguf_writer_set_u32(w, "tokenizer.ggml.unknown_token_id", 0);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_bos_token", true);
    gguf_writer_set_bool(w, "tokenizer.ggml.add_eos_token", false);

#define CONVERT_ADD(nm, ptr, ne0, ne1)                                                        \
    do {                                                                                      \
        int64_t ne_[2] = { (ne0), (ne1) };                                                    \
        int nd_ = ne_[1] == 1 ? 1 : 2;                                                        \
        gguf_writer_add_tensor(w, nm, QTYPE_F32, nd_, ne_, (ptr), (size_t)(ne0) * (size_t)(ne1) * 4); \
    } while (0)
    CONVERT_ADD("token_embd.weight", f + o_emb, dim, V);
    CONVERT_ADD("output_norm.weight", f + o_fin, dim, 1);
    if (!c.shared) CONVERT_ADD("output.weight", f + o_cls, dim, V);
    /* each layer's tensors: llama2.c's per-layer arrays, layer l at l * ne0 * ne1 floats */
    const struct {
        const char *suffix;
        int64_t off, ne0, ne1;   /* the array's offset in floats, and its (ne0, ne1) per layer */
    } lt[] = {
        { "attn_norm.weight", o_att, dim, 1 },   { "attn_q.weight", o_wq, dim, dim },
        { "attn_k.weight", o_wk, dim, kv_dim },  { "attn_v.weight", o_wv, dim, kv_dim },
        { "attn_output.weight", o_wo, dim, dim }, { "ffn_norm.weight", o_ffn, dim, 1 },
        { "ffn_gate.weight", o_w1, dim, hid },   { "ffn_down.weight", o_w2, hid, dim },
        { "ffn_up.weight", o_w3, dim, hid },
    };
    char tn[96];
    for (int64_t l = 0; l < L; l++)
        for (size_t i = 0; i < TM_ARRAY_LEN(lt); i++) {
            snprintf(tn, sizeof tn, "blk.%lld.%s", (long long)l, lt[i].suffix);
            CONVERT_ADD(tn, f + lt[i].off + l * lt[i].ne0 * lt[i].ne1, lt[i].ne0, lt[i].ne1);
        }
#undef CONVERT_ADD

    char err[512];
    gguf_status st = gguf_writer_write(w, out, err, sizeof err);
    if (st != GGUF_OK) fprintf(stderr, "tokenmill convert: %s\n", err);
    else
        fprintf(stderr, "tokenmill convert: wrote %s (llama, dim %d, layers %d, heads %d/%d, ffn %d, vocab %d, ctx %d, %s output)\n",
                out, c.dim, c.n_layers, c.n_heads, c.n_kv_heads, c.hidden_dim, c.vocab_size, c.seq_len,
                c.shared ? "tied" : "untied");
    gguf_writer_free(w);
    convert_vocab_free(&v);
    free(buf);
    return st == GGUF_OK ? 0 : 1;
}

int cmd_convert(int argc, char **argv)
{
    const char *pos[3] = { 0 }, *out = NULL, *name = NULL;
    int npos = 0;
    const cmd_opt opts[] = {
        { "--output", "-o", CMD_OPT_STR, &out, .arg = "OUT.gguf", .help = "the GGUF to write", .required = true },
        { "--name", NULL, CMD_OPT_STR, &name, .arg = "NAME", .help = "general.name of the model" },
        { 0 },
    };
    const char *synopsis = "convert llama2c WEIGHTS.bin TOKENIZER.bin -o OUT.gguf [--name NAME]";
    cmd_opts_status ost = cmd_opts_parse("convert", synopsis, opts, argc, argv, 1, pos, 3, &npos);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);
    if (npos != 3 || strcmp(pos[0], "llama2c") != 0) {
        fprintf(stderr, "tokenmill convert: %s\n", npos > 0 && strcmp(pos[0], "llama2c") ? "the only input format is llama2c"
                                                                                    : "needs WEIGHTS.bin and TOKENIZER.bin");
        cmd_opts_hint("convert", synopsis);
        return 2;
    }
    return convert_llama2c(pos[1], pos[2], out, name);
}
