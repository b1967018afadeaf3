#!/usr/bin/env bash
# Regenerates the Python code from protos/ into a scratch directory and fails
# when it differs from what is committed in clients/python/src/turnwire_client/v1.
set -euo pipefail
cd "$(dirname "$0")/.."
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
bash tools/generate-python.sh "$scratch/v1"
if ! diff -r -x __init__.py -x __pycache__ "$scratch/v1" clients/python/src/turnwire_client/v1; then
  echo "generated code is out of date: run 'make protos' and commit the result" >&2
  exit 1
fi
echo "generated code matches protos/"
