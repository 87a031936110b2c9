// endpoints: the routes and options that clients written for other servers expect, on one
// `tokenmill serve` of models/stories260K.gguf and (where the gateway answers them itself) on a
// gateway without workers:
//  - POST /tokenize and /detokenize in llama.cpp server's shapes, token for token against
//    llama.cpp (node-llama-cpp, vocabulary only).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import path from "node:path";
import { getLlama } from "node-llama-cpp";
import { root, startServer, startCluster, stopServers } from "./server.mjs";

const stories = path.join(root, "models/stories260K.gguf");
let srv, gw, vocab;

before(async () => {
  srv = await startServer(stories, []);
  gw = await startCluster(stories, [], { gatewayArgs: ["--register", "127.0.0.1:0"] });
  const llama = await getLlama({ gpu: false, build: "never", logLevel: "fatal" });
  vocab = await llama.loadModel({ modelPath: stories, vocabOnly: true });
});
after(stopServers);

async function post(url, route, body, headers = {}) {
  const res = await fetch(url + route, { method: "POST", headers: { "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body) });
  return { status: res.status, headers: res.headers, body: await res.json() };
}

test("/tokenize and /detokenize answer in llama.cpp's shapes, on serve and on the gateway", async () => {
  const texts = ["Once upon a time, there was a little dog.", "  two  spaces\nand a line", "é ü 日本"];
  for (const url of [srv.url, gw.url]) {
    for (const text of texts) {
      const want = Array.from(vocab.tokenize(text, false));
      const r = await post(url, "/tokenize", { content: text });
      assert.equal(r.status, 200, JSON.stringify(r.body));
      assert.deepEqual(r.body.tokens, want, text);
      const d = await post(url, "/detokenize", { tokens: want });
      assert.equal(d.status, 200);
      // SPM writes the space it put before the text back, as llama.cpp's /detokenize does
      assert.equal(d.body.content, " " + text);
    }
    // add_special: BOS first; with_pieces: ids and pieces, a piece not valid UTF-8 as bytes
    // (llama.cpp's README example, 'á' on this very vocabulary)
    const p = await post(url, "/tokenize", { content: "Once á", add_special: true, with_pieces: true });
    assert.deepEqual(p.body.tokens, [{ id: 1, piece: "<s>" }, { id: 403, piece: " Once" }, { id: 410, piece: " " },
      { id: 198, piece: [195] }, { id: 164, piece: [161] }]);
    const d = await post(url, "/detokenize", { tokens: [1, 403, 198, 164] });
    assert.equal(d.body.content, "<s> Onceá");
    // a mixed array: add_special applies to the leading string only
    const m = await post(url, "/tokenize", { content: ["Once", 5, "Once"], add_special: true });
    assert.deepEqual(m.body.tokens, [1, 403, 5, 403]);
    // bad input: 400s in OpenAI's shape naming the field
    for (const [route, body, param] of [["/detokenize", { tokens: [1, 512] }, "tokens[1]"],
      ["/detokenize", { tokens: "1" }, "tokens"], ["/tokenize", {}, "content"], ["/tokenize", { content: [-1] }, "content[0]"],
      ["/tokenize", { content: "x", with_pieces: 1 }, "with_pieces"], ["/tokenize", { content: "x", extra: 1 }, "extra"]]) {
      const e = await post(url, route, body);
      assert.equal(e.status, 400, JSON.stringify(body));
      assert.equal(e.body.error.param, param);
    }
    assert.equal((await post(url, "/tokenize", "{")).status, 400);
  }
});
