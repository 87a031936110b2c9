// metrics: a tokenmill server's unlabelled /metrics lines as { name: number }, for the
// benchmarks that read the server's own figures (time to first token, store counters).
//
//   await serverMetrics(port)   e.g. .tokenmill_time_to_first_token_seconds_sum
import http from "node:http";

export function serverMetrics(port) {
  return new Promise((resolve, reject) => {
    http.get({ port, path: "/metrics" }, (res) => {
      let t = "";
      res.on("data", (d) => (t += d));
      res.on("end", () => {
        const m = {};
        for (const l of t.split("\n")) {
          const x = l.match(/^(tokenmill_\w+) (\S+)$/);
          if (x) m[x[1]] = Number(x[2]);
        }
        resolve(m);
      });
    }).on("error", reject);
  });
}
