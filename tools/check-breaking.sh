#!/usr/bin/env bash
# buf breaking (FILE rules) of the working tree against the contract on main:
# on a branch, main itself; on main, the previous commit (a clean clone of main
# has nothing newer to compare).
set -euo pipefail
cd "$(dirname "$0")/.."
branch=$(git rev-parse --abbrev-ref HEAD 2>/dev/null || echo "")
if [ "$branch" != "main" ] && git rev-parse --verify -q main >/dev/null; then
  against="main"
elif git rev-parse --verify -q HEAD~1 >/dev/null; then
  against="HEAD~1"
else
  echo "buf breaking: no earlier commit to compare with"; exit 0
fi
if ! git cat-file -e "$against:buf.yaml" 2>/dev/null; then
  echo "buf breaking: $against has no contract yet"; exit 0
fi
node_modules/.bin/buf breaking --against ".git#ref=$against"
echo "buf breaking: no breaking changes against $against"
