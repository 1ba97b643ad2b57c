#!/usr/bin/env bash
# Everything that needs a CUDA device, in one prepared run (issue #51): the CUDA-only tests, then the benchmark
# on Llama-3.2-1B and Llama-3-8B shapes (random weights built on the GPU, bfloat16), each JSON under OUT.
#
#   bash steer_ui/tools/gpu_run.sh OUT          on the GPU machine (the device tool sets $OUT)
#   GPU_RUN_DRY=1 bash steer_ui/tools/gpu_run.sh /tmp/gpu-dry
#                                               here, on the CPU: the same steps on random:llama-mini, --quick,
#                                               so a typo fails on the CPU and not in a GPU lease
# GPU_RUN_MODELS (default "random:llama-8b random:llama-1b"), GPU_RUN_PROFILE=0 (no profile) and GPU_RUN_EXACT=0 (no
# float32 many-users run) shorten a rerun.
#
# A lease is minutes long, so every step has its own time limit and a step that fails or runs out leaves the
# others to run; each bench writes its JSON after every section (marked incomplete until it ends).  The GPU
# machine reaches no package index: wheels of what its image lacks or has in another version travel in .whl/
# (transformers as pinned here, gguf for the export tests, regex as transformers asks).
set -uo pipefail
OUT="${1:?usage: gpu_run.sh OUT}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
LOG="$OUT/run.log"
export PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 STEER_UI_CACHE="${STEER_UI_CACHE:-/tmp/steer-ui-cache}"
say() { echo "[$(date +%T)] $*" | tee -a "$LOG"; }

if [ -n "${GPU_RUN_DRY:-}" ]; then
  DEVICE=cpu; MODELS="random:llama-mini"; QUICK="--quick"; TEST_LIMIT=300; BENCH_LIMIT=300
  PROFILED=random:llama-mini; EXACT=random:llama-mini
else
  DEVICE=cuda; MODELS="${GPU_RUN_MODELS:-random:llama-8b random:llama-1b}"; QUICK=""; TEST_LIMIT=110; BENCH_LIMIT=150
  PROFILED=random:llama-8b; EXACT=random:llama-1b
  if ls .whl/*.whl >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
      >>"$LOG" 2>&1 && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi

say "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1 || true
  "$PY" -c "import torch, transformers, platform; print('python', platform.python_version(), 'torch', torch.__version__,
'transformers', transformers.__version__, 'cuda', torch.version.cuda, torch.cuda.is_available() and
torch.cuda.get_device_name(0))"
  nproc; } >>"$LOG" 2>&1

say "CUDA tests (the tests that skip without a GPU, named for cuda)"
timeout "$TEST_LIMIT" "$PY" -m pytest -q -p no:cacheprovider -o addopts="" -rfEs -k "cuda or gpu" \
  tests/unit/test_static_decode.py tests/unit/test_devices.py tests/unit/test_random_models.py \
  tests/unit/test_generation.py tests/unit/test_int8.py tests/unit/test_loading.py tests/unit/test_prefix.py \
  tests/unit/test_fused_ops.py \
  >"$OUT/tests.txt" 2>&1
say "tests exit $? ($(tail -1 "$OUT/tests.txt"))"

previous_ok=1
for model in $MODELS; do
  name="${model#random:}"
  json="$OUT/bench-cuda-$name.json"
  # the OpenAI front's section needs uvicorn, which the GPU image lacks (it is measured on the CPU)
  skip="training,openai"
  # the 8B run keeps the sections issue #51 sets targets on (decode, slider, sweep, many users, accuracy)
  [ "$name" = llama-8b ] && skip="training,openai,extract,many_prompts,alpha_grid,vs_float32"
  decode=""
  # where the first model's run (the captured step's first use) failed, the next one runs the dynamic step so
  # that the lease still measures something
  [ "$previous_ok" = 1 ] || decode="--decode dynamic"
  say "bench $model on $DEVICE (skip: $skip) $decode"
  limit=$BENCH_LIMIT
  timeout "$limit" "$PY" -m steer_ui bench --model "$model" --device "$DEVICE" --dtype bfloat16 $QUICK \
    --skip "$skip" $decode --json --out "$json" >/dev/null 2>>"$LOG"
  code=$?
  say "bench $model exit $code"
  if [ "$code" = 0 ]; then previous_ok=1; else previous_ok=0; fi
  "$PY" - "$json" <<'EOF' >>"$LOG" 2>&1 || true
import json, sys
r = json.load(open(sys.argv[1]))
print("incomplete" if r.get("incomplete") else "complete", "sections:", r.get("section_seconds"))
for k, v in (r.get("ratios") or {}).items():
    print(f"  {k}: {v}  met={r.get('met', {}).get(k)}")
EOF
done
if [ "${GPU_RUN_PROFILE:-1}" = 1 ]; then
  say "where the decode step's time goes ($PROFILED)"
  timeout 100 "$PY" -m steer_ui.tools.profile_step --model "$PROFILED" --device "$DEVICE" --dtype bfloat16 \
    >"$OUT/profile-step.txt" 2>>"$LOG"
  say "profile exit $?"
  say "where the engine thread's time goes while eight decode at once ($PROFILED)"
  timeout 90 "$PY" -m steer_ui.tools.many_users --model "$PROFILED" --device "$DEVICE" --dtype bfloat16 \
    --profile-engine --reps 3 >"$OUT/profile-engine.txt" 2>>"$LOG"
  say "engine profile exit $?"
fi

# many users' exactness in float32: a result that parts from its solo run there is the batching's doing, not
# bfloat16's rounding (in bfloat16 a batch of another size rounds differently)
if [ "${GPU_RUN_EXACT:-1}" = 1 ]; then
say "many users in float32 ($EXACT)"
timeout 100 "$PY" -m steer_ui.tools.many_users --model "$EXACT" --device "$DEVICE" --dtype float32 \
  >"$OUT/many-users-float32.json" 2>>"$LOG"
say "many users exit $?"
fi
say "done"
