"""Non-finite steps: the train step never applies a NaN/Inf update, and the loop stops (or skips a few).

On the device, `apply_if_finite` keeps the previous parameters and optimizer state when the loss or the
gradient norm is not finite, so the state (and every checkpoint of it) stays the last good one. On the
host, `NonFiniteSteps` reads each step's flag one step late (so checking never stalls the device) and
ends the run with a clear message once more than --skip_nonfinite_steps steps went bad.
"""
import jax
import optax

from flaxlm.errors import UserError


def apply_if_finite(finite, tx, grads, opt_state, params):
    """(params, opt_state) after the optimizer step where `finite` (a scalar bool), else both unchanged, in
    their own dtypes (--param_dtype bfloat16: a float32 learning rate does not promote them).
    A lax.cond, so only the taken branch runs and the donated state is updated in place; selecting between
    the old and the new state leaf by leaf made XLA keep a copy of every optimizer-state buffer."""
    def step(p, o, g):
        updates, new_o = tx.update(g, o, p)
        same_dtypes = lambda new, old: jax.tree.map(lambda a, b: a.astype(b.dtype), new, old)  # noqa: E731
        return same_dtypes(optax.apply_updates(p, updates), p), same_dtypes(new_o, o)  # bfloat16 params stay so
    return jax.lax.cond(finite, step, lambda p, o, g: (p, o), params, opt_state, grads)


class NonFiniteSteps:
    """The host's side: `watch(step, metrics)` after each step, `check_all()` before logging and at the end;
    raises UserError once more than `allowed` steps were not finite."""

    def __init__(self, allowed, last_checkpoint):
        self.allowed = allowed or 0
        self.skipped = 0
        self.last_checkpoint = last_checkpoint  # () -> description of the newest checkpoint on disk
        self._unchecked = []  # (step, device metrics) whose flag the host has not read yet

    def watch(self, step, metrics):
        """Take step's device metrics (step is 1-based) and check the steps before it: reading the previous
        step's flag does not stall this one, which may still run."""
        self._unchecked.append((step, metrics))
        self._check(keep_last=1)

    def check_all(self):
        """Check every step watched so far."""
        self._check(keep_last=0)

    def _check(self, keep_last):
        while len(self._unchecked) > keep_last:
            step, metrics = self._unchecked.pop(0)
            self._check_step(step, jax.device_get(metrics))

    def _check_step(self, step, metrics):
        """metrics: the step's host metrics (with 'finite', 'loss', 'grad_norm')."""
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
