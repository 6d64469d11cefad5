"""evaluate_suite.py's parts: one pretrained model fine-tuned and judged on a list of tasks.

    suite_file.py   the suite's yaml: its tasks (kind, files under --data_dir or hub datasets, the script's flags),
                    checked up front
    runner.py       each task as a subprocess of its script; a crash becomes a row of the table, not the end
    scores.py       the predictions files (the scripts' output contract) as per-example statistics and a metric
    baselines.py    the trivial baseline of each kind (majority class, most frequent tag per word, copy the source)
    bootstrap.py    the 95% interval of a score: validation examples resampled with replacement
    table.py        the table printed and written as results.json and results.md
"""
