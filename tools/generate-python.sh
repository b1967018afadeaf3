#!/usr/bin/env bash
# Generates the Python code for protos/ into DIR (default: the client package's
# turnwire_client/v1). protoc names Python modules after the .proto paths
# (turnwire/v1/x.proto -> turnwire.v1.x_pb2); the client ships them as
# turnwire_client.v1, so the module references in the generated imports are
# renamed. Only import statements and .pyi type references change: the
# serialized descriptors inside *_pb2.py keep the proto package turnwire.v1.
# (protoletariat does this rewrite generally, but pins protobuf < 6.)
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-clients/python/src/turnwire_client/v1}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
node_modules/.bin/buf generate -o "$scratch"
gen="$scratch/python/turnwire/v1"
sed -i -E 's/^(from|import) turnwire\.v1\b/\1 turnwire_client.v1/' "$gen"/*.py "$gen"/*.pyi
sed -i -E 's/\bturnwire\.v1\.([a-z_]+_pb2)\b/turnwire_client.v1.\1/g' "$gen"/*.pyi
mkdir -p "$target"
find "$target" -maxdepth 1 -name '*_pb2*' -delete
cp "$gen"/*_pb2* "$target"/
