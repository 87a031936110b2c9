#!/usr/bin/env bash
# The main job on the bundled model: starts `tokenmill serve` on models/stories260K.gguf (a free
# port), shows a short exchange through each API with curl (OpenAI completions, chat
# completions and responses; Anthropic messages), streaming included, prints a few /metrics
# lines, then stops the server. `make run` calls this after building.
# MODEL=path.gguf serves another model; PROMPT sets the text.
set -euo pipefail
cd "$(dirname "$0")/.."
model="${MODEL:-models/stories260K.gguf}"
prompt="${PROMPT:-Once upon a time, there was a little girl named Lily.}"
log=$(mktemp /tmp/tokenmill-run.XXXXXX)
build/tokenmill serve -m "$model" --port 0 2>"$log" &
pid=$!
trap 'kill $pid 2>/dev/null; wait $pid 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 100); do
  grep -q 'listening on' "$log" && break
  kill -0 $pid 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.1
done
url=$(grep -o 'http://[0-9.:]*' "$log" | head -1)
cat "$log"
q=$(printf '%s' "$prompt" | sed 's/\\/\\\\/g; s/"/\\"/g')

show() {  # $1 = title, $2 = path, $3 = JSON body, $4 = jq-less text extractor (python)
  echo
  echo "== $1: POST $2"
  local out code
  out=$(curl -s -w '\n%{http_code}' "$url$2" -H 'content-type: application/json' -H 'anthropic-version: 2023-06-01' -d "$3")
  code=$(printf '%s' "$out" | tail -1)
  out=$(printf '%s' "$out" | sed '$d')
  if [ "$code" = 404 ]; then echo "(this route is not in this build yet)"; return; fi
  printf '%s' "$out" | python3 -c "$4" 2>/dev/null || printf '%s\n' "$out"
}

show "OpenAI completions" /v1/completions \
  "{\"prompt\":\"$q\",\"max_tokens\":60,\"temperature\":0.8,\"seed\":42}" \
  'import json,sys; r=json.load(sys.stdin); print(r["choices"][0]["text"]); print("usage:", json.dumps(r["usage"]))'
show "OpenAI chat completions" /v1/chat/completions \
  "{\"messages\":[{\"role\":\"user\",\"content\":\"$q\"}],\"max_tokens\":60,\"temperature\":0.8,\"seed\":42}" \
  'import json,sys; r=json.load(sys.stdin); print(r["choices"][0]["message"]["content"]); print("usage:", json.dumps(r["usage"]))'
show "OpenAI responses" /v1/responses \
  "{\"input\":\"$q\",\"max_output_tokens\":60,\"temperature\":0.8}" \
  'import json,sys; r=json.load(sys.stdin); print("".join(c.get("text","") for o in r["output"] for c in o.get("content",[]))); print("usage:", json.dumps(r["usage"]))'
show "Anthropic messages" /v1/messages \
  "{\"model\":\"stories260K\",\"max_tokens\":60,\"messages\":[{\"role\":\"user\",\"content\":\"$q\"}]}" \
  'import json,sys; r=json.load(sys.stdin); print("".join(b.get("text","") for b in r["content"])); print("usage:", json.dumps(r["usage"]))'

echo
echo "== streaming (SSE) from /v1/completions, text as it arrives:"
curl -sN "$url/v1/completions" -d "{\"prompt\":\"$q\",\"max_tokens\":40,\"temperature\":0,\"stream\":true}" |
  python3 -c '
import json, sys
for line in sys.stdin:
    line = line.strip()
    if line.startswith("data: {"):
        print(json.loads(line[6:])["choices"][0]["text"], end="", flush=True)
print()'

echo
echo "== /metrics (excerpt)"
curl -s "$url/metrics" | grep -E '^tokenmill_(requests_total|generated_tokens_total|prompt_tokens_total|kv_blocks_(used|free)|engine_steps_total|time_to_first_token_seconds_(sum|count)) '
