#!/usr/bin/env bash
# Every prepared GPU check in one run, for a task that is lent a GPU (one large card; the whole run stays under
# 10 minutes: each check has its own time limit, and one that runs out is recorded and the rest still run).
#
#   bash bench/gpu/run_all.sh [--smoke] [--list] [--only NAME[,NAME...]] [OUT_DIR]
#
# OUT_DIR: where each check writes its JSON and log (default $OUT, else bench/results/gpu). run_all.json there
# lists every check with its exit status, seconds and files. --smoke runs each check's CPU plumbing mode instead
# (no GPU numbers; what the tests run). --list prints the checks and exits.
#
# Python: python3 (on the lent machine, the one with CUDA PyTorch). Packages that machine lacks travel as wheels
# in .whl/ (made here by scripts/gpu_wheels.sh; the device tool's `carry` names .whl) and are installed into
# /tmp/h3site first. dit_12gb needs ComfyUI's source tree ($COMFYUI_DIR, else .comfy/ComfyUI) and its packages
# (comfy-kitchen, comfy-aimdo): too large to carry with the rest (see scripts/gpu_wheels.sh). dit_quantised_kjnodes
# also runs KJNodes' H3 nodes when a ComfyUI-KJNodes checkout is at .kjnodes/ (carry it) or $KJNODES_DIR.
set -uo pipefail
cd "$(dirname "$0")/../.."

SMOKE=0
LIST=0
ONLY=""
OUT_DIR=""
while [ $# -gt 0 ]; do
    case "$1" in
        --smoke) SMOKE=1 ;;
        --list) LIST=1 ;;
        --only) shift; ONLY=",${1:-},"; ;;
        -*) echo "run_all.sh: unknown option $1" >&2; exit 2 ;;
        *) OUT_DIR=$1 ;;
    esac
    shift
done
OUT_DIR=${OUT_DIR:-${OUT:-bench/results/gpu}}
PY=${PYTHON:-python3}

# name | seconds allowed | its CPU plumbing flag for --smoke ("" = GPU only) | command (--out FILE is appended
# where the command is a script). The limits add up to 590 s.
CHECKS=(
    "verify_kernels|80||-m h3director verify-kernels --device cuda --json --no-cache"
    "doctor_driver|15||bench/gpu/doctor_driver.py"
    "decode_pool|60|--smoke|bench/gpu/decode_pool.py"
    "gguf_dequant_cuda|45|--smoke|bench/gpu/gguf_dequant_cuda.py"
    "block_swap_overlap|45|--dry-run|bench/gpu/block_swap_overlap.py"
    "upscale_recipe|45|--smoke|bench/gpu/upscale_recipe.py"
    "resume_checkpoint_cost|90|--smoke|bench/gpu/resume_checkpoint_cost.py"
    "ledger_cuda|30|--smoke|bench/gpu/ledger_cuda.py"
    "dit_12gb|120|--smoke|bench/gpu/dit_12gb.py"
    "dit_quantised_kjnodes|60|--smoke|bench/gpu/dit_quantised_kjnodes.py"
)

if [ "$LIST" = 1 ]; then
    for check in "${CHECKS[@]}"; do echo "${check%%|*}"; done
    exit 0
fi

mkdir -p "$OUT_DIR"
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/h3site .whl/*.whl \
        || { echo "run_all.sh: installing .whl/ failed" >&2; exit 2; }
    export PYTHONPATH="$PWD:/tmp/h3site${PYTHONPATH:+:$PYTHONPATH}"
else
    export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
if [ -z "${COMFYUI_DIR:-}" ] && [ -f .comfy/ComfyUI/main.py ]; then
    export COMFYUI_DIR="$PWD/.comfy/ComfyUI"
fi
export PYTHONUNBUFFERED=1

summary="$OUT_DIR/run_all.json"
echo "{\"smoke\": $([ "$SMOKE" = 1 ] && echo true || echo false), \"checks\": [" > "$summary.tmp"
first=1
failed=0
for check in "${CHECKS[@]}"; do
    IFS='|' read -r name limit smoke_flag command <<< "$check"
    if [ -n "$ONLY" ] && [[ "$ONLY" != *",$name,"* ]]; then
        continue
    fi
    json="$OUT_DIR/$name.json"
    log="$OUT_DIR/$name.log"
    script=${command%% *}
    args=()
    if [ "$SMOKE" = 1 ] && [ -z "$smoke_flag" ]; then   # GPU work with no CPU plumbing mode
        echo "$name: not run in --smoke (it has no CPU mode; its CPU parts are tested elsewhere)"
        continue
    elif [ "$script" = "-m" ]; then                     # the CLI: JSON on stdout
        # shellcheck disable=SC2086
        start=$(date +%s%N); timeout "$limit" "$PY" $command > "$json" 2> "$log"; status=$?
    elif [ ! -f "$script" ]; then
        echo "run_all.sh: $name: $script is missing" > "$log"; status=127; start=$(date +%s%N)
    else
        [ "$SMOKE" = 1 ] && args+=("$smoke_flag")
        # shellcheck disable=SC2086
        start=$(date +%s%N); timeout "$limit" "$PY" $command --out "$json" "${args[@]}" > "$log" 2>&1; status=$?
    fi
    millis=$(( ($(date +%s%N) - start) / 1000000 ))
    seconds=$(printf '%d.%03d' $((millis / 1000)) $((millis % 1000)))
    echo "$name: exit $status in ${seconds}s ($log)"
    [ "$status" = 0 ] || failed=$((failed + 1))
    [ "$first" = 1 ] || echo "," >> "$summary.tmp"
    first=0
    printf '  {"name": "%s", "exit": %d, "seconds": %s, "limit_s": %d, "json": "%s", "log": "%s"}' \
        "$name" "$status" "$seconds" "$limit" "$json" "$log" >> "$summary.tmp"
done
echo "], \"failed\": $failed}" >> "$summary.tmp"
mv "$summary.tmp" "$summary"
echo "wrote $summary ($failed failed)"
[ "$failed" = 0 ]
