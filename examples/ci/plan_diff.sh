#!/usr/bin/env bash
# Compile this checkout's plan and diff it against the plan committed on BASE_REF; write the markdown comment.
#
#   PLANCC_SOURCE=data/train.jsonl PLANCC_CONFIG=plancc.toml PLANCC_PLAN_DIR=plans/train \
#     bash examples/ci/plan_diff.sh origin/main
#
# Environment: PLANCC_SOURCE (what `plancc compile` reads; leave it empty when PLANCC_CONFIG lists `datasets`),
# PLANCC_CONFIG (optional settings file), PLANCC_PLAN_DIR (the committed plan, default plans/train; commit it
# without its tokens/, which the diff does not read), PLANCC_FAIL_ON (default dataset,masks,metrics-regression;
# "" reports only), PLANCC_DIFF_OUT (default plan-diff.md). Exit code: that of `plancc diff` - 0 ok, 1 a
# --fail-on check failed, 2 bad input (a compile error is written into the markdown too). Runs the same way on a
# laptop as in CI.
set -uo pipefail

BASE_REF="${1:?usage: plan_diff.sh BASE_REF   (e.g. origin/main)}"
SOURCE="${PLANCC_SOURCE-}"
CONFIG="${PLANCC_CONFIG:-}"
PLAN_DIR="${PLANCC_PLAN_DIR:-plans/train}"
FAIL_ON="${PLANCC_FAIL_ON-dataset,masks,metrics-regression}"
OUT="${PLANCC_DIFF_OUT:-plan-diff.md}"
if [ -z "$SOURCE" ] && [ -z "$CONFIG" ]; then
  echo "plan_diff.sh: set PLANCC_SOURCE (what plancc compile reads) or PLANCC_CONFIG (a config listing datasets)" >&2
  exit 2
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

report_error() {  # title, file with the message
  { echo "### plancc plan diff"; echo; echo "❌ $1"; echo; echo '```'; cat "$2"; echo '```'; } > "$OUT"
  cat "$2" >&2
}

compile_args=()
[ -n "$SOURCE" ] && compile_args+=("$SOURCE")
[ -n "$CONFIG" ] && compile_args+=(--config "$CONFIG")
# the exact command that writes the plan this branch should commit
recompile="plancc compile ${compile_args[*]} -o $PLAN_DIR --overwrite"

if ! plancc compile "${compile_args[@]}" -o "$work/new" --quiet 2> "$work/err"; then
  report_error "\`plancc compile ${compile_args[*]}\` failed" "$work/err"
  exit 2
fi

if ! git cat-file -e "$BASE_REF:$PLAN_DIR/plan.parquet" 2> /dev/null; then
  { echo "### plancc plan diff"; echo
    echo "ℹ️ \`$BASE_REF\` has no plan committed at \`$PLAN_DIR\`: nothing to compare yet."
    echo "Commit one with \`$recompile\` (keep \`$PLAN_DIR/tokens/\` out of git)."; } > "$OUT"
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
  printf '\n⚠️ The plan committed at `%s` is not what this branch compiles to: run `%s` and commit it.\n' \
    "$PLAN_DIR" "$recompile" >> "$OUT"
fi
# Its token store is rebuilt by every compile and read by no diff: it does not belong in git.
if [ -n "$(git ls-files -- "$PLAN_DIR/tokens" | head -n 1)" ]; then
  printf '\nℹ️ `%s/tokens/` is committed: `plancc diff` does not read it. Add it to `.gitignore` and `git rm -r --cached` it.\n' \
    "$PLAN_DIR" >> "$OUT"
fi
exit "$rc"
