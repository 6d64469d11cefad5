"""Training machinery every script shares: the loop (loop.py) and its pieces (train_step, progress, evaluation,
saving), the device mesh and sharding, checkpoints, the optimizer, surviving preemption and divergence, and the
steps of the scripts' pipeline from their options to the export (pipeline). Where a run reports is flaxlm.reporting;
compiling a run for a TPU slice (--compile_for) is flaxlm.planning."""
