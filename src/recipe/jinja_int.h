/*
 * jinja_int: what only jinja*.c may see: the arena, the tokens and the syntax tree.
 *
 *   jinja_parse.c  the lexer (@huggingface/jinja's, preprocessing included) and the parser
 *   jinja.c        values, the evaluator, filters, tests, methods, tojson, the render
 */
#ifndef TM_JINJA_INT_H
#define TM_JINJA_INT_H

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

#endif
