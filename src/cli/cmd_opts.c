/*
 * cmd_opts: option tables (see cmd_opts.h). A lookup walks the table and the tables it
 * includes, in order; the first entry whose name or alias matches wins.
 */
#include "cli/cmd_opts.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/gc.h"
#include "cli/cmd_common.h"

static bool cmd_opts_takes_value(cmd_opt_kind k)
{
    return k != CMD_OPT_FLAG && k != CMD_OPT_SET;
}

/* The entry named `name` (len bytes) in opts or an included table, or NULL. */
static const cmd_opt *cmd_opts_find(const cmd_opt *opts, const char *name, size_t len)
{
    for (const cmd_opt *o = opts; o->kind != CMD_OPT_END; o++) {
        if (o->kind == CMD_OPT_TABLE) {
            const cmd_opt *in = cmd_opts_find(o->dst, name, len);
            if (in) return in;
            continue;
        }
        if (o->name && strlen(o->name) == len && !memcmp(o->name, name, len)) return o;
        if (o->alias && strlen(o->alias) == len && !memcmp(o->alias, name, len)) return o;
    }
    return NULL;
}

static bool cmd_opts_u64(const char *prog, const char *typed, const char *z, cmd_opt_u64 *dst)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = 0;
    if (*z >= '0' && *z <= '9') v = strtoull(z, &end, 0);
    if (!end || *end || errno) {
        fprintf(stderr, "tokenmill %s: %s: '%s' is not a whole number in 0..2^64-1\n", prog, typed, z);
        return false;
    }
    *dst = (cmd_opt_u64){ v, true };
    return true;
}

/* Appends value (split at commas when o->set) to the list *o->dst; false after a message. */
static bool cmd_opts_list(const char *prog, const cmd_opt *o, const char *typed, const char *value)
{
    cmd_opt_list *l = o->dst;
    char *rest = (char *)value;   /* argv's own storage, writable */
    for (;;) {
        char *comma = o->set ? strchr(rest, ',') : NULL;
        if (comma) *comma = 0;
        if (o->set && !*rest) {
            fprintf(stderr, "tokenmill %s: %s: an empty entry in '%s'\n", prog, typed, value);
            return false;
        }
        if (l->n >= l->cap) {
            fprintf(stderr, "tokenmill %s: %s: more than %d values\n", prog, typed, l->cap);
            return false;
        }
        l->v[l->n++] = rest;
        if (!comma) return true;
        rest = comma + 1;
    }
}

/* The index of value among o->choices into *(int *)o->dst; false after a message. */
static bool cmd_opts_choice(const char *prog, const cmd_opt *o, const char *typed, const char *value)
{
    size_t vlen = strlen(value);
    int idx = 0;
    for (const char *c = o->choices; *c; idx++) {
        const char *bar = strchr(c, '|');
        size_t clen = bar ? (size_t)(bar - c) : strlen(c);
        if (clen == vlen && !memcmp(c, value, vlen)) {
            *(int *)o->dst = idx;
            return true;
        }
        if (!bar) break;
        c = bar + 1;
    }
    fprintf(stderr, "tokenmill %s: %s: '%s' is not one of %s\n", prog, typed, value, o->choices);
    return false;
}

/* Stores value (NULL for FLAG / SET) through o; false after a message. */
static bool cmd_opts_store(const char *prog, const cmd_opt *o, const char *typed, const char *value)
{
    long l;
    double d;
    switch (o->kind) {
    case CMD_OPT_STR:
        *(const char **)o->dst = value;
        return true;
    case CMD_OPT_LONG:
    case CMD_OPT_INT:
        if (!cmd_common_int(prog, typed, value, (long)o->lo, (long)o->hi, &l)) return false;
        if (o->kind == CMD_OPT_LONG) *(long *)o->dst = l;
        else *(int *)o->dst = (int)l;
        return true;
    case CMD_OPT_DOUBLE:
    case CMD_OPT_FLOAT:
        if (!cmd_common_num(prog, typed, value, o->lo, o->hi, &d)) return false;
        if (o->kind == CMD_OPT_DOUBLE) *(double *)o->dst = d;
        else *(float *)o->dst = (float)d;
        return true;
    case CMD_OPT_FLAG:
        *(bool *)o->dst = true;
        return true;
    case CMD_OPT_SET:
        *(int *)o->dst = o->set;
        return true;
    case CMD_OPT_SIZE:
        if (!(*(uint64_t *)o->dst = gc_parse_size(value))) {
            fprintf(stderr, "tokenmill %s: %s: '%s' is not a size such as 512M or 20G\n", prog, typed, value);
            return false;
        }
        return true;
    case CMD_OPT_LIST:
        return cmd_opts_list(prog, o, typed, value);
    case CMD_OPT_U64:
        return cmd_opts_u64(prog, typed, value, o->dst);
    case CMD_OPT_CHOICE:
        return cmd_opts_choice(prog, o, typed, value);
    case CMD_OPT_FN:
        return o->fn(prog, typed, value, o->dst);
    case CMD_OPT_END:
    case CMD_OPT_TABLE:
        break;
    }
    return false;
}

static bool cmd_opts_seen(const cmd_opt *o, const cmd_opt *const *seen, int n_seen)
{
    for (int k = 0; k < n_seen; k++)
        if (seen[k] == o) return true;
    return false;
}

/* The first required entry of opts (or an included table) not among seen[0..n_seen). */
static const cmd_opt *cmd_opts_missing(const cmd_opt *opts, const cmd_opt *const *seen, int n_seen)
{
    for (const cmd_opt *o = opts; o->kind != CMD_OPT_END; o++) {
        if (o->kind == CMD_OPT_TABLE) {
            const cmd_opt *in = cmd_opts_missing(o->dst, seen, n_seen);
            if (in) return in;
            continue;
        }
        if (o->required && !cmd_opts_seen(o, seen, n_seen)) return o;
    }
    return NULL;
}

cmd_opts_status cmd_opts_parse(const char *prog, const char *synopsis, const cmd_opt *opts, int argc,
                               char **argv, int first, const char **pos, int max_pos, int *n_pos)
{
    int np = 0, n_seen = 0;
    const cmd_opt *seen[CMD_OPTS_MAX_REQUIRED];   /* required entries given so far */
    bool only_pos = false;
    if (n_pos) *n_pos = 0;
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        bool is_opt = !only_pos && a[0] == '-' && a[1] != 0;
        if (is_opt && !strcmp(a, "--")) {
            only_pos = true;
            continue;
        }
        if (is_opt && (!strcmp(a, "-h") || !strcmp(a, "--help"))) {
            cmd_opts_usage(stdout, synopsis, opts);
            return CMD_OPTS_HELP;
        }
        if (!is_opt) {
            if (!pos || np >= max_pos) {
                fprintf(stderr, "tokenmill %s: unexpected argument '%s'\n", prog, a);
                goto err;
            }
            pos[np++] = a;
            if (n_pos) *n_pos = np;
            continue;
        }
        const char *eq = a[1] == '-' ? strchr(a, '=') : NULL;
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const cmd_opt *o = cmd_opts_find(opts, a, len);
        if (!o) {
            fprintf(stderr, "tokenmill %s: unknown option '%.*s'\n", prog, (int)len, a);
            goto err;
        }
        const char *value = NULL;
        if (cmd_opts_takes_value(o->kind)) {
            if (eq) value = eq + 1;
            else if (i + 1 < argc) value = argv[++i];
            else {
                fprintf(stderr, "tokenmill %s: %s needs a value\n", prog, a);
                goto err;
            }
        } else if (eq) {
            fprintf(stderr, "tokenmill %s: %.*s takes no value\n", prog, (int)len, a);
            goto err;
        }
        /* a required entry names the one thing the command works on (-m MODEL): a second
         * one is refused rather than silently replacing the first */
        if (o->required && cmd_opts_takes_value(o->kind) && cmd_opts_seen(o, seen, n_seen)) {
            fprintf(stderr, "tokenmill %s: %s%s%s is given more than once: it takes one value\n", prog,
                    o->alias ? o->alias : "", o->alias ? "/" : "", o->name);
            goto err;
        }
        char typed[64];
        snprintf(typed, sizeof typed, "%.*s", (int)len, a);
        if (!cmd_opts_store(prog, o, typed, value)) goto err;
        if (o->required && n_seen < CMD_OPTS_MAX_REQUIRED && !cmd_opts_seen(o, seen, n_seen)) seen[n_seen++] = o;
    }
    const cmd_opt *miss = cmd_opts_missing(opts, seen, n_seen);
    if (miss) {
        fprintf(stderr, "tokenmill %s: %s%s%s is required\n", prog, miss->alias ? miss->alias : "", miss->alias ? "/" : "",
                miss->name);
        goto err;
    }
    return CMD_OPTS_OK;
err:
    cmd_opts_hint(prog, synopsis);
    return CMD_OPTS_ERR;
}

static void cmd_opts_usage_lines(FILE *f, const cmd_opt *opts)
{
    for (const cmd_opt *o = opts; o->kind != CMD_OPT_END; o++) {
        if (o->kind == CMD_OPT_TABLE) {
            cmd_opts_usage_lines(f, o->dst);
            continue;
        }
        if (!o->help) continue;
        char head[160];   /* an option with its value's choices (mkmodel's --arch list) */
        int n = snprintf(head, sizeof head, "%s%s%s", o->alias ? o->alias : "", o->alias ? ", " : "", o->name);
        if (cmd_opts_takes_value(o->kind) && n > 0 && (size_t)n < sizeof head)
            snprintf(head + n, sizeof head - (size_t)n, " %s",
                     o->arg ? o->arg : o->kind == CMD_OPT_CHOICE ? o->choices : "VALUE");
        fprintf(f, "  %-28s %s%s\n", head, o->help, o->required ? " (required)" : "");
    }
}

void cmd_opts_hint(const char *prog, const char *synopsis)
{
    fprintf(stderr, "usage: tokenmill %s\n(tokenmill %s --help lists the options)\n", synopsis, prog);
}

void cmd_opts_usage(FILE *f, const char *synopsis, const cmd_opt *opts)
{
    fprintf(f, "usage: tokenmill %s\noptions:\n", synopsis);
    cmd_opts_usage_lines(f, opts);
}

int cmd_opts_exit(cmd_opts_status st)
{
    return st == CMD_OPTS_HELP ? 0 : 2;
}
