#!/usr/bin/env bash
# The last call of a lent-GPU session (scripts/gpu/stage.sh; docs/gpu.md, "On a GPU"): unpack the
# carried packages and kernel cache, then within BUDGET seconds: make train's cartpole on CUDA,
# a profile of three eager Ant SHAC iterations (scripts/profile_run.py), and the Ant at 4096 and
# 1024 worlds and the cartpole with device=null (scripts/bench_gpu.py). Figures go to $OUT.
set -u
T0=$(date +%s); el() { echo "[$(( $(date +%s) - T0 )) s] $*"; }
S=/tmp/stage; mkdir -p $S /tmp/site; cp .gpu/part* $S/ 2>/dev/null
if [ ! -d /tmp/site/warp ]; then
  cat $(ls $S/part* | sort) | xz -dc -T0 | tar xf - -C /tmp/site || { echo "call.sh: unpacking failed"; ls -la $S; exit 2; }
fi
mkdir -p /tmp/warpcache && tar xzf .gpu/cache.tgz -C /tmp/warpcache
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 WARP_CACHE_PATH=/tmp/warpcache
python3 -c "import warp as wp, newton.examples, hydra; wp.init()" >/dev/null 2>&1 || { echo "call.sh: imports failed"; exit 3; }
el ready
B=${BUDGET:-230}
timeout 30 python3 scripts/bench_gpu.py --out $OUT/a --rows cartpole:0:cuda:0@27 | tail -3
mkdir -p $OUT/prof
timeout 75 python3 scripts/profile_run.py --top 40 --out $OUT/prof -- train +env=ant task=shac device=cuda \
  iterations=3 log_every=1 capture=false checkpoint.every=0 plot_every=null env.horizon=64 hydra.run.dir=/tmp/prof \
  > $OUT/prof/profile.txt 2>&1
el "profile rc $?"; grep -A12 "== device" $OUT/prof/profile.txt | head -14
LEFT=$(( B - ($(date +%s) - T0) ))
[ "$LEFT" -gt 20 ] || { el "no time left for the rows"; exit 0; }
timeout $LEFT python3 scripts/bench_gpu.py --out $OUT/b --deadline $(( LEFT - 3 )) --set ant=env.horizon=64 \
  --rows ant:4096:cuda:30@70 ant:1024:cuda:30@45 cartpole:0:null:0@30 | tail -6
el end
