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
from flaxlm.models.convert import name_map_of, place_hf_state_dict, task_of, to_hf_state_dict
from flaxlm.models.registry import family_of

logger = logging.getLogger(__name__)


def save_config(output_dir, config, task=None, dtype="float32"):
    """Write config.json as the family's Hugging Face class writes it (or the fine-tuning task's class: with
    num_labels, id2label, label2id, problem_type), with its architecture, the tie_word_embeddings that
    transformers 4.x and 5.x both read right (T5 v1.1: false) and the weights' dtype."""
    family = family_of(config)
    config = copy.deepcopy(config)
    config.architectures = [name_map_of(config, task).architecture]
    config.tie_word_embeddings = family.tie_word_embeddings(config)
    config.dtype = dtype
    hf_io.write_config(output_dir, config)


def save_pretrained(output_dir, config, params, max_shard_bytes=hf_io.MAX_SHARD_BYTES):
    """Write config.json and model.safetensors (float32; bfloat16 when the params are, --param_dtype bfloat16)
    loadable by transformers' from_pretrained of the family's architecture (AutoModelForMaskedLM,
    T5ForConditionalGeneration), or for a fine-tuning head's params by AutoModelForSequenceClassification /
    AutoModelForQuestionAnswering. A model over max_shard_bytes is written in shards with their index, as
    transformers writes it."""
    tensors = to_hf_state_dict(config, params)
    hf_io.write_safetensors(output_dir, tensors, max_shard_bytes)
    dtypes = {x.dtype.name for x in tensors.values()}
    save_config(output_dir, config, task_of(config, params), "bfloat16" if dtypes == {"bfloat16"} else "float32")


def _load(path, config, dtype, seed, task, execution, shardings=None, param_dtype="float32"):
    """The model of `config` (task None: its pretraining model) with the weights in directory `path`, each
    tensor read straight to its place: shardings(abstract params) -> a pytree of shardings (None: all on the
    default device)."""
    import jax
    from jax.sharding import SingleDeviceSharding

    graphdef, abstract = abstract_model(config, dtype, task, execution)
    if shardings is None:
        shardings = jax.tree.map(lambda _: SingleDeviceSharding(jax.devices()[0]), abstract)
    else:
        shardings = shardings(abstract)
    params = place_hf_state_dict(config, hf_io.lazy_checkpoint(path), shardings, param_dtype=param_dtype, seed=seed,
                                 task=task, shapes=abstract)  # a padded vocabulary (execution's): zero rows
    return merge_model(graphdef, params)


def load_pretrained(path, dtype="float32", *, seed=0, execution=None, shardings=None, param_dtype="float32",
                    edit_config=None):
    """(config, model) from a directory holding config.json + safetensors (or a hub name); compute in dtype,
    the layers run as `execution` says (flaxlm.models.layer_stack.Execution; None: a plain loop).

    The weights are read tensor by tensor (a sharded checkpoint shard by shard) straight into their places:
    shardings(abstract params) gives a sharding per parameter (e.g. flaxlm.training.sharding.state_shardings over
    a mesh; None: the default device). They are sent in the checkpoint's dtype and kept as param_dtype ("float32"
    master weights, or "bfloat16").

    A bare BERT/RoBERTa encoder checkpoint gets a fresh MLM head initialized from `seed` (logged as a warning).
    edit_config: config -> the config the model is built from (the weights are the same; e.g. a longer RoPE).
    """
    path = hf_io.resolve_dir(path)
    config = hf_io.load_config(path)
    config = edit_config(config) if edit_config else config
    return config, _load(path, config, dtype, seed, None, execution, shardings, param_dtype)


def task_config(config, task, *, num_labels=None, id2label=None, problem_type=None):
    """A copy of `config` set up for the task: question answering has 2 outputs (start, end); a classifier has
    num_labels outputs named by id2label ({id: name}; label2id follows), problem_type as transformers reads it;
    architectures names the task's class."""
    config = copy.deepcopy(config)
    config.architectures = [name_map_of(config, task).architecture]  # the task's class (task_of reads it)
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
                  execution=None, param_dtype="float32", edit_config=None):
    """(config, model) for fine-tuning: the encoder in directory `path` (a masked-LM export, a bare encoder or a
    checkpoint that has this task's head already) with the task's head (a Head of its family: an encoder's
    "sequence_classification", "question_answering" or "token_classification"). A head the checkpoint lacks starts fresh from `seed`
    (one warning), pretraining heads are dropped (a note); a directory holding only config.json gives a
    freshly initialized model. The config gets num_labels / id2label / label2id / problem_type (task_config).
    execution: how the layers run (flaxlm.models.layer_stack.Execution; None: a plain loop); edit_config as
    load_pretrained's."""
    path = hf_io.resolve_dir(path)
    loaded = hf_io.load_config(path)
    config = task_config(edit_config(loaded) if edit_config else loaded, task, num_labels=num_labels, id2label=id2label,
                         problem_type=problem_type)
    model_class(config, task)  # a known task on a family with that head, else a UserError
    if not hf_io.has_weights(path):
        logger.warning("no weights in %s (only config.json): the %s model starts freshly initialized", path,
                       config.model_type)
        return config, create_model(config, dtype=dtype, seed=seed, task=task, execution=execution)
    return config, _load(path, config, dtype, seed, task, execution, param_dtype=param_dtype)
