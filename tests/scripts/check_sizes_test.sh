#!/usr/bin/env bash
# scripts/check-sizes on files it is given: a file of 1,001 lines fails, a
# function of 151 lines fails (naming it), one of 150 lines and a file of
# 1,000 lines pass, and an allow-list entry lets the long function through.
# Usage: check_sizes_test.sh SOURCE_DIR
set -euo pipefail
check=$1/scripts/check-sizes
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# function_of N NAME: a C++ function whose body spans N lines in all.
function_of() {
  echo "int $2() {"
  for ((i = 0; i < $1 - 3; i++)); do echo "  int x$i = $i;"; done
  echo "  return 0;"
  echo "}"
}
: > "$tmp/empty-allowlist"
run() { "$check" --allowlist "$tmp/empty-allowlist" "$@"; }

seq 1000 | sed 's|^|// line |' > "$tmp/ok_file.cc"
run "$tmp/ok_file.cc" > "$tmp/out" || fail "a 1,000-line file was refused: $(cat "$tmp/out")"
seq 1001 | sed 's|^|// line |' > "$tmp/big_file.cc"
rc=0; run "$tmp/big_file.cc" > "$tmp/out" || rc=$?
[ "$rc" = 1 ] || fail "a 1,001-line file: exit $rc, not 1"
grep -q "big_file.cc: 1001 lines (limit 1000" "$tmp/out" || fail "no line for the file: $(cat "$tmp/out")"

function_of 150 Fits > "$tmp/fits.cc"
run "$tmp/fits.cc" > "$tmp/out" || fail "a 150-line function was refused: $(cat "$tmp/out")"
function_of 151 TooLong > "$tmp/long.cc"
rc=0; run "$tmp/long.cc" > "$tmp/out" || rc=$?
[ "$rc" = 1 ] || fail "a 151-line function: exit $rc, not 1"
grep -q "function TooLong: 151 lines" "$tmp/out" || fail "no line for the function: $(cat "$tmp/out")"

# The allow-list names a function with why; an entry without why is refused.
rel=$(python3 -c 'import os,sys; print(os.path.relpath(sys.argv[1], sys.argv[2]))' "$tmp/long.cc" "$1")
echo "$rel:TooLong  # a test's reason" > "$tmp/allow"
"$check" --allowlist "$tmp/allow" "$tmp/long.cc" > "$tmp/out" || fail "allow-listed: $(cat "$tmp/out")"
echo "$rel:TooLong" > "$tmp/allow"
rc=0; "$check" --allowlist "$tmp/allow" "$tmp/long.cc" > "$tmp/out" 2>&1 || rc=$?
[ "$rc" != 0 ] || fail "an allow-list entry without why was accepted"
echo "check_sizes_test: passed"
