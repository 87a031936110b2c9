/*
 * main: the tokenmill command. Dispatches to the subcommands in src/cli/; see
 * `tokenmill help`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cmd.h"
#include "util/cpu.h"

static const struct {
    const char *name;
    int (*fn)(int argc, char **argv);
    const char *help;
} main_cmds[] = {
    { "serve", cmd_serve, "serve -m MODEL [--host H] [--port P] [--threads N] [--ctx N] [--max-seqs N] [--api-key K ...] [--model-name NAME]: HTTP API server" },
    { "gateway", cmd_gateway, "gateway -m MODEL --listen HOST:PORT [--prefill HOST:PORT,...] [--decode HOST:PORT,...] [--register HOST:PORT] [--cache SPEC]: cluster front" },
    { "run", cmd_run, "run -m MODEL -p PROMPT [-n N] [--temp T] [--seed S] [--threads N]: generate text" },
    { "tokenize", cmd_tokenize, "tokenize -m MODEL [--special] [--pieces] [--no-bos] [--file F | --batch F.json | TEXT]: token ids as JSON" },
    { "convert", cmd_convert, "convert llama2c WEIGHTS.bin TOKENIZER.bin -o OUT.gguf" },
    { "mkmodel", cmd_mkmodel, "mkmodel --arch llama|qwen2|qwen3|qwen3moe|deepseek2|mistral4|gpt-oss|phi3|mistral3|qwen35|qwen35moe|gemma3|glm4moe|gemma4|deepseek4 [--preset P] [--vocab F] --type T --seed S -o OUT.gguf" },
    { "eval", cmd_eval, "eval -m MODEL --input FILE.json: top log-probs at every position (testing)" },
    { "template", cmd_template, "template -m MODEL [--template NAME] --input CONV.json: prompt ids as JSON (testing)" },
    { "grammar", cmd_grammar, "grammar print|check|sample|bench (--schema F | --regex R | --gbnf F | --json) [--input DOCS.json] [-m MODEL -n N]: structured output (testing)" },
    { "store", cmd_store, "store stat|ls|gc|fsck SPEC [--capacity SIZE] [--retention R]: block store maintenance" },
    { "worker", cmd_worker, "worker --role prefill|decode|mixed -m MODEL --listen HOST:PORT --cache SPEC [--gateway HOST:PORT]: cluster worker" },
    { "expert", cmd_expert, "expert -m MODEL --listen HOST:PORT: a member of an expert-parallel group (serve/worker --ep-member)" },
    { "bench", cmd_bench, "bench -m MODEL [--pp N] [--tg N] [--seqs 1,4,16]: timings as JSON; bench curves -m MODEL: the two price curves; bench profile -m MODEL: time per op" },
};

static void main_usage(FILE *f)
{
    fprintf(f, "usage: tokenmill COMMAND [options]\n\ncommands:\n");
    for (size_t i = 0; i < sizeof main_cmds / sizeof main_cmds[0]; i++)
        fprintf(f, "  %s\n", main_cmds[i].help);
    fprintf(f, "\n'tokenmill COMMAND --help' lists every option of COMMAND.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        main_usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        main_usage(stdout);
        return 0;
    }
    char err[256];
    if (!cpu_simd_check(err, sizeof err)) {
        fprintf(stderr, "tokenmill: %s\n", err);
        return 2;
    }
    for (size_t i = 0; i < sizeof main_cmds / sizeof main_cmds[0]; i++)
        if (!strcmp(argv[1], main_cmds[i].name)) return main_cmds[i].fn(argc - 1, argv + 1);
    fprintf(stderr, "tokenmill: unknown command '%s'\n", argv[1]);
    main_usage(stderr);
    return 2;
}
