"""Options: every script's flags defined once (options), their parsing with yaml recipe files (cli), and
train.py's nested experiment configs built from the same options (experiments, experiment_registry)."""
