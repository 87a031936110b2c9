/*
 * jinja_int: what only jinja*.c may see: the arena, the tokens and the syntax tree; the
 * evaluator's values and the calls between its files.
 *
 *   jinja_parse.c   the lexer (@huggingface/jinja's, preprocessing included) and the parser
 *   jinja.c         values, the evaluator, tests, methods, tojson, the render
 *   jinja_filters.c the filters: one function per kind of value, in a table by kind
 */
#ifndef TM_JINJA_INT_H
#define TM_JINJA_INT_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "recipe/jinja.h"

/* Bump allocator: chunks never move, everything is freed at once. cap bounds the bytes
 * held (0: no bound); an allocation past it returns NULL. */
typedef struct jarena_chunk jarena_chunk;
typedef struct {
    jarena_chunk *head;     /* newest chunk first */
    size_t held;            /* bytes of all chunks */
    size_t cap;             /* bound on held, 0 for none */
} jarena;

void *jarena_alloc(jarena *a, size_t sz);   /* 16-byte aligned, zeroed; NULL past cap */
void jarena_free(jarena *a);

typedef enum {
    JN_TEXT = 0,    /* s: template text (a string literal too) */
    JN_STR,         /* s */
    JN_INT,         /* i */
    JN_FLOAT,       /* f */
    JN_IDENT,       /* s */
    JN_ARRAY,       /* v[n] */
    JN_TUPLE,       /* v[n] */
    JN_OBJECT,      /* v[n]: key, value, key, value, ... */
    JN_MEMBER,      /* a object, b property; flag: computed ([...]) */
    JN_SLICE,       /* a start, b stop, c step (each may be NULL) */
    JN_CALL,        /* a callee, v[n] arguments */
    JN_KWARG,       /* s name, a value */
    JN_SPREAD,      /* a (*x) */
    JN_KWSPREAD,    /* a (**x) */
    JN_BINARY,      /* op, a, b */
    JN_UNARY,       /* op, a */
    JN_FILTER,      /* a operand, b filter (IDENT or CALL of an IDENT) */
    JN_TEST,        /* a operand, s test name; flag: negated */
    JN_SELECT,      /* a value, b condition (a if b) */
    JN_TERNARY,     /* a condition, b if true, c if false */
    JN_IF,          /* a test, v[n] body, w[nw] else */
    JN_FOR,         /* a target (IDENT or TUPLE), b iterable, v[n] body, w[nw] else */
    JN_SET,         /* a target, b value (NULL: block v[n]) */
    JN_MACRO,       /* s name, w[nw] parameters, v[n] body; flag: uses varargs/kwargs */
    JN_CALLSTMT,    /* a call (CALL), w[nw] caller parameters, v[n] body; flag as MACRO */
    JN_FILTERSTMT,  /* b filter, v[n] body */
    JN_BREAK,
    JN_CONTINUE,
    JN_COMMENT,
} jnode_kind;

typedef enum {
    JOP_OR = 0, JOP_AND, JOP_NOT, JOP_EQ, JOP_NE, JOP_LT, JOP_GT, JOP_LE, JOP_GE, JOP_IN, JOP_NOTIN,
    JOP_ADD, JOP_SUB, JOP_CONCAT, JOP_MUL, JOP_DIV, JOP_FLOORDIV, JOP_MOD, JOP_POW, JOP_NEG, JOP_POS,
} jop;

typedef struct jnode jnode;
struct jnode {
    jnode_kind kind;
    jop op;
    bool flag;
    int line;               /* 1-based line of the source (after preprocessing) */
    const char *s;          /* NUL-terminated; sn bytes */
    size_t sn;
    int64_t i;
    double f;
    jnode *a, *b, *c;
    jnode **v;              /* n children (arguments, body, elements) */
    size_t n;
    jnode **w;              /* nw children (else branch, parameters) */
    size_t nw;
};

struct jinja_program {
    jarena arena;           /* every node and string */
    jnode **body;           /* n_body top-level statements */
    size_t n_body;
};

/* ---- the evaluator's values (jinja.c; jinja_filters.c applies filters to them) ---------- */

typedef struct {
    size_t n;               /* bytes */
    const char *p;          /* n bytes + NUL */
    const uint8_t *t;       /* n taint flags, NULL: none tainted */
} jstr;

typedef enum {
    JV_UNDEF = 0, JV_NONE, JV_BOOL, JV_INT, JV_FLOAT, JV_STR, JV_LIST, JV_DICT, JV_NS, JV_FUNC, JV_LOOP,
} jv_kind;

typedef struct jlist jlist;
typedef struct jdict jdict;
typedef struct jfunc jfunc;
typedef struct jloop jloop;

typedef struct {
    jv_kind kind;
    bool tuple;             /* JV_LIST: made by a tuple literal */
    union {
        bool b;
        int64_t i;
        double f;
        const jstr *s;
        jlist *l;
        jdict *d;           /* JV_DICT and JV_NS */
        jfunc *fn;
        jloop *loop;
    };
} jv;

struct jlist {
    size_t n;
    jv *v;                  /* n items */
};

struct jdict {
    size_t n, cap;
    const jstr **k;         /* n keys */
    jv *v;                  /* n values */
};

typedef struct jenv jenv;
struct jenv {
    jenv *parent;
    size_t n, cap;
    const char **names;     /* n names (NUL-terminated, owned by the program or the caller) */
    jv *vals;
};

typedef enum {
    JF_NAMESPACE = 0, JF_RAISE, JF_RANGE, JF_STRFTIME, JF_MACRO, JF_CALLER, JF_METHOD,
} jfunc_kind;

struct jfunc {
    jfunc_kind kind;
    const jnode *node;      /* MACRO: the macro; CALLER: the call statement */
    jenv *env;              /* CALLER: where the call statement is */
    jv self;                /* METHOD: the receiver */
    const char *method;     /* METHOD: its name */
};

struct jloop {
    size_t i, n;            /* iteration (0-based) of n */
    const jv *items;        /* n items iterated */
};

/* A growing string with its taint, in the arena. */
typedef struct {
    char *p;
    uint8_t *t;
    size_t n, cap;
    bool tainted;           /* some flag is 1 */
} jsb;

/* Function arguments: positional then keyword. */
typedef struct {
    jv *pos;
    size_t n_pos;
    const jstr **kw_k;
    jv *kw_v;
    size_t n_kw;
    bool has_kw;            /* a keyword-arguments value was passed (even empty: call blocks) */
} jargs;

typedef struct {
    jarena arena;
    jmp_buf jb;
    jinja_status st;
    char *err;
    size_t errsz;
    uint64_t steps, max_steps;
    size_t max_output;
    int depth;
    jsb *out;               /* where statements write */
    const char *today;
} jx;

#define JV_UNDEF_V ((jv){ .kind = JV_UNDEF })
#define JV_NONE_V ((jv){ .kind = JV_NONE })

static inline jv jv_str(const jstr *s) { return (jv){ .kind = JV_STR, .s = s }; }
static inline jv jv_bool(bool b) { return (jv){ .kind = JV_BOOL, .b = b }; }
static inline jv jv_int(int64_t i) { return (jv){ .kind = JV_INT, .i = i }; }
static inline jv jv_float(double f) { return (jv){ .kind = JV_FLOAT, .f = f }; }
static inline double jv_num(jv v) { return v.kind == JV_INT ? (double)v.i : v.kind == JV_FLOAT ? v.f : v.b ? 1 : 0; }

typedef struct {
    int indent;             /* 0: none */
    bool ensure_ascii, sort_keys, undef_null;
    const char *item_sep, *key_sep;
} jjson_opt;

typedef struct {
    const jstr *attr;       /* NULL: the item itself */
    bool case_sensitive, reverse, by_value_of_pair;
    int pair_index;         /* -1 or the index into [key, value] pairs */
} jsort_key;

extern const jjson_opt jjson_default, jjson_print;

void jx_fail(jx *x, jinja_status st, const char *fmt, ...) __attribute__((noreturn, format(printf, 3, 4)));
const jv *jarg(const jargs *a, size_t i, const char *name);
jv *jdict_get(const jdict *d, const jstr *k);
jv jdict_view(jx *x, const jdict *d, int which /* 0 keys, 1 values, 2 items */);
void jjson(jx *x, jsb *b, jv v, const jjson_opt *o, int depth);
size_t js_space_at(const char *s, size_t n);
const jstr *jsb_done(jx *x, jsb *b);
void jsb_lit(jx *x, jsb *b, const char *z);
void jsb_str(jx *x, jsb *b, const jstr *s);
void jsb_sub(jx *x, jsb *b, const jstr *s, size_t off, size_t n);
void jsort(jx *x, jv *v, size_t n, const jsort_key *k);
const jstr *jstr_case(jx *x, const jstr *s, int mode /* 0 lower, 1 upper, 2 title, 3 capitalize */);
size_t jstr_cps(jx *x, const jstr *s, size_t **offs);
int64_t jstr_len16(const jstr *s);
const jstr *jstr_lit(jx *x, const char *z);
const jstr *jstr_new(jx *x, const char *p, size_t n, bool tainted);
const jstr *jstr_trim(jx *x, const jstr *s, bool left, bool right);
jv jv_attr_path(jx *x, jv item, const jstr *path);
int jv_compare(jx *x, jv a, jv b, bool case_sensitive);
void jv_js(jx *x, jsb *b, jv v);
jv jv_list(jx *x, size_t n);
void jv_print(jx *x, jsb *b, jv v);
bool jv_strict_eq(jv a, jv b);
bool jv_truthy(jv v);
const char *jv_type(jv v);
void jx_eval_args(jx *x, jenv *env, jnode *const *v, size_t n, jargs *a);
bool jx_is_dict_method(const char *m);
jv jx_method(jx *x, jv self, const char *m, const jargs *a);
void jx_step(jx *x);
bool jx_test(jx *x, const char *name, jv v, const jv *arg, int line);

/* jinja_filters.c: v | f, f an IDENT or a CALL of one (fails the render when f is unknown or
 * does not take v). */
jv jx_filter(jx *x, jenv *env, jv v, const jnode *f);

#endif
