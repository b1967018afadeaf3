#!/usr/bin/env bash
# Regenerates the client code from protos/ into a scratch directory and fails
# when it differs from what is committed: the Python code in
# clients/python/src/turnwire_client/v1 and the TypeScript code in
# clients/node/src/gen always, the Go code in clients/go/gen/turnwire/v1 when
# the Go plugins are installed.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
bash tools/generate-python.sh "$scratch/v1"
if ! diff -r -x __init__.py -x __pycache__ "$scratch/v1" clients/python/src/turnwire_client/v1; then
  echo "generated Python code is out of date: run 'make protos' and commit the result" >&2
  exit 1
fi
echo "generated Python code matches protos/"
bash tools/generate-ts.sh "$scratch/ts"
if ! diff -r "$scratch/ts" clients/node/src/gen; then
  echo "generated TypeScript code is out of date: run 'make protos' and commit the result" >&2
  exit 1
fi
echo "generated TypeScript code matches protos/"
if command -v protoc-gen-go >/dev/null && command -v protoc-gen-go-grpc >/dev/null; then
  bash tools/generate-go.sh "$scratch/go"
  if ! diff -r "$scratch/go" clients/go/gen/turnwire/v1; then
    echo "generated Go code is out of date: run 'make protos' and commit the result" >&2
    exit 1
  fi
  echo "generated Go code matches protos/"
else
  echo "protoc-gen-go or protoc-gen-go-grpc not installed: NOT checking the generated Go code" \
    "(apt-get install protoc-gen-go protoc-gen-go-grpc)"
fi
