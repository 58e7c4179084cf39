#!/usr/bin/env bash
# The report of every testdata session, byte for byte, from the gpufl of a git revision (default:
# main) and from this checkout: text (--color never) and --json, on 1 and on 3 threads. Exits 1 at
# the first difference. Builds the revision's gpufl once into target/report-diff/<rev>.
#   bash scripts/report-diff.sh [REV]
set -euo pipefail
cd "$(dirname "$0")/.."
rev=${1:-main}
sha=$(git rev-parse --short "$rev")
base=target/report-diff/$sha
if [ ! -x "$base/gpufl" ]; then
  src=$(mktemp -d)
  git archive "$sha" | tar -x -C "$src"
  CARGO_TARGET_DIR="$PWD/target/report-diff/build" cargo build --release -q -p gpufl-cli \
    --manifest-path "$src/Cargo.toml"
  mkdir -p "$base"
  cp target/report-diff/build/release/gpufl "$base/gpufl"
  rm -rf "$src"
fi
cargo build --release -q -p gpufl-cli
new=target/release/gpufl
n=0
for dir in testdata/sessions/*/; do
  for args in "--color never" "--json"; do
    # shellcheck disable=SC2086
    want=$("$base/gpufl" report $args "$dir" 2>&1; echo "rc $?")
    for t in 1 3; do
      # shellcheck disable=SC2086
      got=$(GPUFL_THREADS=$t "$new" report $args "$dir" 2>&1; echo "rc $?")
      if [ "$got" != "$want" ]; then
        echo "DIFFERS: $dir $args, $t thread(s):"
        diff <(echo "$want") <(echo "$got") | head -20
        exit 1
      fi
    done
    n=$((n + 1))
  done
done
echo "identical: $n reports (text and JSON of $((n / 2)) sessions) from $sha and this checkout, on 1 and 3 threads"
