#!/bin/sh
# Every report committed beside a journal under docs/, regenerated from that journal with the
# tool's own `bisect report` (Markdown and JSON): journal.jsonl -> report.md / report.json,
# NAME.jsonl -> NAME.report.md / NAME.report.json. Run it after a change to the report or to
# the search's priors; tests/test_report_records.py fails until the committed files match.
set -eu
cd "$(dirname "$0")/.."
BISECT=${BISECT:-.venv/bin/bisect}
find docs -name '*.jsonl' | sort | while read -r journal; do
  dir=$(dirname "$journal")
  stem=$(basename "$journal" .jsonl)
  if [ "$stem" = journal ]; then out="$dir/report"; else out="$dir/$stem.report"; fi
  "$BISECT" report --journal "$journal" -o "$out.md"
  "$BISECT" report --journal "$journal" --format json -o "$out.json"
done
