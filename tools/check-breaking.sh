#!/usr/bin/env bash
# buf breaking (FILE rules, buf.yaml) of the working tree's contract:
#  - against the released contract, protos/released/turnwire-v1.binpb: a buf
#    image committed when a release's contract is published (see
#    protos/released/README.md). Always, on main too: comparing main with its
#    own previous commit says nothing about what clients were promised.
#  - on a branch other than main, also against main, so a branch does not
#    break what main already has (unreleased additions included).
set -euo pipefail
cd "$(dirname "$0")/.."
buf=node_modules/.bin/buf
released=protos/released/turnwire-v1.binpb
if [ ! -f "$released" ]; then
  echo "buf breaking: $released is missing; see protos/released/README.md" >&2
  exit 1
fi
"$buf" breaking --against "$released"
echo "buf breaking: no breaking changes against the released contract ($released)"

branch=$(git rev-parse --abbrev-ref HEAD 2>/dev/null || echo "")
if [ "$branch" != "main" ] && git rev-parse --verify -q main >/dev/null 2>&1 \
  && git cat-file -e "main:buf.yaml" 2>/dev/null; then
  "$buf" breaking --against ".git#ref=main"
  echo "buf breaking: no breaking changes against main"
fi
