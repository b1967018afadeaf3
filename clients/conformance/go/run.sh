#!/usr/bin/env bash
# Runs the Go conformance runner (main.go here) in GOPATH mode on Debian's Go
# packages, as tools/go-test.sh runs the client's tests: a scratch GOPATH where
# turnwire.dev/go holds links to clients/go's folders plus `conformance` (this
# folder), so the runner may use the client's internal/sidecar package.
# Arguments are case names (default: all). TURNWIRE_BIN: the server command.
set -euo pipefail
cd "$(dirname "$0")/../../.."
repo=$PWD
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
mkdir -p "$scratch/src/turnwire.dev/go"
for entry in "$repo"/clients/go/*/; do
  ln -s "$entry" "$scratch/src/turnwire.dev/go/$(basename "$entry")"
done
ln -s "$repo/clients/conformance/go" "$scratch/src/turnwire.dev/go/conformance"
export GO111MODULE=off GOFLAGS= GOPATH="$scratch:/usr/share/gocode"
export TURNWIRE_BIN=${TURNWIRE_BIN:-$repo/.venv/bin/turnwire}
export TURNWIRE_CONFORMANCE_DIR=${TURNWIRE_CONFORMANCE_DIR:-$repo/clients/conformance}
unformatted=$(gofmt -l clients/conformance/go)
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted (run gofmt -w on them)" >&2
  exit 1
fi
go vet turnwire.dev/go/conformance
go build -o "$scratch/conformance" turnwire.dev/go/conformance
"$scratch/conformance" "$@"
