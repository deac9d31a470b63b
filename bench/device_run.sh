#!/usr/bin/env bash
# The accelerator run of issues 38/39 and 49/50, as one call of the device tool (H100 or H200, under
# 9 minutes). The device gets a copy of the tree without .git: pass the commit it measures, which
# every result file records (bench/common.py git_commit):
#   HEADS_JAX_COMMIT=<git rev-parse HEAD here> bash bench/device_run.sh   # analysis_ab, pretrain_ab
#   PARTS=pretrain_ab HEADS_JAX_COMMIT=... bash bench/device_run.sh
# pretrain_ab runs torch's peer (torch.compile) itself, at sequence 128 and 512, in the same call.
# analysis_ab runs, in this order (a part cut by its limit keeps its rows): every statistics path
# on the full-row batch and their checks; the analysis as `heads-jax analyze` runs it (UD EWT test
# and MRPC dev, packed: the bare forward, stacked and kernel side by side, what auto takes); then
# the profiles, the statistics alone and one 8,192-position sequence.
# The machine has jax, flax, optax, orbax, torch and transformers (Python 3.12) but not every
# requirement of heads_jax: the wheels in .whl/ (ml-collections, matplotlib-venn, tensorboardX; fetched
# beforehand with `pip download --no-deps --python-version 3.12 ...`) are installed over it, and
# heads_jax runs from the tree (PYTHONPATH). Outputs go to $OUT (the tool's folder), else bench/results.
set -uo pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-bench/results/device}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export HEADS_JAX_COMMIT=${HEADS_JAX_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
{ echo "commit $HEADS_JAX_COMMIT"
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit,memory.total --format=csv
  python3 -c "import jax, jaxlib, flax, optax, torch, transformers; print('jax', jax.__version__, 'jaxlib', jaxlib.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__); print(jax.devices())"
  date -u; } 2>&1 | tee "$OUT/env.txt"
PARTS=${PARTS:-analysis_ab,pretrain_ab}
LIMITS=${LIMITS:-analysis_ab=170,pretrain_ab=330}
timeout ${TOTAL:-530} python3 bench/accelerator.py --parts "$PARTS" --limits "$LIMITS" --out "$OUT" 2>&1 | tee "$OUT/log.txt"
echo "exit ${PIPESTATUS[0]}"
