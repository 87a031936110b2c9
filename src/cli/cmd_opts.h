/*
 * cmd_opts: the one option parser of the tokenmill subcommands. A command describes its
 * options in a table (name, alias, kind, destination, range, help) and calls cmd_opts_parse;
 * the usage text is printed from the same table, so the two can never disagree.
 *
 * Syntax, as getopt_long: `--name VALUE`, `--name=VALUE`, `-a VALUE` for an alias, flags
 * without a value, `--` ends the options (everything after it is positional), and `-h` /
 * `--help` asks for the usage. Numbers go through cmd_common_int / cmd_common_num: the whole
 * string a number, no overflow, within the entry's range. Every error prints one line
 *   tokenmill PROG: <what is wrong>
 * to stderr and the synopsis after it (cmd_opts_hint), with a pointer to --help. An entry
 * marked required that is not on the command line is such an error too:
 *   tokenmill PROG: -m/--model is required
 */
#ifndef TM_CMD_OPTS_H
#define TM_CMD_OPTS_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

typedef enum {
    CMD_OPT_END = 0,   /* terminates a table */
    CMD_OPT_STR,       /* dst: const char **; the argument as given */
    CMD_OPT_LONG,      /* dst: long *; a whole number in [lo, hi] */
    CMD_OPT_INT,       /* dst: int *; a whole number in [lo, hi] */
    CMD_OPT_DOUBLE,    /* dst: double *; a number in [lo, hi] */
    CMD_OPT_FLOAT,     /* dst: float *; a number in [lo, hi] */
    CMD_OPT_FLAG,      /* dst: bool *; set to true, takes no value */
    CMD_OPT_SET,       /* dst: int *; set to `set`, takes no value */
    CMD_OPT_CHOICE,    /* dst: int *; the index of the value in `choices` ("f16|f32") */
    CMD_OPT_SIZE,      /* dst: uint64_t *; bytes, "20G" / "512M" / "4096" (gc_parse_size), not 0 */
    CMD_OPT_U64,       /* dst: cmd_opt_u64 *; a whole number 0..2^64-1, decimal or 0x hex */
    CMD_OPT_LIST,      /* dst: cmd_opt_list *; repeatable, each value appended; with set = 1 a value
                        * is also split at commas ("a,b" appends a and b; argv is modified) */
    CMD_OPT_FN,        /* fn(prog, name, value, dst) parses the value; false after a message */
    CMD_OPT_TABLE,     /* dst: const cmd_opt *; another table whose entries belong here too */
} cmd_opt_kind;

/* A 64-bit value (a seed) that may be any number, so "given" cannot be a sentinel value. */
typedef struct {
    uint64_t value;
    bool given;            /* set when the option was on the command line */
} cmd_opt_u64;

/* The values of a repeatable option, in command-line order. */
typedef struct {
    const char **v;        /* (cap) values; they point into argv */
    int n;
    int cap;               /* one more is an error naming the option */
} cmd_opt_list;

typedef struct cmd_opt cmd_opt;
struct cmd_opt {
    const char *name;      /* "--threads" */
    const char *alias;     /* "-t", or NULL */
    cmd_opt_kind kind;
    void *dst;             /* where the value goes (type per kind) */
    double lo, hi;         /* range of LONG / INT / DOUBLE / FLOAT values */
    int set;               /* the value a SET option stores */
    const char *choices;   /* a CHOICE option's values, '|'-separated */
    bool (*fn)(const char *prog, const char *name, const char *value, void *dst);
    const char *arg;       /* the value's name in the usage ("N", "FILE"); NULL: "VALUE" */
    const char *help;      /* one line for the usage, or NULL to leave the option out of it */
    bool required;         /* parsing fails unless the option is given, and when a value-taking
                            * one is given twice (at most
                            * CMD_OPTS_MAX_REQUIRED such entries in a table and those it includes) */
};

#define CMD_OPTS_MAX_REQUIRED 16

typedef enum {
    CMD_OPTS_OK = 0,       /* parsed; positional arguments in pos[0..*n_pos) */
    CMD_OPTS_HELP,         /* -h / --help: the usage went to stdout; exit 0 */
    CMD_OPTS_ERR,          /* a message and the usage went to stderr; exit 2 */
} cmd_opts_status;

/* Parses argv[first..argc). Arguments that are not options are stored in pos (at most
 * max_pos of them; one more is an error); pos may be NULL when the command takes none. After
 * the last argument, the first required entry (in table order) that was not given is an error.
 * synopsis is the first usage line after "usage: tokenmill ", e.g. "bench -m MODEL [options]". */
cmd_opts_status cmd_opts_parse(const char *prog, const char *synopsis, const cmd_opt *opts, int argc,
                               char **argv, int first, const char **pos, int max_pos, int *n_pos);
/* Prints "usage: tokenmill SYNOPSIS" and one line per option with help ("(required)" after
 * a required one's). */
void cmd_opts_usage(FILE *f, const char *synopsis, const cmd_opt *opts);
/* After a usage error: the synopsis and a pointer to --help, on stderr. */
void cmd_opts_hint(const char *prog, const char *synopsis);

/* Exit status for a status that is not CMD_OPTS_OK (0 for help, 2 for an error). */
int cmd_opts_exit(cmd_opts_status st);

#endif
