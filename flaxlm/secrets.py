"""Secrets (hub tokens, API keys, passwords) never leave in anything a run writes, sends or prints.

A secret is the value of an option whose name says token, key, secret or password (--token, --hub_token; in a recipe
or a --params_override too) and of an environment variable whose name says so (HF_TOKEN, WANDB_API_KEY,
MLFLOW_TRACKING_PASSWORD). The options' records (the trackers' config, the model card, train.py's experiment.yaml)
leave such options out; and once flaxlm.config.cli.parse_args has read them (`remember`):
- sys.argv holds the command line with each secret replaced by MASK (`protect_command_line`): a library that records
  the command line (W&B's run metadata) records that one, which still reruns the experiment once the token is filled
  in; a secret given there is visible to every user of the host (`ps`), and one warning line says so;
- `scrub` masks them in a text: the one-line errors and the tracebacks flaxlm.errors.run_main prints.
"""
import os
import re
import sys

MASK = "***"
# (a model config's num_key_value_heads, create_config.py --set, is no key: "key_value" is left out)
SECRET_NAME = re.compile(r"(?:^|_)(?:token|key(?!_value)|apikey|secret|password|passwd|credentials?)(?:_|$)",
                         re.IGNORECASE)
# A shorter value of a secret-named variable is a switch (HF_HUB_DISABLE_IMPLICIT_TOKEN=1), not a secret: masked in
# a flag's place on the command line, never hunted for inside other text.
MIN_LENGTH = 8
_remembered = set()
_warned = []


def is_secret(name):
    """Whether an option, a config key (task.model.token) or an environment variable holds a secret, by its name."""
    return bool(SECRET_NAME.search(re.sub(r"[-.]", "_", str(name).lstrip("-"))))


def remember(*values):
    """Secrets read from the command line, a recipe or an override: masked from now on."""
    _remembered.update(str(v) for v in values if v is not None and len(str(v)) >= MIN_LENGTH)


def known_values():
    """Every secret value this process knows: those remembered and the environment's, longest first."""
    env = {v for k, v in os.environ.items() if is_secret(k) and len(v) >= MIN_LENGTH}
    return sorted(_remembered | env, key=len, reverse=True)


def scrub(text):
    """text with every known secret value replaced by MASK."""
    for value in known_values():
        text = text.replace(value, MASK)
    return text


def redact_argv(argv):
    """A command line with secrets masked: the value of a secret-named flag (--hub_token X, --hub_token=X, a
    misspelled --hub-token X), of a secret key=value inside an argument (--params_override=task.model.token=X) and
    every known secret value wherever it stands."""
    out, hide_next = [], False
    for arg in argv:
        if hide_next and not arg.startswith("--"):
            out.append(MASK)
        elif arg.startswith("-") and is_secret(arg.partition("=")[0]):
            out.append(f"{arg.partition('=')[0]}={MASK}" if "=" in arg else arg)
        else:
            out.append(scrub(_mask_pairs(arg)))
        hide_next = arg.startswith("-") and "=" not in arg and is_secret(arg)
    return out


def _mask_pairs(arg):
    """The comma-separated key=value pairs of an argument with a secret key's value masked, to the end of its pair:
    --params_override=task.model.token=X,trainer.seed=1 -> --params_override=task.model.token=***,trainer.seed=1."""
    pairs = []
    for pair in arg.split(","):
        parts = pair.split("=")
        secret = next((i for i in range(1, len(parts)) if is_secret(parts[i - 1])), None)
        pairs.append("=".join(parts if secret is None else [*parts[:secret], MASK]))
    return ",".join(pairs)


def protect_command_line():
    """sys.argv with its secrets masked (redact_argv), in place, for every library that reads it later; the first time
    a secret is found there, one warning that the command line is visible to every user of the host."""
    redacted = redact_argv(sys.argv)
    if redacted == sys.argv:
        return
    names = [name for arg in sys.argv for pair in arg.split(",") for name in pair.split("=")[:-1] or [pair]
             if is_secret(name)]  # --hub_token, --params_override's task.model.token
    sys.argv[:] = redacted
    if not _warned:
        _warned.append(True)
        where = " and ".join(dict.fromkeys(names)) or "a secret"
        print(f"warning: {where} on the command line can be read by every user of this host (ps); set HF_TOKEN in "
              f"the environment or log in once with `hf auth login` (huggingface-cli login) instead",
              file=sys.stderr, flush=True)
