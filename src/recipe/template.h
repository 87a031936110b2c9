/*
 * template: built-in chat templates that turn a conv into prompt token ids.
 *
 * Families (names for --template):
 *   qwen3      ChatML as Qwen3 writes it: tools in the system turn, <think> reasoning for the
 *              turns after the last user query, <tool_call>/<tool_response>, enable_thinking.
 *   qwen2.5    ChatML as Qwen2.5 writes it (default system prompt, tools, no reasoning).
 *   qwen2      ChatML as Qwen2 writes it (default system prompt "You are a helpful assistant").
 *   chatml     plain ChatML (no default system prompt). Like their references, qwen2 and
 *              chatml write neither tool definitions nor tool calls; a tool result is a "tool"
 *              turn.
 *   llama3     Llama 3 / 3.1 header ids; tools in the first user turn, "Environment: ipython",
 *              JSON tool calls, tool results as ipython turns.
 *   deepseek3  DeepSeek V3.1: <｜User｜>/<｜Assistant｜>, <think> and the tool-call tokens.
 *   deepseek4  DeepSeek V4 (deepseek4-flash-0731: the V4-Flash-0731 revision, whose "high"
 *              reasoning effort writes its effort text): tools in the system prompt, DSML
 *              tool calls (<｜DSML｜tool_calls> / invoke / parameter), <tool_result> in the
 *              user turn, <think> reasoning kept or dropped as the template decides.
 *   deepseek-r1  DeepSeek R1 (and its distills): "<｜Assistant｜><think>\n" generation prompt,
 *              reasoning dropped from history, "function<｜tool▁sep｜>NAME\n```json" calls.
 *   harmony    gpt-oss (alias gpt-oss): <|start|>ROLE<|channel|>CHANNEL<|message|>...<|end|>; a
 *              system message with the date and "Reasoning: low|medium|high", the developer
 *              message with the instructions and the tools as a TypeScript namespace, calls as
 *              "assistant to=functions.NAME" commentary messages ending in <|call|>, the
 *              analysis (reasoning) of earlier turns dropped.
 *   plain      base models (stories260K): BOS (if the vocabulary asks for it) and the text.
 * Each mirrors, turn for turn, the reference Jinja template of its family in llama.cpp's
 * models/templates (Qwen-Qwen3-0.6B, Qwen-Qwen2.5-7B-Instruct,
 * meta-llama-Llama-3.1-8B-Instruct, deepseek-ai-DeepSeek-V3.1, deepseek-ai-DeepSeek-V4 and
 * -V4-Flash-0731, openai-gpt-oss-120b, deepseek-ai-DeepSeek-R1-Distill-Qwen-32B
 * (llama.cpp's copy, whose thinking defaults to off); qwen2: the chat_template of
 * llama.cpp's ggml-vocab-qwen2.gguf; chatml: llama.cpp's ChatML test template), with Python
 * Jinja semantics, tools included: DeepSeek's references write tool calls and results but
 * not the definitions (DeepSeek has them described in the system prompt).
 *
 * Choosing the family: a GGUF whose tokenizer.chat_template is exactly one of those texts
 * gets its family; any other template text is not recognised (template_new fails unless a
 * name is given), as rendering it as a similar family would silently change the prompt. A
 * GGUF with no template text (base models, vocabulary files) is judged by its special tokens.
 *
 * Control tokens only by ID. Rendering produces a list of segments: control tokens (ids) and
 * text runs. Scaffolding strings of the template are searched for the vocabulary's special
 * tokens (control and user-defined), which are emitted by id; all user, system, tool and
 * assistant-history text is tokenised as plain text with no special-token matching at all (a
 * user-typed "<|im_end|>", "</think>" or "<｜User｜>" gives ordinary text tokens). Adjacent
 * scaffolding text and content text form one run, tokenised together, so that the ids equal
 * llama.cpp's tokenisation of the rendered string with parse_special = true whenever the
 * content contains no special-token text. Runs are tokenised in parallel threads when the
 * prompt's text is long.
 *
 * A template is immutable after template_new and may be shared by threads.
 */
#ifndef TM_TEMPLATE_H
#define TM_TEMPLATE_H

#include <stddef.h>
#include <stdint.h>

#include "model/gguf.h"
#include "recipe/conv.h"
#include "recipe/events.h"
#include "recipe/tokenizer.h"
#include "util/threadpool.h"

typedef enum {
    TEMPLATE_OK = 0,
    TEMPLATE_ERR_NAME,      /* unknown template name */
    TEMPLATE_ERR_UNRECOGNISED, /* no name given and the model's template text is none of the
                               families' (the message names --template and the families) */
    TEMPLATE_ERR_JSON,      /* tool parameters or call arguments are not valid JSON */
    TEMPLATE_ERR_CONV,      /* the conversation cannot be written in this family (e.g. tools
                               offered to llama3 with no user turn) */
    TEMPLATE_ERR_TOKENIZE,  /* the tokenizer failed */
    TEMPLATE_ERR_TEMPLATE,  /* the Jinja template failed: syntax, an operation, an error it raised */
    TEMPLATE_ERR_LIMIT,     /* the Jinja template passed a bound: steps, output, memory, depth */
} template_status;

typedef enum {
    TEMPLATE_PLAIN = 0,
    TEMPLATE_CHATML,
    TEMPLATE_QWEN2,
    TEMPLATE_QWEN25,
    TEMPLATE_QWEN3,
    TEMPLATE_LLAMA3,
    TEMPLATE_DEEPSEEK3,
    TEMPLATE_DEEPSEEK_R1,
    TEMPLATE_HARMONY,
    TEMPLATE_DEEPSEEK4,     /* DeepSeek V4 (template_dsv4.c) */
    TEMPLATE_DEEPSEEK4_FLASH, /* DeepSeek V4-Flash-0731: V4 with its "high" effort text */
    TEMPLATE_JINJA,         /* any other template text, run by the Jinja interpreter (jinja.h) */
} template_family;

typedef struct template template;

/* A prompt: token ids and, for debugging and the CLI, the rendered text (control tokens
 * spelled as their vocabulary text). */
typedef struct {
    int32_t *ids;        /* n_ids token ids */
    size_t n_ids;
    char *text;          /* NUL-terminated rendering */
    size_t text_len;     /* bytes of text */
} template_prompt;

/* template_open with the model's own template text. */
template_status template_new(const tokenizer *tok, const gguf *g, const char *name, template **out,
                             char *err, size_t errsz);
/* Chooses the renderer for the template text text[0..text_len) (NULL: g's
 * tokenizer.chat_template). name NULL or "auto": the family whose reference text it is, else
 * the Jinja interpreter; no text at all: the family the vocabulary's special tokens suggest.
 * name "jinja": the interpreter (a text is needed); another name: that family. A text for the
 * interpreter must parse (else TEMPLATE_ERR_TEMPLATE) and render a plain conversation within
 * the interpreter's bounds (else TEMPLATE_ERR_LIMIT), with a message saying why; an error the
 * template raises or meets on that conversation does not refuse it (some templates need
 * tools, or refuse a system turn). g may be NULL (vocabulary
 * only). tok must outlive the template. */
template_status template_open(const tokenizer *tok, const gguf *g, const char *name, const char *text, size_t text_len,
                              template **out, char *err, size_t errsz);
/* template_open with the text of the file at path (NULL: the model's own). */
template_status template_open_file(const tokenizer *tok, const gguf *g, const char *name, const char *path,
                                   template **out, char *err, size_t errsz);
void template_free(template *t);

/* The family's name; "jinja" for the interpreter. */
const char *template_name(const template *t);
/* The tool-call syntax the output parser reads for this template: "qwen", "llama3",
 * "deepseek", "harmony", "mistral", "glm", "dsml" or "none" (answers are text). */
const char *template_tool_format(const template *t);
/* The vocabulary the template was made for. */
const tokenizer *template_tokenizer(const template *t);
template_family template_get_family(const template *t);
/* The family for a name ("qwen3", ...); -1 if unknown. */
int template_family_by_name(const char *name);
/* The family template_new would choose for this model (no name given): the family whose
 * reference text g's tokenizer.chat_template is, -1 if it is another text; without a
 * template text, by the special tokens (and general.architecture). */
int template_detect(const tokenizer *tok, const gguf *g);

/* Renders and tokenises c. A pool tp (NULL: none) tokenises a long prompt's text runs in
 * parallel; concurrent callers may share it (threadpool_try_run: one that finds it busy
 * tokenises alone). On success fills *out (free with template_prompt_free). */
template_status template_apply(const template *t, const conv *c, threadpool *tp, template_prompt *out,
                               char *err, size_t errsz);
void template_prompt_free(template_prompt *p);

/* The output splitter's markers for a response to c (ids from this vocabulary; whether
 * tools were offered; whether the prompt leaves a think block open). */
void template_markers(const template *t, const conv *c, events_markers *m);

/* Plain-text tokenisation with no special-token matching at all (not even user-defined
 * tokens such as <think>); appends to *ids (realloc'd, *cap grown). Returns the count added,
 * or -1 on tokenizer failure. */
int64_t template_tokenize_plain(const template *t, const char *text, size_t len, int32_t **ids, size_t *n,
                                size_t *cap);

#endif
