#!/usr/bin/env bash
# The GPU recipe of docs/gpu.md as one script, each stage under its own time limit, so that a
# short lease on a GPU machine returns whatever finished:
#
#   1. facts     nvidia-smi, torch, transformers (facts.txt)
#   2. tests     pytest -m "gpu or triton" without TF32 (CUDA graphs, the fused path and its Triton
#                kernels, weight updates, NVML, megatron on cuda)
#   3. run       `run --recipe gpu-check`: sync vs APRIL at the 1.5B shape, hf engine and torch trainer
#                on the GPU, forced DeepScaleR-shaped lengths, 10 steps per arm in ABBA blocks of 2,
#                no warm start, the trainer's state only at an interruption, GPU telemetry on; its
#                prediction is committed in results/gpu/prediction-gpu-check
#   4. simcheck  the simulator's prediction against the same engine at forced lengths
#                (`simcheck --recipe gpu-check`, the prediction hashed before measuring): pass/fail on
#                the counted schedule
#   5. mbu       the hf engine's decode step vs the bandwidth limit at the 1.5B shape
#                (benchmarks/hf_bench.py --mbu --profile; batches 1/64/256, the eager, static and fused
#                decode paths against the issue-33 targets, kernel time by category)
#   (memory      the torch trainer's memory estimate vs the measured CUDA peak: measured on the first
#                lease, results/gpu/h100-2026-11-26; STAGES="... memory" runs it again)
#
# Everything lands in $WORK (default runs/gpu-recipe); after every stage the whole folder is packed
# into $PACK (default $WORK.tar.gz), so a stage killed by its limit keeps the ones before it.
#
#   timeout 480 bash benchmarks/gpu_recipe.sh        # on one H100: the stage limits add up to 405 s
#
# Give the whole command a limit above the sum of the stage limits (plus up to 15 s each for a stage
# that must be killed, and the packing): a command killed while packing returns only a partial archive.
# On the first H100 lease (results/gpu/h100-2026-11-26) the run stage's warm start took 85 s of GPU
# and 37 s of idle GPU while its weights were saved, and every step saved 15.7 GB of trainer state:
# no step finished in 150 s.  The preset skips both (forced lengths need no warm start; the trainer's
# state is written only at an interruption).
#   DEVICE=cpu MODEL=tiny HW=cpu SMALL=1 bash benchmarks/gpu_recipe.sh   # a dry run of every stage on a CPU
#   (tests/test_gpu_recipe.py runs it, slow)
set -u
WORK=${WORK:-runs/gpu-recipe}
PACK=${PACK:-$WORK.tar.gz}
DEVICE=${DEVICE:-cuda}
MODEL=${MODEL:-r1-distill-qwen-1.5b}
HW=${HW:-h100}
STAGES=${STAGES:-facts tests run simcheck mbu}
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
export APRIL_BENCH_CACHE=${APRIL_BENCH_CACHE:-/tmp/april-bench-cache}
# The trainer keeps float32 weights; TF32 tensor cores run its matrix products about 8x faster than
# plain float32 on Hopper (cuBLAS override: no code path changes).  The hf engine decodes in bf16 and
# is not affected.
export TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=${TORCH_ALLOW_TF32_CUBLAS_OVERRIDE:-1}
export PY=${PYTHON:-python3} COMMIT=${COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
if [ "${SMALL:-0}" = 1 ]; then  # the dry run's sizes
  LIMIT_SCALE=${LIMIT_SCALE:-4}
  RUN_SIZES="--steps 2 --block-steps 1 --warmup-steps 0 --rollout-batch-size 2 --n-samples-per-prompt 4 --over-sampling-batch-size 4 --max-response-len 48"
  SIM_SIZES="--steps 1 --repeats 1 --block-steps 1 --warmup-steps 0 --rollout-batch-size 2 --n-samples-per-prompt 4 --over-sampling-batch-size 4 --max-response-len 48"
  MBU_SIZES="--batches 1,8 --context 64 --steps 8"
  MEM_SIZES="--model tiny --batch 2x4x16x64 --configs 256:128:0"
else
  LIMIT_SCALE=${LIMIT_SCALE:-1}
  RUN_SIZES=""  # the preset's own: 10 steps per arm
  SIM_SIZES="--steps 2 --repeats 1 --block-steps 1 --warmup-steps 0"
  MBU_SIZES="--batches 1,64,256 --profile"
  MEM_SIZES="--model $MODEL"
fi
# The preset (april_bench/recipes.py:gpu_check) with this machine's device and model.
PRESET="--recipe gpu-check --hw $HW --model $MODEL --engine-arg device=$DEVICE --trainer-arg device=$DEVICE
  --warmstart-arg device=$DEVICE --no-progress"

mkdir -p "$WORK"
: > "$WORK/stages.txt"

stage() {  # stage NAME SECONDS COMMAND...: run it, log it, note its exit status and time, repack
  local name=$1 limit=$(( $2 * LIMIT_SCALE )) start rc
  shift 2
  case " $STAGES " in *" $name "*) ;; *) return 0 ;; esac
  start=$(date +%s)
  echo "== $name (limit ${limit}s): $*" | tee -a "$WORK/stages.txt"
  timeout --signal=INT --kill-after=15 "$limit" "$@" > "$WORK/$name.log" 2>&1
  rc=$?
  echo "   $name rc=$rc in $(( $(date +%s) - start ))s" | tee -a "$WORK/stages.txt"
  tail -n 5 "$WORK/$name.log"
  # state/ is left out: checkpoints are a resume's input, and a run stopped by its limit may leave a
  # trainer state (15.7 GB at the 1.5B shape) or its temporary file there
  tar -czf "$PACK.part" --exclude=state -C "$(dirname "$WORK")" "$(basename "$WORK")" && mv "$PACK.part" "$PACK"
}

facts() {
  date -u +%FT%TZ
  echo "commit $COMMIT; TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=$TORCH_ALLOW_TF32_CUBLAS_OVERRIDE"
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true
  $PY -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, torch.cuda.is_available() and torch.cuda.get_device_name())"
  $PY -c "import pynvml; pynvml.nvmlInit(); print('nvml', pynvml.nvmlSystemGetDriverVersion())" 2>&1 || true
}

export -f facts
stage facts 15 bash -c facts
# without TF32: the megatron-vs-torch test compares AdamW updates at a 1e-3 relative tolerance that
# TF32's 10-bit mantissa exceeds (0.8% on the first H100 run, results/gpu/h100-2026-11-26)
stage tests 60 env -u TORCH_ALLOW_TF32_CUBLAS_OVERRIDE $PY -m pytest -q -p no:cacheprovider -m "gpu or triton" -rs tests/test_hf_static.py tests/test_hf_fused.py tests/test_hf_triton.py tests/test_decode_benchmarks.py tests/test_telemetry_real.py tests/test_megatron_trainer.py
# shellcheck disable=SC2086
stage run 180 $PY -m april_bench run $PRESET $RUN_SIZES --out "$WORK/run-gpu-check-$MODEL"
# shellcheck disable=SC2086
stage simcheck 100 $PY -m april_bench simcheck $PRESET $SIM_SIZES \
  --validation-log "$WORK/simcheck-log.jsonl" --out "$WORK/simcheck-hf-$DEVICE"
stage mbu 50 $PY benchmarks/hf_bench.py --mbu --device "$DEVICE" --model "$MODEL" $MBU_SIZES --out "$WORK/benchmarks"
stage memory 80 $PY benchmarks/trainer_memory_cuda.py $MEM_SIZES --timeout 60 --out "$WORK/benchmarks"
echo "packed: $PACK"
