/*
 * events: splits a model's output into answer text, reasoning and tool calls, by token ID.
 *
 * The caller feeds each generated token id with the text its streaming detokenizer produced
 * for it (possibly empty); the splitter calls back with events as soon as they are decided.
 * Markers switch state only when they arrive as their own token id (from the template's
 * events_markers); a marker's spelling produced from ordinary tokens ("<", "think", ">") is
 * plain text. The end-of-turn token itself should not be fed (the caller stops on it) and
 * then calls events_finish.
 *
 * States: TEXT (answer), REASONING (between think start/end; the prompt may open it, see
 * starts_in_reasoning), and tool-call states per format:
 *   QWEN      <tool_call> {"name": N, "arguments": {...}} </tool_call>, any number of them.
 *   DEEPSEEK  <｜tool▁calls▁begin｜> (<｜tool▁call▁begin｜> N <｜tool▁sep｜> ARGS
 *             <｜tool▁call▁end｜>)* <｜tool▁calls▁end｜>; ARGS may be fenced in ```json ...```;
 *             the R1 form "function<｜tool▁sep｜>N\n```json\nARGS\n```" is accepted too.
 *   LLAMA3    the answer is one JSON object {"name": N, "parameters": {...}} (or
 *             "arguments"), optionally after <|python_tag|>. There is no marker token, so
 *             this is decided on text: when tools were offered and the answer's first
 *             non-blank character is '{', the text is held until the JSON value is complete.
 *
 *   MISTRAL   [TOOL_CALLS]N[ARGS]{...} per call (Mistral Small 3.2, Devstral, Ministral 3; a
 *             [CALL_ID]X between the name and [ARGS] is read and ignored), or the older
 *             [TOOL_CALLS][{"name": N, "arguments": {...}, "id": X}, ...] (Nemo, 7B v0.3). No
 *             end marker: a call ends where its arguments' JSON value ends (text after it is
 *             answer text), at the next [TOOL_CALLS] or at finish. The older array is decided
 *             when it is a complete JSON value (all its calls at once). Call ids are 9
 *             alphanumerics, the only ids Mistral's templates take back.
 *   GLM       <tool_call>N (<arg_key>K</arg_key> <arg_value>V</arg_value>)* </tool_call>
 *             (GLM-4.5/4.6/4.7), every marker by id. A value is a JSON string of its raw text
 *             when the tool's schema types that argument "string"; otherwise the JSON value
 *             it spells when it parses (trimmed), else a string of its raw text. The call is
 *             committed at its first complete argument, each argument sent whole.
 *   DSML      DeepSeek V4 (and V3.2): <｜DSML｜tool_calls> (V3.2: function_calls), then per
 *             call <｜DSML｜invoke name="N"> with <｜DSML｜parameter name="K"
 *             string="true|false">V</｜DSML｜parameter> per argument, </｜DSML｜invoke>, and
 *             </｜DSML｜tool_calls>. Only "｜DSML｜" is a token (tool_start); the '<', '</' and
 *             tag names around it are text, so a '<' ending a text piece is held back until the
 *             next token shows whether the ｜DSML｜ token follows it. A block may open inside
 *             reasoning (the reasoning ends there). A string="true" value is a JSON string of
 *             its raw text; another the JSON value it spells (trimmed), else a string. The call
 *             is committed at its invoke tag, each argument sent whole; a block that opened no
 *             call before it went wrong is answer text.
 *   XML       Qwen3.5, Qwen3-Coder: <tool_call> <function=N> (<parameter=K> V </parameter>)*
 *             </function> </tool_call> per call; only <tool_call> and </tool_call> are tokens,
 *             the tags inside are text. One newline after <parameter=K> and one before
 *             </parameter> frame the value and are not part of it. A value is typed as GLM's
 *             (a string of its raw text when the schema types it "string", else the JSON value
 *             it spells, else a string). The call is committed at its <function=N> tag, each
 *             parameter sent whole at its closing tag; a call that never opened its function
 *             tag is answer text.
 *   HARMONY   gpt-oss: the output is a list of messages. Each has a header, read up to
 *             <|message|>: the role (the prompt already wrote "<|start|>assistant" for the
 *             first), <|channel|> and the channel name (the last one counts), optionally a
 *             recipient "to=functions.NAME" (in the role part or after the channel; not
 *             "to=assistant") and
 *             "<|constrain|>json"; then the body, ended by <|end|> (another message follows
 *             after <|start|>), <|call|> or <|return|> (both end generation: the caller stops
 *             and calls events_finish). A body with a recipient is a tool call whose
 *             arguments are the body (JSON; the name is the recipient without "functions.");
 *             otherwise channel "analysis" is reasoning and every other channel ("final", a
 *             "commentary" preamble) answer text. A header that never reaches <|message|> is
 *             dropped when it was cut by the end of the output after a <|channel|> marker,
 *             and emitted as text otherwise (or when longer than any real header); text
 *             outside any message is answer text.
 *
 * Tool calls stream as they are generated, as vLLM's parsers do: once a call's head has
 * arrived (QWEN/LLAMA3: {"name": N, "arguments"|"parameters": {; DEEPSEEK: the name, the
 * separator, an optional ```json fence line, then {) the call is committed: TOOL_START (index,
 * generated id, name) is sent, then TOOL_ARGS fragments of the arguments re-emitted as compact
 * JSON as far as they are final (jsonfmt_prefix) and closable (never ending inside a key or
 * after a ':' or ','), and at the end marker TOOL_END with the complete arguments, which are
 * exactly the concatenated fragments and always valid JSON. Fragments are never taken back:
 * when a committed call's arguments turn out malformed or are cut (token limit, no end
 * marker), what was sent is closed at that point (an open string and the open brackets are
 * closed; vLLM likewise completes partial JSON and sends the missing tail at the end) and the
 * rest of the raw text is dropped. A call whose head has another shape (arguments given as a
 * JSON string, other keys first) is decided at its end marker, all its events at once.
 * Rule for malformed calls not committed: when the body does not parse (not JSON, no string
 * name, arguments neither an object nor a string holding a JSON object), nothing is dropped
 * and no tool events are sent: the raw text, marker texts included, is emitted as answer
 * text. A call left open at finish is parsed the same way (valid: a tool call; otherwise
 * text).
 *
 * Whitespace (when markers.trim): blank text at the start of the answer or of the
 * reasoning, blank text right before a marker and at the end are dropped, as the families'
 * reference parsers strip them; blanks between words are kept (held back until a non-blank
 * character follows).
 *
 * Memory: buffers grow while the first requests run and are kept by events_reset, so a warm
 * splitter does not allocate. One splitter per running sequence; not thread-safe.
 */
#ifndef TM_EVENTS_H
#define TM_EVENTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "recipe/conv.h"

typedef enum {
    EVENTS_TOOLFMT_NONE = 0,
    EVENTS_TOOLFMT_QWEN,
    EVENTS_TOOLFMT_DEEPSEEK,
    EVENTS_TOOLFMT_LLAMA3,
    EVENTS_TOOLFMT_HARMONY,
    EVENTS_TOOLFMT_MISTRAL,
    EVENTS_TOOLFMT_GLM,
    EVENTS_TOOLFMT_DSML,
    EVENTS_TOOLFMT_XML,
} events_toolfmt;

/* Token ids of the markers; -1 where the vocabulary has none. */
typedef struct {
    int32_t think_start;       /* <think> */
    int32_t think_end;         /* </think> */
    events_toolfmt toolfmt;    /* how tool calls are written */
    int32_t tool_start;        /* QWEN, GLM, XML <tool_call>; DEEPSEEK <｜tool▁call▁begin｜>; LLAMA3 <|python_tag|>;
                                  MISTRAL [TOOL_CALLS]; DSML ｜DSML｜ */
    int32_t tool_end;          /* QWEN, GLM, XML </tool_call>; DEEPSEEK <｜tool▁call▁end｜> */
    int32_t tools_begin;       /* DEEPSEEK <｜tool▁calls▁begin｜> */
    int32_t tools_end;         /* DEEPSEEK <｜tool▁calls▁end｜> */
    int32_t tool_sep;          /* DEEPSEEK <｜tool▁sep｜>; MISTRAL [ARGS] */
    int32_t call_id;           /* MISTRAL [CALL_ID] */
    int32_t arg_key;           /* GLM <arg_key> */
    int32_t arg_key_end;       /* GLM </arg_key> */
    int32_t arg_val;           /* GLM <arg_value> */
    int32_t arg_val_end;       /* GLM </arg_value> */
    bool dsml_v32;             /* DSML: the block is <｜DSML｜function_calls> (V3.2), not tool_calls */
    const conv *tools;         /* GLM, DSML, XML: the request, whose tool schemas say which arguments are
                                  strings; NULL: none. Must outlive the splitter */
    int32_t h_start;           /* HARMONY <|start|> */
    int32_t h_channel;         /* HARMONY <|channel|> */
    int32_t h_message;         /* HARMONY <|message|> */
    int32_t h_constrain;       /* HARMONY <|constrain|> */
    int32_t h_end;             /* HARMONY <|end|> (a message ends, more may follow) */
    int32_t h_call;            /* HARMONY <|call|> (a tool call ends the output) */
    int32_t h_return;          /* HARMONY <|return|> (the answer ends the output) */
    const char *h_forced;      /* HARMONY: the prompt opened a call to this function (its
                                  arguments come first); NULL if not. Must outlive the splitter */
    bool h_analysis;           /* HARMONY: the first message is analysis that <|end|> ends (the
                                  server closes it for a reasoning budget or a format): what
                                  precedes that <|end|> without a header is reasoning, not text */
    bool starts_in_reasoning;  /* the prompt ended inside an open think block */
    bool tools_enabled;        /* tools were offered: calls are read only then (otherwise what
                                  looks like one is text) */
    bool trim;                 /* drop blank text at section edges (chat families) */
} events_markers;

/* A markers value with every id -1 and no tool format. */
void events_markers_none(events_markers *m);

typedef enum {
    EVENTS_TEXT = 0,    /* answer text delta: text/len */
    EVENTS_REASONING,   /* reasoning delta: text/len */
    EVENTS_TOOL_START,  /* tool_index, tool_id, tool_name */
    EVENTS_TOOL_ARGS,   /* tool_index, tool_id; text/len: arguments JSON fragment */
    EVENTS_TOOL_END,    /* tool_index, tool_id, tool_name; text/len: the complete arguments JSON */
    EVENTS_FINISH,      /* finish */
} events_kind;

typedef enum {
    EVENTS_FINISH_STOP = 0,    /* end of turn or a stop sequence */
    EVENTS_FINISH_LENGTH,      /* token limit */
    EVENTS_FINISH_TOOL_CALLS,  /* ended normally after at least one tool call */
} events_finish_reason;

typedef struct {
    events_kind kind;
    const char *text;             /* delta or arguments (valid during the callback only) */
    size_t len;                   /* bytes of text */
    int tool_index;               /* 0-based index of the call in this response */
    const char *tool_id;          /* "call_" + 24 alphanumerics, NUL-terminated */
    const char *tool_name;        /* NUL-terminated */
    events_finish_reason finish;  /* FINISH only */
} events_event;

typedef void (*events_cb)(void *ud, const events_event *e);

typedef struct events events;

/* A splitter for markers m (copied); ids are drawn from a PRNG seeded with seed. */
events *events_new(const events_markers *m, uint64_t seed, events_cb cb, void *ud);
void events_free(events *ev);
/* Starts a new response with the same callback, keeping the buffers. */
void events_reset(events *ev, const events_markers *m, uint64_t seed);

/* One generated token and the text the detokenizer gave for it. */
void events_feed(events *ev, int32_t token, const char *text, size_t len);
/* Ends the response: flushes what is held and sends FINISH (STOP becomes TOOL_CALLS when a
 * tool call was sent). Nothing may be fed afterwards until events_reset. */
void events_finish(events *ev, events_finish_reason reason);

/* Tool calls sent so far in this response. */
int events_n_tool_calls(const events *ev);
/* Whether the splitter is inside reasoning (the next token's text would be reasoning). */
bool events_in_reasoning(const events *ev);

#endif
