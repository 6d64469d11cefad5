"""Hugging Face checkpoints: tensor-name maps, safetensors load/save, config.json, hub download.

Each model family registers a Family in NAME_MAPS: a function returning (hf_name, our_path, kind) triples,
kind "linear" for a torch Linear weight [out, in] that is our kernel [in, out] transposed, "copy" otherwise;
a normalize function accepting other conventions (tied copies, old names); the architecture name; what a
bare checkpoint may lack; and the tie_word_embeddings value config.json gets on export.
The loader is strict: every tensor is used, none is missing, every shape matches.
"""
import copy
import json
import logging
import os
import re
import tempfile
from typing import Callable, NamedTuple

import numpy as np

from flaxlm import models
from flaxlm.errors import UserError
from flaxlm.models.t5 import ties_embeddings
from flaxlm.models.torch_weights import has_pickle_checkpoint, read_pickle_checkpoint

logger = logging.getLogger(__name__)

SAFE_WEIGHTS = "model.safetensors"
SAFE_INDEX = "model.safetensors.index.json"


# ---------------------------------------------------------------------------------------------------------
# Name maps


def _bert_prefix(config):
    return "roberta." if config.model_type == "roberta" else "bert."


def _torch_layers(names):
    """(norm, linear): add a LayerNorm's / a torch Linear's tensors under hf to `names`, as our path ours."""
    def norm(hf, ours):
        names.extend([(f"{hf}.weight", (*ours, "scale"), "copy"), (f"{hf}.bias", (*ours, "bias"), "copy")])

    def linear(hf, ours):
        names.extend([(f"{hf}.weight", (*ours, "kernel"), "linear"), (f"{hf}.bias", (*ours, "bias"), "copy")])
    return norm, linear


def bert_encoder_names(config):
    """Tensor names of the BERT / RoBERTa encoder (under bert. / roberta.) -> our parameter paths."""
    p = _bert_prefix(config)
    names = [
        (f"{p}embeddings.word_embeddings.weight", ("embeddings", "word", "embedding"), "copy"),
        (f"{p}embeddings.position_embeddings.weight", ("embeddings", "position", "embedding"), "copy"),
        (f"{p}embeddings.token_type_embeddings.weight", ("embeddings", "token_type", "embedding"), "copy"),
    ]
    norm, linear = _torch_layers(names)
    norm(f"{p}embeddings.LayerNorm", ("embeddings", "norm"))
    for i in range(config.num_hidden_layers):
        hf, ours = f"{p}encoder.layer.{i}.", ("layers", str(i))
        for proj in ("query", "key", "value"):
            linear(f"{hf}attention.self.{proj}", (*ours, "attn", proj))
        linear(f"{hf}attention.output.dense", (*ours, "attn", "out"))
        norm(f"{hf}attention.output.LayerNorm", (*ours, "attn_norm"))
        linear(f"{hf}intermediate.dense", (*ours, "mlp_in"))
        linear(f"{hf}output.dense", (*ours, "mlp_out"))
        norm(f"{hf}output.LayerNorm", (*ours, "mlp_norm"))
    return names


def bert_names(config):
    """Tensor names of BertForMaskedLM / RobertaForMaskedLM (transformers 5) -> our parameter paths."""
    names = bert_encoder_names(config)
    norm, linear = _torch_layers(names)
    if config.model_type == "roberta":
        linear("lm_head.dense", ("mlm_head", "dense"))
        norm("lm_head.layer_norm", ("mlm_head", "norm"))
        names.append(("lm_head.bias", ("mlm_head", "bias"), "copy"))
    else:
        linear("cls.predictions.transform.dense", ("mlm_head", "dense"))
        norm("cls.predictions.transform.LayerNorm", ("mlm_head", "norm"))
        names.append(("cls.predictions.bias", ("mlm_head", "bias"), "copy"))
    return names


def bert_task_names(config, task):
    """Tensor names of Bert/RobertaForSequenceClassification or *ForQuestionAnswering -> our paths
    (flaxlm.models.bert_heads): RoBERTa's classifier.dense / classifier.out_proj are our pooler / classifier."""
    names = bert_encoder_names(config)
    _, linear = _torch_layers(names)
    if task == "question_answering":
        linear("qa_outputs", ("qa_outputs",))
    elif config.model_type == "roberta":
        linear("classifier.dense", ("pooler",))
        linear("classifier.out_proj", ("classifier",))
    else:
        linear("bert.pooler.dense", ("pooler",))
        linear("classifier", ("classifier",))
    return names


def _bert_renamed(config, tensors):
    """Older and bare checkpoints in today's names: the model prefix added, gamma/beta renamed, buffers dropped."""
    p = _bert_prefix(config)
    out = {}
    for name, x in tensors.items():
        if name.split(".")[0] in ("embeddings", "encoder", "pooler"):  # a bare BertModel / RobertaModel
            name = p + name
        name = re.sub(r"(LayerNorm|layer_norm)\.gamma$", r"\1.weight", name)
        name = re.sub(r"(LayerNorm|layer_norm)\.beta$", r"\1.bias", name)
        if name.endswith((".position_ids", ".token_type_ids")):
            continue  # non-persistent buffers older transformers saved
        out[name] = x
    return out


def _drop(tensors, prefixes):
    """(tensors without the names starting with one of prefixes, the names dropped)."""
    dropped = sorted(n for n in tensors if n.startswith(prefixes))
    return {n: x for n, x in tensors.items() if not n.startswith(prefixes)}, dropped


def _bert_normalize(config, tensors, notes):
    """Accept older and bare checkpoints: add the model prefix, rename gamma/beta, drop buffers, the pooler,
    the NSP head and tied copies of the decoder (checked equal to what we tie them to)."""
    p = _bert_prefix(config)
    head = "lm_head." if config.model_type == "roberta" else "cls.predictions."
    out, dropped = _drop(_bert_renamed(config, tensors), (f"{p}pooler.", "cls.seq_relationship."))
    if dropped:
        notes.append(f"ignored {len(dropped)} tensor(s) masked-LM training does not use (pooler / next-sentence "
                     f"head): {', '.join(dropped)}")
    word = out.get(f"{p}embeddings.word_embeddings.weight")
    decoder_w = out.pop(f"{head}decoder.weight", None)
    if decoder_w is not None and word is not None and (
            decoder_w.shape != word.shape or not np.allclose(decoder_w, word)):
        raise UserError(f"tensor {head}decoder.weight differs from {p}embeddings.word_embeddings.weight; only "
                        f"checkpoints with tied input/output embeddings are supported")
    decoder_b = out.pop(f"{head}decoder.bias", None)
    if decoder_b is not None:
        out.setdefault(f"{head}bias", decoder_b)
    return out


def _bert_task_normalize(config, tensors, notes, task):
    """A checkpoint for fine-tuning: the pretraining heads (masked-LM, next-sentence) and a pooler the task's
    head does not use are dropped, each with a note; BERT's pooler is kept for sequence classification."""
    out, dropped = _drop(_bert_renamed(config, tensors), ("lm_head.", "cls.predictions.", "cls.seq_relationship."))
    if dropped:
        notes.append(f"dropped the pretraining head(s) of the checkpoint ({len(dropped)} tensor(s): masked-LM / "
                     f"next-sentence), which {task.replace('_', ' ')} does not use")
    if task != "sequence_classification" or config.model_type == "roberta":
        out, dropped = _drop(out, (f"{_bert_prefix(config)}pooler.",))
        if dropped:
            notes.append(f"dropped the checkpoint's pooler ({', '.join(dropped)}), which "
                         f"{task.replace('_', ' ')} with {config.model_type} does not use")
    return out


def t5_names(config):
    """Tensor names of T5ForConditionalGeneration (transformers 5) -> our parameter paths (flaxlm.models.t5).

    Hugging Face keeps each stack's relative-position bias in its first block only; encoder.embed_tokens and
    decoder.embed_tokens are the shared embeddings (never saved); lm_head.weight exists when untied (v1.1).
    """
    names = [("shared.weight", ("shared", "embedding"), "copy")]

    def norm(hf, ours):
        names.append((f"{hf}.weight", (*ours, "scale"), "copy"))

    def linear(hf, ours):
        names.append((f"{hf}.weight", (*ours, "kernel"), "linear"))

    ffn = ("wi_0", "wi_1", "wo") if config.is_gated_act else ("wi", "wo")
    for stack, n in (("encoder", config.num_layers), ("decoder", config.num_decoder_layers)):
        names.append((f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                      (stack, "relative_attention_bias", "embedding"), "copy"))
        for i in range(n):
            hf, ours = f"{stack}.block.{i}.layer.", (stack, "layers", str(i))
            for proj in ("q", "k", "v", "o"):
                linear(f"{hf}0.SelfAttention.{proj}", (*ours, "attn", proj))
            norm(f"{hf}0.layer_norm", (*ours, "attn_norm"))
            if stack == "decoder":
                for proj in ("q", "k", "v", "o"):
                    linear(f"{hf}1.EncDecAttention.{proj}", (*ours, "cross_attn", proj))
                norm(f"{hf}1.layer_norm", (*ours, "cross_norm"))
            f = 2 if stack == "decoder" else 1
            for w in ffn:
                linear(f"{hf}{f}.DenseReluDense.{w}", (*ours, "mlp", w))
            norm(f"{hf}{f}.layer_norm", (*ours, "mlp_norm"))
        norm(f"{stack}.final_layer_norm", (stack, "final_norm"))
    if not ties_embeddings(config):
        linear("lm_head", ("lm_head",))
    return names


def _same(a, b):
    return a.shape == b.shape and np.allclose(np.asarray(a, np.float32), np.asarray(b, np.float32))


def _t5_normalize(config, tensors, notes):
    """Drop what Hugging Face ties or ignores: the stacks' embed_tokens copies of shared.weight, a tied
    lm_head.weight (checked equal), decoder cross-attention's unused relative_attention_bias. An untied (v1.1)
    config whose checkpoint has no lm_head.weight (transformers 5 saves v1.1 models built from a config tied)
    gets a copy of shared.weight, which is what transformers computes with."""
    out = dict(tensors)
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"):
        x = out.pop(name, None)
        if x is None:
            continue
        if "shared.weight" not in out:
            out["shared.weight"] = x
        elif not _same(x, out["shared.weight"]):
            raise UserError(f"tensor {name} differs from shared.weight; only checkpoints whose encoder and decoder "
                            f"share the input embeddings (every T5) are supported")
    unused = "decoder.block.0.layer.1.EncDecAttention.relative_attention_bias.weight"
    if out.pop(unused, None) is not None:
        notes.append(f"ignored {unused} (cross-attention has no position bias; transformers ignores it too)")
    shared, head = out.get("shared.weight"), out.get("lm_head.weight")
    if ties_embeddings(config):
        if head is not None:
            if shared is not None and not _same(head, shared):
                raise UserError("tensor lm_head.weight differs from shared.weight but config.json describes original "
                                "T5 with tied embeddings; for an untied LM head (T5 v1.1) set tie_word_embeddings "
                                "to false in config.json")
            out.pop("lm_head.weight")
    elif head is None and shared is not None and getattr(config, "tie_word_embeddings", False):
        out["lm_head.weight"] = shared
        notes.append("the checkpoint has no lm_head.weight and its config.json ties it to shared.weight; the "
                     "untied LM head starts as a copy of the shared embeddings")
    return out


def gpt2_names(config):
    """Tensor names of GPT2LMHeadModel -> our paths (flaxlm.models.gpt2). Conv1D weights are [in, out] already."""
    names = [("transformer.wte.weight", ("embed", "embedding"), "copy"),
             ("transformer.wpe.weight", ("position", "embedding"), "copy")]

    def norm(hf, ours):
        names.extend([(f"{hf}.weight", (*ours, "scale"), "copy"), (f"{hf}.bias", (*ours, "bias"), "copy")])

    def conv1d(hf, ours):
        names.extend([(f"{hf}.weight", (*ours, "kernel"), "copy"), (f"{hf}.bias", (*ours, "bias"), "copy")])

    for i in range(config.n_layer):
        hf, ours = f"transformer.h.{i}.", ("layers", str(i))
        norm(f"{hf}ln_1", (*ours, "attn_norm"))
        conv1d(f"{hf}attn.c_attn", (*ours, "attn", "qkv"))
        conv1d(f"{hf}attn.c_proj", (*ours, "attn", "out"))
        norm(f"{hf}ln_2", (*ours, "mlp_norm"))
        conv1d(f"{hf}mlp.c_fc", (*ours, "fc_in"))
        conv1d(f"{hf}mlp.c_proj", (*ours, "fc_out"))
    norm("transformer.ln_f", ("final_norm",))
    if not getattr(config, "tie_word_embeddings", True):
        names.append(("lm_head.weight", ("lm_head", "kernel"), "linear"))
    return names


def _drop_tied_head(config, out, head, embeddings):
    """A tied config's head tensor, if saved, must equal the embeddings it is tied to; it is dropped."""
    if getattr(config, "tie_word_embeddings", True) and head in out:
        x = out.pop(head)
        if embeddings in out and not _same(x, out[embeddings]):
            raise UserError(f"tensor {head} differs from {embeddings} but config.json ties them; set "
                            f"tie_word_embeddings to false in config.json for an untied LM head")
    return out


def _gpt2_normalize(config, tensors, notes):
    """Accept a bare GPT2Model checkpoint (no 'transformer.' prefix, as the hub's gpt2 is saved), drop the
    causal-mask buffers older transformers saved, and a tied lm_head.weight (checked equal to wte)."""
    out = {}
    for name, x in tensors.items():
        if name.endswith((".attn.bias", ".attn.masked_bias")):
            continue  # buffers (the causal mask and its fill value), not weights; c_attn's bias ends .c_attn.bias
        if name.split(".")[0] in ("wte", "wpe", "h", "ln_f"):
            name = "transformer." + name
        out[name] = x
    return _drop_tied_head(config, out, "lm_head.weight", "transformer.wte.weight")


def opt_names(config):
    """Tensor names of OPTForCausalLM -> our paths (flaxlm.models.opt). Optional: biases (enable_bias), norm
    tensors (layer_norm_elementwise_affine), project_in/out (word_embed_proj_dim), the final norm, lm_head."""
    p = "model.decoder."
    names = [(f"{p}embed_tokens.weight", ("embed", "embedding"), "copy"),
             (f"{p}embed_positions.weight", ("position", "embedding"), "copy")]

    def norm(hf, ours):
        if config.layer_norm_elementwise_affine:
            names.extend([(f"{hf}.weight", (*ours, "scale"), "copy"), (f"{hf}.bias", (*ours, "bias"), "copy")])

    def linear(hf, ours, bias=config.enable_bias):
        names.append((f"{hf}.weight", (*ours, "kernel"), "linear"))
        if bias:
            names.append((f"{hf}.bias", (*ours, "bias"), "copy"))

    if config.word_embed_proj_dim != config.hidden_size:
        linear(f"{p}project_in", ("project_in",), bias=False)
        linear(f"{p}project_out", ("project_out",), bias=False)
    for i in range(config.num_hidden_layers):
        hf, ours = f"{p}layers.{i}.", ("layers", str(i))
        for proj in ("q", "k", "v"):
            linear(f"{hf}self_attn.{proj}_proj", (*ours, "attn", proj))
        linear(f"{hf}self_attn.out_proj", (*ours, "attn", "out"))
        norm(f"{hf}self_attn_layer_norm", (*ours, "attn_norm"))
        linear(f"{hf}fc1", (*ours, "fc_in"))
        linear(f"{hf}fc2", (*ours, "fc_out"))
        norm(f"{hf}final_layer_norm", (*ours, "mlp_norm"))
    if config.do_layer_norm_before and not getattr(config, "_remove_final_layer_norm", False):
        norm(f"{p}final_layer_norm", ("final_norm",))
    if not getattr(config, "tie_word_embeddings", True):
        linear("lm_head", ("lm_head",), bias=False)
    return names


def _opt_normalize(config, tensors, notes):
    """Accept a bare OPTModel checkpoint (names from 'decoder.', as some hub OPT files are saved) and drop a tied
    lm_head.weight (checked equal to the token embeddings)."""
    out = {("model." + name if name.startswith("decoder.") else name): x for name, x in tensors.items()}
    return _drop_tied_head(config, out, "lm_head.weight", "model.decoder.embed_tokens.weight")


def llama_names(config):
    """Tensor names of LlamaForCausalLM -> our paths (flaxlm.models.llama). Biases only with attention_bias /
    mlp_bias; lm_head.weight only when untied."""
    names = [("model.embed_tokens.weight", ("embed", "embedding"), "copy")]

    def linear(hf, ours, bias):
        names.append((f"{hf}.weight", (*ours, "kernel"), "linear"))
        if bias:
            names.append((f"{hf}.bias", (*ours, "bias"), "copy"))

    for i in range(config.num_hidden_layers):
        hf, ours = f"model.layers.{i}.", ("layers", str(i))
        names.append((f"{hf}input_layernorm.weight", (*ours, "attn_norm", "scale"), "copy"))
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            linear(f"{hf}self_attn.{proj}", (*ours, "attn", proj), config.attention_bias)
        names.append((f"{hf}post_attention_layernorm.weight", (*ours, "mlp_norm", "scale"), "copy"))
        for proj in ("gate_proj", "up_proj", "down_proj"):
            linear(f"{hf}mlp.{proj}", (*ours, "mlp", proj), getattr(config, "mlp_bias", False))
    names.append(("model.norm.weight", ("final_norm", "scale"), "copy"))
    if not getattr(config, "tie_word_embeddings", False):
        linear("lm_head", ("lm_head",), False)
    return names


def _llama_normalize(config, tensors, notes):
    """Accept a bare LlamaModel checkpoint (no 'model.' prefix), drop the rotary_emb.inv_freq buffers older
    transformers saved, and a tied lm_head.weight (checked equal to the token embeddings)."""
    out = {}
    for name, x in tensors.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue  # a buffer computed from config.json, not a weight
        if name.split(".")[0] in ("embed_tokens", "layers", "norm"):
            name = "model." + name
        out[name] = x
    return _drop_tied_head(config, out, "lm_head.weight", "model.embed_tokens.weight")


class Family(NamedTuple):
    names: Callable  # names(config) -> [(hf_name, our_path, kind)]
    normalize: Callable  # normalize(config, tensors, notes) -> tensors in the names' convention
    architecture: str  # config.json "architectures"
    fresh_head: str | None = None  # top-level parameter group a bare checkpoint may lack (started fresh)
    tie_word_embeddings: Callable = lambda config: True  # the value written to config.json on export


def _tie_word_embeddings(config):
    return bool(getattr(config, "tie_word_embeddings", True))


# config.model_type -> Family
NAME_MAPS = {
    "bert": Family(bert_names, _bert_normalize, "BertForMaskedLM", fresh_head="mlm_head"),
    "roberta": Family(bert_names, _bert_normalize, "RobertaForMaskedLM", fresh_head="mlm_head"),
    "t5": Family(t5_names, _t5_normalize, "T5ForConditionalGeneration", tie_word_embeddings=ties_embeddings),
    "gpt2": Family(gpt2_names, _gpt2_normalize, "GPT2LMHeadModel", tie_word_embeddings=_tie_word_embeddings),
    "opt": Family(opt_names, _opt_normalize, "OPTForCausalLM", tie_word_embeddings=_tie_word_embeddings),
    "llama": Family(llama_names, _llama_normalize, "LlamaForCausalLM", tie_word_embeddings=_tie_word_embeddings),
}


def _name_map(config):
    model_type = getattr(config, "model_type", None)
    if model_type not in NAME_MAPS:
        raise UserError(f"unsupported model_type {model_type!r}; supported: {', '.join(NAME_MAPS)}")
    return NAME_MAPS[model_type]


# fine-tuning task -> (Hugging Face class suffix, our parameter groups of its head, which a checkpoint may lack)
TASK_HEADS = {
    "sequence_classification": ("ForSequenceClassification", ("pooler", "classifier")),
    "question_answering": ("ForQuestionAnswering", ("qa_outputs",)),
}


class Layout(NamedTuple):
    """How one model (a family's pretraining model, or a fine-tuning head on BERT/RoBERTa) is saved."""
    names: list  # [(hf_name, our_path, kind)]
    normalize: Callable  # normalize(tensors, notes) -> tensors in the names' convention
    architecture: str
    fresh_groups: tuple  # top-level parameter groups a checkpoint may lack entirely (started fresh)


def task_of(params):
    """The fine-tuning task whose head `params` hold (flaxlm.models.bert_heads), or None."""
    if "qa_outputs" in params:
        return "question_answering"
    return "sequence_classification" if "classifier" in params else None


def layout(config, task=None):
    """The Layout of `config`'s pretraining model (task None) or of a fine-tuning task's model."""
    family = _name_map(config)
    if task is None:
        return Layout(family.names(config), lambda t, notes: family.normalize(config, t, notes),
                      family.architecture, (family.fresh_head,) if family.fresh_head else ())
    models.model_class(config, task)  # a known task on BERT/RoBERTa, else a UserError
    suffix, groups = TASK_HEADS[task]
    return Layout(bert_task_names(config, task), lambda t, notes: _bert_task_normalize(config, t, notes, task),
                  family.architecture.removesuffix("ForMaskedLM") + suffix, groups)


def _get(tree, path):
    for k in path:
        tree = tree[k]
    return tree


def _set(tree, path, value):
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def _describe(config):
    """'model_type 't5', 2+2 layers': what a mismatch message names of config.json."""
    layers = str(config.num_hidden_layers)
    if getattr(config, "num_decoder_layers", None) is not None:
        layers += f"+{config.num_decoder_layers}"
    return f"model_type {config.model_type!r}, {layers} layers"


def _list(names, limit=5):
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(names[:limit]) + more


# ---------------------------------------------------------------------------------------------------------
# State dicts


def to_hf_state_dict(config, params):
    """Our params -> {Hugging Face tensor name: float32 numpy array}, as transformers' save_pretrained writes
    (for a fine-tuning head's params, as the task's *ForSequenceClassification / *ForQuestionAnswering)."""
    out = {}
    for hf, path, kind in layout(config, task_of(params)).names:
        x = np.asarray(_get(params, path), dtype=np.float32)
        out[hf] = np.ascontiguousarray(x.T if kind == "linear" else x)
    return out


def from_hf_state_dict(config, tensors, *, init_params=None, seed=0, task=None):
    """{Hugging Face tensor name: array} -> our params (nested dict of float32 numpy arrays), for the family's
    pretraining model (task None) or a fine-tuning task's model (models.TASK_MODELS).

    A head the checkpoint lacks entirely (BERT/RoBERTa: the MLM head of a bare encoder; a task's head on a
    pretrained encoder) comes from `init_params` (default: a fresh init from seed), with a warning. Any other
    missing, unexpected or wrongly shaped tensor is a UserError.
    """
    spec = layout(config, task)
    notes = []
    tensors = spec.normalize(dict(tensors), notes)
    _, shapes = models.abstract_model(config, task=task)
    expected = spec.names
    absent = [g for g in spec.fresh_groups if not any(hf in tensors for hf, path, _ in expected if path[0] == g)]
    missing = [hf for hf, path, _ in expected if hf not in tensors and path[0] not in absent]
    if missing:
        raise UserError(f"checkpoint is missing tensor(s) {_list(missing)}; it does not match config.json "
                        f"({_describe(config)})")
    if absent:  # a bare encoder, or a pretrained one fine-tuned for the first time: the head starts fresh
        if init_params is None:
            _, init_params = models.split_model(models.create_model(config, seed=seed, task=task))
        if task is None:
            notes.append("the checkpoint has no masked-LM head (a bare encoder); the head starts freshly initialized")
        else:
            notes.append(f"the checkpoint has no {' / '.join(absent)} weights of the {task.replace('_', ' ')} "
                         f"head; they start freshly initialized (train them before use)")
        tensors = dict(tensors)
        for hf, path, kind in expected:
            if path[0] in absent:
                x = np.asarray(_get(init_params, path), np.float32)
                tensors[hf] = x.T if kind == "linear" else x
    unexpected = set(tensors) - {hf for hf, _, _ in expected}
    if unexpected:
        raise UserError(f"checkpoint has unexpected tensor(s) {_list(unexpected)}; it does not match config.json "
                        f"({_describe(config)})")
    params = {}
    for hf, path, kind in expected:
        want = tuple(_get(shapes, path).shape)
        want_hf = want[::-1] if kind == "linear" else want
        x = np.asarray(tensors[hf])
        if tuple(x.shape) != want_hf:
            if task is not None and path[0] in spec.fresh_groups:
                raise UserError(f"tensor {hf} of the checkpoint's {task.replace('_', ' ')} head has shape "
                                f"{tuple(x.shape)}, this task needs {want_hf} (num_labels={config.num_labels}); "
                                f"fine-tune from the pretrained model instead (a checkpoint without this head)")
            raise UserError(f"tensor {hf} has shape {tuple(x.shape)} but config.json implies {want_hf}; "
                            f"use the config.json the checkpoint was saved with")
        x = x.astype(np.float32)
        _set(params, path, np.ascontiguousarray(x.T if kind == "linear" else x))
    for note in notes:
        logger.warning("%s", note)
    return params


# ---------------------------------------------------------------------------------------------------------
# Files


def _atomic_write(path, write):
    """Call write(tmp_path) then move the file into place, so a crash never leaves half a file."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path) or ".", prefix=os.path.basename(path) + ".", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def save_config(output_dir, config, task=None):
    """Write config.json as the family's Hugging Face class writes it (or the fine-tuning task's class: with
    num_labels, id2label, label2id, problem_type), with its architecture and the tie_word_embeddings that
    transformers 4.x and 5.x both read right (T5 v1.1: false)."""
    family = _name_map(config)
    os.makedirs(output_dir, exist_ok=True)
    config = copy.deepcopy(config)
    config.architectures = [layout(config, task).architecture]
    config.tie_word_embeddings = family.tie_word_embeddings(config)
    config.dtype = "float32"
    _atomic_write(os.path.join(output_dir, "config.json"), lambda p: config.to_json_file(p, use_diff=True))


def save_pretrained(output_dir, config, params):
    """Write config.json and model.safetensors (float32) loadable by transformers' from_pretrained of the
    family's architecture (AutoModelForMaskedLM, T5ForConditionalGeneration), or for a fine-tuning head's
    params by AutoModelForSequenceClassification / AutoModelForQuestionAnswering."""
    from safetensors.numpy import save_file

    tensors = to_hf_state_dict(config, params)
    os.makedirs(output_dir, exist_ok=True)
    _atomic_write(os.path.join(output_dir, SAFE_WEIGHTS), lambda p: save_file(tensors, p, metadata={"format": "pt"}))
    save_config(output_dir, config, task_of(params))


def _looks_local(path):
    return os.path.isabs(path) or path.startswith((".", "~")) or path.count("/") > 1


def resolve_dir(path, allow_patterns=("config.json", "*.safetensors", "*.json")):
    """A local directory for `path`: itself if local, else a snapshot downloaded from the hub."""
    path = os.fspath(path)
    if os.path.isdir(os.path.expanduser(path)):
        return os.path.expanduser(path)
    if os.path.exists(path):
        raise UserError(f"{path} is a file; pass the model directory holding config.json")
    if _looks_local(path):
        raise UserError(f"directory {path} does not exist; pass a model directory holding config.json")
    try:
        from huggingface_hub import snapshot_download
        return snapshot_download(path, allow_patterns=list(allow_patterns))
    except Exception as e:  # network, auth, offline mode, unknown repo
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"could not download {path} from the hub ({type(e).__name__}: {reason}); download it "
                        f"beforehand and pass the local directory") from None


def load_config(path):
    """The transformers config in directory `path` (or a hub name); UserError if absent or invalid."""
    from transformers import AutoConfig

    path = resolve_dir(path, allow_patterns=("config.json",))
    file = os.path.join(path, "config.json")
    if not os.path.isfile(file):
        raise UserError(f"no config.json in {path}; pass a model directory (create one with create_config.py)")
    try:
        with open(file, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:  # unreadable, not UTF-8, not JSON (the message says where)
        raise UserError(f"invalid config.json in {path}: not JSON ({e}); fix it or write a new one with "
                        f"create_config.py") from None
    if not isinstance(data, dict):
        raise UserError(f"invalid config.json in {path}: a JSON {type(data).__name__}, not an object of config "
                        f"keys; fix it or write a new one with create_config.py")
    try:  # flaxlm runs its own model code only: a config's custom (hub) code is never needed, nor run
        return AutoConfig.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # no or unknown model_type, a value of the wrong type: transformers' own errors
        reason = " ".join(str(e).split())[:300] or type(e).__name__
        raise UserError(f"invalid config.json in {path} ({reason}); fix or regenerate it") from None


def read_safetensors(path):
    """{name: numpy array} from model.safetensors or the shards listed in model.safetensors.index.json
    (else from a pytorch_model.bin, read safely by torch when it is installed)."""
    from safetensors import safe_open

    index = os.path.join(path, SAFE_INDEX)
    if os.path.isfile(index):
        try:
            with open(index) as f:
                files = sorted(set(json.load(f)["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise UserError(f"invalid {index} ({e}); re-save the model") from None
    elif os.path.isfile(os.path.join(path, SAFE_WEIGHTS)):
        files = [SAFE_WEIGHTS]
    elif has_pickle_checkpoint(path):
        return read_pickle_checkpoint(path)  # through torch.load(weights_only=True) only
    else:
        raise UserError(f"no {SAFE_WEIGHTS} in {path}; pass a directory written by save_pretrained")
    tensors = {}
    for name in files:
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            raise UserError(f"shard {file} listed in {SAFE_INDEX} is missing; download the whole model again")
        try:
            with safe_open(file, framework="np") as f:
                for k in f.keys():
                    tensors[k] = f.get_tensor(k)
        except (OSError, ValueError) as e:
            raise UserError(f"cannot read {file} ({e}); the file is damaged, download or export it again") from None
        except Exception as e:  # safetensors raises its own SafetensorError for corrupt headers
            raise UserError(f"cannot read {file} ({type(e).__name__}: {e}); the file is damaged, download or "
                            f"export it again") from None
    return tensors


def load_pretrained(path, dtype="float32", *, seed=0, execution=None):
    """(config, model) from a directory holding config.json + safetensors (or a hub name); compute in dtype,
    the layers run as `execution` says (flaxlm.models.layer_stack.Execution; None: a plain loop).

    A bare BERT/RoBERTa encoder checkpoint gets a fresh MLM head initialized from `seed` (logged as a warning).
    """
    import jax
    import jax.numpy as jnp

    path = resolve_dir(path)
    config = load_config(path)
    _name_map(config)
    graphdef, _ = models.abstract_model(config, dtype, execution=execution)
    params = from_hf_state_dict(config, read_safetensors(path), seed=seed)
    return config, models.merge_model(graphdef, jax.tree.map(jnp.asarray, params))


def has_weights(path):
    return any(os.path.isfile(os.path.join(path, f)) for f in (SAFE_WEIGHTS, SAFE_INDEX)) or has_pickle_checkpoint(path)


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
    """(config, model) for fine-tuning: the BERT/RoBERTa encoder in directory `path` (a masked-LM export, a bare
    encoder or a checkpoint that has this task's head already) with the task's head (flaxlm.models.bert_heads),
    task "sequence_classification" or "question_answering". A head the checkpoint lacks starts fresh from
    `seed` (one warning), pretraining heads are dropped (a note); a directory holding only config.json gives a
    freshly initialized model. The config gets num_labels / id2label / label2id / problem_type (task_config).
    execution: how the layers run (flaxlm.models.layer_stack.Execution; None: a plain loop)."""
    import jax
    import jax.numpy as jnp

    path = resolve_dir(path)
    config = task_config(load_config(path), task, num_labels=num_labels, id2label=id2label,
                         problem_type=problem_type)
    models.model_class(config, task)  # a known task on BERT/RoBERTa, else a UserError
    if not has_weights(path):
        logger.warning("no weights in %s (only config.json): the %s model starts freshly initialized", path,
                       config.model_type)
        return config, models.create_model(config, dtype=dtype, seed=seed, task=task, execution=execution)
    graphdef, _ = models.abstract_model(config, dtype, task, execution)
    params = from_hf_state_dict(config, read_safetensors(path), seed=seed, task=task)
    return config, models.merge_model(graphdef, jax.tree.map(jnp.asarray, params))
