#!/usr/bin/env bash
# Regenerates the synchronous Python client from the async one (tools/generate_sync_client.py)
# into a scratch directory and fails when it differs from the committed
# clients/python/src/turnwire_client/_sync_client.py.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-.venv/bin/python}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
"$python" tools/generate_sync_client.py "$scratch"
if ! diff -u clients/python/src/turnwire_client/_sync_client.py "$scratch/_sync_client.py"; then
  echo "the generated sync client is out of date: run 'make sync-client' and commit the result" >&2
  exit 1
fi
echo "generated sync client matches clients/python/src/turnwire_client/client.py"
