/*
 * cmd_common: what the long-running subcommands (serve, gateway, worker) do alike at start:
 * the stop signals and loading a model with its tokenizer, with their error messages.
 */
#ifndef TM_CMD_COMMON_H
#define TM_CMD_COMMON_H

#include <signal.h>
#include <stdbool.h>

#include "model/model.h"
#include "recipe/tokenizer.h"

/* Blocks SIGINT and SIGTERM in the calling thread and ignores SIGPIPE. Call it before any
 * thread starts: threads inherit the mask, so only the main loop's sigwait/sigtimedwait on
 * *set takes a stop signal, and one arriving while threads start cannot kill the process
 * before its clean shutdown. */
void cmd_common_block_stop_signals(sigset_t *set);

/* Loads the GGUF at path and its tokenizer; on failure prints "tokenmill PROG: why" and
 * returns false with whatever was loaded freed (*m and *tok NULL). */
bool cmd_common_load_model(const char *prog, const char *path, model **m, tokenizer **tok);

#endif
