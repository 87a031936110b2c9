/*
 * eventstest: the marker tokens the output-splitter tests (test_events, test_api) share, and
 * the events_markers of each tool-call family built from them, as the template builds them
 * from a real vocabulary. Ordinary tokens stay below 1000; a test feeds a marker as "#ID".
 * Header-only (static inline functions), like tinymodel.h.
 */
#ifndef TM_EVENTSTEST_H
#define TM_EVENTSTEST_H

#include "recipe/events.h"

/* think, Qwen's <tool_call>, DeepSeek's calls / call / sep, Llama 3's <|python_tag|> */
enum { THINK = 5000, UNTHINK, TC, UNTC, CALLS_B, CALLS_E, CALL_B, CALL_E, SEP, PYTAG };
/* Mistral: [TOOL_CALLS] [ARGS] [CALL_ID] [THINK] [/THINK]; GLM: <tool_call> </tool_call> <arg_key>
 * </arg_key> <arg_value> </arg_value> */
enum { MI_CALLS = 7000, MI_ARGS, MI_CALLID, MI_THINK, MI_UNTHINK };
enum { G_TC = 7100, G_UNTC, G_KEY, G_UNKEY, G_VAL, G_UNVAL };
/* DeepSeek V4: ｜DSML｜ (the only DSML token; think markers are THINK/UNTHINK) */
enum { DSML = 7200 };
/* harmony (gpt-oss) */
enum { H_START = 6000, H_CHANNEL, H_MESSAGE, H_CONSTRAIN, H_END, H_CALL, H_RETURN };

static inline events_markers eventstest_qwen(void)
{
    events_markers m;
    events_markers_none(&m);
    m.think_start = THINK;
    m.think_end = UNTHINK;
    m.toolfmt = EVENTS_TOOLFMT_QWEN;
    m.tool_start = TC;
    m.tool_end = UNTC;
    m.tools_enabled = true;
    m.trim = true;
    return m;
}

static inline events_markers eventstest_deepseek(void)
{
    events_markers m;
    events_markers_none(&m);
    m.think_start = THINK;
    m.think_end = UNTHINK;
    m.toolfmt = EVENTS_TOOLFMT_DEEPSEEK;
    m.tools_begin = CALLS_B;
    m.tools_end = CALLS_E;
    m.tool_start = CALL_B;
    m.tool_end = CALL_E;
    m.tool_sep = SEP;
    m.tools_enabled = true;
    m.trim = true;
    return m;
}

static inline events_markers eventstest_llama3(void)
{
    events_markers m;
    events_markers_none(&m);
    m.toolfmt = EVENTS_TOOLFMT_LLAMA3;
    m.tool_start = PYTAG;
    m.tools_enabled = true;
    m.trim = true;
    return m;
}

static inline events_markers eventstest_harmony(void)
{
    events_markers m;
    events_markers_none(&m);
    m.toolfmt = EVENTS_TOOLFMT_HARMONY;
    m.h_start = H_START;
    m.h_channel = H_CHANNEL;
    m.h_message = H_MESSAGE;
    m.h_constrain = H_CONSTRAIN;
    m.h_end = H_END;
    m.h_call = H_CALL;
    m.h_return = H_RETURN;
    m.tools_enabled = true;
    m.trim = true;
    return m;
}

static inline events_markers eventstest_mistral(void)
{
    events_markers m;
    events_markers_none(&m);
    m.think_start = MI_THINK;
    m.think_end = MI_UNTHINK;
    m.toolfmt = EVENTS_TOOLFMT_MISTRAL;
    m.tool_start = MI_CALLS;
    m.tool_sep = MI_ARGS;
    m.call_id = MI_CALLID;
    m.tools_enabled = true;
    m.trim = true;
    return m;
}

static inline events_markers eventstest_glm(void)
{
    events_markers m;
    events_markers_none(&m);
    m.think_start = THINK;
    m.think_end = UNTHINK;
    m.toolfmt = EVENTS_TOOLFMT_GLM;
    m.tool_start = G_TC;
    m.tool_end = G_UNTC;
    m.arg_key = G_KEY;
    m.arg_key_end = G_UNKEY;
    m.arg_val = G_VAL;
    m.arg_val_end = G_UNVAL;
    m.tools_enabled = true;
    m.trim = true;
    return m;
}

/* Qwen3.5's XML calls: only <tool_call> and </tool_call> are tokens (GLM's ids reused) */
static inline events_markers eventstest_xml(void)
{
    events_markers m;
    events_markers_none(&m);
    m.think_start = THINK;
    m.think_end = UNTHINK;
    m.toolfmt = EVENTS_TOOLFMT_XML;
    m.tool_start = G_TC;
    m.tool_end = G_UNTC;
    m.tools_enabled = true;
    m.trim = true;
    return m;
}

static inline events_markers eventstest_dsml(void)
{
    events_markers m;
    events_markers_none(&m);
    m.think_start = THINK;
    m.think_end = UNTHINK;
    m.toolfmt = EVENTS_TOOLFMT_DSML;
    m.tool_start = DSML;
    m.tools_enabled = true;
    m.trim = true;
    return m;
}

#endif
