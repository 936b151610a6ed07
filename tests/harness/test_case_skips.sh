#!/usr/bin/env bash
# The test mains' exit codes (tests/support/case_skips.hpp): 77 (ctest's
# "Skipped") only when every case that ran was skipped and none failed; a
# skipped case beside a passing one leaves 0, beside a failing one 1.
# Usage: test_case_skips.sh <case_skips_probe binary>
set -uo pipefail
probe=$1
fails=0
expect() {  # expect <rc> <case filter>
  local want=$1 filter=$2
  "$probe" --test-case="$filter" >/dev/null 2>&1
  local rc=$?
  if [ "$rc" -eq "$want" ]; then echo "ok: '$filter' exits $rc"; else echo "FAIL: '$filter' exits $rc, expected $want"; fails=$((fails + 1)); fi
}
expect 77 "probe: skips"
expect 0 "probe: passes"
expect 0 "probe: skips,probe: passes"
expect 1 "probe: fails"
expect 1 "probe: skips,probe: fails"
out=$("$probe" --test-case="probe: skips" 2>&1)
grep -q "^SKIPPED: this probe always skips$" <<<"$out" ||
  { echo "FAIL: the skip prints no SKIPPED line"; fails=$((fails + 1)); }
echo "$((6 - fails)) passed, $fails failed"
[ "$fails" -eq 0 ]
