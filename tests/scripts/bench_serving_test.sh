#!/usr/bin/env bash
# scripts/bench-serving --quick, twice round each point, on stories260K:
# the five configurations' clusters (the two SLO ones once per workload,
# with the SLOs in their config) start with their workers pinned, every
# point's `tandem bench` run completes all its requests (the script fails
# otherwise), each result has per-request placements and predicted TTFTs,
# and the generated block has both workloads' tables, the SLO table, a
# verdict per rate and the three targets. A second, one-round run of two
# configurations (--configs) keeps the text around the markers; a bad
# --configs and a cluster that cannot start (no model file) fail the
# script, naming why. A third run is the shifting study's smoke test
# (issue #35): conditional and adaptive (planner slo) on the quick
# shifting trace: its table, the role-flip column and both new targets'
# verdicts. No timing is asserted.
# Usage: bench_serving_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
doc=$tmp/serving.md
python3 "$src/scripts/bench-serving" --quick --rounds 2 --build "$build" \
  --configs colocated,disaggregated,conditional,colocated-tpot,conditional-slo \
  --workloads prefill-heavy,decode-heavy \
  --results "$tmp/results" --doc "$doc" 2> "$tmp/stderr" || {
  cat "$tmp/stderr" >&2; echo "FAIL: scripts/bench-serving exited $?" >&2; exit 1; }
fail() { echo "FAIL: $1" >&2; cat "$doc" >&2; exit 1; }
grep -q '^<!-- bench-serving:begin' "$doc" || fail "no begin marker"
grep -q '^<!-- bench-serving:end -->' "$doc" || fail "no end marker"
for w in prefill-heavy decode-heavy; do
  grep -q "^### $w\$" "$doc" || fail "no $w table"
  for c in colocated disaggregated conditional colocated-tpot conditional-slo; do
    n=$(grep -c "^| [0-9.]* | $c | " "$doc" || true)
    [ "$n" -ge 4 ] || fail "$c: $n table rows, expected 2 rates x 2 workloads"
  done
done
# 5 configs x 2 workloads x 2 rates x 2 rounds results + 2 unloaded runs.
n=$(ls "$tmp/results" | wc -l)
[ "$n" -eq 42 ] || fail "$n result files, expected 42"
# Every result completed all 8 requests and has a placement entry and a
# predicted TTFT entry (a number or null) per request.
for f in "$tmp/results"/*-round*.json; do
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(0 if r["completed"]==8 and r["failed"]==0 and len(r["placements"])==8 and len(r["predicted_ttfts"])==8 else 1)' "$f" \
    || fail "$f: not 8 completed, or placements / predicted_ttfts missing"
done
grep -q '^### Targets (issue #34)$' "$doc" || fail "no targets section"
for t in a b c; do
  grep -q "^($t): \*\*" "$doc" || fail "no verdict of target ($t)"
done
grep -q 'conditional-slo run with the workload' "$doc" || fail "SLO wiring not stated"
# A second run keeps what is outside the markers.
printf 'intro\n' > "$tmp/keep.md"; cat "$doc" >> "$tmp/keep.md"; printf '\n## Why\nkept\n' >> "$tmp/keep.md"
python3 "$src/scripts/bench-serving" --quick --rounds 1 --configs colocated,disaggregated --build "$build" \
  --results "$tmp/results2" --doc "$tmp/keep.md" 2> "$tmp/stderr2" || { cat "$tmp/stderr2" >&2; exit 1; }
head -1 "$tmp/keep.md" | grep -q '^intro$' || fail "text before the markers lost"
tail -1 "$tmp/keep.md" | grep -q '^kept$' || fail "text after the markers lost"
[ "$(grep -c 'bench-serving:begin' "$tmp/keep.md")" -eq 1 ] || fail "markers doubled"
grep -q 'one round: no noise estimate' "$tmp/keep.md" || fail "one-round verdict"
grep -q '^\*\*(a)\*\* n/a: not run: conditional, conditional-slo\.$' "$tmp/keep.md" || fail "target (a) without its configs"
[ "$(grep -c '^| [0-9.]* | conditional' "$tmp/keep.md")" -eq 0 ] || fail "--configs ran conditional"
# The shifting workload: a trace replayed on conditional and adaptive.
python3 "$src/scripts/bench-serving" --quick --rounds 1 --configs conditional,adaptive \
  --workloads shifting --build "$build" --results "$tmp/results5" --doc "$tmp/shift.md" \
  2> "$tmp/stderr5" || { cat "$tmp/stderr5" >&2; echo "FAIL: shifting run" >&2; exit 1; }
grep -q '^### shifting$' "$tmp/shift.md" || fail "no shifting table"
grep -q '^| adaptive | ' "$tmp/shift.md" || fail "no adaptive row"
grep -q '^| conditional | ' "$tmp/shift.md" || fail "no conditional row"
grep -q '^### Targets (issue #35)$' "$tmp/shift.md" || fail "no issue #35 targets"
ls "$tmp/results5" | grep -q 'adaptive-shifting-round1' || fail "no adaptive shifting result"
# A bad --configs is refused, naming the option.
python3 "$src/scripts/bench-serving" --quick --configs colocated,bogus --build "$build" 2> "$tmp/stderr3" \
  && fail "--configs bogus accepted"
grep -q -- '--configs: expected some of' "$tmp/stderr3" || fail "--configs error: $(cat "$tmp/stderr3")"
# A cluster that does not start fails the script, saying which and why.
TMPDIR=$tmp python3 "$src/scripts/bench-serving" --quick --configs colocated --model "$tmp/missing.gguf" \
  --build "$build" --results "$tmp/results4" 2> "$tmp/stderr4" && fail "a cluster without its model started"
grep -q 'FAILED: colocated: router did not start' "$tmp/stderr4" || fail "no start failure: $(cat "$tmp/stderr4")"
grep -q 'missing.gguf' "$tmp/stderr4" || fail "start failure without the log's reason"
echo "PASS: bench-serving --quick"
