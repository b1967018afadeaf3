#!/usr/bin/env bash
# The Go kit's conformance fixture (clients/conformance/kits/SPEC.md): builds
# main.go here in GOPATH mode on Debian's Go packages, as tools/go-test.sh
# builds the client (a scratch GOPATH where turnwire.dev/go links to
# clients/go), then runs it with the arguments given (--port N --journal PATH).
# Build output goes to stderr; exec, so SIGTERM reaches the fixture.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../../../.." && pwd)
scratch=$(mktemp -d)
mkdir -p "$scratch/src/turnwire.dev"
ln -s "$repo/clients/go" "$scratch/src/turnwire.dev/go"
out="${TMPDIR:-/tmp}/turnwire-kit-fixture-go-$(id -u)"
mkdir -p "$out"
# Built beside the last build and renamed over it: a fixture running from an
# earlier build keeps its file.
if ! GO111MODULE=off GOFLAGS= GOPATH="$scratch:/usr/share/gocode" \
    go build -o "$out/fixture.$$" "$here/main.go" >&2; then
  rm -rf "$scratch"
  exit 1
fi
rm -rf "$scratch"
mv -f "$out/fixture.$$" "$out/fixture"
exec "$out/fixture" "$@"
