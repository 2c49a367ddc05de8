#!/usr/bin/env bash
# Stage one lent-GPU session (docs/gpu.md, "On a GPU"), from the project's root with .venv built:
#   .gpu/part0, .gpu/part1, ...  the installed warp, newton (with the two test modules
#                                newton.examples imports), hydra, omegaconf and antlr4, as one
#                                xz tar cut into parts that each fit one device call with the tree
#   .gpu/cache.tgz               the CUDA kernels of the cartpole, the swing-up and the Ant for
#                                sm_$ARCH, compiled here by `python -m harness compile` (no GPU needed)
#   .gpu/call.sh                 scripts/gpu/call.sh
# Then, back to back (a lent machine stays warm about 30 s after a call):
#   carry [".gpu/part0"]: mkdir -p /tmp/stage && cp .gpu/part0 /tmp/stage/
#   ...one such call per further part but the last...
#   carry [".gpu/partN", ".gpu/cache.tgz", ".gpu/call.sh"]: BUDGET=S bash .gpu/call.sh
set -euo pipefail
ARCH=${ARCH:-90}; PARTMB=${PARTMB:-56}
SP=$(echo .venv/lib/python3*/site-packages)
[ -d "$SP/warp" ] || { echo "stage: no .venv with warp here (run make train first)"; exit 2; }
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu
meta=$(cd "$SP" && ls -d warp_lang-*.dist-info newton-*.dist-info hydra_core-*.dist-info omegaconf-*.dist-info \
  antlr4_python3_runtime-*.dist-info hydra_joblib_launcher-*.dist-info)
files=$(mktemp)
(cd "$SP" && find warp newton hydra hydra_plugins omegaconf antlr4 $meta -type f -not -path '*/__pycache__/*' \
  -not -path 'warp/tests/*' -not -path 'warp/examples/*' \
  \( -not -path 'newton/tests/*' -o -path newton/tests/__init__.py -o -path newton/tests/unittest_utils.py \)) > "$files"
tar cf - -C "$SP" -T "$files" | xz -6 -T2 | (cd .gpu && split -b "${PARTMB}000000" -d -a 1 - part)
rm -f "$files"
cache=$(mktemp -d)
for run in "+env=cartpole" "+env=cartpole_swingup task=shac" "+env=ant task=shac"; do
  WARP_CACHE_PATH=$cache .venv/bin/python -m harness compile $run device=cuda arch="$ARCH" | tail -1
done
# the CUDA modules only: a CPU module's machine code is this CPU's
(cd "$cache" && find . -name '*.cubin' -o -name '*.ptx' | xargs -n1 dirname | sort -u | tar czf "$OLDPWD/.gpu/cache.tgz" -T -)
rm -rf "$cache"
cp scripts/gpu/call.sh .gpu/call.sh
ls -la .gpu
