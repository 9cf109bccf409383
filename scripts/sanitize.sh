#!/usr/bin/env bash
# Builds a C extension (by default the C scanner of audit logs, timelines/parsers/_auditscan.c)
# with AddressSanitizer and UndefinedBehaviorSanitizer into OUTDIR, never next to its source:
# ingest must not load it. For the fuzz tests (timelines/tests/test_fuzz_sanitized.py), which run
# their generated inputs through it. Prints the module's path, then the ASan runtime that a
# Python importing it needs in LD_PRELOAD (the interpreter itself is not instrumented). Any
# sanitizer finding aborts the process (-fno-sanitize-recover). Needs gcc or clang with their
# sanitizer runtimes (Debian's gcc brings libasan and libubsan).
#
#   scripts/sanitize.sh OUTDIR [SOURCE.c [MODULE]]
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:?usage: scripts/sanitize.sh OUTDIR [SOURCE.c [MODULE]]}
src=${2:-timelines/parsers/_auditscan.c}
name=${3:-_auditscan}
python=${PYTHON_BIN:-.venv/bin/python}
cc=${CC:-gcc}
suffix=$("$python" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
include=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
runtime=$("$cc" -print-file-name=libasan.so)
if [ ! -e "$runtime" ]; then
  echo "sanitize.sh: $cc has no AddressSanitizer runtime (libasan.so)" >&2
  exit 1
fi
mkdir -p "$out"
"$cc" -O1 -g -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all \
  -shared -fPIC -std=gnu11 -Wall -Wextra -Wno-unused-parameter \
  -I"$include" "$src" -o "$out/$name$suffix"
echo "$out/$name$suffix"
realpath "$runtime"
