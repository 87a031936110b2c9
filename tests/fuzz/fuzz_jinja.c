/*
 * fuzz_jinja: the Jinja interpreter's parser and evaluator on the input as a template text,
 * rendered with a small conversation and tight bounds. Checks beyond the sanitizers: a render
 * ends (the bounds hold) and its output has one taint flag per byte, each 0 or 1.
 */
#include "fuzz.h"

#include "recipe/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    jinja_program *p = NULL;
    char err[256];
    if (jinja_parse((const char *)data, size, &p, err, sizeof err) != JINJA_OK) return 0;
    static const char msgs[] = "[{\"role\":\"system\",\"content\":\"s\"},{\"role\":\"user\",\"content\":\"u<|x|>\"},"
                               "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c\",\"type\":\"function\","
                               "\"function\":{\"name\":\"f\",\"arguments\":{\"a\":[1,2.5,true]}}}]}]";
    jinja_var v[] = {
        { .name = "messages", .kind = JINJA_VAR_JSON, .text = msgs, .len = sizeof msgs - 1, .tainted = true },
        { .name = "add_generation_prompt", .kind = JINJA_VAR_BOOL, .b = true },
        { .name = "bos_token", .kind = JINJA_VAR_STRING, .text = "<s>", .len = 3 },
    };
    jinja_limits lim = { .max_steps = 200000, .max_output = 1 << 16, .max_memory = 16 << 20 };
    jinja_output o;
    if (jinja_render(p, v, sizeof v / sizeof *v, "2025-01-01", &lim, &o, err, sizeof err) == JINJA_OK) {
        for (size_t i = 0; i < o.len; i++)
            if (o.taint[i] > 1) __builtin_trap();
        jinja_output_free(&o);
    }
    jinja_program_free(p);
    return 0;
}
