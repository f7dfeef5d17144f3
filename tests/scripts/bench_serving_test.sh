#!/usr/bin/env bash
# scripts/bench-serving --quick, twice round each point, on stories260K:
# the three clusters start with their workers pinned, every point's
# `tandem bench` run completes all its requests (the script fails
# otherwise), and the generated block has both workloads' tables, the
# SLO table and a verdict per rate. No timing is asserted.
# Usage: bench_serving_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
doc=$tmp/serving.md
python3 "$src/scripts/bench-serving" --quick --rounds 2 --build "$build" \
  --results "$tmp/results" --doc "$doc" 2> "$tmp/stderr" || {
  cat "$tmp/stderr" >&2; echo "FAIL: scripts/bench-serving exited $?" >&2; exit 1; }
fail() { echo "FAIL: $1" >&2; cat "$doc" >&2; exit 1; }
grep -q '^<!-- bench-serving:begin' "$doc" || fail "no begin marker"
grep -q '^<!-- bench-serving:end -->' "$doc" || fail "no end marker"
for w in prefill-heavy decode-heavy; do
  grep -q "^### $w\$" "$doc" || fail "no $w table"
  for c in colocated disaggregated conditional; do
    n=$(grep -c "^| [0-9.]* | $c | " "$doc" || true)
    [ "$n" -ge 4 ] || fail "$c: $n table rows, expected 2 rates x 2 workloads"
  done
done
# 3 configs x 2 workloads x 2 rates x 2 rounds results + 2 unloaded runs.
n=$(ls "$tmp/results" | wc -l)
[ "$n" -eq 26 ] || fail "$n result files, expected 26"
# Every result completed all 8 requests.
for f in "$tmp/results"/*-round*.json; do
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r["completed"]==8 and r["failed"]==0 else 1)' "$f" \
    || fail "$f: not 8 completed"
done
# A second run keeps what is outside the markers.
printf 'intro\n' > "$tmp/keep.md"; cat "$doc" >> "$tmp/keep.md"; printf '\n## Why\nkept\n' >> "$tmp/keep.md"
python3 "$src/scripts/bench-serving" --quick --rounds 1 --build "$build" \
  --results "$tmp/results2" --doc "$tmp/keep.md" 2> "$tmp/stderr2" || { cat "$tmp/stderr2" >&2; exit 1; }
head -1 "$tmp/keep.md" | grep -q '^intro$' || fail "text before the markers lost"
tail -1 "$tmp/keep.md" | grep -q '^kept$' || fail "text after the markers lost"
[ "$(grep -c 'bench-serving:begin' "$tmp/keep.md")" -eq 1 ] || fail "markers doubled"
grep -q 'one round: no noise estimate' "$tmp/keep.md" || fail "one-round verdict"
echo "PASS: bench-serving --quick"
