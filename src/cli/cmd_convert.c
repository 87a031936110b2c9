/*
 * cmd_convert: placeholder until its module lands; replaced in this same piece of work.
 */
#include <stdio.h>
#include "cli/cmd.h"

int cmd_convert(int argc, char **argv)
{
    (void)argc; (void)argv;
    fprintf(stderr, "tokenmill convert: unavailable in this build\n");
    return 1;
}
