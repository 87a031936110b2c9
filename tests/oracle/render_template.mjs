// render_template: the reference rendering of a chat template. Renders one of llama.cpp's
// reference Jinja files (tests/data/llama.cpp/models/templates) with @huggingface/jinja for a
// conversation in tokenmill's `template --input` format (an OpenAI-chat-like body; see
// src/cli/cmd_template.c), the way llama.cpp's server passes it: tool-call arguments as
// objects, content as a string, reasoning_content only when given.
//   node tests/oracle/render_template.mjs TEMPLATE.jinja CONV.json BOS_TEXT EOS_TEXT
import fs from "node:fs";
import { Template } from "@huggingface/jinja";

export function jinjaContext(conv, bosText, eosText) {
  const messages = conv.messages.map((m) => {
    const o = { role: m.role };
    let c = m.content;
    if (Array.isArray(c)) c = c.map((p) => p.text).join("");
    // null stays null only with tool calls (templates that test "content is not none")
    o.content = c === null && m.tool_calls && m.tool_calls.length ? null : c ?? "";
    if (m.reasoning_content !== undefined) o.reasoning_content = m.reasoning_content;
    // llama.cpp's server hands the reasoning to the gpt-oss template as "thinking" too
    if (m.reasoning_content !== undefined) o.thinking = m.reasoning_content;
    if (m.tool_calls && m.tool_calls.length) {
      o.tool_calls = m.tool_calls.map((tc) => ({
        id: tc.id,
        type: "function",
        function: {
          name: tc.function.name,
          arguments: typeof tc.function.arguments === "string" ? JSON.parse(tc.function.arguments) : tc.function.arguments,
        },
      }));
    }
    if (m.tool_call_id !== undefined) o.tool_call_id = m.tool_call_id;
    if (m.name !== undefined) o.name = m.name;
    return o;
  });
  const ctx = {
    messages,
    add_generation_prompt: conv.add_generation_prompt ?? true,
    bos_token: bosText,
    eos_token: eosText,
  };
  if (conv.tools && conv.tools.length) ctx.tools = conv.tools;
  if (conv.enable_thinking !== undefined) ctx.enable_thinking = conv.enable_thinking;
  if (conv.reasoning_effort !== undefined) ctx.reasoning_effort = conv.reasoning_effort;
  return ctx;
}

// templateText: the Jinja source.
// conv.date ("YYYY-MM-DD") stands in for today's date where the template prints it (the
// built-in strftime_now cannot be replaced).
export function renderTemplate(templateText, conv, bosText, eosText) {
  if (conv.date !== undefined) templateText = templateText.replaceAll('strftime_now("%Y-%m-%d")', JSON.stringify(conv.date));
  const tmpl = new Template(templateText);
  return tmpl.render(jinjaContext(conv, bosText, eosText));
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const [tf, cf, bos = "", eos = ""] = process.argv.slice(2);
  process.stdout.write(renderTemplate(fs.readFileSync(tf, "utf8"), JSON.parse(fs.readFileSync(cf, "utf8")), bos, eos));
}
