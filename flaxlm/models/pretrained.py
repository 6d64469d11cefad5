"""Models in Hugging Face's directory format (config.json + model.safetensors), read and written the way
transformers' from_pretrained / save_pretrained do, for each family's pretraining model and its fine-tuning heads.

    config, model = load_pretrained(path, dtype="bfloat16")          # a directory or a hub name
    save_pretrained(output_dir, config, params)                     # loadable by transformers
    config, model = load_for_task(path, "sequence_classification", num_labels=3)   # BERT/RoBERTa + a head
"""
import copy
import logging

from flaxlm.models import hf_io
from flaxlm.models.build import abstract_model, create_model, merge_model, model_class
from flaxlm.models.convert import from_hf_state_dict, name_map_of, task_of, to_hf_state_dict
from flaxlm.models.registry import family_of

logger = logging.getLogger(__name__)


def save_config(output_dir, config, task=None):
    """Write config.json as the family's Hugging Face class writes it (or the fine-tuning task's class: with
    num_labels, id2label, label2id, problem_type), with its architecture and the tie_word_embeddings that
    transformers 4.x and 5.x both read right (T5 v1.1: false)."""
    family = family_of(config)
    config = copy.deepcopy(config)
    config.architectures = [name_map_of(config, task).architecture]
    config.tie_word_embeddings = family.tie_word_embeddings(config)
    config.dtype = "float32"
    hf_io.write_config(output_dir, config)


def save_pretrained(output_dir, config, params):
    """Write config.json and model.safetensors (float32) loadable by transformers' from_pretrained of the
    family's architecture (AutoModelForMaskedLM, T5ForConditionalGeneration), or for a fine-tuning head's
    params by AutoModelForSequenceClassification / AutoModelForQuestionAnswering."""
    hf_io.write_safetensors(output_dir, to_hf_state_dict(config, params))
    save_config(output_dir, config, task_of(config, params))


def _load(path, config, dtype, seed, task, execution):
    """The model of `config` (task None: its pretraining model) with the weights in directory `path`."""
    import jax
    import jax.numpy as jnp

    graphdef, _ = abstract_model(config, dtype, task, execution)
    params = from_hf_state_dict(config, hf_io.read_safetensors(path), seed=seed, task=task)
    return merge_model(graphdef, jax.tree.map(jnp.asarray, params))


def load_pretrained(path, dtype="float32", *, seed=0, execution=None):
    """(config, model) from a directory holding config.json + safetensors (or a hub name); compute in dtype,
    the layers run as `execution` says (flaxlm.models.layer_stack.Execution; None: a plain loop).

    A bare BERT/RoBERTa encoder checkpoint gets a fresh MLM head initialized from `seed` (logged as a warning).
    """
    path = hf_io.resolve_dir(path)
    config = hf_io.load_config(path)
    return config, _load(path, config, dtype, seed, None, execution)


def task_config(config, task, *, num_labels=None, id2label=None, problem_type=None):
    """A copy of `config` set up for the task: question answering has 2 outputs (start, end); a classifier has
    num_labels outputs named by id2label ({id: name}; label2id follows), problem_type as transformers reads it."""
    config = copy.deepcopy(config)
    if task == "question_answering":
        config.num_labels = 2
        return config
    if id2label is not None:
        id2label = {int(i): str(name) for i, name in id2label.items()}
        if num_labels is not None and num_labels != len(id2label):
            raise ValueError(f"num_labels {num_labels} != {len(id2label)} names in id2label")
        config.id2label = id2label
        config.label2id = {name: i for i, name in id2label.items()}
    elif num_labels is not None:
        config.num_labels = num_labels
    if problem_type is not None:
        config.problem_type = problem_type
    return config


def load_for_task(path, task, *, num_labels=None, dtype="float32", seed=0, id2label=None, problem_type=None,
                  execution=None):
    """(config, model) for fine-tuning: the encoder in directory `path` (a masked-LM export, a bare encoder or a
    checkpoint that has this task's head already) with the task's head (a Head of its family: BERT/RoBERTa's
    "sequence_classification" or "question_answering"). A head the checkpoint lacks starts fresh from `seed`
    (one warning), pretraining heads are dropped (a note); a directory holding only config.json gives a
    freshly initialized model. The config gets num_labels / id2label / label2id / problem_type (task_config).
    execution: how the layers run (flaxlm.models.layer_stack.Execution; None: a plain loop)."""
    path = hf_io.resolve_dir(path)
    config = task_config(hf_io.load_config(path), task, num_labels=num_labels, id2label=id2label,
                         problem_type=problem_type)
    model_class(config, task)  # a known task on a family with that head, else a UserError
    if not hf_io.has_weights(path):
        logger.warning("no weights in %s (only config.json): the %s model starts freshly initialized", path,
                       config.model_type)
        return config, create_model(config, dtype=dtype, seed=seed, task=task, execution=execution)
    return config, _load(path, config, dtype, seed, task, execution)
