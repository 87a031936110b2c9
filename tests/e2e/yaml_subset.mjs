// yaml_subset: reads the YAML that deploy/ is written in, for the tests (no YAML package is
// installed, and the manifests must be read as Kubernetes reads them, not by regexes).
//
// The subset: documents split by `---`; block mappings (`key: value`, `key:` + a nested block
// or a sequence at the key's indent or deeper); block sequences (`- value`, `- key: v` opening
// a mapping, `-` + a nested block); literal block scalars (`|`, `|-`); flow mappings and
// sequences (`{ a: b }`, `["x", 1]`) nested at will; double-quoted (JSON escapes) and
// single-quoted strings; plain scalars typed as Kubernetes types them (plain() below: null,
// booleans, integers incl. octal, floats, else a string); `#` comments. Anything else (anchors, tags, folded
// scalars, multi-line plain scalars, tabs for indentation) throws with the line number, so a
// manifest that leaves the subset fails the test instead of being misread.

function fail(no, why) {
  throw new Error(`yaml line ${no}: ${why}`);
}

// The line without its comment (a # at its start or after a blank, outside quotes).
function stripComment(s) {
  let q = null;
  for (let i = 0; i < s.length; i++) {
    const c = s[i];
    if (q) {
      if (c === "\\" && q === '"') i++;
      else if (c === q) q = null;
    } else if (c === '"' || c === "'") q = c;
    else if (c === "#" && (i === 0 || s[i - 1] === " ")) return s.slice(0, i).trimEnd();
  }
  return s.trimEnd();
}

// Plain scalars resolve as Kubernetes reads them (sigs.k8s.io/yaml: go-yaml's YAML 1.1 rules):
// 0400 is octal (a Secret volume's defaultMode), yes / no / on / off are booleans.
function plain(s, no) {
  if (/^[&*!|>%@`]/.test(s)) fail(no, `unsupported scalar ${s}`);
  if (s === "" || s === "~" || /^(null|Null|NULL)$/.test(s)) return null;
  if (/^(y|Y|yes|Yes|YES|true|True|TRUE|on|On|ON)$/.test(s)) return true;
  if (/^(n|N|no|No|NO|false|False|FALSE|off|Off|OFF)$/.test(s)) return false;
  if (/^[-+]?0[0-7]+$/.test(s)) return parseInt(s, 8);
  if (/^[-+]?0o[0-7]+$/.test(s)) return (s[0] === "-" ? -1 : 1) * parseInt(s.replace(/^[-+]?0o/, ""), 8);
  if (/^[-+]?0x[0-9a-fA-F]+$/.test(s)) return (s[0] === "-" ? -1 : 1) * parseInt(s.replace(/^[-+]?0x/, ""), 16);
  if (/^[-+]?(0|[1-9][0-9_]*)$/.test(s)) return Number(s.replace(/_/g, ""));
  if (/^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$/.test(s)) return Number(s);
  return s;
}

// A flow value (or a plain / quoted scalar) from s at pos; returns [value, next pos].
function flow(s, pos, no, inFlow) {
  const ws = () => {
    while (pos < s.length && s[pos] === " ") pos++;
  };
  ws();
  const c = s[pos];
  if (c === "{" || c === "[") {
    const close = c === "{" ? "}" : "]";
    const out = c === "{" ? {} : [];
    pos++;
    ws();
    if (s[pos] === close) return [out, pos + 1];
    for (;;) {
      if (c === "{") {
        const [k, p1] = flow(s, pos, no, true);
        pos = p1;
        ws();
        if (s[pos] !== ":") fail(no, `expected ':' in a flow mapping at column ${pos + 1}`);
        const [v, p2] = flow(s, pos + 1, no, true);
        out[String(k)] = v;
        pos = p2;
      } else {
        const [v, p2] = flow(s, pos, no, true);
        out.push(v);
        pos = p2;
      }
      ws();
      if (s[pos] === ",") {
        pos++;
        continue;
      }
      if (s[pos] === close) return [out, pos + 1];
      fail(no, `expected ',' or '${close}' at column ${pos + 1}`);
    }
  }
  if (c === '"') {
    let end = pos + 1;
    while (end < s.length && s[end] !== '"') end += s[end] === "\\" ? 2 : 1;
    if (end >= s.length) fail(no, "unterminated string");
    return [JSON.parse(s.slice(pos, end + 1)), end + 1];
  }
  if (c === "'") {
    let end = pos + 1, v = "";
    for (;;) {
      if (end >= s.length) fail(no, "unterminated string");
      if (s[end] === "'" && s[end + 1] === "'") {
        v += "'";
        end += 2;
      } else if (s[end] === "'") break;
      else v += s[end++];
    }
    return [v, end + 1];
  }
  // plain: to the end, or in a flow collection to the next , : } ] (a ':' followed by a blank)
  let end = pos;
  while (end < s.length) {
    const d = s[end];
    if (inFlow && (d === "," || d === "}" || d === "]")) break;
    if (d === ":" && (end + 1 === s.length || s[end + 1] === " " || (inFlow && ",}]".includes(s[end + 1])))) break;
    end++;
  }
  return [plain(s.slice(pos, end).trim(), no), end];
}

function scalarOrFlow(text, no) {
  const [v, end] = flow(text, 0, no, false);
  if (text.slice(end).trim() !== "") fail(no, `unexpected text after a value: ${text.slice(end)}`);
  return v;
}

const KEY = /^("(?:[^"\\]|\\.)*"|'[^']*'|[^\s"'{[\]},#:-][^:#]*?|-[^\s:#][^:#]*?)\s*:(?:\s+(.*))?$/;

class Doc {
  constructor(lines) {
    this.lines = lines; // { no, ind, text } with the comment stripped; raw kept for block scalars
    this.i = 0;
  }
  skip() {
    while (this.i < this.lines.length && this.lines[this.i].text === "") this.i++;
  }
  cur() {
    this.skip();
    return this.lines[this.i];
  }
  block(ind) {
    const l = this.cur();
    if (!l || l.ind < ind) return null;
    return l.text === "-" || l.text.startsWith("- ") ? this.seq(l.ind) : this.map(l.ind);
  }
  value(l, ind, rest) {
    // the value of a key (or item) on line l whose text after ':' is rest; ind its indent
    if (rest === "|" || rest === "|-") return this.literal(ind, rest === "|");
    if (rest !== "") return scalarOrFlow(rest, l.no);
    this.i++;
    const n = this.cur();
    if (!n) return null;
    if (n.ind > ind) return this.block(n.ind);
    if (n.ind === ind && (n.text === "-" || n.text.startsWith("- "))) return this.seq(ind);
    return null;
  }
  literal(ind, keep) {
    const out = [];
    let j = this.i + 1, strip = -1;
    for (; j < this.lines.length; j++) {
      const raw = this.lines[j].raw;
      if (raw.trim() === "") {
        out.push("");
        continue;
      }
      const ri = raw.length - raw.trimStart().length;
      if (ri <= ind) break;
      if (strip < 0) strip = ri;
      if (ri < strip) fail(this.lines[j].no, "a block scalar's line is indented less than its first");
      out.push(raw.slice(strip));
    }
    while (out.length && out[out.length - 1] === "") out.pop();
    this.i = j;
    return out.join("\n") + (keep && out.length ? "\n" : "");
  }
  map(ind) {
    const out = {};
    for (;;) {
      const l = this.cur();
      if (!l || l.ind < ind) return out;
      if (l.ind > ind) fail(l.no, "unexpected indentation");
      if (l.text === "-" || l.text.startsWith("- ")) return out; // a sequence at the parent key's indent
      const m = KEY.exec(l.text);
      if (!m) fail(l.no, `expected 'key: value', got: ${l.text}`);
      const key = /^["']/.test(m[1]) ? scalarOrFlow(m[1], l.no) : m[1];
      if (Object.hasOwn(out, key)) fail(l.no, `duplicate key ${key}`);
      const rest = (m[2] ?? "").trim();
      const before = this.i;
      out[key] = this.value(l, ind, rest);
      if (this.i === before) this.i++;
    }
  }
  seq(ind) {
    const out = [];
    for (;;) {
      const l = this.cur();
      if (!l || l.ind < ind) return out;
      if (l.ind > ind) fail(l.no, "unexpected indentation");
      if (!(l.text === "-" || l.text.startsWith("- "))) return out;
      const after = l.text.slice(1);
      const rest = after.trim();
      const col = ind + 1 + (after.length - after.trimStart().length);
      if (rest === "") {
        this.i++;
        const n = this.cur();
        out.push(n && n.ind > ind ? this.block(n.ind) : null);
      } else if (!/^[{["']/.test(rest) && KEY.test(rest)) {
        // "- key: v": a mapping whose first line shares the dash's
        this.lines[this.i] = { ...l, ind: col, text: rest };
        out.push(this.map(col));
      } else if (rest.startsWith("- ")) {
        this.lines[this.i] = { ...l, ind: col, text: rest };
        out.push(this.seq(col));
      } else {
        out.push(scalarOrFlow(rest, l.no));
        this.i++;
      }
    }
  }
}

// The documents of text, in order (empty documents left out).
export function yamlDocs(text) {
  const docs = [];
  let cur = [];
  const end = () => {
    if (cur.some((l) => l.text !== "")) {
      const d = new Doc(cur);
      const v = d.block(0);
      const left = d.cur();
      if (left) fail(left.no, `unexpected line: ${left.raw.trim()}`);
      docs.push(v);
    }
    cur = [];
  };
  text.split("\n").forEach((raw, k) => {
    const no = k + 1;
    if (/^---\s*$/.test(raw)) return end();
    if (/^\t/.test(raw) || /^ *\t/.test(raw)) fail(no, "tab in indentation");
    const ind = raw.length - raw.trimStart().length;
    cur.push({ no, ind, text: stripComment(raw.trim() === "" ? "" : raw.slice(ind)), raw });
  });
  end();
  return docs;
}
