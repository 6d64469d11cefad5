"""Training machinery every script shares: the loop, the device mesh and sharding, checkpoints, the optimizer,
logging, surviving preemption and divergence, and the run's setup and export (pipeline)."""
