#!/usr/bin/env bash
# CTest readme_pipeline: runs the README's "From conversations to a page to read" block (encode | score
# && report, section "## Report") as written, in a scratch directory that sees the repository's tests/
# and the built binary as build/ds4replay, then checks its outputs.
#   tests/python/readme_pipeline.sh BINARY
set -euo pipefail
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
repo="$(cd "$(dirname "$0")/../.." && pwd)"
work="$(mktemp -d /tmp/ds4r-readme-pipeline.XXXXXX)"
trap 'rm -rf "$work"' EXIT
# The second ```sh block of the README's "## Report" section.
block="$(awk '/^## Report/{s=1;next} s&&/^## /{exit} s' "$repo/README.md" |
  awk '/^```sh/{n++;if(n==2){f=1;next}} f&&/^```/{exit} f')"
[ -n "$block" ] || { echo "readme_pipeline: no pipeline block in README.md's Report section" >&2; exit 1; }
mkdir -p "$work/build"
ln -s "$repo/tests" "$work/tests"
ln -s "$bin" "$work/build/ds4replay"
cd "$work"
echo "$block"
bash -euo pipefail -c "$block"
n_in=$(grep -c . tests/python/data/chats.jsonl)
n_out=$(grep -c '"logprob"' r.jsonl)
[ "$n_in" -eq "$n_out" ] || { echo "readme_pipeline: $n_out results for $n_in inputs" >&2; exit 1; }
grep -q '"token_text"' r.jsonl || { echo "readme_pipeline: no token_text carried through score" >&2; exit 1; }
grep -q 'ds4replay report' r.html || { echo "readme_pipeline: r.html is not a report" >&2; exit 1; }
grep -q 'class="pairbox"' r.html || { echo "readme_pipeline: r.html has no pair comparison" >&2; exit 1; }
grep -q '>capital-edited<' r.html || { echo "readme_pipeline: r.html lacks the ids" >&2; exit 1; }
echo "readme_pipeline: ok ($n_out sequences, $(wc -c <r.html) bytes of HTML)"
