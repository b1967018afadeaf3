#!/usr/bin/env bash
# Generates every client's code from protos/ with one `buf generate` (buf.gen.yaml) into a
# scratch folder, then places it: Python into clients/python/src/turnwire_client/v1, TypeScript
# into clients/node/src/gen, Go into clients/go/gen/turnwire/v1. With DIR, writes to
# DIR/python, DIR/ts and DIR/go instead (tools/check-generated.sh compares those).
#
# Python: protoc names modules after the .proto paths (turnwire/v1/x.proto ->
# turnwire.v1.x_pb2); the client ships them as turnwire_client.v1, so the module references in
# the generated imports are renamed. Only import statements and .pyi type references change:
# the serialized descriptors inside *_pb2.py keep the proto package turnwire.v1. (protoletariat
# does this rewrite generally, but pins protobuf < 6.)
#
# Go: needs protoc-gen-go and protoc-gen-go-grpc on PATH (Debian packages); without them the Go
# plugins are left out of the template, the Go code is not touched, and the script says so.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-}
python_target=${out:+$out/python}
python_target=${python_target:-clients/python/src/turnwire_client/v1}
ts_target=${out:+$out/ts}
ts_target=${ts_target:-clients/node/src/gen}
go_target=${out:+$out/go}
go_target=${go_target:-clients/go/gen/turnwire/v1}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

template=buf.gen.yaml
with_go=1
if ! command -v protoc-gen-go >/dev/null || ! command -v protoc-gen-go-grpc >/dev/null; then
  with_go=0
  # The same template without the two Go plugins, as buf's inline --template JSON.
  template=$(.venv/bin/python -c '
import json, yaml
config = yaml.safe_load(open("buf.gen.yaml"))
config["plugins"] = [p for p in config["plugins"] if p.get("local") not in ("protoc-gen-go", "protoc-gen-go-grpc")]
print(json.dumps(config))')
  echo "protoc-gen-go or protoc-gen-go-grpc not installed: NOT generating the Go code" \
    "(apt-get install protoc-gen-go protoc-gen-go-grpc)"
fi
node_modules/.bin/buf generate --template "$template" -o "$scratch"

gen="$scratch/python/turnwire/v1"
sed -i -E 's/^(from|import) turnwire\.v1\b/\1 turnwire_client.v1/' "$gen"/*.py "$gen"/*.pyi
sed -i -E 's/\bturnwire\.v1\.([a-z_]+_pb2)\b/turnwire_client.v1.\1/g' "$gen"/*.pyi
mkdir -p "$python_target"
find "$python_target" -maxdepth 1 -name '*_pb2*' -delete
cp "$gen"/*_pb2* "$python_target"/

rm -rf "$ts_target"
mkdir -p "$(dirname "$ts_target")"
cp -r "$scratch/ts" "$ts_target"

if [ "$with_go" = 1 ]; then
  mkdir -p "$go_target"
  find "$go_target" -maxdepth 1 -name '*.pb.go' -delete
  cp "$scratch"/go/turnwire/v1/*.pb.go "$go_target"/
fi
