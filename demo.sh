#!/usr/bin/env bash
# The demo pipeline end to end on the default corpus (CPython's own documentation text), no download:
#   bash demo.sh       RoBERTa: BPE tokenizer -> config -> masked-LM pretraining with evaluation ->
#                      Hugging Face export -> fill-mask on five cloze sentences, scored
#                                                                 (configs/demo.yaml, output in runs/demo/)
#   bash demo.sh t5    T5 v1.1: Unigram tokenizer -> config -> span-corruption pretraining with evaluation
#                      -> Hugging Face export -> span filling     (configs/t5-demo.yaml, output in runs/t5-demo/)
#   bash demo.sh clm   GPT-2: BPE tokenizer -> config -> causal-LM pretraining with evaluation -> Hugging Face
#                      export -> text generation                  (configs/clm-demo.yaml, output in runs/clm-demo/)
# Further arguments go to the training script (e.g. --max_steps 100). Each run replaces its output.
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python}
task=mlm
if [[ "${1:-}" == "t5" || "${1:-}" == "mlm" || "${1:-}" == "clm" ]]; then task=$1; shift; fi
start=$(date +%s)
$PY -m flaxlm.data.demo_corpus --output_dir runs/demo/data
if [[ $task == mlm ]]; then
    recipe=configs/demo.yaml run=runs/demo/run
    $PY train_tokenizer.py --config_file $recipe --overwrite_output_dir
    $PY create_config.py --config_file $recipe --overwrite_output_dir
    $PY run_mlm_flax.py --config_file $recipe --overwrite_output_dir "$@"
    # The check: five sentences in the manner of the docs (chosen before the recipe was tuned), each with the word
    # the model should rank first at its <mask>; fill_mask.py prints its guesses and counts the right ones.
    $PY fill_mask.py $run \
        --cloze "A break statement terminates the nearest enclosing <mask>." loop \
        --cloze "If the index is out of range, IndexError is <mask>." raised \
        --cloze "A Python program can also explicitly raise an <mask> with the raise statement." exception \
        --cloze "A return statement specifies the return <mask> of the function call." value \
        --cloze "Keyword-only parameters may only be passed by keyword <mask>." arguments
elif [[ $task == clm ]]; then
    recipe=configs/clm-demo.yaml run=runs/clm-demo/run
    $PY train_tokenizer.py --config_file $recipe --overwrite_output_dir
    $PY create_config.py --config_file $recipe --overwrite_output_dir
    $PY run_clm_flax.py --config_file $recipe --overwrite_output_dir "$@"
    $PY generate.py --model_name_or_path $run --prompt "The break statement" --prompt "Return the absolute value" \
        --max_new_tokens 40
else
    recipe=configs/t5-demo.yaml run=runs/t5-demo/run
    $PY train_tokenizer.py --config_file $recipe --overwrite_output_dir
    $PY create_config.py --config_file $recipe --overwrite_output_dir
    $PY run_t5_mlm_flax.py --config_file $recipe --overwrite_output_dir "$@"
    $PY fill_spans.py $run "The break statement is used to leave a <extra_id_0> early." \
        "Return the <extra_id_0> value of a number."
fi
$PY -m flaxlm.reporting.eval_summary $run/metrics.jsonl
echo "demo finished in $(( $(date +%s) - start )) s; eval losses in $run/metrics.jsonl, loss curves in $run/loss.png"
