#!/usr/bin/env bash
# The main job on the bundled model: generate a short story with stories260K, streaming the
# text, then the speed line. `make run` calls this after building.
set -euo pipefail
cd "$(dirname "$0")/.."
prompt="${PROMPT:-Once upon a time, there was a little girl named Lily.}"
exec build/tokenmill run -m models/stories260K.gguf -p "$prompt" -n "${N:-200}" --temp "${TEMP:-0.8}" --seed "${SEED:-42}"
