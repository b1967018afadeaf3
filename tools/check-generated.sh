#!/usr/bin/env bash
# Regenerates the client code from protos/ into a scratch directory and fails
# when it differs from what is committed: the Python code in
# clients/python/src/turnwire_client/v1, the TypeScript code in clients/node/src/gen.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
bash tools/generate-python.sh "$scratch/v1"
if ! diff -r -x __init__.py -x __pycache__ "$scratch/v1" clients/python/src/turnwire_client/v1; then
  echo "generated Python code is out of date: run 'make protos' and commit the result" >&2
  exit 1
fi
bash tools/generate-ts.sh "$scratch/ts"
if ! diff -r "$scratch/ts" clients/node/src/gen; then
  echo "generated TypeScript code is out of date: run 'make protos' and commit the result" >&2
  exit 1
fi
echo "generated code matches protos/"
