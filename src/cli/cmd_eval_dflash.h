/*
 * cmd_eval_dflash: the drafting rounds of `tokenmill eval --draft` (a part of eval, not a
 * subcommand): see cmd_eval_dflash.c.
 */
#ifndef TM_CMD_EVAL_DFLASH_H
#define TM_CMD_EVAL_DFLASH_H

#include <jansson.h>

#include "model/model.h"

/* A dflash drafter's rounds beside model m on IN.json's root; the exit status. */
int cmd_eval_dflash(model *m, const char *draft_path, json_t *root, int threads, int kv_type);

#endif
