/*
 * cmd_tokenize: `tokenmill tokenize -m MODEL [--special] [--pieces] [--no-bos] [--file F |
 * --batch F.json | TEXT]`. Prints the token ids of the text as one JSON array on one line;
 * --pieces prints [[id,"piece"],...] with each token's decoded text. --batch reads a JSON
 * array of strings and prints a JSON array of id arrays (one process for many texts, used by
 * the tests). BOS is prepended when the model asks for it unless --no-bos; --special lets
 * control-token text in the input match control tokens.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli/cmd.h"
#include "cli/cmd_opts.h"
#include "cli/cmd_common.h"
#include "recipe/tokenizer.h"
#include "util/jsonfmt.h"
#include "util/util.h"

/* Writes s[0..n) as a JSON string; bytes that are not valid UTF-8 become U+FFFD. */
static void cmd_tokenize_json_str(FILE *f, const char *s, size_t n)
{
    bytebuf b = { 0 };
    jsonfmt_write_string(&b, s, n);
    fwrite(b.p, 1, b.len, f);
    bytebuf_free(&b);
}

/* Tokenises and prints one text; returns false on a tokenizer error. */
static bool cmd_tokenize_one(const tokenizer *t, const char *text, size_t len, bool add_special,
                             bool special, bool pieces, FILE *f)
{
    int32_t cap = (int32_t)TM_MIN(len + 16, (size_t)INT32_MAX / 8);
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) return false;
    int32_t n = tokenizer_encode(t, text, len, add_special, special, ids, cap);
    if (n > cap) {
        free(ids);
        cap = n;
        ids = malloc((size_t)cap * sizeof *ids);
        if (!ids) return false;
        n = tokenizer_encode(t, text, len, add_special, special, ids, cap);
    }
    if (n < 0) {
        free(ids);
        return false;
    }
    fputc('[', f);
    char *buf = malloc(tokenizer_max_piece(t) + 1);
    for (int32_t i = 0; i < n; i++) {
        if (i) fputc(',', f);
        if (pieces) {
            int np = tokenizer_token_to_piece(t, ids[i], buf, (int)tokenizer_max_piece(t) + 1, true);
            fprintf(f, "[%d,", ids[i]);
            cmd_tokenize_json_str(f, buf, np > 0 ? (size_t)np : 0);
            fputc(']', f);
        } else {
            fprintf(f, "%d", ids[i]);
        }
    }
    fputc(']', f);
    free(buf);
    free(ids);
    return true;
}

int cmd_tokenize(int argc, char **argv)
{
    const char *model_path = NULL, *file = NULL, *batch = NULL, *text = NULL;
    bool special = false, pieces = false, no_bos = false;
    const cmd_opt opts[] = {
        { "--model", "-m", CMD_OPT_STR, &model_path, .arg = "MODEL", .help = "the GGUF whose vocabulary to use", .required = true },
        { "--file", NULL, CMD_OPT_STR, &file, .arg = "F", .help = "tokenize the bytes of file F" },
        { "--batch", NULL, CMD_OPT_STR, &batch, .arg = "F.json", .help = "tokenize each string of a JSON array" },
        { "--special", NULL, CMD_OPT_FLAG, &special, .help = "control-token text becomes control tokens" },
        { "--pieces", NULL, CMD_OPT_FLAG, &pieces, .help = "print [id, piece] pairs" },
        { "--no-bos", NULL, CMD_OPT_FLAG, &no_bos, .help = "do not add the model's BOS/EOS" },
        { 0 },
    };
    const char *synopsis = "tokenize -m MODEL [options] [--file F | --batch F.json | TEXT]: token ids as JSON";
    int n_pos = 0;
    cmd_opts_status ost = cmd_opts_parse("tokenize", synopsis, opts, argc, argv, 1, &text, 1, &n_pos);
    if (ost != CMD_OPTS_OK) return cmd_opts_exit(ost);
    bool add_special = !no_bos;
    if ((!!file + !!batch + !!text) != 1) {
        fprintf(stderr, "tokenmill tokenize: give exactly one of --file, --batch and TEXT\n");
        cmd_opts_hint("tokenize", synopsis);
        return 2;
    }

    tokenizer *t;
    if (!cmd_common_load_vocab("tokenize", model_path, &t)) return 1;

    int rc = 0;
    if (batch) {
        json_error_t je;
        json_t *arr = json_load_file(batch, JSON_ALLOW_NUL, &je);
        if (!arr || !json_is_array(arr)) {
            fprintf(stderr, "tokenmill tokenize: %s: expected a JSON array of strings (%s)\n", batch, arr ? "not an array" : je.text);
            json_decref(arr);
            tokenizer_free(t);
            return 1;
        }
        putchar('[');
        for (size_t i = 0; i < json_array_size(arr) && rc == 0; i++) {
            json_t *s = json_array_get(arr, i);
            if (!json_is_string(s)) {
                fprintf(stderr, "tokenmill tokenize: %s: element %zu is not a string\n", batch, i);
                rc = 1;
                break;
            }
            if (i) putchar(',');
            if (!cmd_tokenize_one(t, json_string_value(s), json_string_length(s), add_special, special, pieces, stdout)) {
                fprintf(stderr, "tokenmill tokenize: tokenisation failed\n");
                rc = 1;
            }
        }
        puts("]");
        json_decref(arr);
    } else {
        size_t len;
        char *buf = NULL;
        if (file) {
            buf = util_read_file(file, &len);
            if (!buf) {
                fprintf(stderr, "tokenmill tokenize: cannot read %s\n", file);
                tokenizer_free(t);
                return 1;
            }
            text = buf;
        } else {
            len = strlen(text);
        }
        if (cmd_tokenize_one(t, text, len, add_special, special, pieces, stdout)) putchar('\n');
        else {
            fprintf(stderr, "tokenmill tokenize: tokenisation failed\n");
            rc = 1;
        }
        free(buf);
    }
    tokenizer_free(t);
    return rc;
}
