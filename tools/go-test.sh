#!/usr/bin/env bash
# Builds, vets and tests the Go client (clients/go) in GOPATH mode with
# Debian's Go packages: the Go module proxy is not used, the libraries come
# from /usr/share/gocode (apt-get install golang-go golang-google-grpc-dev
# golang-github-golang-protobuf-1-5-dev golang-google-genproto-dev). The
# client's import path turnwire.dev/go is a link to clients/go in a scratch
# GOPATH. The tests start .venv/bin/turnwire (TURNWIRE_BIN overrides it).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/src/turnwire.dev"
ln -s "$repo/clients/go" "$scratch/src/turnwire.dev/go"
export GO111MODULE=off GOFLAGS= GOPATH="$scratch:/usr/share/gocode"
export TURNWIRE_BIN=${TURNWIRE_BIN:-$repo/.venv/bin/turnwire}
# `go ... ./...` from inside the link: Go does not follow a linked GOPATH
# folder when it expands turnwire.dev/go/... itself.
cd "$scratch/src/turnwire.dev/go"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted (run gofmt -w on them)" >&2
  exit 1
fi
go vet ./...
go test -count=1 "$@" ./...
