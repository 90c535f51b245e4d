#!/usr/bin/env bash
# The prepared GPU run, as each device call runs it (docs/gpu.md, "The prepared run"): stage what this
# call carried (.gpu/callN/, made here by scripts/gpu/carry.py) in a folder that outlives the call on
# the warm machine; then, unless the first argument is "stage", run everything (scripts/gpu/run_all.py,
# which joins the staged parts, installs the staged wheels and writes its results under $OUT).
set -euo pipefail
STAGE=${SPECDEC_STAGE:-/tmp/specdec-stage}
mkdir -p "$STAGE"
for file in .gpu/call*/*; do
  if [ -f "$file" ]; then cp -f "$file" "$STAGE/"; fi
done
echo "staged in $STAGE: $(ls "$STAGE" | tr '\n' ' ')"
if [ "${1:-}" = stage ]; then
  exit 0
fi
export PYTHONUNBUFFERED=1
exec python3 scripts/gpu/run_all.py --stage "$STAGE" --out "${OUT:?OUT is the device call's output folder}" "$@"
