#!/usr/bin/env bash
# kiln's GPU check, for a machine with NVIDIA GPUs: no Rust toolchain and no internet needed.
# Everything it runs is in this folder (built by `cargo xtask gpu-check --carry-dir <dir>`).
#
#   bash run.sh [--dry-run] [--out DIR] [--steps a,b,...]
#
# Steps, each with a time limit, each logged to DIR/<step>.log, summed up in DIR/summary.md, in
# the order of what they tell: devices, diagnosis (under 3 minutes: missing libraries or
# headers, slow compilation, a hang, or working; the driver, NVRTC and headers used; kernels
# compiled and seconds of a cold and a warm warm-up), train, compare (cuda against flex, and
# vulkan where the machine has a Vulkan driver), trajectories (PyTorch's training runs followed
# step by step on cuda and flex), bench (kiln on cuda and vulkan beside PyTorch
# eager and channels-last+bf16), train (the quickstart on cuda; its loss must fall), soak (eight
# epochs; device memory must stay flat), devices-all (data parallel on every GPU), plan (kiln
# plan's estimate against the measured peak at two batch sizes), max-memory (batch_size "auto"
# under max_memory; every epoch's peak must stay under it), bf16 and f16 (mixed-precision
# training, and bf16's measured peak); nodes is listed as skipped (blocked upstream).
# --dry-run runs the same steps on this machine's CPU (flex, and a software Vulkan device when
# there is one) at toy sizes, to check the script and the carried binary on a machine without GPU.
# --steps runs only the named steps (for a machine lent for a few minutes: the important first).
# --quick runs, instead, what a 15-minute loan (the machine's start included) has room for, its
# step limits adding up to 9 minutes: four lanes side by side, each with its own kernel cache
# (cubecl compiles on one thread per process): the cuDNN test (KILN_REQUIRE_CUDA: it fails
# rather than skips) and the quickstart cold then warm; the cross-backend comparisons and
# PyTorch's training runs; burn's own CUDA convolution against the CPU, kiln bench's kernels
# compiled and tuned, and a ResNet-50 training step's kernels counted and timed one by one
# (`kiln bench --kernels`: every kernel and every cuDNN and cuBLAS call, with its device time);
# the same kernels for training with kiln's CubeCL batch norm instead of cuDNN's. Then, the GPU
# alone, PyTorch's and kiln's benchmarks on cuda (ResNet-18 CIFAR and ResNet-50 at batch 128,
# train and infer, f32 and bf16, with each training step's host time), and kiln's training
# again with kiln's batch norm. It leaves six files in DIR: summary.md, bench.md, kernels.md,
# kiln.json, torch.json and logs.tar.gz (every log and JSON), so that the results travel back
# whole.
set -uo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
DRY=0
QUICK=0
OUT=""
STEPS=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --quick) QUICK=1 ;;
        --out) OUT="$2"; shift ;;
        --steps) STEPS=",$2,"; shift ;;
        -h|--help) sed -n 2,30p "$0"; exit 0 ;;
        *) echo "run.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
OUT="${OUT:-$HERE/results-$(date +%Y%m%d-%H%M%S)}"
mkdir -p "$OUT/work"
OUT="$(cd "$OUT" && pwd)"
KILN="$OUT/work/kiln"
gzip -dc "$HERE/kiln.gz" > "$KILN" && chmod +x "$KILN" || { echo "cannot unpack $HERE/kiln.gz" >&2; exit 1; }
# One kernel cache (compiled kernels and autotune results) for every step: what one step
# compiled, the next reuses. The diagnosis starts it cold.
export KILN_CACHE_DIR="$OUT/cache"
rm -rf "$KILN_CACHE_DIR"
# cubecl 0.10 caches the PTX it compiles, but the driver turns PTX into machine code again in
# every process (cuModuleLoadData), keeping the result in its own JIT cache, 256 MiB by default:
# an H200's cold quickstart filled it (295 MB in ~/.nv) before the first step ended, so later runs
# compiled again. 4 GiB is the driver's largest.
export CUDA_CACHE_MAXSIZE="${CUDA_CACHE_MAXSIZE:-4294967296}"
PYTHON="${PYTHON:-python3}"
# cubecl compiles CUDA kernels with NVRTC; PyTorch's wheels carry it under site-packages/nvidia.
NV_LIBS="$("$PYTHON" -c 'import glob, site; print(":".join(sorted({d for p in site.getsitepackages() for d in glob.glob(p + "/nvidia/*/lib")})))' 2>/dev/null || true)"
if [ -n "$NV_LIBS" ]; then
    export LD_LIBRARY_PATH="$NV_LIBS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi

if [ "$DRY" = 1 ]; then
    GPU=flex
    COMPARE=(--backends flex,vulkan --reference flex)
    COMPARE_OPTIONAL=()
    COMPARE_18=(--model resnet18 --width 8 --image-size 16 --batch 4 --steps 2)
    COMPARE_50=(--model resnet50 --zero-init-residual --width 4 --image-size 32 --batch 2 --steps 2)
    BENCH_BACKENDS=flex
    TORCH_DEVICE=cpu
    BENCH=(--models resnet18-cifar --batches 8 --warmup 1 --min-steps 1 --min-seconds 0)
    SOAK=(--set epochs=3 --set batch_size=32 --set model.width=8 --set data.source.train_size=256 --set data.source.val_size=64)
    PLAN_BATCHES=(8 32)
    MAX_MEMORY=512MiB
else
    GPU=cuda
    COMPARE=(--backends flex,cuda --reference flex)
    COMPARE_OPTIONAL=(--backends flex,vulkan --reference flex --allow-missing)
    COMPARE_18=(--model resnet18 --width 64 --image-size 32 --batch 16 --steps 3)
    COMPARE_50=(--model resnet50 --zero-init-residual --width 16 --image-size 64 --batch 8 --steps 3)
    BENCH_BACKENDS=cuda,vulkan
    TORCH_DEVICE=cuda
    BENCH=(--warmup 3 --min-steps 5 --min-seconds 2)
    SOAK=()
    PLAN_BATCHES=(128 512)
    MAX_MEMORY=4GiB
fi

FAILED=0
{
    echo "# kiln GPU check $(date -u +%Y-%m-%dT%H:%M:%SZ)$([ "$DRY" = 1 ] && echo ' (dry run)')"
    echo
    echo "| step | result | seconds | log |"
    echo "|---|---|---:|---|"
} > "$OUT/summary.md"

# descendants PID: PID and every process below it.
descendants() {
    echo "$1"
    local child
    for child in $(pgrep -P "$1"); do descendants "$child"; done
}

# kill_tree PID: ends PID and everything it started.
kill_tree() {
    local pids
    pids="$(descendants "$1")"
    kill -TERM $pids 2>/dev/null
    sleep 2
    kill -KILL $pids 2>/dev/null
}

# snapshot PID: what a stalled step's processes are doing. Each thread's state and CPU ticks,
# twice five seconds apart (busy or waiting), and backtraces where a debugger is installed.
snapshot() {
    local pid round task debugger
    for round in 1 2; do
        echo "== threads, round $round ($(date -u +%H:%M:%S)): tid name state user-ticks system-ticks wchan"
        for pid in $(descendants "$1"); do
            echo "-- process $pid: $(tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | cut -c1-200)"
            for task in /proc/"$pid"/task/*; do
                echo "$(basename "$task") $(cut -d' ' -f2,3,14,15 "$task/stat" 2>/dev/null) $(cat "$task/wchan" 2>/dev/null)"
            done
        done
        [ "$round" = 1 ] && sleep 5
    done
    debugger="$(command -v gdb || command -v cuda-gdb)"
    if [ -n "$debugger" ]; then
        for pid in $(descendants "$1"); do
            echo "== backtraces of $pid ($debugger)"
            timeout 60 "$debugger" -p "$pid" -batch -ex "thread apply all bt 20" 2>&1 | grep -v '^\[New LWP' | head -n 600
        done
    fi
}

# wanted NAME: whether --steps (if given) names NAME.
wanted() {
    [ -z "$STEPS" ] || [[ "$STEPS" == *",$1,"* ]]
}

# step NAME SECONDS COMMAND...: runs COMMAND under a time limit and records the outcome.
step() {
    local name="$1" limit="$2"
    shift 2
    wanted "$name" || return 0
    local log="$OUT/$name.log" start=$SECONDS rc
    echo "== $name (up to ${limit}s): $*"
    echo "\$ $*" > "$log"
    (cd "$OUT/work" && exec "$@") >> "$log" 2>&1 &
    local pid=$! waited=0
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$limit" ]; do
        sleep 1
        waited=$((waited + 1))
    done
    if kill -0 "$pid" 2>/dev/null; then
        snapshot "$pid" > "$OUT/$name.stalled.log" 2>&1
        kill_tree "$pid"
        wait "$pid" 2>/dev/null
        rc=124
    else
        wait "$pid"
        rc=$?
    fi
    tail -n 25 "$log" | sed 's/^/   /'
    local result=ok
    if [ $rc = 124 ]; then result="FAILED (over ${limit}s)"; elif [ $rc != 0 ]; then result="FAILED (exit $rc)"; fi
    [ "$result" = ok ] || FAILED=1
    echo "| $name | $result | $((SECONDS - start)) | $name.log |" >> "$OUT/summary.md"
    return $rc
}

# note NAME TEXT: a step that did not run, and why.
note() {
    wanted "$1" || return 0
    echo "== $1: $2"
    echo "| $1 | $2 | 0 | |" >> "$OUT/summary.md"
}

# quick: see --quick above. A lane's steps share its kernel cache and run one after another.
quick() {
    local qs=(--config "$HERE/configs/quickstart.toml" --backend "$GPU")
    local bench=(--models resnet18-cifar,resnet50 --batches 128 --modes train,infer)
    local bench_kiln=("${bench[@]}" --precision f32,bf16)
    # Training with kiln's CubeCL batch norm in place of cuDNN's
    # (KILN_KERNELS=portable-batch-norm): which of the two is faster is measured, not assumed.
    local bench_bn=(--models resnet18-cifar,resnet50 --batches 128 --modes train --precision f32)
    # One ResNet-50 training step's kernels, counted and timed one by one.
    local kernels=(--models resnet50 --batches 32 --modes train --kernels --warmup 1 --min-steps 1 --min-seconds 0)
    local trajectory=(--width 4 --image-size 16 --batch 2 --steps 1 --trajectories "$HERE/trajectory")
    local fast=(--warmup 3 --min-steps 5 --min-seconds 2)
    local CUDNN_TEST="$OUT/work/cudnn-test"
    if [ -f "$HERE/cudnn-test.gz" ]; then
        gzip -dc "$HERE/cudnn-test.gz" > "$CUDNN_TEST" && chmod +x "$CUDNN_TEST"
    fi
    if [ "$DRY" = 1 ]; then
        bench=(--models resnet18-cifar --batches 8 --modes train,infer)
        bench_kiln=("${bench[@]}" --precision f32)
        bench_bn=(--models resnet18-cifar --batches 8 --modes train --precision f32)
        kernels=(--models resnet18-cifar --batches 2 --modes train --kernels --warmup 1 --min-steps 1 --min-seconds 0)
        fast=(--warmup 1 --min-steps 1 --min-seconds 0)
    fi
    (
        export KILN_CACHE_DIR="$OUT/cache-quickstart"
        step devices 20 bash -c "'$KILN' devices --backend $GPU; command -v nvidia-smi >/dev/null && nvidia-smi -L || true"
        # Each cuDNN pass against burn's convolution on the CPU, batch norm against the textbook,
        # cuBLAS's products against burn's; KILN_REQUIRE_CUDA makes a missing GPU, cuDNN or cuBLAS
        # a failure, not a skip. RUST_LOG=warn shows a fallback to burn's kernel ("cuDNN did not
        # run"). The test makes about 130 algorithm searches (11 shapes, 3 passes, f32 with and
        # without TF32, bf16, f16) and prints how many and how long they took.
        [ -x "$CUDNN_TEST" ] && RUST_LOG=warn KILN_REQUIRE_CUDA=$((1 - DRY)) step cudnn 100 "$CUDNN_TEST" --nocapture cudnn_matches cudnn_grouped cublas_matches
        # cuDNN's algorithm choices kept in kiln's cache and read back by the next process.
        [ -x "$CUDNN_TEST" ] && RUST_LOG=warn KILN_REQUIRE_CUDA=$((1 - DRY)) step cudnn-kept 30 "$CUDNN_TEST" --nocapture choices_are_kept
        step quickstart-cold 130 "$KILN" train "${qs[@]}" --set "logging.runs_dir=\"$OUT/work/runs-cold\""
        step quickstart-warm 40 "$KILN" train "${qs[@]}" --set "logging.runs_dir=\"$OUT/work/runs-warm\""
    ) &
    (
        export KILN_CACHE_DIR="$OUT/cache-compare"
        step compare-resnet18 80 "$KILN" compare "${COMPARE[@]}" "${COMPARE_18[@]}" --json "$OUT/compare-resnet18.json"
        step compare-resnet50 90 "$KILN" compare "${COMPARE[@]}" "${COMPARE_50[@]}" --json "$OUT/compare-resnet50.json"
        step trajectories 100 "$KILN" compare "${COMPARE[@]}" "${trajectory[@]}" --json "$OUT/trajectories.json"
    ) &
    (
        export KILN_CACHE_DIR="$OUT/cache-bench"
        # burn's autotuned CUDA convolution (what runs without cuDNN), each pass against the CPU:
        # its gradients were seen 0.34 off on an H200; this names the shape and pass. And its
        # implicit-GEMM weight gradient launched directly (patches/cubek-convolution).
        [ -x "$CUDNN_TEST" ] && step burn-conv 90 "$CUDNN_TEST" --nocapture burns_cuda burns_implicit_gemm
        step bench-compile 150 "$KILN" bench --backends "$GPU" "${bench_kiln[@]}" \
            --warmup 1 --min-steps 1 --min-seconds 0
        step kernels 60 "$KILN" bench --backends "$GPU" "${kernels[@]}" --markdown "$OUT/kernels.md" \
            --json "$OUT/kernels.json"
    ) &
    (
        # The portable path on the GPU's Vulkan driver: the quickstart twice with one cache, the
        # second run's first epoch against its second (the pipeline cache kept in kiln's cache,
        # patches/cubecl-wgpu, is what a warm run no longer builds again).
        export KILN_CACHE_DIR="$OUT/cache-vulkan"
        local vk=(--config "$HERE/configs/quickstart.toml" --backend vulkan --set epochs=2)
        [ "$DRY" = 1 ] && vk+=(--set model.width=4 --set 'data.source={kind="synthetic",train_size=32,val_size=8,image_size=8}')
        step vulkan-cold 200 "$KILN" train "${vk[@]}" --set "logging.runs_dir=\"$OUT/work/runs-vk-cold\""
        step vulkan-warm 80 "$KILN" train "${vk[@]}" --set "logging.runs_dir=\"$OUT/work/runs-vk-warm\""
    ) &
    (
        export KILN_CACHE_DIR="$OUT/cache-bench-portable-bn"
        KILN_KERNELS=portable-batch-norm step bench-compile-portable-bn 180 "$KILN" bench --backends "$GPU" \
            "${bench_bn[@]}" --warmup 1 --min-steps 1 --min-seconds 0
    ) &
    wait
    for round in cold warm; do
        echo "| quickstart $round | $(grep -ho 'the first step took [0-9.]* s' "$OUT/quickstart-$round.log" | head -n1); $(grep -h '^epoch ' "$OUT/quickstart-$round.log" | tail -n1 | cut -c1-140) | 0 | quickstart-$round.log |" >> "$OUT/summary.md"
    done
    # Vulkan: each run's epochs, and the pipeline cache files the cold run left for the warm one.
    for round in cold warm; do
        echo "| vulkan $round | $(grep -h '^epoch ' "$OUT/vulkan-$round.log" | cut -c1-90 | paste -sd ';' -) | 0 | vulkan-$round.log |" >> "$OUT/summary.md"
    done
    echo "| vulkan pipeline cache | $(find "$OUT/cache-vulkan" -path '*pipelines*' -type f -printf '%f %s bytes; ' 2>/dev/null) | 0 | |" >> "$OUT/summary.md"
    # How many algorithm searches the cuDNN test made, and in how long (its limit's basis).
    echo "| cudnn searches | $(grep -ho '[0-9]* cuDNN algorithm searches in [0-9.]* s' "$OUT/cudnn.log" | head -n1) | 0 | cudnn.log |" >> "$OUT/summary.md"
    # A ResNet-50 step's kernels: the launches per step and the five kinds with most device time.
    if [ -f "$OUT/kernels.md" ]; then
        echo "| kernels per step | $(grep -ho 'Kernels per training step.*' "$OUT/kernels.md" | head -n1 | cut -c1-120); by device time: $(awk -F'|' '/^\| [^-k]/ && NF == 5 { printf "%s\t%s\n", $4, $2 }' "$OUT/kernels.md" | sort -rn | head -n5 | awk -F'\t' '{ printf "%s%s %.2f ms", (NR > 1 ? ", " : ""), $2, $1 }') | 0 | kernels.md |" >> "$OUT/summary.md"
    fi
    # The GPU alone from here: timings.
    local reference=()
    if "$PYTHON" -c 'import torch, torchvision' 2>/dev/null; then
        step bench-pytorch 70 "$PYTHON" "$HERE/bench_torch.py" --device "$TORCH_DEVICE" "${bench[@]}" "${fast[@]}" \
            --json "$OUT/torch.json" && reference=(--reference "$OUT/torch.json")
    else
        note bench-pytorch "skipped: $PYTHON cannot import torch and torchvision"
    fi
    (
        export KILN_CACHE_DIR="$OUT/cache-bench"
        step bench-kiln 100 "$KILN" bench --backends "$GPU" "${bench_kiln[@]}" "${fast[@]}" \
            "${reference[@]}" --json "$OUT/kiln.json" --markdown "$OUT/bench.md"
    )
    (
        export KILN_CACHE_DIR="$OUT/cache-bench-portable-bn"
        KILN_KERNELS=portable-batch-norm step bench-portable-bn 60 "$KILN" bench --backends "$GPU" \
            "${bench_bn[@]}" "${fast[@]}" "${reference[@]}" --json "$OUT/kiln-portable-bn.json"
    )
    # What travels back: the tables and one archive of every log and comparison.
    (cd "$OUT" && tar czf logs.tar.gz -- *.log *.json 2>/dev/null && rm -f -- *.log compare-*.json trajectories.json kiln-portable-bn.json kernels.json)
    rm -rf "$OUT/work" "$OUT"/cache-*
}
if [ "$QUICK" = 1 ]; then
    quick
    echo
    cat "$OUT/summary.md"
    [ -f "$OUT/bench.md" ] && { echo; cat "$OUT/bench.md"; }
    ! grep -q FAILED "$OUT/summary.md"
    exit $?
fi

step devices 60 bash -c "'$KILN' devices; '$KILN' devices --backend $GPU; command -v nvidia-smi >/dev/null && nvidia-smi -L || true"

# diagnosis: what is wrong, if anything, in under 3 minutes. kiln warmup compiles and tunes the
# quickstart's kernels twice: cold (an empty cache) and warm (the same cache, which must make it
# fast). cubecl logs each kernel it compiles (RUST_LOG trace of its compiler modules), so the
# counts and, on a hang, the last kernel named say where the time goes.
diagnose() {
    local rc=0 verdict
    if ! "$KILN" devices --backend "$GPU" > "$OUT/diagnosis.devices.log" 2>&1; then
        echo "diagnosis: MISSING LIBRARIES OR HEADERS: $(grep -m1 error "$OUT/diagnosis.devices.log")"
        return 1
    fi
    echo "runtime: $(grep -m1 "^$GPU:0" "$OUT/diagnosis.devices.log")"
    for round in cold warm; do
        local start=$SECONDS
        RUST_LOG="warn,cubecl_cuda::compute::context=trace,cubecl_wgpu::backend=trace" \
            timeout 75 "$KILN" warmup --config "$HERE/configs/quickstart.toml" --backend "$GPU" \
            > "$OUT/diagnosis.$round.log" 2>&1
        rc=$?
        local compiled cached
        compiled=$(grep -cE 'Compiling kernel|compiling WGSL module|Compiling [a-z_]' "$OUT/diagnosis.$round.log")
        cached=$(grep -cE 'Using (PTX|SPIR-V) cache' "$OUT/diagnosis.$round.log")
        echo "$round: exit $rc, $((SECONDS - start)) s, $compiled kernels compiled, $cached from the cache"
        echo "| diagnosis $round | exit $rc: $((SECONDS - start)) s, $compiled kernels compiled, $cached cached | 0 | diagnosis.$round.log |" >> "$OUT/summary.md"
        if [ $rc = 124 ]; then
            # Still compiling (a kernel logged in the last 10 s) or stuck (nothing for longer).
            local quiet=$(( $(date +%s) - $(stat -c %Y "$OUT/diagnosis.$round.log") ))
            if [ "$compiled" -gt 0 ] && [ "$quiet" -le 10 ]; then
                verdict="SLOW COMPILATION: the $round warm-up did not end in 75 s but was still compiling: $compiled kernels, $(awk -v n="$compiled" -v t="$((SECONDS - start))" 'BEGIN { printf "%.2f", t / n }') s each (the first step needs every kernel it and autotuning launch)"
            else
                verdict="A HANG: the $round warm-up did not end in 75 s and logged nothing for its last $quiet s; last kernel logged: $(grep -E 'ompiling' "$OUT/diagnosis.$round.log" | tail -n1 | cut -c1-160)"
            fi
            echo "diagnosis: $verdict"
            return 1
        elif [ $rc != 0 ]; then
            echo "diagnosis: FAILED: $(grep -m1 error "$OUT/diagnosis.$round.log")"
            return 1
        fi
    done
    echo "diagnosis: WORKING"
}
step diagnosis 170 bash -c "$(declare -f diagnose); KILN='$KILN' GPU='$GPU' HERE='$HERE' OUT='$OUT' diagnose"

# train: the quickstart; the training loss of the last epoch must be below the first's.
# A cold first step compiles every kernel it and autotuning launch: on an H200 with cubecl 0.10,
# over 420 kernels at about 0.8 s each (NVRTC, then the driver's JIT, on one thread); the limit
# fits that. Later steps reuse the cache.
step train 600 "$KILN" train --config "$HERE/configs/quickstart.toml" --backend "$GPU" \
    --set "logging.runs_dir=\"$OUT/work/runs\""
if wanted train; then
    METRICS="$(ls -td "$OUT"/work/runs/quickstart-*/ 2>/dev/null | head -n 1)metrics.csv"
    if [ -f "$METRICS" ] && awk -F, 'NR == 2 { first = $4 } NR > 1 { last = $4 } END { exit !(NR > 2 && last < first) }' "$METRICS"; then
        echo "| train loss falls | ok: $(awk -F, 'NR > 1 { printf "%s%.4f", (NR > 2 ? " -> " : ""), $4 }' "$METRICS") | 0 | train.log |" >> "$OUT/summary.md"
    else
        echo "| train loss falls | FAILED (see $METRICS) | 0 | train.log |" >> "$OUT/summary.md"
        FAILED=1
    fi
fi

step compare-resnet18 180 "$KILN" compare "${COMPARE[@]}" "${COMPARE_18[@]}" --json "$OUT/compare-resnet18.json"
step compare-resnet50 180 "$KILN" compare "${COMPARE[@]}" "${COMPARE_50[@]}" --json "$OUT/compare-resnet50.json"
# PyTorch's four 50-step training runs, followed on each backend (the cross-backend part at a
# toy size). The bounds are twice PyTorch's own float32 error on the CPU: TF32 may exceed them.
step trajectories 240 "$KILN" compare "${COMPARE[@]}" --width 4 --image-size 16 --batch 2 --steps 1 \
    --trajectories "$HERE/trajectory" --json "$OUT/trajectories.json"
if [ ${#COMPARE_OPTIONAL[@]} -gt 0 ]; then
    step compare-vulkan 180 "$KILN" compare "${COMPARE_OPTIONAL[@]}" "${COMPARE_18[@]}" --json "$OUT/compare-vulkan.json"
fi

REFERENCE=()
if "$PYTHON" -c 'import torch, torchvision' 2>/dev/null; then
    step bench-pytorch 240 "$PYTHON" "$HERE/bench_torch.py" --device "$TORCH_DEVICE" "${BENCH[@]}" --json "$OUT/torch.json" \
        && REFERENCE=(--reference "$OUT/torch.json")
else
    note bench-pytorch "skipped: $PYTHON cannot import torch and torchvision"
fi
step bench-kiln 300 "$KILN" bench --backends "$BENCH_BACKENDS" "${BENCH[@]}" "${REFERENCE[@]}" \
    --json "$OUT/kiln.json" --markdown "$OUT/bench.md"

# soak: device memory per epoch (kiln's pool, and the driver's view through nvidia-smi).
if wanted soak; then
    if command -v nvidia-smi >/dev/null && [ "$DRY" = 0 ]; then
        nvidia-smi --query-gpu=timestamp,index,memory.used --format=csv,noheader -lms 500 > "$OUT/soak-nvidia-smi.csv" 2>/dev/null &
        SMI=$!
    fi
    step soak 240 "$KILN" train --config "$HERE/configs/soak.toml" --backend "$GPU" "${SOAK[@]}" \
        --set "logging.runs_dir=\"$OUT/work/runs\""
    [ -n "${SMI:-}" ] && kill "$SMI" 2>/dev/null
    SOAK_METRICS="$(ls -td "$OUT"/work/runs/soak-*/ 2>/dev/null | head -n 1)metrics.csv"
    # The first epoch includes kernel compilation and autotuning; from the second on, the peak must
    # not grow by more than 10%.
    if [ -f "$SOAK_METRICS" ] && awk -F, 'NR == 3 { second = $12 } NR > 1 { last = $12 } END { exit !(NR > 3 && second > 0 && last <= second * 1.10) }' "$SOAK_METRICS"; then
        RESULT=ok
    else
        RESULT=FAILED
        FAILED=1
    fi
    echo "| soak memory flat | $RESULT: peak MiB by epoch $(awk -F, 'NR > 1 { printf "%s%.0f", (NR > 2 ? ", " : ""), $12 / 1048576 }' "$SOAK_METRICS" 2>/dev/null) | 0 | soak.log |" >> "$OUT/summary.md"
fi

# devices-all: data parallel over every device (two replicas of the CPU in a dry run); the
# console's epoch line gives images/s in total and per device.
ALL_DEVICES=all
[ "$DRY" = 1 ] && ALL_DEVICES=0,0
step devices-all 300 "$KILN" train --config "$HERE/configs/quickstart.toml" --backend "$GPU" \
    --devices "$ALL_DEVICES" --set "logging.runs_dir=\"$OUT/work/runs-all\""

# plan: kiln plan's estimate beside the peak of three real training steps, at two batch sizes
# (the estimate's constants were measured on the CPU; this is where the GPU's are measured).
for BATCH in "${PLAN_BATCHES[@]}"; do
    step "plan-$BATCH" 180 bash -c "'$KILN' plan --config '$HERE/configs/soak.toml' --backend $GPU ${SOAK[*]} --set batch_size=$BATCH --measure --json > '$OUT/plan-$BATCH.json'"
    wanted "plan-$BATCH" && "$PYTHON" - "$OUT/plan-$BATCH.json" >> "$OUT/summary.md" 2>/dev/null <<'PY' || true
import json, sys
r = json.load(open(sys.argv[1]))
m = r.get("measured") or {}
if m:
    e = r["estimate_bytes"]
    print(f"| plan estimate vs measured | batch {m['per_device']}: {e / 2**20:.0f} MiB vs {m['peak_bytes'] / 2**20:.0f} MiB ({(e / m['peak_bytes'] - 1) * 100:+.0f}%) | 0 | {sys.argv[1].rsplit('/', 1)[-1]} |")
PY
done

# max-memory: batch_size "auto" under max_memory; the run's peak of every epoch must stay below
# the cap (on the GPU, where the figure is the job's pool; the CPU's includes the process).
step max-memory 300 "$KILN" train --config "$HERE/configs/soak.toml" --backend "$GPU" "${SOAK[@]}" \
    --set epochs=2 --set batch_size=auto --set "max_memory=\"$MAX_MEMORY\"" \
    --set "name=\"max-memory\"" --set "logging.runs_dir=\"$OUT/work/runs-memory\""
if wanted max-memory; then
    CAPPED="$(ls -td "$OUT"/work/runs-memory/max-memory-*/ 2>/dev/null | head -n 1)"
    CAP_BYTES="$("$PYTHON" -c "import sys; n, u = sys.argv[1][:-3], sys.argv[1][-3:]; print(int(float(n) * {'GiB': 2**30, 'MiB': 2**20}[u]))" "$MAX_MEMORY")"
    if [ -f "${CAPPED}metrics.csv" ] && { [ "$DRY" = 1 ] || awk -F, -v cap="$CAP_BYTES" 'NR > 1 && $12 > cap { over = 1 } END { exit over || NR < 2 }' "${CAPPED}metrics.csv"; }; then
        RESULT=ok
    else
        RESULT=FAILED
        FAILED=1
    fi
    echo "| max-memory $MAX_MEMORY | $RESULT: $(grep -h '^batch_size' "${CAPPED}config.toml" 2>/dev/null), peak MiB by epoch $(awk -F, 'NR > 1 { printf "%s%.0f", (NR > 2 ? ", " : ""), $12 / 1048576 }' "${CAPPED}metrics.csv" 2>/dev/null) | 0 | max-memory.log |" >> "$OUT/summary.md"
fi

note nodes "skipped: needs two machines (tests/cluster.rs runs two processes on loopback)"
# bf16 and f16: the soak model in mixed precision for two epochs (f32 master weights; f16 with
# loss scaling); the console's epoch lines give images/s beside the f32 soak's, and the
# plan-bf16 step the measured peak.
for PRECISION in bf16 f16; do
    step "$PRECISION" 300 "$KILN" train --config "$HERE/configs/soak.toml" --backend "$GPU" "${SOAK[@]}" \
        --set epochs=2 --set "precision=\"$PRECISION\"" --set "name=\"soak-$PRECISION\"" \
        --set "logging.runs_dir=\"$OUT/work/runs-precision\""
done
step plan-bf16 180 bash -c "'$KILN' plan --config '$HERE/configs/soak.toml' --backend $GPU ${SOAK[*]} --set precision=bf16 --measure --json > '$OUT/plan-bf16.json'"

echo
cat "$OUT/summary.md"
[ -f "$OUT/bench.md" ] && { echo; cat "$OUT/bench.md"; }
rm -f "$KILN"
exit $FAILED
