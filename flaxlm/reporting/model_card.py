"""The model card (README.md) beside every export, written with huggingface_hub's model-card support: the hub's YAML
metadata (library_name, pipeline_tag, language, license, datasets, base_model, tags), then the family and size, the
tokenizer, the data (sources, mixture weights, tokens seen, epochs per source), the hyperparameters, the final and
best evaluation figures (from OUTPUT_DIR/metrics.jsonl), the hardware and time, the loss curves (loss.png) and how to
load it in transformers. evaluate_suite.py adds its table to a card written here (add_suite_table).

A README.md that flaxlm did not write (no MARK line in it) is never overwritten: the card is not written then, and a
line says so. Delete the MARK line from a card to keep your edits from then on.
"""
import os

from flaxlm.reporting.run_log import read_rows

MARK = "<!-- flaxlm model card: rewritten by each export; delete this line to keep your edits -->"
SUITE_START, SUITE_END = "<!-- flaxlm suite -->", "<!-- /flaxlm suite -->"
PIPELINE_TAGS = {"CausalLM": "text-generation", "MaskedLM": "fill-mask", "Seq2SeqLM": "text2text-generation",
                 "ConditionalGeneration": "text2text-generation", "SequenceClassification": "text-classification",
                 "TokenClassification": "token-classification", "QuestionAnswering": "question-answering"}
HYPERPARAMETERS = ("optim", "learning_rate", "lr_scheduler_type", "lr_scheduler_kwargs", "warmup_steps", "warmup_ratio",
                   "weight_decay", "adafactor", "z_loss", "adam_beta1", "adam_beta2", "max_grad_norm",
                   "per_device_train_batch_size", "train_batch_size", "gradient_accumulation_steps", "num_train_epochs",
                   "max_steps", "max_seq_length", "block_size", "mlm_probability", "noise_density",
                   "mean_noise_span_length", "train_only", "freeze_steps", "dtype", "param_dtype", "sharding", "seed",
                   "method")
LOWER_IS_BETTER = ("loss", "perplexity", "bits_per_byte")
HIGHER_IS_BETTER = ("accuracy", "f1", "exact_match", "precision", "recall", "mcc", "bleu", "chrf", "rouge")

TEMPLATE = """---
{{ card_data }}
---

""" + MARK + """

# {{ name }}

{{ summary }}

## Tokenizer

{{ tokenizer }}

## Training data

{% for line in data %}- {{ line }}
{% else %}- none: no training in this run
{% endfor %}
{%- if tokens %}
{{ tokens }}
{% endif %}
{%- if hyperparameters %}
## Training hyperparameters

| option | value |
|---|---|
{% for k, v in hyperparameters %}| `--{{ k }}` | {{ v }} |
{% endfor %}
{%- endif %}
{%- if evaluation %}
## Evaluation

| split | metric | final (step {{ final_step }}) | best (step) |
|---|---|---|---|
{% for split, metric, final, best in evaluation %}| {{ split }} | {{ metric }} | {{ final }} | {{ best }} |
{% endfor %}
{%- endif %}
""" + SUITE_START + "\n" + SUITE_END + """

## Hardware and time

{{ hardware }}
{%- if loss_plot %}

## Loss curves

![loss curves](loss.png)
{%- endif %}

## How to use

```python
from transformers import AutoTokenizer, {{ auto_class }}

tokenizer = AutoTokenizer.from_pretrained("{{ repo }}")
model = {{ auto_class }}.from_pretrained("{{ repo }}")
```

Trained in JAX with flaxlm's {{ script }}; the weights load in transformers as they are.
"""


def card_path(output_dir):
    return os.path.join(output_dir, "README.md")


def ours(path):
    """Whether the README.md at path is absent or a card flaxlm wrote (MARK still in it)."""
    if not os.path.exists(path):
        return True
    with open(path, encoding="utf-8", errors="replace") as f:
        return MARK in f.read()


def pipeline_tag(auto_class):
    return next((tag for suffix, tag in PIPELINE_TAGS.items() if auto_class.endswith(suffix)), None)


def hub_datasets(options):
    """The --dataset_name values that name hub datasets (not local folders)."""
    return [d for d in options.get("dataset_name") or [] if not os.path.exists(os.path.expanduser(d))]


def hub_model_id(name):
    """name if it names a model on the hub (the card's base_model, which the hub links), None for a local one: a
    folder on disk (what the scripts load then) or a path that is no hub id (./x, /x, x/, a/b/c)."""
    from huggingface_hub.errors import HFValidationError
    from huggingface_hub.utils import validate_repo_id
    if not name or os.path.exists(os.path.expanduser(name)):
        return None
    try:
        validate_repo_id(name)
    except HFValidationError:
        return None
    return name


def data_lines(options, rows):
    """One line per training source, with its mixture weight and, from the last "data" row, rows/tokens/epochs."""
    files = [("file", f) for f in options.get("train_file") or []]
    weights = options.get("train_file_weights")
    if options.get("prepared_data"):
        files, weights = [("prepared data", f) for f in options["prepared_data"]], options.get("prepared_data_weights")
    elif options.get("dataset_name"):
        configs = options.get("dataset_config_name") or []
        files = [("dataset", f"{d}" + (f" ({configs[i]})" if i < len(configs) and configs[i] else ""))
                 for i, d in enumerate(options["dataset_name"])]
        weights = options.get("dataset_weights")
    drawn = next((r for r in reversed(rows) if r.get("split") == "data"), {})
    names = [k[:-len("_rows")] for k in drawn if k.endswith("_rows")]
    lines = [f"file `{options['focus_train_file']}`: FOCUS's auxiliary embeddings"] if options.get(
        "focus_train_file") else []
    for i, (kind, name) in enumerate(files):
        line = f"{kind} `{name}`"
        if weights and i < len(weights):
            line += f", mixture weight {weights[i]}"
        if i < len(names):
            n = names[i]
            line += (f": {drawn[f'{n}_rows']} rows, {drawn[f'{n}_tokens']} tokens, "
                     f"{drawn[f'{n}_epochs']} epochs")
        lines.append(line)
    return lines


def evaluation_rows(rows):
    """(final step, [(split, metric, final value, best "value (step)")]) of the eval and test rows."""
    out, final_step = [], None
    for split in ("eval", "test"):
        done = [r for r in rows if r.get("split") == split]
        if not done:
            continue
        final = done[-1]
        final_step = final["step"] if final_step is None else final_step
        for metric, value in final.items():
            if metric in ("step", "split", "time") or not isinstance(value, (int, float)):
                continue
            best = ""
            lower = any(w in metric for w in LOWER_IS_BETTER)
            if len(done) > 1 and (lower or any(w in metric for w in HIGHER_IS_BETTER)):
                pick = (min if lower else max)(done, key=lambda r: r.get(metric, float("inf") if lower else -1e300))
                best = f"{pick[metric]} (step {pick['step']})"
            out.append((split, metric, value, best))
    return final_step, out


OBJECTIVE_OPTIONS = {"mlm_probability": ("fill-mask", None), "noise_density": ("text2text-generation",),
                     "mean_noise_span_length": ("text2text-generation",)}  # shown only for these pipeline tags


def hyperparameters(options, tag):
    """[(option, value)] of the hyperparameters the run set (--num_train_epochs only without --max_steps)."""
    out = []
    for k in HYPERPARAMETERS:
        value = options.get(k)
        if value in (None, False, []) or (k == "num_train_epochs" and options.get("max_steps")):
            continue
        if k in OBJECTIVE_OPTIONS and tag not in OBJECTIVE_OPTIONS[k]:
            continue
        out.append((k, value))
    return out


def hardware_line(rows):
    import jax
    devices = jax.devices()
    seconds = sum(r.get("seconds", 0) for r in rows if r.get("split") == "run")
    took = f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 else (
        f"{seconds:.0f} s")
    time = f"; training took {took}" if seconds else ""
    return (f"{len(devices)} × {devices[0].device_kind} ({jax.process_count()} host"
            f"{'s' if jax.process_count() > 1 else ''}, JAX {jax.__version__}){time}.")


def write_model_card(output_dir, *, config, tokenizer, auto_class, script, options, n_params, base_model=None,
                     how="pretrained from scratch", repo=None, library_name="transformers"):
    """README.md in output_dir (see the module's docstring); returns its path, or None when a README.md the user
    wrote is there (kept, with one line saying so)."""
    from huggingface_hub import ModelCard, ModelCardData
    path = card_path(output_dir)
    if not ours(path):
        print(f"kept {path}: it is not a card flaxlm wrote (delete it to get one)", flush=True)
        return None
    metrics = os.path.join(output_dir, "metrics.jsonl")
    rows = read_rows(metrics) if os.path.exists(metrics) else []
    family = config.model_type
    tags = ["flaxlm", "jax", family]
    data = ModelCardData(library_name=library_name, pipeline_tag=pipeline_tag(auto_class),
                         language=options.get("language"), license=options.get("license"),
                         datasets=hub_datasets(options) or None, base_model=hub_model_id(base_model), tags=tags)
    final_step, evaluation = evaluation_rows(rows)
    train_rows = [r for r in rows if r.get("split") == "train"]
    tokens = f"Tokens seen: {train_rows[-1]['tokens']} in {train_rows[-1]['step']} steps." if (
        train_rows and "tokens" in train_rows[-1]) else ""
    name = os.path.basename(os.path.abspath(repo or output_dir)) if not repo or os.path.exists(repo) else repo
    size = f"{n_params / 1e6:.1f}M" if n_params >= 1e5 else f"{n_params / 1e3:.1f}K"
    start = "" if not base_model else (f" from `{base_model}`" if hub_model_id(base_model) else
                                       f" from the local model `{base_model}`")
    summary = (f"A {family} model ({config.architectures[0] if getattr(config, 'architectures', None) else family}) "
               f"of {size} parameters, {how}{start}.")
    vocab = getattr(tokenizer, "vocab_size", None)
    card = ModelCard.from_template(
        data, template_str=TEMPLATE, name=name, summary=summary, script=script, repo=repo or output_dir,
        tokenizer=f"{type(tokenizer).__name__}, {len(tokenizer) if vocab is not None else '?'} tokens "
                  f"(model_max_length {getattr(tokenizer, 'model_max_length', '?')}).",
        data=data_lines(options, rows), tokens=tokens,
        hyperparameters=hyperparameters(options, data.pipeline_tag),
        evaluation=evaluation, final_step=final_step, hardware=hardware_line(rows),
        loss_plot=os.path.exists(os.path.join(output_dir, "loss.png")), auto_class=auto_class.split(".")[-1])
    card.save(path)
    return path


def add_suite_table(model_dir, table):
    """Put evaluate_suite.py's table (markdown) into the card of model_dir, if flaxlm wrote it; True when done."""
    from huggingface_hub import ModelCard
    path = card_path(model_dir)
    if not os.path.exists(path) or not ours(path):
        return False
    card = ModelCard.load(path)
    head, rest = card.text.split(SUITE_START, 1)
    _, tail = rest.split(SUITE_END, 1)
    card.text = f"{head}{SUITE_START}\n## Evaluation suite\n\n{table.strip()}\n{SUITE_END}{tail}"
    card.save(path)
    return True
