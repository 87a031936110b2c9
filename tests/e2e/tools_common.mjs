// What the tool-call tests of the families share (toolfmt, tools_dsv4, tools_qwen35): the one
// tool they force, and the calls of a streamed Chat Completions answer put back together.
import assert from "node:assert/strict";

// A city from an enum (a string parameter) and a day count (an integer one): a forced call's
// arguments are valid exactly when both come back typed.
export const weatherTool = {
  type: "function",
  function: {
    name: "get_weather",
    description: "Weather in a city.",
    parameters: { type: "object", properties: { city: { type: "string", enum: ["Paris", "Oslo"] }, days: { type: "integer", enum: [1, 3, 7] } }, required: ["city", "days"], additionalProperties: false },
  },
};

// The arguments (a JSON string, or an object) are the tool's: the city a string, the days a number.
export function checkWeatherArgs(a) {
  const o = typeof a === "string" ? JSON.parse(a) : a;
  assert.ok(["Paris", "Oslo"].includes(o.city) && [1, 3, 7].includes(o.days), JSON.stringify(a));
}

// A streamed chat completion's tool-call fragments added up: { name, args, finish }.
export async function streamedCall(stream) {
  let args = "", name = "", finish = null;
  for await (const ch of stream) {
    const d = ch.choices[0];
    for (const tc of d?.delta?.tool_calls ?? []) {
      if (tc.function?.name) name += tc.function.name;
      args += tc.function?.arguments ?? "";
    }
    if (d?.finish_reason) finish = d.finish_reason;
  }
  return { name, args, finish };
}
