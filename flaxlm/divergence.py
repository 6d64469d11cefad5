"""Non-finite steps: the train step never applies a NaN/Inf update, and the loop stops (or skips a few).

On the device, `guard_update` keeps the previous parameters and optimizer state when the loss or the
gradient norm is not finite, so the state (and every checkpoint of it) stays the last good one. On the
host, `NonFiniteSteps` reads each step's flag one step late (so checking never stalls the device) and
ends the run with a clear message once more than --skip_nonfinite_steps steps went bad.
"""
import jax
import jax.numpy as jnp

from flaxlm.errors import UserError


def guard_update(finite, new_tree, old_tree):
    """new_tree where `finite` (a scalar bool), else old_tree, leaf by leaf."""
    return jax.tree.map(lambda new, old: jnp.where(finite, new, old), new_tree, old_tree)


class NonFiniteSteps:
    """Counts skipped steps; `check(step, metrics)` raises UserError past the allowance."""

    def __init__(self, allowed, last_checkpoint):
        self.allowed = allowed or 0
        self.skipped = 0
        self.last_checkpoint = last_checkpoint  # () -> description of the newest checkpoint on disk

    def check(self, step, metrics):
        """metrics: the step's host metrics (with 'finite', 'loss', 'grad_norm'); step is 1-based."""
        if metrics["finite"]:
            return
        self.skipped += 1
        what = f"step {step}: loss {metrics['loss']}, gradient norm {metrics['grad_norm']}"
        if self.skipped > self.allowed:
            allow = (f"--skip_nonfinite_steps {self.allowed} allowed {self.allowed}"
                     if self.allowed else "pass --skip_nonfinite_steps N to skip up to N such steps")
            raise UserError(f"{what} (not finite): training stopped; the update was not applied and "
                            f"{self.last_checkpoint()} is intact. Lower --learning_rate, raise --warmup_steps or "
                            f"--max_grad_norm clipping, use float32, or {allow}")
        print(f"warning: {what} (not finite): update skipped ({self.skipped} of {self.allowed} allowed)",
              flush=True)
