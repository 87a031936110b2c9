/*
 * cmd_eval: placeholder until its module lands; replaced in this same piece of work.
 */
#include <stdio.h>
#include "cli/cmd.h"

int cmd_eval(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "tokenmill eval: unavailable in this build\n");
    return 1;
}
