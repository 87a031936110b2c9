// bench/args: the bench scripts' one option parser. A script describes its options in a table
// and gets back an object of their values; --help prints the table, and anything the table
// does not allow (an unknown option, a missing value, a non-number where a number is wanted, a
// value outside an option's choices, a required option left out) is a one-line error and exit
// status 2, before the script starts servers or builds models.
//
//   const o = parseArgs("bench/foo", [
//     { name: "-m", key: "model", arg: "MODEL", help: "the GGUF file", required: true },
//     { name: "--reps", kind: "number", default: 3, help: "runs of each configuration" },
//     { name: "--bin", key: "bins", kind: "list", default: ["build/tokenmill"], help: "builds to compare" },
//     { name: "--no-llama", key: "llama", kind: "flag", value: false, default: true, help: "tokenmill only" },
//   ]);
//
// An entry:
//   name      the option as typed ("--kv-mib", "-m"); alias: other spellings (["-t"])
//   key       the property of the result it sets; by default the name in camelCase ("kvMib")
//   kind      "string" (the default), "number", "list" (comma-separated, empty items
//             dropped; of: "number" makes each a number) or "flag" (no value)
//   default   the property's value when the option is not given (left out when undefined;
//             a flag without one defaults to false)
//   value     (flag) what the flag sets its key to: true unless given
//   sets      (flag) other properties it sets, e.g. --quick: { reps: 1, pp: 128 }; applied in
//             argument order, so an option after it overrides them
//   choices   (string) the values allowed
//   arg       the value's placeholder in --help (N for numbers, A,B for lists, S otherwise)
//   required  an error when the option is not given
//   help      one line for --help
// Options are read in order and a later one wins. A value is the next argument whatever it
// looks like (bench/gap's --args passes serve options through).

const camel = (name) => name.replace(/^-+/, "").replace(/-([a-z0-9])/g, (_, c) => c.toUpperCase());

function fail(prog, msg) {
  process.stderr.write(`${prog}: ${msg} (--help lists the options)\n`);
  process.exit(2);
}

const kindOf = (e) => e.kind ?? "string";
const keyOf = (e) => e.key ?? camel(e.name);

function placeholder(e) {
  const k = kindOf(e);
  if (k === "flag") return "";
  if (e.arg) return e.arg;
  if (e.choices) return e.choices.join("|");
  return k === "number" ? "N" : k === "list" ? (e.of === "number" ? "N,N" : "A,B") : "S";
}

function shown(v) {
  if (Array.isArray(v)) return v.join(",");
  return typeof v === "string" ? (v === "" ? '""' : v) : String(v);
}

// The --help text: one line per option, its placeholder, help and default.
export function argsHelp(prog, table) {
  const rows = table.map((e) => {
    const names = [e.name, ...(e.alias ?? [])].join(", ");
    const ph = placeholder(e);
    let help = e.help ?? "";
    if (e.required) help += " (required)";
    else if (kindOf(e) !== "flag" && e.default != null) help += ` (default ${shown(e.default)})`;
    return [ph ? `${names} ${ph}` : names, help];
  });
  const w = Math.max(...rows.map((r) => r[0].length));
  return `usage: ${prog} [options]\n` + rows.map(([l, h]) => `  ${l.padEnd(w)}  ${h}`).join("\n") + "\n";
}

function number(prog, name, s) {
  const x = typeof s === "string" && s.trim() !== "" ? Number(s) : NaN;
  if (!Number.isFinite(x)) fail(prog, `${name} wants a number, not "${s}"`);
  return x;
}

// Parses argv (by default this process's arguments) by table; see the file comment. Prints
// the help and exits 0 on -h or --help.
export function parseArgs(prog, table, argv = process.argv.slice(2)) {
  const byName = new Map();
  const o = {};
  for (const e of table) {
    for (const n of [e.name, ...(e.alias ?? [])]) byName.set(n, e);
    const d = kindOf(e) === "flag" && e.default === undefined && !e.sets ? false : e.default;
    if (d !== undefined && !(keyOf(e) in o)) o[keyOf(e)] = d;
  }
  const given = new Set();
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i];
    if (a === "-h" || a === "--help") {
      process.stdout.write(argsHelp(prog, table));
      process.exit(0);
    }
    const e = byName.get(a);
    if (!e) fail(prog, `unknown option ${a}`);
    given.add(e);
    const k = kindOf(e);
    if (k === "flag") {
      if (e.sets) Object.assign(o, e.sets);
      else o[keyOf(e)] = e.value ?? true;
      continue;
    }
    if (i + 1 >= argv.length) fail(prog, `${a} needs a value`);
    const v = argv[++i];
    if (k === "number") o[keyOf(e)] = number(prog, a, v);
    else if (k === "list") {
      const items = v.split(",").filter(Boolean);
      o[keyOf(e)] = e.of === "number" ? items.map((x) => number(prog, a, x)) : items;
    } else {
      if (e.choices && !e.choices.includes(v)) fail(prog, `${a} is one of ${e.choices.join(", ")}, not "${v}"`);
      o[keyOf(e)] = v;
    }
  }
  for (const e of table) if (e.required && !given.has(e)) fail(prog, `${e.name} is required`);
  return o;
}
