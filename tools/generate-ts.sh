#!/usr/bin/env bash
# Generates the TypeScript code for protos/ into DIR (default: clients/node/src/gen)
# with buf.gen.ts.yaml (protoc-gen-es from node_modules).
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-clients/node/src/gen}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
node_modules/.bin/buf generate --template buf.gen.ts.yaml -o "$scratch"
rm -rf "$target"
mkdir -p "$(dirname "$target")"
cp -r "$scratch/ts" "$target"
