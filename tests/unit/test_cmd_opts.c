/*
 * test_cmd_opts: the option-table parser's required entries. A required entry missing from
 * the command line (directly or through an included table) fails the parse with one message
 * naming it; given in any spelling (alias, --name=VALUE, repeated) it passes; -h still works.
 */
#include "harness.h"

#include <stdlib.h>
#include <unistd.h>

#include "cli/cmd_opts.h"

/* Runs cmd_opts_parse on argv (NULL-terminated) with stderr captured into err. */
static cmd_opts_status parse(const cmd_opt *opts, char **argv, char *err, size_t errsz)
{
    int argc = 0;
    while (argv[argc]) argc++;
    fflush(stderr);
    int saved = dup(STDERR_FILENO);
    FILE *tmp = tmpfile();
    dup2(fileno(tmp), STDERR_FILENO);
    FILE *so = stdout;
    stdout = fopen("/dev/null", "w");   /* the -h usage */
    cmd_opts_status st = cmd_opts_parse("demo", "demo -m MODEL", opts, argc, argv, 1, NULL, 0, NULL);
    fclose(stdout);
    stdout = so;
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    rewind(tmp);
    size_t n = fread(err, 1, errsz - 1, tmp);
    err[n] = 0;
    fclose(tmp);
    return st;
}

TEST(test_required_missing_and_given)
{
    const char *model = NULL, *input = NULL;
    long n = 0;
    const cmd_opt inner[] = {
        { "--input", NULL, CMD_OPT_STR, &input, .required = true },
        { 0 },
    };
    const cmd_opt opts[] = {
        { "--model", "-m", CMD_OPT_STR, &model, .required = true },
        { "--n", NULL, CMD_OPT_LONG, &n, 0, 100, .arg = "N" },
        { .kind = CMD_OPT_TABLE, .dst = (void *)inner },
        { 0 },
    };
    char err[1024];

    char *a1[] = { "demo", "--n", "3", NULL };
    CHECK(parse(opts, a1, err, sizeof err) == CMD_OPTS_ERR);
    CHECKF(strstr(err, "tokenmill demo: -m/--model is required\n") != NULL, "%s", err);
    CHECK(strstr(err, "usage: tokenmill demo -m MODEL") != NULL);

    char *a2[] = { "demo", "-m", "x.gguf", NULL };   /* the included table's entry */
    CHECK(parse(opts, a2, err, sizeof err) == CMD_OPTS_ERR);
    CHECKF(strstr(err, "tokenmill demo: --input is required\n") != NULL, "%s", err);

    char *a3[] = { "demo", "--input=i.json", "--model=y.gguf", NULL };
    model = input = NULL;
    CHECK(parse(opts, a3, err, sizeof err) == CMD_OPTS_OK);
    CHECK(err[0] == 0);
    CHECK(model && !strcmp(model, "y.gguf") && input && !strcmp(input, "i.json"));
    /* given twice: refused, not the last one silently served */
    char *a6[] = { "demo", "--input=i.json", "--model=x.gguf", "-m", "y.gguf", NULL };
    CHECK(parse(opts, a6, err, sizeof err) == CMD_OPTS_ERR);
    CHECKF(strstr(err, "tokenmill demo: -m/--model is given more than once: it takes one value\n") != NULL, "%s", err);

    char *a4[] = { "demo", "-h", NULL };   /* help needs no required option */
    CHECK(parse(opts, a4, err, sizeof err) == CMD_OPTS_HELP);

    char *a5[] = { "demo", "--", "-m", NULL };   /* after --, "-m" is positional, not the option */
    CHECK(parse(opts, a5, err, sizeof err) == CMD_OPTS_ERR);
}

TEST(test_required_flag_and_fn)
{
    bool f = false;
    const cmd_opt opts[] = {
        { "--yes", NULL, CMD_OPT_FLAG, &f, .required = true },
        { 0 },
    };
    char err[1024];
    char *a1[] = { "demo", NULL };
    CHECK(parse(opts, a1, err, sizeof err) == CMD_OPTS_ERR);
    CHECKF(strstr(err, "tokenmill demo: --yes is required\n") != NULL, "%s", err);
    char *a2[] = { "demo", "--yes", NULL };
    CHECK(parse(opts, a2, err, sizeof err) == CMD_OPTS_OK && f);
}

/* The usage marks the required entries from the same flag the parser checks. */
TEST(test_usage_marks_required)
{
    const char *model = NULL;
    long n = 0;
    const cmd_opt opts[] = {
        { "--model", "-m", CMD_OPT_STR, &model, .arg = "MODEL", .help = "the GGUF", .required = true },
        { "--n", NULL, CMD_OPT_LONG, &n, 0, 100, .arg = "N", .help = "a count" },
        { 0 },
    };
    char buf[1024] = { 0 };
    FILE *f = fmemopen(buf, sizeof buf - 1, "w");
    cmd_opts_usage(f, "demo -m MODEL", opts);
    fclose(f);
    CHECKF(strstr(buf, "the GGUF (required)\n") != NULL, "%s", buf);
    CHECKF(strstr(buf, "a count\n") != NULL && !strstr(buf, "a count (required)"), "%s", buf);
}

int main(void)
{
    RUN(test_required_missing_and_given);
    RUN(test_required_flag_and_fn);
    RUN(test_usage_marks_required);
    HARNESS_END();
}
