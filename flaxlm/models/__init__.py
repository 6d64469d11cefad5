"""Models: construction from a transformers config, and a functional (graphdef, params) view for jax.jit
(flaxlm.models.build's docstring shows them in use: create_model, split_model, apply_model, apply_hidden).

How the layers run (a loop or jax.lax.scan, rematerialization, the attention kernel): create_model(config,
execution=Execution(scan=True, remat="full")) (flaxlm.models.layer_stack); the params are the same either way.

Fine-tuning heads (the encoder families): create_model(config, task="sequence_classification",
"question_answering" or "token_classification"), or load_for_task(path, task) for the encoder of a pretrained checkpoint with that head (flaxlm.models.pretrained).

Each model family is one file (bert.py, t5.py, gpt2.py, llama.py, mistral.py, gemma2.py, bloom.py, ...) ending in its
Family entry
(flaxlm.models.family), registered in flaxlm.models.registry. The names below are re-exported from build.py,
registry.py, convert.py, pretrained.py and hf_io.py.
"""
from flaxlm.models.build import (abstract_model, apply_hidden, apply_model, count_config_params, count_params,
                                 create_model, decay_mask, merge_model, model_class, split_model)
from flaxlm.models.convert import from_hf_state_dict, to_hf_state_dict
from flaxlm.models.hf_io import load_config
from flaxlm.models.layer_stack import Execution
from flaxlm.models.pretrained import load_for_task, load_pretrained, save_config, save_pretrained, task_config
from flaxlm.models.registry import CAUSAL_LM_TYPES, MODELS, TASK_MODEL_TYPES, TASKS, check_causal_lm, family_of

__all__ = ["MODELS", "CAUSAL_LM_TYPES", "TASK_MODEL_TYPES", "TASKS", "check_causal_lm", "family_of", "model_class",
           "create_model", "split_model", "merge_model", "apply_model", "apply_hidden", "abstract_model", "Execution",
           "decay_mask", "count_params", "count_config_params", "load_config", "load_pretrained", "save_pretrained",
           "save_config", "load_for_task", "task_config", "to_hf_state_dict", "from_hf_state_dict"]
