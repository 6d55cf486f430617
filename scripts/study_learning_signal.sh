#!/usr/bin/env bash
# Runs docs/study_learning_signal.md's registered commands, two at a time where one does not need the other's model
# (the results do not depend on the order: fp32, one thread, seed 0 each), each under `/usr/bin/time -v` (its wall
# and CPU time and peak memory in <dir>/<stage>.time), then the registered test. From the repository root:
#
#     nohup bash scripts/study_learning_signal.sh outputs/study_ls > outputs/study_ls.log 2>&1 &
set -euo pipefail
D=${1:-outputs/study_ls}
PY=${PYTHON:-.venv/bin/python}
export OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false TRL_EXPERIMENTAL_SILENCE=1
mkdir -p "$D"
COMMON=(--num_eval_games 200 --eval_max_turns 4 --seed 0)

stage() {  # stage NAME ARGS...: one registered command, timed, its output in <dir>/NAME.log
    local name=$1; shift
    echo "$(date -u +%H:%M:%S) start $name"
    /usr/bin/time -v -o "$D/$name.time" "$PY" "$@" > "$D/$name.log" 2>&1
    echo "$(date -u +%H:%M:%S) done $name ($(grep -o 'Elapsed.*' "$D/$name.time"))"
}

# S0 and the teacher (each needs only the base model)
stage start examples/textworld_sft.py --config recipes/quickstart_sft.yaml --output_dir "$D/start" \
    --num_eval_games 200 --seed 0 &
stage teacher examples/textworld_sft.py --config recipes/quickstart_sft.yaml --output_dir "$D/teacher" \
    --first_train_game 1000 --num_train_games 96 --num_eval_games 200 --seed 0 &
wait
# arms 1 and 2 (from S0)
stage sft examples/textworld_sft.py --config recipes/quickstart_sft.yaml --model_name_or_path "$D/start" \
    --output_dir "$D/sft" --num_train_games 48 "${COMMON[@]}" &
stage dagger examples/textworld_dagger.py --config recipes/quickstart_dagger.yaml --model_name_or_path "$D/start" \
    --output_dir "$D/dagger" --num_train_games 48 --dagger_iterations 2 --dagger_beta_0 0.5 \
    --dagger_beta_decay 0.5 --num_train_epochs 1 "${COMMON[@]}" &
wait
# arms 3 and 4 (from S0; 4 also needs the teacher)
stage grpo_ds examples/textworld_grpo.py --config recipes/quickstart.yaml --model_name_or_path "$D/start" \
    --output_dir "$D/grpo_ds" --num_train_games 48 --max_steps 6 --eval_start_model false \
    --dynamic_sampling true --dynamic_sampling_max_draws 2 "${COMMON[@]}" &
stage distill examples/textworld_grpo.py --config recipes/quickstart.yaml --model_name_or_path "$D/start" \
    --output_dir "$D/distill" --num_train_games 48 --max_steps 12 --eval_start_model false \
    --teacher_model_name_or_path "$D/teacher" --teacher_signal reward --teacher_kl_coef 1.0 "${COMMON[@]}" &
wait
"$PY" scripts/study_learning_signal.py "$D" | tee "$D/test.txt"
