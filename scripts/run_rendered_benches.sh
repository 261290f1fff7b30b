#!/bin/bash
# Rerun the benches whose results files the documents render (scripts/render_docs.py), with the arguments the
# documents state, one after another, on the committed code (a results file records the commit and refuses to be
# fresh when tracked code had uncommitted changes). Then: python scripts/render_docs.py && python scripts/render_docs.py --check
#
#   bash scripts/run_rendered_benches.sh [NAME ...]     # default: all; NAME = a results file's stem
#   bash scripts/run_rendered_benches.sh $(.venv/bin/python scripts/render_docs.py --stale)   # only what is stale
#
# Each bench writes bench/results/NAME.json. Heavy ones run with the smaller arguments the docs name; run this on
# a quiet machine (the shared 2-core build machine needs about an hour for all of them).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
COMFY_PY=${COMFY_PYTHON:-.comfy/venv/bin/python}        # the vendored ComfyUI's environment (scripts/setup_comfyui.sh)
export PYTHONPATH=$PWD OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
# each entry: the command the documents state (evaluated; $PY and $COMFY_PY as above)
declare -A COMMANDS=(
  [fragmentation]='$PY bench/fragmentation.py --sweep'
  [planner_calibration]='$PY bench/planner_calibration.py'
  [planner_speed]='$PY bench/planner_speed.py'
  [planner_dit_tiers]='$PY bench/planner_dit_tiers.py'
  [decode_exactness]='$PY bench/decode_exactness.py'
  [gguf_quantize]='$PY bench/gguf_quantize.py'
  [native]='$PY bench/native.py --repeats 3'
  [monitor_overhead]='$PY bench/monitor_overhead.py --repeats 3'
  [demo_memory]='$PY bench/demo_memory.py'
  [ffn_row_chunk_exactness]='$PY bench/ffn_row_chunk_exactness.py --rows 1024 2500 9000 --threads 1 2 3 --gemm-cols 0'
  [decode_memory]='$PY bench/decode_memory.py --frames 22 73 141 --plot docs/img/decode_memory.png'
  [gguf_dequant]='$PY bench/gguf_dequant.py'
  [dit_memory]='$PY bench/dit_memory.py --rows 8192 --framework comfy diffusers'
  [planner_external]='$PY bench/planner_external.py'
  [avsync_accuracy]='$PY bench/avsync_accuracy.py'
  [comfy_decode_memory]='COMFYUI_DIR=.comfy/ComfyUI $COMFY_PY bench/comfy_decode_memory.py --frames 22 124 243 362'
  [shared_read_copies]='COMFYUI_DIR=.comfy/ComfyUI $PY bench/shared_read_copies.py'
  [arena_staging]='$PY bench/arena_staging.py'
  [stitch_memory]='$PY bench/stitch_memory.py --segments 4 --frames 120'
  [keyframe_detail]='$PY bench/keyframe_detail.py'
  [upscale_seams]='$COMFY_PY bench/upscale_seams.py'
  [upscale_memory]='$PY bench/upscale_memory.py --frames 24 240 --large-frames 48'
  [farm_overhead]='$PY bench/farm_overhead.py --jobs 6 --rounds 2'
  [resume_checkpoint_cost]='$PY bench/resume_checkpoint_cost.py --repeats 10'
  [upscale_recipe]='$COMFY_PY bench/upscale_recipe.py --frames 2 --tile 1920 512'
  [ledger_overhead]='$PY bench/ledger_overhead.py --prompts 4'
  [dit_quantised_exactness]='$COMFY_PY bench/dit_quantised_exactness.py --rows 300 --in-features 512 --out-features 1024'
  [dit_quantised_vs_kjnodes]='$COMFY_PY bench/dit_quantised_vs_kjnodes.py --kjnodes "${KJNODES_DIR:?set KJNODES_DIR to a ComfyUI-KJNodes checkout}"'
)
ORDER=(fragmentation planner_external planner_speed planner_calibration planner_dit_tiers decode_exactness gguf_quantize
       native monitor_overhead demo_memory ffn_row_chunk_exactness decode_memory gguf_dequant dit_memory avsync_accuracy
       comfy_decode_memory shared_read_copies arena_staging stitch_memory keyframe_detail upscale_seams upscale_memory
       farm_overhead resume_checkpoint_cost upscale_recipe ledger_overhead dit_quantised_exactness
       dit_quantised_vs_kjnodes)
if [ -n "$(git status --porcelain --untracked-files=no -- . ':!bench/results' ':!docs' ':!*.md')" ]; then
  echo "uncommitted changes to tracked code: commit first (results would record a dirty checkout)" >&2
  exit 1
fi
failed=()
for name in "${@:-${ORDER[@]}}"; do
  [ -n "${COMMANDS[$name]:-}" ] || { echo "unknown bench $name (known: ${ORDER[*]})" >&2; exit 2; }
  echo "== $name: ${COMMANDS[$name]}"
  eval "${COMMANDS[$name]}" || failed+=("$name")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed (exit status not 0; a results file may still have been written, with the failure in it): ${failed[*]}" >&2
  exit 1
fi
