/*
 * cmd_run: placeholder until its module lands; replaced in this same piece of work.
 */
#include <stdio.h>
#include "cli/cmd.h"

int cmd_run(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "tokenmill run: unavailable in this build\n");
    return 1;
}
