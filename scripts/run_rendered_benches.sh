#!/bin/bash
# Rerun the benches whose results files the documents render (scripts/render_docs.py), with the arguments the
# documents state, one after another, on the committed code (a results file records the commit and refuses to be
# fresh when tracked code had uncommitted changes). Then: python scripts/render_docs.py && python scripts/render_docs.py --check
#
#   bash scripts/run_rendered_benches.sh [NAME ...]     # default: all; NAME = a results file's stem
#
# Each bench writes bench/results/NAME.json. Heavy ones run with the smaller arguments the docs name; run this on
# a quiet machine (the shared 2-core build machine needs about an hour for all of them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export PYTHONPATH=$PWD OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
declare -A COMMANDS=(
  [fragmentation]="bench/fragmentation.py --sweep"
  [planner_calibration]="bench/planner_calibration.py"
  [planner_speed]="bench/planner_speed.py"
  [planner_dit_tiers]="bench/planner_dit_tiers.py"
  [decode_exactness]="bench/decode_exactness.py"
  [gguf_quantize]="bench/gguf_quantize.py"
  [native]="bench/native.py --repeats 3"
  [monitor_overhead]="bench/monitor_overhead.py --repeats 3"
  [demo_memory]="bench/demo_memory.py"
  [ffn_row_chunk_exactness]="bench/ffn_row_chunk_exactness.py --rows 1024 2500 9000 --threads 1 2 3 --gemm-cols 0"
  [decode_memory]="bench/decode_memory.py --frames 22 73 141 --plot docs/img/decode_memory.png"
  [gguf_dequant]="bench/gguf_dequant.py"
  [dit_memory]="bench/dit_memory.py --rows 8192 --framework comfy diffusers"
  [planner_external]="bench/planner_external.py"
)
ORDER=(fragmentation planner_external planner_speed planner_calibration planner_dit_tiers decode_exactness gguf_quantize
       native monitor_overhead demo_memory ffn_row_chunk_exactness decode_memory gguf_dequant dit_memory)
if [ -n "$(git status --porcelain --untracked-files=no -- . ':!bench/results' ':!docs' ':!*.md')" ]; then
  echo "uncommitted changes to tracked code: commit first (results would record a dirty checkout)" >&2
  exit 1
fi
failed=()
for name in "${@:-${ORDER[@]}}"; do
  [ -n "${COMMANDS[$name]:-}" ] || { echo "unknown bench $name (known: ${ORDER[*]})" >&2; exit 2; }
  echo "== $name: $PY ${COMMANDS[$name]}"
  # shellcheck disable=SC2086
  $PY ${COMMANDS[$name]} || failed+=("$name")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed (exit status not 0; a results file may still have been written, with the failure in it): ${failed[*]}" >&2
  exit 1
fi
