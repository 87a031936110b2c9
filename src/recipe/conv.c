/*
 * conv: the shared conversation. See conv.h. The arena is a list of chunks; a string larger
 * than the chunk size gets a chunk of its own.
 */
#include "recipe/conv.h"

#include <stdlib.h>
#include <string.h>

#include "util/util.h"

#define CONV_CHUNK_SZ (16 * 1024)

struct conv_chunk {
    conv_chunk *next;  /* older chunk */
    size_t used;       /* bytes used of data */
    size_t cap;        /* bytes of data */
    char data[];       /* cap bytes */
};

void conv_init(conv *c)
{
    memset(c, 0, sizeof *c);
    c->add_generation_prompt = true;
}

void conv_free(conv *c)
{
    for (int i = 0; i < c->n_turns; i++) free(c->turns[i].parts);
    free(c->turns);
    free(c->tools);
    conv_chunk *k = c->arena;
    while (k) {
        conv_chunk *nx = k->next;
        free(k);
        k = nx;
    }
    memset(c, 0, sizeof *c);
}

static char *conv_alloc(conv *c, size_t sz)
{
    conv_chunk *k = c->arena;
    if (!k || k->cap - k->used < sz) {
        size_t cap = sz > CONV_CHUNK_SZ ? sz : CONV_CHUNK_SZ;
        conv_chunk *nk = xmalloc(sizeof *nk + cap);
        nk->cap = cap;
        nk->used = 0;
        if (sz > CONV_CHUNK_SZ && k) {
            /* keep the current partly used chunk at the head */
            nk->next = k->next;
            k->next = nk;
        } else {
            nk->next = k;
            c->arena = nk;
        }
        k = nk;
    }
    char *p = k->data + k->used;
    k->used += sz;
    return p;
}

const char *conv_strdup(conv *c, const char *s, size_t len)
{
    char *p = conv_alloc(c, len + 1);
    if (len) memcpy(p, s, len);
    p[len] = 0;
    return p;
}

int conv_add_turn(conv *c, conv_role role)
{
    if (c->n_turns == c->cap_turns) {
        c->cap_turns = c->cap_turns ? c->cap_turns * 2 : 8;
        c->turns = xrealloc(c->turns, (size_t)c->cap_turns * sizeof *c->turns);
    }
    conv_turn *t = &c->turns[c->n_turns];
    memset(t, 0, sizeof *t);
    t->role = role;
    return c->n_turns++;
}

static conv_part *conv_new_part(conv *c, conv_part_kind kind)
{
    if (c->n_turns == 0) conv_add_turn(c, CONV_ROLE_USER);
    conv_turn *t = &c->turns[c->n_turns - 1];
    if (t->n_parts == t->cap_parts) {
        t->cap_parts = t->cap_parts ? t->cap_parts * 2 : 2;
        t->parts = xrealloc(t->parts, (size_t)t->cap_parts * sizeof *t->parts);
    }
    conv_part *p = &t->parts[t->n_parts++];
    p->kind = kind;
    p->text = p->id = p->name = p->args = "";
    p->len = p->args_len = 0;
    return p;
}

void conv_add_text(conv *c, const char *text, size_t len)
{
    conv_part *p = conv_new_part(c, CONV_PART_TEXT);
    p->text = conv_strdup(c, text, len);
    p->len = len;
}

void conv_add_reasoning(conv *c, const char *text, size_t len)
{
    conv_part *p = conv_new_part(c, CONV_PART_REASONING);
    p->text = conv_strdup(c, text, len);
    p->len = len;
}

/* A tool call or result: the id and name copied ("" when NULL), then the body. */
static conv_part *conv_add_tool_part(conv *c, conv_part_kind kind, const char *id, const char *name,
                                     const char *body, size_t len, const char **body_copy)
{
    const char *ic = id ? conv_strdup(c, id, strlen(id)) : "";
    const char *nc = name ? conv_strdup(c, name, strlen(name)) : "";
    *body_copy = conv_strdup(c, body, len);
    conv_part *p = conv_new_part(c, kind);
    p->id = ic;
    p->name = nc;
    return p;
}

void conv_add_tool_call(conv *c, const char *id, const char *name, const char *args, size_t args_len)
{
    if (!args) { args = "{}"; args_len = 2; }
    const char *ac;
    conv_part *p = conv_add_tool_part(c, CONV_PART_TOOL_CALL, id, name, args, args_len, &ac);
    p->args = ac;
    p->args_len = args_len;
}

void conv_add_tool_result(conv *c, const char *call_id, const char *name, const char *content, size_t len)
{
    const char *tc;
    conv_part *p = conv_add_tool_part(c, CONV_PART_TOOL_RESULT, call_id, name, content, len, &tc);
    p->text = tc;
    p->len = len;
}

void conv_add_tool(conv *c, const char *name, const char *description, const char *parameters)
{
    if (c->n_tools == c->cap_tools) {
        c->cap_tools = c->cap_tools ? c->cap_tools * 2 : 4;
        c->tools = xrealloc(c->tools, (size_t)c->cap_tools * sizeof *c->tools);
    }
    conv_tool *t = &c->tools[c->n_tools++];
    t->name = conv_strdup(c, name ? name : "", name ? strlen(name) : 0);
    t->description = description ? conv_strdup(c, description, strlen(description)) : NULL;
    t->parameters = parameters ? conv_strdup(c, parameters, strlen(parameters)) : NULL;
    t->strict = false;
}

void conv_add_message(conv *c, conv_role role, const char *text)
{
    conv_add_turn(c, role);
    if (role == CONV_ROLE_TOOL) conv_add_tool_result(c, NULL, NULL, text, strlen(text));
    else conv_add_text(c, text, strlen(text));
}

const char *conv_role_name(conv_role role)
{
    switch (role) {
    case CONV_ROLE_SYSTEM: return "system";
    case CONV_ROLE_DEVELOPER: return "developer";
    case CONV_ROLE_USER: return "user";
    case CONV_ROLE_ASSISTANT: return "assistant";
    case CONV_ROLE_TOOL: return "tool";
    }
    return "?";
}

int conv_turn_count(const conv_turn *t, conv_part_kind kind)
{
    int n = 0;
    for (int i = 0; i < t->n_parts; i++) n += t->parts[i].kind == kind;
    return n;
}

const char *conv_turn_join(conv *c, const conv_turn *t, conv_part_kind kind, size_t *len)
{
    size_t total = 0;
    int n = 0;
    const conv_part *one = NULL;
    for (int i = 0; i < t->n_parts; i++) {
        const conv_part *p = &t->parts[i];
        if (p->kind != kind) continue;
        total += p->len;
        n++;
        one = p;
    }
    if (len) *len = total;
    if (n == 0) return NULL;
    if (n == 1) return one->text;
    char *o = conv_alloc(c, total + 1);
    size_t at = 0;
    for (int i = 0; i < t->n_parts; i++) {
        const conv_part *p = &t->parts[i];
        if (p->kind != kind) continue;
        memcpy(o + at, p->text, p->len);
        at += p->len;
    }
    o[at] = 0;
    return o;
}
