"""--report_to: where a run reports besides OUTPUT_DIR/metrics.jsonl (always written), each tracker through its own
library, with transformers' names and environment variables:

    tensorboard  TensorBoard event files in OUTPUT_DIR/tensorboard (tensorboardX; the default)
    wandb        Weights & Biases: WANDB_PROJECT (default flaxlm), WANDB_ENTITY, WANDB_MODE=offline, WANDB_API_KEY,
                 WANDB_DIR (default OUTPUT_DIR: its files in OUTPUT_DIR/wandb), ...
    mlflow       MLflow: MLFLOW_TRACKING_URI (default: MLflow's), MLFLOW_EXPERIMENT_NAME (default flaxlm), ...
    trackio      Hugging Face's local-first tracker: TRACKIO_PROJECT (default flaxlm), TRACKIO_DIR (default: trackio's),
                 TRACKIO_SPACE_ID

Each gets every row of metrics.jsonl at its step (as SPLIT/NAME: train/loss, eval/accuracy, data/...), the run's
options as its config (secrets left out: flaxlm.secrets, which also masks them in the command line W&B records) and
loss.png at the end; --run_name names the run. Each writes where its own settings say. A resumed run continues the
same tracker run (OUTPUT_DIR/trackers.json keeps the ids) and sends no step twice. A tracker that fails, at the start
or mid-run, costs one warning and is dropped: the training goes on.
"""
import json
import os
import sys

from flaxlm.errors import UserError

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")
MODULES = {"tensorboard": "tensorboardX", "wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
PACKAGES = {"tensorboard": "tensorboardX", "wandb": "wandb", "mlflow": "mlflow-skinny", "trackio": "trackio"}
STATE = "trackers.json"  # in the output directory: each tracker's run, for a resumed run to continue
PROJECT = "flaxlm"  # the project (W&B, trackio) or experiment (MLflow) when the environment names none


def installed(name):
    import importlib.util
    return importlib.util.find_spec(MODULES[name]) is not None


def resolve_report_to(values):
    """The trackers --report_to names (transformers' values: a list, or commas; "all": every installed one; "none":
    metrics.jsonl only; not given: tensorboard). A name that is not a tracker, or one whose library is not
    installed, is a UserError naming what to do."""
    if values is None:
        return ["tensorboard"]
    names = [n.strip().lower() for v in ([values] if isinstance(values, str) else values) for n in v.split(",")]
    names = [n for n in names if n]
    for n in names:
        if n not in (*TRACKERS, "all", "none"):
            raise UserError(f"--report_to {n} is not a tracker here; use {', '.join(TRACKERS)}, all or none")
    if "none" in names:
        if len(names) > 1:
            raise UserError(f"--report_to none cannot go with {', '.join(n for n in names if n != 'none')}; "
                            f"pass one or the other")
        return []
    if "all" in names:
        return [n for n in TRACKERS if installed(n)]
    for n in names:
        if not installed(n):
            raise UserError(f"--report_to {n} needs the {PACKAGES[n]} package, which is not installed: pip install "
                            f"{PACKAGES[n]} (or pip install -r requirements-trackers.txt)")
    return list(dict.fromkeys(names))


def warn(msg):
    print(f"warning: {msg}", file=sys.stderr, flush=True)


def reason(e):
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"


def flat(split, metrics):
    """{SPLIT/NAME: number} of one metrics.jsonl row (its numbers only)."""
    return {f"{split}/{k}": v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class TensorBoard:
    name = "tensorboard"

    def __init__(self, output_dir, subdir="tensorboard", **unused):
        from tensorboardX import SummaryWriter
        self.writer = SummaryWriter(os.path.join(output_dir, subdir))
        self.state = {}

    def log(self, step, split, metrics):
        for k, v in flat(split, metrics).items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def image(self, path):
        pass  # TensorBoard draws its own curves

    def close(self):
        self.writer.close()


class Wandb:
    name = "wandb"

    def __init__(self, output_dir, run_name, config, saved):
        import wandb
        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", PROJECT), name=run_name, config=config,
                              dir=None if os.environ.get("WANDB_DIR") else output_dir, id=saved.get("id"), resume="allow" if saved else None,
                              reinit="create_new")
        self.state = {"id": self.run.id}

    def log(self, step, split, metrics):
        self.run.log(flat(split, metrics), step=step)

    def image(self, path):
        self.run.log({"loss_curves": self.wandb.Image(path)})

    def table(self, step, name, columns):
        keys = list(columns)
        rows = [[_cell(columns[k][i]) for k in keys] for i in range(len(columns[keys[0]]))]
        self.run.log({name: self.wandb.Table(columns=["step", *keys], data=[[step, *r] for r in rows])}, step=step)

    def close(self):
        self.run.finish()


def _cell(value):
    """A table cell W&B takes: numbers and text as they are, anything else (a message list) as JSON."""
    return value if isinstance(value, (int, float, str)) or value is None else json.dumps(value, ensure_ascii=False)


class Mlflow:
    name = "mlflow"

    def __init__(self, output_dir, run_name, config, saved):
        from mlflow import MlflowClient
        self.client = MlflowClient()
        if saved:
            self.run_id = saved["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
        else:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME", PROJECT)
            experiment = self.client.get_experiment_by_name(name)
            experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
            self.run_id = self.client.create_run(experiment_id, run_name=run_name).info.run_id
            from mlflow.entities import Param
            params = [Param(k, json.dumps(v)[:6000]) for k, v in config.items()]
            for i in range(0, len(params), 100):  # MLflow takes at most 100 params a call
                self.client.log_batch(self.run_id, params=params[i:i + 100])
        self.state = {"run_id": self.run_id}

    def log(self, step, split, metrics):
        import time

        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step)
                                                    for k, v in flat(split, metrics).items()])

    def image(self, path):
        self.client.log_artifact(self.run_id, path)

    def close(self):
        self.client.set_terminated(self.run_id)


class Trackio:
    name = "trackio"

    def __init__(self, output_dir, run_name, config, saved):
        import trackio
        self.trackio = trackio
        self.project = saved.get("project") or os.environ.get("TRACKIO_PROJECT", PROJECT)
        self.run = trackio.init(project=self.project, name=saved.get("name") or run_name, config=config,
                                resume="allow" if saved else "never", space_id=os.environ.get("TRACKIO_SPACE_ID"),
                                embed=False)  # no --run_name: trackio names it
        self.state = {"project": self.project, "name": self.run.name, "id": self.run.id}

    def log(self, step, split, metrics):
        self.run.log(flat(split, metrics), step=step)

    def image(self, path):
        self.run.log({"loss_curves": self.trackio.Image(path)})

    def close(self):
        self.run.finish()


STARTS = {"wandb": Wandb, "mlflow": Mlflow, "trackio": Trackio}


def open_trackers(names, output_dir, run_name=None, config=None, resuming=False, tensorboard="tensorboard"):
    """The trackers of `names` (resolve_report_to's), started; a resumed run continues the runs trackers.json names.
    Call from process 0 only."""
    path = os.path.join(output_dir, STATE)
    saved = {}
    if resuming and os.path.exists(path):
        with open(path, encoding="utf-8") as f:
            saved = json.load(f)
    trackers = []
    for name in names:
        try:
            if name == "tensorboard":
                trackers.append(TensorBoard(output_dir, tensorboard))
            else:
                trackers.append(STARTS[name](output_dir, run_name, dict(config or {}), saved.get(name) or {}))
        except Exception as e:  # noqa: BLE001 -- no login, no network, a bad URI: the training matters more
            warn(f"--report_to {name} could not start ({reason(e)}); the run goes on without it")
    state = {t.name: t.state for t in trackers if t.state}
    if state:
        os.makedirs(output_dir, exist_ok=True)
        with open(path, "w", encoding="utf-8") as f:
            json.dump({**saved, **state}, f, indent=1)
    return trackers


class Reporting:
    """Rows to every tracker; one that fails is dropped with a warning. `sent`: {split: last step} the trackers
    already have (a resumed run's redone steps are not sent again)."""

    def __init__(self, trackers):
        self.trackers = list(trackers)
        self.sent = {}

    def _each(self, what, call):
        for t in list(self.trackers):
            try:
                call(t)
            except Exception as e:  # noqa: BLE001 -- a tracker service failing mid-run never ends the training
                warn(f"--report_to {t.name} failed {what} ({reason(e)}); the run goes on without it")
                self.trackers.remove(t)

    def log(self, step, split, metrics):
        if step <= self.sent.get(split, -1):
            return
        self._each(f"at step {step}", lambda t: t.log(step, split, metrics))

    def image(self, path):
        self._each("sending the loss curves", lambda t: t.image(path))

    def table(self, step, name, columns):
        """Sample rows ({column: [value per row]}) to the trackers that show tables (W&B); the others skip them."""
        self._each(f"at step {step}", lambda t: t.table(step, name, columns) if hasattr(t, "table") else None)

    def close(self):
        self._each("at the end", lambda t: t.close())
        self.trackers = []
