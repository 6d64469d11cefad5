#!/usr/bin/env bash
# The demo pipeline end to end on the default corpus (CPython's own documentation text):
# tokenizer -> config -> masked-LM pretraining with evaluation -> Hugging Face export -> fill-mask.
# Runs in a few minutes on a 2-core CPU. Output in runs/demo/ (replaced on each run).
set -euo pipefail
cd "$(dirname "$0")"
PY=${PYTHON:-python}
start=$(date +%s)
$PY -m flaxlm.demo_corpus --output_dir runs/demo/data
$PY train_tokenizer.py --config_file configs/demo.yaml --overwrite_output_dir
$PY create_config.py --config_file configs/demo.yaml --overwrite_output_dir
$PY run_mlm_flax.py --config_file configs/demo.yaml --overwrite_output_dir "$@"
$PY fill_mask.py runs/demo/run "The break statement is used to leave a l<mask>p early." \
    "Return the absolute value of a n<mask>ber."
$PY -m flaxlm.eval_summary runs/demo/run/metrics.jsonl
echo "demo finished in $(( $(date +%s) - start )) s; eval losses in runs/demo/run/metrics.jsonl"
