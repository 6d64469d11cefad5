"""TPU planning: TPU slices by the names people rent them under, as compile-only devices (tpu_slices), and a run's
train and eval steps compiled for one on any host, with whether they fit its HBM (compile_for, --compile_for)."""
