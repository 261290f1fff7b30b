#!/usr/bin/env bash
# Memory-safety checks for h3director/native/h3_core.c (not part of the default pytest run):
#   1. the C test driver built with AddressSanitizer + UndefinedBehaviorSanitizer;
#   2. the Python native tests against an ASan+UBSan build of the library (H3_NATIVE_LIB), with
#      libasan/libubsan preloaded into the (uninstrumented) interpreter;
#   3. the C test driver under valgrind memcheck.
# Usage: bash tests/native/sanitize.sh            (from the repository root; needs gcc, valgrind)
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-.venv/bin/python}
CC=${CC:-gcc}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
SRC=h3director/native/h3_core.c
DRIVER=tests/native/test_h3_core.c
COMMON=(-std=c11 -ffp-contract=off -g -pthread)

echo "== 1. C driver, ASan + UBSan"
"$CC" "${COMMON[@]}" -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all \
    -o "$WORK/test_asan" "$DRIVER" "$SRC" -lm
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 "$WORK/test_asan"

echo "== 2. Python native tests, ASan + UBSan library"
"$PY" -m h3director.native.build --sanitize --output "$WORK/_h3_core_asan.so" >/dev/null
PRELOAD="$("$CC" -print-file-name=libasan.so):$("$CC" -print-file-name=libubsan.so)"
# detect_leaks=0: the interpreter itself is not instrumented and keeps objects alive at exit.
env LD_PRELOAD="$PRELOAD" ASAN_OPTIONS=detect_leaks=0:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 H3_NATIVE=c H3_NATIVE_LIB="$WORK/_h3_core_asan.so" \
    "$PY" -m pytest -q -p no:cacheprovider tests/test_native_dequant.py tests/test_native_pack.py \
    tests/test_native_arena.py -k "not numpy"

echo "== 3. C driver, valgrind memcheck"
"$CC" "${COMMON[@]}" -O2 -o "$WORK/test_plain" "$DRIVER" "$SRC" -lm
valgrind --quiet --error-exitcode=1 --leak-check=full --errors-for-leak-kinds=definite,indirect "$WORK/test_plain"
echo "sanitizers and valgrind: clean"
