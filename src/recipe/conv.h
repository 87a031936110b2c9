/*
 * conv: the one conversation format that the three HTTP APIs (OpenAI Chat Completions, OpenAI
 * Responses, Anthropic Messages) convert into, and that the chat templates render.
 *
 * A conversation is a list of turns (system, developer, user, assistant, tool), each a list of
 * parts: text, reasoning (an assistant's thinking), a tool call (id, function name, arguments
 * as JSON text) or a tool result (the id of the call it answers, content text). Tool
 * definitions carry the JSON-schema parameters as JSON text. Nothing here knows a JSON
 * library: JSON is passed as text, and checked by the templates when they print it.
 *
 * Memory: every string is copied into an arena owned by the conv (chunked, never moves), so
 * callers may free their request buffers right after building the conv. conv_init/conv_free
 * bracket its life; turns and parts are appended only, in order. Not thread-safe while being
 * built; read-only use from several threads afterwards is fine.
 *
 * Shapes the APIs produce map onto this as follows: a Chat Completions "tool" message is a
 * CONV_ROLE_TOOL turn with one TOOL_RESULT part; an Anthropic user message holding several
 * tool_result blocks becomes one CONV_ROLE_TOOL turn per block (templates group consecutive
 * tool turns as their reference does); an assistant message's tool_calls become TOOL_CALL
 * parts after its text.
 */
#ifndef TM_CONV_H
#define TM_CONV_H

#include <stdbool.h>
#include <stddef.h>

typedef enum {
    CONV_ROLE_SYSTEM = 0,
    CONV_ROLE_DEVELOPER,   /* OpenAI's newer name for system; templates treat it as system */
    CONV_ROLE_USER,
    CONV_ROLE_ASSISTANT,
    CONV_ROLE_TOOL,
} conv_role;

typedef enum {
    CONV_PART_TEXT = 0,
    CONV_PART_REASONING,   /* assistant thinking (reasoning_content / thinking blocks) */
    CONV_PART_TOOL_CALL,   /* assistant: call of a function */
    CONV_PART_TOOL_RESULT, /* tool turn: the output of a call */
} conv_part_kind;

typedef struct {
    conv_part_kind kind;
    const char *text;      /* TEXT/REASONING: the text; TOOL_RESULT: the content (UTF-8, NUL-terminated) */
    size_t len;            /* bytes of text */
    const char *id;        /* TOOL_CALL: the call id; TOOL_RESULT: id of the call answered ("" if unknown) */
    const char *name;      /* TOOL_CALL: function name; TOOL_RESULT: function name if known, else "" */
    const char *args;      /* TOOL_CALL: arguments as JSON text (an object), NUL-terminated */
    size_t args_len;       /* bytes of args */
} conv_part;

typedef struct {
    conv_role role;
    conv_part *parts;      /* n_parts parts in order */
    int n_parts;
    int cap_parts;         /* allocated parts */
} conv_turn;

typedef struct {
    const char *name;        /* function name */
    const char *description; /* NULL when the API gave none */
    const char *parameters;  /* JSON-schema object as JSON text, NULL when none */
    bool strict;             /* calls must validate against parameters (OpenAI / Anthropic
                              * `strict: true`); set by the API parsers, false by default */
} conv_tool;

typedef enum {
    CONV_THINKING_DEFAULT = 0, /* whatever the model family's template does by default */
    CONV_THINKING_OFF,
    CONV_THINKING_ON,
} conv_thinking;

/* How hard the model should think, for families whose prompt says it (harmony's "Reasoning:
 * low|medium|high" line); DEFAULT lets the family derive it from `thinking`. */
typedef enum {
    CONV_EFFORT_DEFAULT = 0,
    CONV_EFFORT_LOW,
    CONV_EFFORT_MEDIUM,
    CONV_EFFORT_HIGH,
} conv_effort;

typedef struct conv_chunk conv_chunk;

typedef struct {
    conv_turn *turns;            /* n_turns turns in order */
    int n_turns;
    int cap_turns;
    conv_tool *tools;            /* n_tools tool definitions offered to the model */
    int n_tools;
    int cap_tools;
    bool add_generation_prompt;  /* end with the opening of an assistant turn (default true) */
    conv_thinking thinking;      /* enable_thinking as the templates know it */
    conv_effort effort;          /* reasoning effort (reasoning_effort, reasoning.effort) */
    const char *date;            /* "YYYY-MM-DD" for templates that print the current date;
                                    NULL: today's UTC date (tests fix it) */
    const char *forced_call;     /* the tool the answer must call, when it is one (NULL: none);
                                    templates that can open the call in the prompt do (harmony) */
    const char *template_kwargs; /* chat_template_kwargs: a JSON object whose members are more
                                    variables for a Jinja template (NULL: none) */
    conv_chunk *arena;           /* string storage (list of chunks, newest first) */
} conv;

void conv_init(conv *c);
/* Frees everything the conv owns; the conv may be conv_init'ed again. Accepts a zeroed conv. */
void conv_free(conv *c);

/* Copies len bytes (plus a NUL) into the conv's arena; returns the copy. */
const char *conv_strdup(conv *c, const char *s, size_t len);

/* Appends a new empty turn and returns its index. */
int conv_add_turn(conv *c, conv_role role);
/* Appends parts to the LAST turn (conv_add_turn first). Strings are copied. name/id/args may
 * be NULL (stored as ""; args as "{}"). */
void conv_add_text(conv *c, const char *text, size_t len);
void conv_add_reasoning(conv *c, const char *text, size_t len);
void conv_add_tool_call(conv *c, const char *id, const char *name, const char *args, size_t args_len);
void conv_add_tool_result(conv *c, const char *call_id, const char *name, const char *content, size_t len);
/* Adds a tool definition; description and parameters may be NULL. */
void conv_add_tool(conv *c, const char *name, const char *description, const char *parameters);

/* Convenience: a turn with one text part. */
void conv_add_message(conv *c, conv_role role, const char *text);

const char *conv_role_name(conv_role role);

/* Helpers for templates: the concatenation of the turn's parts of one kind (TEXT or
 * REASONING), written into the conv's arena. Returns NULL if the turn has no part of that
 * kind (so "" means present but empty). */
const char *conv_turn_join(conv *c, const conv_turn *t, conv_part_kind kind, size_t *len);
int conv_turn_count(const conv_turn *t, conv_part_kind kind);

#endif
