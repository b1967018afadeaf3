#!/usr/bin/env bash
# Generates the Go code for protos/ into DIR (default: clients/go/gen/turnwire/v1)
# with buf.gen.go.yaml: protoc-gen-go and protoc-gen-go-grpc from PATH (Debian:
# apt-get install protoc-gen-go protoc-gen-go-grpc); go_package comes from buf's
# managed mode there, not from the .proto files.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${1:-clients/go/gen/turnwire/v1}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
node_modules/.bin/buf generate --template buf.gen.go.yaml -o "$scratch"
mkdir -p "$target"
find "$target" -maxdepth 1 -name '*.pb.go' -delete
cp "$scratch"/go/turnwire/v1/*.pb.go "$target"/
