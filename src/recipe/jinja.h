/*
 * jinja: a Jinja interpreter for chat templates, with taint.
 *
 * The language is the one @huggingface/jinja (the renderer of transformers.js, which llama.cpp's
 * tests and tokenmill's oracle use) implements, with its semantics where it and Python's Jinja
 * differ, so that a rendering can be checked byte for byte against it: lstrip_blocks and
 * trim_blocks on, the trailing newline of the source dropped, `{% generation %}` tags removed;
 * if/elif/else, for (tuple targets, `if` filters, else, loop.*, break/continue), set (also to a
 * namespace attribute and as a block), macro (varargs/kwargs), call/caller, filter blocks; the
 * filters, tests, string and dict methods of that library plus a few of Python's it lacks
 * (round, reject, min, max, sum, map without attribute is refused). Values: undefined, none,
 * booleans, integers (int64), floats, strings, lists (and tuples), dicts (insertion-ordered),
 * namespaces, functions (macros, caller, the globals raise_exception, range, strftime_now and
 * namespace).
 *
 * Taint. Every string carries one flag per byte: tainted bytes came from the request (message
 * contents, names, ids, tool arguments, results and schemas, chat_template_kwargs), untainted
 * ones from the template's own literals. Every operation that builds a string from strings
 * (~, +, join, slicing, trim, replace, tojson, indent, ...) copies each byte's flag with it;
 * characters the operation itself writes (a separator literal, JSON quotes and punctuation) are
 * untainted, a tainted character that is escaped (tojson) stays tainted in all its bytes. The
 * rendering is text plus these flags; the caller tokenises tainted bytes as plain text only.
 *
 * A template is input too. Parsing is depth-limited (no recursion past JINJA_MAX_DEPTH); a
 * render is bounded in steps (every node evaluated and every loop iteration counts), in the
 * bytes of every string it builds and of its output, in memory (one arena per render, freed
 * whole) and in the depth of macro calls and nested evaluation. Passing a bound ends the render
 * with JINJA_ERR_LIMIT and a message saying which; nothing is ever left allocated.
 *
 * A parsed program is immutable and may be rendered by several threads at once.
 */
#ifndef TM_JINJA_H
#define TM_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Nesting of the source (parentheses, blocks, ...: a parenthesis counts two) and of evaluation
 * (nodes inside nodes, macro calls). A level costs the evaluator well under 1 KiB of stack, so
 * renders stay far inside an HTTP thread's 256 KiB; the parser runs at start-up. */
#define JINJA_MAX_DEPTH 128

typedef enum {
    JINJA_OK = 0,
    JINJA_ERR_SYNTAX,   /* the template does not parse */
    JINJA_ERR_RUNTIME,  /* an operation failed (wrong types, unknown filter, ...) */
    JINJA_ERR_RAISED,   /* the template called raise_exception(message) */
    JINJA_ERR_LIMIT,    /* a bound on steps, size, memory or depth was passed */
} jinja_status;

typedef struct jinja_program jinja_program;

/* Bounds of one render; zero fields take the defaults (jinja.c). */
typedef struct {
    uint64_t max_steps;     /* nodes evaluated + loop iterations */
    size_t max_output;      /* bytes of the rendering and of any one string built */
    size_t max_memory;      /* bytes the render's arena may hold */
} jinja_limits;

typedef enum {
    JINJA_VAR_JSON = 0,     /* a JSON text, converted to values (integral numbers to integers) */
    JINJA_VAR_STRING,       /* a string */
    JINJA_VAR_BOOL,
} jinja_var_kind;

/* One variable of the render's context. */
typedef struct {
    const char *name;       /* NUL-terminated */
    jinja_var_kind kind;
    const char *text;       /* JSON / STRING: text[0..len) */
    size_t len;
    bool b;                 /* BOOL */
    bool tainted;           /* every string in it (keys too) comes from the request */
} jinja_var;

/* The rendering: text[0..len) (NUL-terminated) and taint[0..len), 1 for a tainted byte. */
typedef struct {
    char *text;
    uint8_t *taint;
    size_t len;
} jinja_output;

/* Parses src[0..n). On failure *out is NULL and err says what and where (line). */
jinja_status jinja_parse(const char *src, size_t n, jinja_program **out, char *err, size_t errsz);
void jinja_program_free(jinja_program *p);

/* Renders p with the variables vars[0..n_vars). `today` ("YYYY-MM-DD", may be NULL: the current
 * UTC date) is the date strftime_now formats. On success fills *out (jinja_output_free). */
jinja_status jinja_render(const jinja_program *p, const jinja_var *vars, size_t n_vars, const char *today,
                          const jinja_limits *lim, jinja_output *out, char *err, size_t errsz);
void jinja_output_free(jinja_output *o);

#endif
