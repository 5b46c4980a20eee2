#!/usr/bin/env bash
# Compile this checkout's plan and diff it against the plan committed on BASE_REF; write the markdown comment.
#
#   PLANCC_SOURCE=data/train.jsonl PLANCC_CONFIG=plancc.toml PLANCC_PLAN_DIR=plans/train \
#     bash examples/ci/plan_diff.sh origin/main
#
# Environment: PLANCC_SOURCE (required), PLANCC_CONFIG (optional settings file), PLANCC_PLAN_DIR (committed plan,
# default plans/train), PLANCC_FAIL_ON (default dataset,metrics-regression; "" reports only), PLANCC_DIFF_OUT
# (default plan-diff.md). Exit code: that of `plancc diff` - 0 ok, 1 a --fail-on check failed, 2 bad input
# (compile errors are written into the markdown too). Runs the same way on a laptop as in CI.
set -uo pipefail

BASE_REF="${1:?usage: plan_diff.sh BASE_REF   (e.g. origin/main)}"
SOURCE="${PLANCC_SOURCE:?set PLANCC_SOURCE to what plancc compile reads}"
CONFIG="${PLANCC_CONFIG:-}"
PLAN_DIR="${PLANCC_PLAN_DIR:-plans/train}"
FAIL_ON="${PLANCC_FAIL_ON-dataset,metrics-regression}"
OUT="${PLANCC_DIFF_OUT:-plan-diff.md}"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

report_error() {  # title, file with the message
  { echo "### plancc plan diff"; echo; echo "❌ $1"; echo; echo '```'; cat "$2"; echo '```'; } > "$OUT"
  cat "$2" >&2
}

config_args=()
[ -n "$CONFIG" ] && config_args=(--config "$CONFIG")
if ! plancc compile "$SOURCE" -o "$work/new" "${config_args[@]}" --quiet 2> "$work/err"; then
  report_error "\`plancc compile $SOURCE\` failed" "$work/err"
  exit 2
fi

if ! git cat-file -e "$BASE_REF:$PLAN_DIR/plan.parquet" 2> /dev/null; then
  { echo "### plancc plan diff"; echo
    echo "ℹ️ \`$BASE_REF\` has no plan committed at \`$PLAN_DIR\`: nothing to compare yet."
    echo "Commit one with \`plancc compile $SOURCE -o $PLAN_DIR\`."; } > "$OUT"
  exit 0
fi
mkdir -p "$work/base"
git archive "$BASE_REF" "$PLAN_DIR" | tar -x -C "$work/base"

fail_args=()
[ -n "$FAIL_ON" ] && fail_args=(--fail-on "$FAIL_ON")
plancc diff "$work/base/$PLAN_DIR" "$work/new" --format markdown "${fail_args[@]}" -o "$OUT" > /dev/null 2> "$work/err"
rc=$?
if [ "$rc" -eq 2 ]; then
  report_error "\`plancc diff\` could not read a plan" "$work/err"
  exit 2
fi

# The plan committed by this change should be what its data and config compile to.
if [ -f "$PLAN_DIR/plan.parquet" ] && ! plancc diff "$PLAN_DIR" "$work/new" --fail-on any > /dev/null 2>&1; then
  printf '\n⚠️ The plan committed at `%s` is not what this branch compiles to: run `plancc compile %s -o %s --overwrite` and commit it.\n' \
    "$PLAN_DIR" "$SOURCE" "$PLAN_DIR" >> "$OUT"
fi
exit "$rc"
