// fakeworker: a stand-in worker speaking the cluster protocol (docs/protocol.md) for the
// gateway's e2e tests, with a deterministic fake "model": the next token is a function of the
// whole context, so a request resumed anywhere from the tokens already streamed continues
// exactly as an undisturbed one would. It registers with the gateway (--gateway HOST:PORT),
// heartbeats every 300 ms, answers PREFILL with HANDOFF (first token, hit_len as cached) and
// DECODE with one TOKENS frame per token every --ms milliseconds, then FINISH length; DRAIN:
// running requests get FINISH moved at the deadline, then DRAIN done and exit.
//   node fakeworker.mjs --gateway H:P --role prefill|decode|mixed --fp HEX --vocab N [--ms 15]
import net from "node:net";

const args = Object.fromEntries(process.argv.slice(2).reduce((a, v, i, all) => (i % 2 ? a : [...a, [v.replace(/^--/, ""), all[i + 1]]]), []));
const ROLE = { prefill: 1, decode: 2, mixed: 3 }[args.role];
const FP = Buffer.from(args.fp, "hex");
const VOCAB = Number(args.vocab);
const MS = Number(args.ms || 15);
const [host, port] = args.gateway.split(":");

export function nextToken(ctx, vocab) {
  let h = 2166136261;
  for (const t of ctx.slice(-4)) h = Math.imul(h ^ t, 16777619) >>> 0;
  h = Math.imul(h ^ ctx.length, 16777619) >>> 0;
  return 3 + (h % (vocab - 3));   // never 0..2 (unk/bos/eos of llama vocabularies)
}

function frame(type, flags, id, payload) {
  const h = Buffer.alloc(24);
  h.writeUInt32LE(0x50434d54, 0); h.writeUInt16LE(1, 4); h.writeUInt16LE(type, 6);
  h.writeUInt32LE(flags, 8); h.writeBigUInt64LE(BigInt(id), 12); h.writeUInt32LE(payload.length, 20);
  return Buffer.concat([h, payload]);
}
const u8 = (v) => Buffer.from([v]);
const u16 = (v) => { const b = Buffer.alloc(2); b.writeUInt16LE(v); return b; };
const u32 = (v) => { const b = Buffer.alloc(4); b.writeUInt32LE(v >>> 0); return b; };
const u64 = (v) => { const b = Buffer.alloc(8); b.writeBigUInt64LE(BigInt(v)); return b; };
const f32 = (v) => { const b = Buffer.alloc(4); b.writeFloatLE(v); return b; };
const str = (s) => Buffer.concat([u16(Buffer.byteLength(s)), Buffer.from(s)]);

const sock = net.connect(Number(port), host);
const send = (b) => { if (!sock.destroyed) sock.write(b); };
const reqs = new Map();   // id -> { ctx, max, timer }
let draining = false;

sock.on("connect", () => {
  send(frame(1, 1, 0, Buffer.concat([u8(ROLE), u8(0), FP, u32(16), u32(1000), u32(256), u32(4096), u32(VOCAB),
    str(`fake-${args.role}-${process.pid}`), str(`fake-${args.role}-${process.pid}`)])));
  setInterval(() => {
    let sum = 0; for (const r of reqs.values()) sum += r.ctx.length;
    send(frame(2, 0, 0, Buffer.concat([u32(reqs.size), u32(0), u64(sum), u64(0), u32(900), u32(1000), u8(draining ? 1 : 0), u64(0), u64(0)])));
  }, 300);
  console.log("registered");
});
sock.on("error", () => process.exit(1));
sock.on("close", () => process.exit(0));

function readParams(b, o) {
  const p = { temp: b.readFloatLE(o) }; o += 4 * 8 + 8;          // temp..penalty_last_n, seed
  p.max = b.readInt32LE(o); o += 4;
  const ns = b[o++]; o += 4 * ns;
  o += 3;                                                          // ignore_eos, logprobs, top_logprobs
  o += 4;                                                          // cache_class
  const sl = b.readUInt16LE(o); o += 2 + sl;
  return [p, o];
}
function readIds(b, o) {
  const n = b.readUInt32LE(o); o += 4;
  const ids = []; for (let i = 0; i < n; i++) ids.push(b.readInt32LE(o + 4 * i));
  return [ids, o + 4 * n];
}
function finish(id, reason, r) {
  clearInterval(r.timer);
  reqs.delete(id);
  send(frame(7, 0, id, Buffer.concat([u8(reason), u32(r.nPrompt), u32(0), u32(r.ctx.length - r.nPrompt), u32(0)])));
}

let buf = Buffer.alloc(0);
sock.on("data", (d) => {
  buf = Buffer.concat([buf, d]);
  while (buf.length >= 24) {
    const len = buf.readUInt32LE(20);
    if (buf.length < 24 + len) break;
    const type = buf.readUInt16LE(6), id = Number(buf.readBigUInt64LE(12)), p = buf.subarray(24, 24 + len);
    buf = buf.subarray(24 + len);
    if (type === 3) {                                              // PREFILL
      let [pr, o] = readParams(p, 0);
      const hit = p.readUInt32LE(o); o += 4;
      const [prompt] = readIds(p, o);
      if (draining) { send(frame(10, 0, id, Buffer.concat([u32(8), str("draining")]))); continue; }
      const first = nextToken(prompt, VOCAB);
      setTimeout(() => send(frame(4, 0, id, Buffer.concat([u32(first), f32(0), u8(0), u32(prompt.length), u32(hit),
        u32(prompt.length - hit), u32(0), u32(0), u32(1000)]))), MS);
    } else if (type === 5) {                                       // DECODE
      let [pr, o] = readParams(p, 0);
      let prompt, gen;
      [prompt, o] = readIds(p, o);
      [gen, o] = readIds(p, o);
      if (draining) { send(frame(10, 0, id, Buffer.concat([u32(8), str("draining")]))); continue; }
      const r = { ctx: [...prompt, ...gen], nPrompt: prompt.length, max: pr.max };
      reqs.set(id, r);
      r.timer = setInterval(() => {
        if (r.ctx.length - r.nPrompt >= r.max) return finish(id, 2, r);
        const t = nextToken(r.ctx, VOCAB);
        r.ctx.push(t);
        send(frame(6, 0, id, Buffer.concat([u32(1), u32(t)])));
      }, MS);
    } else if (type === 8) {                                       // CANCEL
      const r = reqs.get(id);
      if (r) finish(id, 3, r);
    } else if (type === 9) {                                       // DRAIN
      draining = true;
      const deadline = p.readUInt32LE(1);
      send(frame(9, 0, 0, Buffer.concat([u8(0), u32(deadline)])));
      setTimeout(() => {
        for (const [rid, r] of reqs) finish(rid, 5, r);
        send(frame(9, 0, 0, Buffer.concat([u8(1), u32(0)])));
        setTimeout(() => process.exit(0), 100);
      }, deadline);
    }
  }
});
