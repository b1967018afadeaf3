#!/usr/bin/env bash
# Regenerates every client's code from protos/ (tools/generate.sh) into a scratch directory and
# fails when it differs from what is committed: the Python code in
# clients/python/src/turnwire_client/v1 and the TypeScript code in clients/node/src/gen always,
# the Go code in clients/go/gen/turnwire/v1 when the Go plugins are installed.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
bash tools/generate.sh "$scratch"
stale() {
  echo "generated $1 code is out of date: run 'make protos' and commit the result" >&2
  exit 1
}
diff -r -x __init__.py -x __pycache__ "$scratch/python" clients/python/src/turnwire_client/v1 || stale Python
echo "generated Python code matches protos/"
diff -r "$scratch/ts" clients/node/src/gen || stale TypeScript
echo "generated TypeScript code matches protos/"
if [ -d "$scratch/go" ]; then
  diff -r "$scratch/go" clients/go/gen/turnwire/v1 || stale Go
  echo "generated Go code matches protos/"
else
  echo "NOT checking the generated Go code (protoc-gen-go, protoc-gen-go-grpc not installed)"
fi
