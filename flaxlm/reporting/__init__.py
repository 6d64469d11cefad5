"""Where a run reports: its metrics.jsonl, the console lines above the progress bars and the trackers of
--report_to (run_log, trackers), the loss curves (loss_plot), the model card beside each export (model_card) and a
run's evaluation losses printed from its jsonl (eval_summary)."""
