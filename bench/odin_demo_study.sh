#!/usr/bin/env bash
# The length-debiased reward model in the demo's setting, where a gold judge exists: reward models
# fitted on the demo's judge-ranked TinyStories samples (plain and length_debias odin, seeds 1-3), then
# PPO from the demo's SFT model against each (configs/demo/ppo.yaml, rollout seed = the RM's seed),
# then the demo's held-out evaluation of each PPO export (256 held-out prompts, VADER judge, KL to SFT,
# response length). Reads a finished `make demo` run directory (DEMO_DIR: its sft/model, prefs/rankings.jsonl,
# data/ppo.txt); writes under WORK. Run from the repository root:
#   DEMO_DIR=logs/demo WORK=/tmp/odin_demo bash bench/odin_demo_study.sh
# Knobs: SEEDS ("1 2 3"), JOBS (2 at a time), PY (the venv's python).
set -euo pipefail
D=${DEMO_DIR:?set DEMO_DIR to a finished make demo run directory (logs/demo)}
W=${WORK:?set WORK to an output folder}
SEEDS=${SEEDS:-1 2 3}
JOBS=${JOBS:-2}
PY=${PY:-.venv/bin/python}
mkdir -p "$W/logs" "$W/eval"
export OMP_NUM_THREADS=1 PYTHONUNBUFFERED=1
CLI=("$PY" -m rlhf_lit.cli)
odin_args() { [ "$1" = odin ] && echo "--model.init_args.length_debias.method odin" || true; }
rm_fit() {  # VARIANT SEED
  [ -e "$W/rm_$1_s$2/rlhf_lit_export.json" ] && return 0
  # shellcheck disable=SC2046
  "${CLI[@]}" fit --config configs/demo/reward_model.yaml --seed_everything "$2" \
    --model.init_args.model "$D/sft/model" --model.init_args.export_dir "$W/rm_$1_s$2" \
    --data.init_args.train_path "$D/prefs/rankings.jsonl" \
    --trainer.logger.init_args.save_dir "$W/logs" --trainer.logger.init_args.name "rm_$1_s$2" \
    $(odin_args "$1") > "$W/logs/rm_$1_s$2.log" 2>&1
}
ppo_fit() {  # VARIANT SEED
  [ -e "$W/ppo_$1_s$2/rlhf_lit_export.json" ] && return 0
  "${CLI[@]}" fit --config configs/demo/ppo.yaml --seed_everything "$2" --model.init_args.rollout_seed "$2" \
    --model.init_args.sft_model "$D/sft/model" --model.init_args.reward_model "$W/rm_$1_s$2" \
    --model.init_args.export_dir "$W/ppo_$1_s$2" --data.init_args.train_path "$D/data/ppo.txt" \
    --trainer.logger.init_args.save_dir "$W/logs" --trainer.logger.init_args.name "ppo_$1_s$2" \
    > "$W/logs/ppo_$1_s$2.log" 2>&1
}
evaluate() {  # NAME POLICY
  [ -s "$W/eval/$1.json" ] && return 0
  "$PY" -m demo evaluate --policy "$2" --reference "$D/sft/model" --out "$W/eval/$1.json" > "$W/logs/eval_$1.log" 2>&1
}
chain() {  # VARIANT SEED: RM, PPO, evaluation
  local s=$SECONDS
  rm_fit "$1" "$2" && ppo_fit "$1" "$2" && evaluate "ppo_$1_s$2" "$W/ppo_$1_s$2" \
    && echo "chain $1 seed $2: done in $(( SECONDS - s )) s" || echo "chain $1 seed $2: FAILED (logs in $W/logs)"
}
start=$SECONDS
evaluate sft "$D/sft/model" &
for seed in $SEEDS; do
  for v in plain odin; do
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do sleep 2; done
    chain "$v" "$seed" &
  done
done
wait
echo "all chains: $(( SECONDS - start )) s"
"$PY" bench/odin_demo_summary.py --work "$W" | tee "$W/summary.md"
