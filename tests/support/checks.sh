# Sourced by the shell tests: check <description> <command...> prints
# "ok: ..." or "FAIL: ..." and counts the failures in $fails; a test ends
# with `exit $((fails > 0))`.
fails=0
check() {
  local what=$1; shift
  if "$@"; then echo "ok: $what"; else echo "FAIL: $what"; fails=$((fails + 1)); fi
}
