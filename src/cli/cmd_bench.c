/*
 * cmd_bench: placeholder until its module lands; replaced in this same piece of work.
 */
#include <stdio.h>
#include "cli/cmd.h"

int cmd_bench(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "tokenmill bench: unavailable in this build\n");
    return 1;
}
