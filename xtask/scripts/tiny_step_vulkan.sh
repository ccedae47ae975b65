#!/usr/bin/env bash
# A step of a width-4 ResNet-18 on 8x8 synthetic images at batch 2 on wgpu's Vulkan device, where
# launches dominate (docs/performance.md, "Kernels per step on the portable path"): two kiln
# binaries alternating, each with its own warm kiln cache, ROUNDS rounds of three epochs.
#
#   bash xtask/scripts/tiny_step_vulkan.sh OLD_KILN NEW_KILN
set -u
ROUNDS=${ROUNDS:-2}
OUT=${OUT:-/tmp/kiln-tiny-step}
tiny() {
    local bin=$1 epochs=$2 log=$3
    KILN_CACHE_DIR="$OUT/cache-$(echo "$bin" | tr / _)" "$bin" train --config configs/quickstart.toml \
        --backend vulkan --set model.width=4 --set batch_size=2 --set epochs="$epochs" \
        --set 'data.source={kind="synthetic",train_size=100,val_size=4,image_size=8}' \
        --set "logging.runs_dir=\"$OUT/runs\"" > "$log" 2>&1
}
mkdir -p "$OUT"
for bin in "$@"; do tiny "$bin" 1 "$OUT/warm-up.log"; done
for round in $(seq "$ROUNDS"); do
    for bin in "$@"; do
        tiny "$bin" 3 "$OUT/round.log"
        echo "round $round, $bin: $(grep -h '^epoch' "$OUT/round.log" | grep -o '[0-9.]* s,' | paste -sd ' ' -)"
    done
done
