// The generated gpt-oss model the window-cache tests share (6 layers, a 48-token window on 3
// of them, 128-token blocks) and their 300-token prompt: two full blocks, so window states are
// kept at 128 and 256.
import { execFileSync } from "node:child_process";

import { bin } from "./server.mjs";

export const WINDOW_MODEL_NAME = "tiny-oss";
export const WINDOW_PROMPT_LEN = 300;
export const WINDOW_PROMPT = Array.from({ length: WINDOW_PROMPT_LEN }, (_, i) => 300 + ((i * 7919) % 3000));

export function makeWindowModel(file) {
  execFileSync(bin, ["mkmodel", "--arch", "gpt-oss", "--preset", "gpt-oss-20b", "--layers", "6", "--dim", "128",
    "--ffn", "128", "--heads", "2", "--kv-heads", "1", "--head-dim", "64", "--experts", "4", "--experts-used", "2",
    "--expert-ffn", "128", "--window", "48", "--vocab-size", "4096", "--type", "q8_0", "--seed", "11", "-o", file],
  { stdio: "pipe" });
}
