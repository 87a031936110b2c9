// browser: headless Chromium (Debian's `chromium`) driven over the DevTools protocol on a pipe
// (--remote-debugging-pipe: NUL-terminated JSON on fds 3 and 4), so that no npm package and no
// downloaded browser is needed. The flags keep Chromium from reaching for Google's services
// (the machine's network is closed; only 127.0.0.1 is used). One page per browser: open() it,
// then send() protocol commands to it; events() are every event the page sent so far.
import { spawn } from "node:child_process";
import fs from "node:fs";
import os from "node:os";
import path from "node:path";

export const chromiumPath = process.env.TM_CHROMIUM || "/usr/bin/chromium";
export const haveChromium = fs.existsSync(chromiumPath);

export async function launch({ width = 1000, height = 1400 } = {}) {
  const userDir = fs.mkdtempSync(path.join(os.tmpdir(), "tm-chromium-"));
  const proc = spawn(chromiumPath, [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-default-apps", "--disable-extensions", "--mute-audio", `--user-data-dir=${userDir}`,
    `--window-size=${width},${height}`, "--remote-debugging-pipe", "about:blank",
  ], { stdio: ["ignore", "ignore", "ignore", "pipe", "pipe"] });
  const toChrome = proc.stdio[3], fromChrome = proc.stdio[4];
  let nextId = 1, buf = "";
  const waiting = new Map(), events = [], listeners = [];
  fromChrome.on("data", (d) => {
    buf += d.toString("utf8");
    let i;
    while ((i = buf.indexOf("\0")) >= 0) {
      const msg = JSON.parse(buf.slice(0, i));
      buf = buf.slice(i + 1);
      if (msg.id && waiting.has(msg.id)) {
        const { resolve, reject } = waiting.get(msg.id);
        waiting.delete(msg.id);
        if (msg.error) reject(new Error(`${msg.error.message} (${msg.error.code})`));
        else resolve(msg.result);
      } else if (msg.method) {
        events.push(msg);
        for (const l of listeners.splice(0)) l();
      }
    }
  });
  const call = (method, params = {}, sessionId) => new Promise((resolve, reject) => {
    const id = nextId++;
    waiting.set(id, { resolve, reject });
    toChrome.write(JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) }) + "\0");
  });
  let session = null;
  return {
    async open() {
      const { targetId } = await call("Target.createTarget", { url: "about:blank" });
      ({ sessionId: session } = await call("Target.attachToTarget", { targetId, flatten: true }));
      await call("Page.enable", {}, session);
      await call("Network.enable", {}, session);
      await call("Runtime.enable", {}, session);
    },
    send: (method, params) => call(method, params, session),
    events: () => events.filter((e) => e.sessionId === session),
    // Resolves when an event of this method arrives after the call (bounded by count of events).
    async waitFor(method, from = 0, timeoutMs = 60000) {
      const t0 = Date.now();
      for (;;) {
        const hit = events.slice(from).find((e) => e.method === method && e.sessionId === session);
        if (hit) return hit;
        if (Date.now() - t0 > timeoutMs) throw new Error(`no ${method} within ${timeoutMs} ms`);
        await new Promise((r) => { listeners.push(r); setTimeout(r, 500); });
      }
    },
    eventCount: () => events.length,
    // Browser.close lets Chromium end its helper processes (they write into userDir until
    // then); SIGKILL if it does not exit in time.
    async close() {
      const exited = new Promise((r) => (proc.exitCode !== null || proc.signalCode !== null ? r() : proc.on("exit", r)));
      const t = setTimeout(() => proc.kill("SIGKILL"), 10000);
      call("Browser.close").catch(() => {});
      await exited;
      clearTimeout(t);
      fs.rmSync(userDir, { recursive: true, force: true, maxRetries: 10, retryDelay: 200 });
    },
  };
}
