// sse: reads a server-sent-event stream of JSON data lines (the OpenAI-style streams the
// benchmarks time), so that each benchmark only says what it does with an event.
//
//   onSseJson(res, (json, now) => ...)   res: an http.IncomingMessage; now: performance.now()
//                                         when the chunk holding that event arrived
//   onSseJson(res, fn, () => ...)        and a call when "data: [DONE]" arrives
// Non-JSON lines are skipped.
export function onSseJson(res, fn, onDone) {
  let buf = "";
  res.setEncoding("utf8");
  res.on("data", (d) => {
    buf += d;
    const now = performance.now();
    let k;
    while ((k = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, k);
      buf = buf.slice(k + 2);
      const line = ev.split("\n").find((l) => l.startsWith("data: {"));
      if (line) fn(JSON.parse(line.slice(6)), now);
      else if (onDone && ev.split("\n").includes("data: [DONE]")) onDone(now);
    }
  });
}
