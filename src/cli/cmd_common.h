/*
 * cmd_common: what the subcommands do alike at start: checked numeric option values (every
 * subcommand), and for the long-running ones (serve, gateway, worker) the stop signals and
 * loading a model with its tokenizer, with their error messages.
 */
#ifndef TM_CMD_COMMON_H
#define TM_CMD_COMMON_H

#include <signal.h>
#include <stdbool.h>

#include "model/model.h"
#include "recipe/tokenizer.h"

/* Option values: z must be a number and nothing else (no empty string, no leading blanks, no
 * trailing text such as "2x"), without overflow, and within [lo, hi]. On success *out is set
 * and true returned; otherwise *out is untouched, one line goes to stderr, e.g.
 *   tokenmill bench: --pp: 'abc' is not a whole number in 0..16777216
 * and false is returned (the caller exits with 2). opt names the option as typed. */
bool cmd_common_int(const char *prog, const char *opt, const char *z, long lo, long hi, long *out);
/* The same for a decimal number (strtod's syntax: 1e-6 and 0.5 are fine; nan, inf never are:
 * they fail the range check). */
bool cmd_common_num(const char *prog, const char *opt, const char *z, double lo, double hi, double *out);

/* Blocks SIGINT and SIGTERM in the calling thread and ignores SIGPIPE. Call it before any
 * thread starts: threads inherit the mask, so only the main loop's sigwait/sigtimedwait on
 * *set takes a stop signal, and one arriving while threads start cannot kill the process
 * before its clean shutdown. */
void cmd_common_block_stop_signals(sigset_t *set);

/* Loads the GGUF at path and its tokenizer; on failure prints "tokenmill PROG: why" and
 * returns false with whatever was loaded freed (*m and *tok NULL). */
bool cmd_common_load_model(const char *prog, const char *path, model **m, tokenizer **tok);

#endif
