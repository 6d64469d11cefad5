"""ModernBERT (model_type modernbert): a pre-LayerNorm encoder with rotary positions, a GeGLU MLP and attention
layers that alternate between global and local (sliding-window) attention; its masked-LM model and the
fine-tuning heads on it.

Configured by a transformers ModernBertConfig; the parameters map 1:1 to ModernBertForMaskedLM's (torch Linear
weights [out, in] are our kernels transposed). What sets it apart from BERT:
    positions: RoPE, no position table; config.layer_types says which layers are "full_attention" (global) and
        which "sliding_attention" (local), config.rope_parameters the theta of each kind (hub config.json files
        say global_attn_every_n_layers, global_rope_theta and local_rope_theta; transformers converts them);
    local attention: a token attends to the tokens at most local_attention // 2 positions away (a banded mask);
    layers: x + attn(attn_norm(x)), then x + mlp(mlp_norm(x)); layer 0 has no attn_norm (the embeddings' norm
        precedes it); a final_norm after the last layer; norms and linears without biases unless norm_bias,
        attention_bias, mlp_bias say otherwise;
    MLP: GeGLU, Wi to 2 x intermediate_size (input, gate), Wo(act(input) * gate);
    MLM head: dense (bias: classifier_bias), classifier_activation, norm, then the decoder: the token embeddings
        (tied; an own kernel when tie_word_embeddings is false) plus a bias (decoder_bias).
Logits are computed at every position (sparse_prediction, transformers' shortcut for the loss, changes nothing
here); padding keys are masked, as transformers' sdpa/eager path does (its flash-attention path unpads the batch
instead: the same logits at the real positions).

The fine-tuning heads compute what transformers' models compute (float32; dropout_key=None is eval):
    ModernBertForSequenceClassification: the first token (classifier_pooling "cls") or the mean over real tokens
        ("mean") -> head (dense, act, norm) -> dropout -> classifier;
    ModernBertForQuestionAnswering: head -> dropout -> classifier (2 outputs) at every token: start, end logits;
    ModernBertForTokenClassification: head -> dropout -> classifier at every token: [B, L, num_labels].
Their `head` is the masked-LM head's dense and norm under the same names, so fine-tuning from a masked-LM
checkpoint starts from them, as in transformers; only the classifier starts fresh.

The layers after the first are alike (whether one is global is an input, not a setting), so they run under
--scan_layers; layer 0 runs before them. Shape suffixes as in layers.py, plus R = H / 2 rotary frequencies.
"""
from types import SimpleNamespace

import jax
import jax.numpy as jnp
from flax import nnx

from flaxlm.errors import UserError
from flaxlm.models.bert import gather_rows, segment_positions
from flaxlm.models.family import (Family, Head, add_linear, add_norm, drop_prefixed, drop_tied_head, parts_of_output,
                                  with_prefix)
from flaxlm.models.layer_stack import Execution, run_layers
from flaxlm.models.layers import (LayerNorm, LMHead, Segments, activation, attention, compute_dtype, dense, dropout,
                                  embed, fold_key, split_last, untrained_at)
from flaxlm.models.rope import rope_of, rotate

LAYER_TYPES = ("full_attention", "sliding_attention")


def global_layers(config):
    """(bool per layer): True where the layer attends globally (config.layer_types' "full_attention")."""
    unknown = sorted(set(config.layer_types) - set(LAYER_TYPES))
    if unknown:
        raise UserError(f"unsupported layer type(s) {', '.join(unknown)} in config.json's layer_types; ModernBERT "
                        f"has {' and '.join(LAYER_TYPES)} layers")
    return tuple(t == "full_attention" for t in config.layer_types)


def layer_rope(config, layer_type, head_dim):
    """The Rope of one kind of layer: its entry of config.rope_parameters (theta, scaling)."""
    params = dict(config.rope_parameters[layer_type])
    view = SimpleNamespace(rope_parameters=params, max_position_embeddings=config.max_position_embeddings)
    return rope_of(view, head_dim)


class Inits:
    """transformers' initialization of ModernBERT: normals truncated at +-initializer_cutoff_factor std, std
    initializer_range for inputs, / sqrt(2 * layers) for the projections back to the residual stream."""

    def __init__(self, config):
        self.cutoff = config.initializer_cutoff_factor or 3.0
        self.input = config.initializer_range
        self.output = config.initializer_range / (2.0 * config.num_hidden_layers) ** 0.5
        self.classifier = config.hidden_size ** -0.5

    def dense(self, d_in, d_out, dtype, std, rngs, use_bias):
        return dense(d_in, d_out, dtype, std, rngs, use_bias=use_bias, cutoff=self.cutoff)


def norm(config, rngs):
    return LayerNorm(config.hidden_size, config.norm_eps, rngs, use_bias=config.norm_bias)


class Attention(nnx.Module):
    def __init__(self, config, dtype, rngs, execution, inits):
        D, bias = config.hidden_size, config.attention_bias
        self.Wqkv = inits.dense(D, 3 * D, dtype, inits.input, rngs, bias)
        self.Wo = inits.dense(D, D, dtype, inits.output, rngs, bias)
        self.num_heads = config.num_attention_heads
        self.window = config.local_attention // 2 + 1  # a local layer's keys: less than this many positions away
        self.dropout_rate = config.attention_dropout
        self.implementation = execution.attention_implementation

    def __call__(self, x_BLD, cos_sin_BLR, mask, is_global, key):
        """cos_sin_BLR: the layer kind's RoPE angles (Rope.cos_sin); mask: the padding [B, L], Segments of packed rows, or None; is_global: a bool, traced under
        --scan_layers (both kinds of attention are compiled then, and the layer's runs)."""
        (B, L, D), N = x_BLD.shape, self.num_heads
        qkv_BL3NH = self.Wqkv(x_BLD.reshape(B * L, D)).reshape(B, L, 3, N, D // N)
        q_BLNH = rotate(qkv_BL3NH[:, :, 0], *cos_sin_BLR)
        k_BLNH = rotate(qkv_BL3NH[:, :, 1], *cos_sin_BLR)

        def attend(window):
            return attention(q_BLNH, k_BLNH, qkv_BL3NH[:, :, 2], mask, window=window, dropout_rate=self.dropout_rate,
                             dropout_key=fold_key(key, 0), implementation=self.implementation)
        if isinstance(is_global, bool):
            o_BLNH = attend(None if is_global else self.window)
        else:
            o_BLNH = jax.lax.cond(is_global, lambda: attend(None), lambda: attend(self.window))
        return dropout(self.Wo(o_BLNH.reshape(B * L, D)), self.dropout_rate, fold_key(key, 1))


class GeGLU(nnx.Module):
    """Wo(dropout(act(input) * gate)), input and gate the two halves of Wi(x)."""

    def __init__(self, config, dtype, rngs, inits):
        D, F, bias = config.hidden_size, config.intermediate_size, config.mlp_bias
        self.Wi = inits.dense(D, 2 * F, dtype, inits.input, rngs, bias)
        self.Wo = inits.dense(F, D, dtype, inits.output, rngs, bias)
        self.act = config.hidden_activation
        self.dropout_rate = config.mlp_dropout

    def __call__(self, x_MD, key):
        input_MF, gate_MF = split_last(self.Wi(x_MD), (self.Wo.in_features,) * 2)
        return self.Wo(dropout(activation(self.act)(input_MF) * gate_MF, self.dropout_rate, key))


class EncoderLayer(nnx.Module):
    def __init__(self, config, dtype, rngs, execution, inits, first):
        self.attn_norm = None if first else norm(config, rngs)  # layer 0: Identity
        self.attn = Attention(config, dtype, rngs, execution, inits)
        self.mlp_norm = norm(config, rngs)
        self.mlp = GeGLU(config, dtype, rngs, inits)

    def __call__(self, x_BLD, cos_sin_BLR, mask, is_global, key):
        B, L, D = x_BLD.shape
        h_BLD = x_BLD if self.attn_norm is None else self.attn_norm(x_BLD)
        x_MD = x_BLD.reshape(B * L, D) + self.attn(h_BLD, cos_sin_BLR, mask, is_global, fold_key(key, 0))
        return (x_MD + self.mlp(self.mlp_norm(x_MD), fold_key(key, 1))).reshape(B, L, D)


class Embeddings(nnx.Module):
    """Token embeddings -> norm -> dropout (no positions: the layers rotate queries and keys)."""

    def __init__(self, config, dtype, rngs, inits):
        self.tok = embed(config.vocab_size, config.hidden_size, inits.input, rngs, inits.cutoff)
        self.norm = norm(config, rngs)
        self.dropout_rate = config.embedding_dropout
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else 0
        self.dtype = dtype

    def __call__(self, ids_BL, key):
        x_BLD = untrained_at(self.tok(ids_BL), ids_BL, self.pad_id)  # transformers' padding_idx
        return dropout(self.norm(x_BLD).astype(self.dtype), self.dropout_rate, key)


class ModernBertEncoder(nnx.Module):
    """ModernBertModel: embeddings, layers, final_norm; every head builds on it. execution: how the layers run
    (flaxlm.models.layer_stack.Execution; default a plain loop)."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        N = config.num_attention_heads
        if config.hidden_size % N or (config.hidden_size // N) % 2:
            raise UserError(f"hidden_size {config.hidden_size} must be num_attention_heads {N} times an even head "
                            f"width (rotary positions); fix config.json")
        activation(config.hidden_activation)  # fail early on an unsupported activation
        activation(config.classifier_activation)
        H, inits = config.hidden_size // N, Inits(config)
        self.is_global = global_layers(config)
        self.ropes = tuple(layer_rope(config, t, H) for t in ("sliding_attention", "full_attention"))
        self.dtype = compute_dtype(dtype)
        self.execution = execution or Execution()
        self.embeddings = Embeddings(config, self.dtype, rngs, inits)
        self.layers = nnx.List([EncoderLayer(config, self.dtype, rngs, self.execution, inits, i == 0)
                                for i in range(config.num_hidden_layers)])
        self.final_norm = norm(config, rngs)

    def encode(self, input_ids_BL, attention_mask_BL=None, dropout_key=None, segment_ids_BL=None):
        """The final_norm'ed output [B, L, D] (compute dtype); dropout_key=None is eval mode. segment_ids_BL:
        packed rows (1, 2, ... per sequence, 0 = padding): each sequence attends to itself, positions restart."""
        B, L = input_ids_BL.shape
        if segment_ids_BL is not None:  # a packed row's segments are contiguous: a window stays inside its own
            positions_BL, mask = segment_positions(segment_ids_BL), Segments(segment_ids_BL)
        else:
            positions_BL, mask = jnp.arange(L, dtype=jnp.int32)[None, :], attention_mask_BL
        local, whole = (rope_.cos_sin(positions_BL) for rope_ in self.ropes)  # once, for every layer of a kind

        def call(i, layer, x_BLD, is_global):  # is_global: a bool, or traced under --scan_layers
            cos_sin_BLR = jax.tree.map(lambda g, l: jnp.where(is_global, g, l), whole, local)
            return layer(x_BLD, cos_sin_BLR, mask, is_global, fold_key(dropout_key, i + 1))

        x_BLD = self.embeddings(input_ids_BL, fold_key(dropout_key, 0))
        flags = list(self.is_global)  # bools; stacked into an array under --scan_layers
        layers = list(self.layers)
        if layers:  # layer 0 differs (no attn_norm); the others are alike: a scan may run them
            x_BLD = call(0, layers[0], x_BLD, flags[0])
            x_BLD = run_layers(layers[1:], x_BLD, lambda i, layer, x, g: call(i + 1, layer, x, g), self.execution,
                               flags[1:])
        return self.final_norm(x_BLD)


class PredictionHead(nnx.Module):
    """ModernBertPredictionHead: dense (bias: classifier_bias) -> classifier_activation -> norm."""

    def __init__(self, config, dtype, rngs, inits):
        D = config.hidden_size
        self.dense = inits.dense(D, D, dtype, inits.output, rngs, config.classifier_bias)
        self.norm = norm(config, rngs)
        self.act = config.classifier_activation

    def __call__(self, x_MD):
        return self.norm(activation(self.act)(self.dense(x_MD)))


class MlmHead(PredictionHead):
    """The prediction head, then the decoder: the token embeddings (tied) or its own kernel, plus a bias."""

    def __init__(self, config, dtype, rngs, inits):
        super().__init__(config, dtype, rngs, inits)
        if config.decoder_bias:
            self.bias = nnx.Param(jnp.zeros((config.vocab_size,), jnp.float32))
        if not config.tie_word_embeddings:
            self.decoder = inits.dense(config.hidden_size, config.vocab_size, dtype, inits.output, rngs, False)


class ModernBertForMaskedLM(ModernBertEncoder):
    """The encoder with its masked-LM head (`mlm_head`: transformers' head and decoder)."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        self.mlm_head = MlmHead(config, self.dtype, rngs, Inits(config))

    def __call__(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *, masked_positions_BP=None,
                 dropout_key=None, hidden=False, segment_ids_BL=None):
        """Logits (float32) [B, L, V], or [B, P, V] at masked_positions_BP; dropout_key=None is eval mode. With
        hidden=True the rows [B, L or P, D] the decoder multiplies instead (see head()). token_type_ids_BL: the
        interface every encoder shares; ModernBERT has no token types and ignores them, as transformers does."""
        x_BLD = self.encode(input_ids_BL, attention_mask_BL, dropout_key, segment_ids_BL)
        if masked_positions_BP is not None:
            x_BLD = gather_rows(x_BLD, masked_positions_BP)
        B, P, D = x_BLD.shape
        h_BPD = self.mlm_head(x_BLD.reshape(B * P, D)).reshape(B, P, D)
        return h_BPD if hidden else self.head().logits(h_BPD)

    def head(self):
        """The decoder: the token embeddings (tied) or its kernel, and the bias (decoder_bias)."""
        head = self.mlm_head
        bias = head.bias[...] if hasattr(head, "bias") else None
        if hasattr(head, "decoder"):
            return LMHead(head.decoder.kernel[...], False, self.dtype, bias)
        return LMHead(self.embeddings.tok.embedding[...], True, self.dtype, bias)


class _TaskModel(ModernBertEncoder):
    """The encoder with a fine-tuning head: the prediction head, dropout and a classifier of num_labels outputs."""

    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        inits = Inits(config)
        self.head = PredictionHead(config, self.dtype, rngs, inits)
        self.classifier = inits.dense(config.hidden_size, config.num_labels, jnp.float32, inits.classifier, rngs,
                                      True)
        self.dropout_rate = config.classifier_dropout

    def classify(self, x_MD, key):
        """float32 [M, num_labels] of the rows x_MD."""
        h_MD = dropout(self.head(x_MD), self.dropout_rate, key)
        return self.classifier(h_MD.astype(jnp.float32))


class ModernBertForSequenceClassification(_TaskModel):
    def __init__(self, config, *, dtype="float32", rngs, execution=None):
        super().__init__(config, dtype=dtype, rngs=rngs, execution=execution)
        self.pooling = config.classifier_pooling  # "cls" or "mean" (transformers' config checks it)

    def __call__(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *, dropout_key=None):
        """float32 logits [B, num_labels] (one column for regression); token types ignored."""
        x_BLD = self.encode(input_ids_BL, attention_mask_BL, fold_key(dropout_key, 0))
        if self.pooling == "cls":
            x_BD = x_BLD[:, 0]
        else:  # the mean over the real tokens
            w_BL1 = (jnp.ones(input_ids_BL.shape) if attention_mask_BL is None else attention_mask_BL)[..., None]
            w_BL1 = w_BL1.astype(jnp.float32)
            x_BD = (x_BLD.astype(jnp.float32) * w_BL1).sum(axis=1) / w_BL1.sum(axis=1)
        return self.classify(x_BD, fold_key(dropout_key, 1))


class ModernBertForQuestionAnswering(_TaskModel):
    def __call__(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *, dropout_key=None):
        """float32 (start_logits_BL, end_logits_BL); token types ignored."""
        x_BLD = self.encode(input_ids_BL, attention_mask_BL, fold_key(dropout_key, 0))
        B, L, D = x_BLD.shape
        logits_BL2 = self.classify(x_BLD.reshape(B * L, D), fold_key(dropout_key, 1)).reshape(B, L, 2)
        return logits_BL2[..., 0], logits_BL2[..., 1]


class ModernBertForTokenClassification(_TaskModel):
    def __call__(self, input_ids_BL, attention_mask_BL=None, token_type_ids_BL=None, *, dropout_key=None):
        """float32 logits [B, L, num_labels]; token types ignored."""
        x_BLD = self.encode(input_ids_BL, attention_mask_BL, fold_key(dropout_key, 0))
        B, L, D = x_BLD.shape
        return self.classify(x_BLD.reshape(B * L, D), fold_key(dropout_key, 1)).reshape(B, L, -1)


def encoder_tensor_names(config):
    """Tensor names of ModernBertModel under model. -> our parameter paths (biases only where the config has them)."""
    nb = config.norm_bias
    names = [("model.embeddings.tok_embeddings.weight", ("embeddings", "tok", "embedding"), "copy")]
    add_norm(names, "model.embeddings.norm", ("embeddings", "norm"), nb)
    for i in range(config.num_hidden_layers):
        hf, ours = f"model.layers.{i}.", ("layers", str(i))
        if i:
            add_norm(names, f"{hf}attn_norm", (*ours, "attn_norm"), nb)
        add_linear(names, f"{hf}attn.Wqkv", (*ours, "attn", "Wqkv"), config.attention_bias)
        add_linear(names, f"{hf}attn.Wo", (*ours, "attn", "Wo"), config.attention_bias)
        add_norm(names, f"{hf}mlp_norm", (*ours, "mlp_norm"), nb)
        add_linear(names, f"{hf}mlp.Wi", (*ours, "mlp", "Wi"), config.mlp_bias)
        add_linear(names, f"{hf}mlp.Wo", (*ours, "mlp", "Wo"), config.mlp_bias)
    add_norm(names, "model.final_norm", ("final_norm",), nb)
    return names


def _add_prediction_head(names, config, ours):
    add_linear(names, "head.dense", (ours, "dense"), config.classifier_bias)
    add_norm(names, "head.norm", (ours, "norm"), config.norm_bias)


def tensor_names(config):
    """Tensor names of ModernBertForMaskedLM -> our paths; decoder.weight only when untied."""
    names = encoder_tensor_names(config)
    _add_prediction_head(names, config, "mlm_head")
    if not config.tie_word_embeddings:
        names.append(("decoder.weight", ("mlm_head", "decoder", "kernel"), "linear"))
    if config.decoder_bias:
        names.append(("decoder.bias", ("mlm_head", "bias"), "copy"))
    return names


def head_tensor_names(config, task):
    """Tensor names of ModernBertFor{SequenceClassification,QuestionAnswering,TokenClassification} -> our paths."""
    names = encoder_tensor_names(config)
    _add_prediction_head(names, config, "head")
    add_linear(names, "classifier", ("classifier",))
    return names


def _prefixed(tensors):
    """A bare ModernBertModel's tensors under model.; the rotary buffers older transformers saved dropped."""
    return with_prefix(tensors, "model.", ("embeddings", "layers", "final_norm"), buffers=("inv_freq",))


def normalize(config, tensors, notes):
    """Accept a bare ModernBertModel checkpoint (its masked-LM head then starts fresh) and a saved copy of the tied
    decoder (checked equal to the token embeddings)."""
    return drop_tied_head(config, _prefixed(tensors), "decoder.weight", "model.embeddings.tok_embeddings.weight")


def normalize_for_head(config, tensors, notes, task):
    """A checkpoint for fine-tuning: the masked-LM decoder is dropped (a note); its head (dense, norm) is the
    task's, as in transformers."""
    out, dropped = drop_prefixed(_prefixed(tensors), ("decoder.",))
    if dropped:
        notes.append(f"dropped the masked-LM decoder of the checkpoint ({', '.join(dropped)}), which "
                     f"{task.replace('_', ' ')} does not use")
    return out


# answerdotai/ModernBERT-base and -large config.json (their global/local layers and thetas as the hub writes them);
# modernbert-tiny is for tests and the CPU demo.
_MODERNBERT = dict(model_type="modernbert", vocab_size=50368, max_position_embeddings=8192, hidden_activation="gelu",
                   global_attn_every_n_layers=3, local_attention=128, global_rope_theta=160000.0,
                   local_rope_theta=10000.0, norm_eps=1e-5, norm_bias=False, attention_bias=False, mlp_bias=False,
                   decoder_bias=True, classifier_activation="gelu", classifier_bias=False, classifier_pooling="mean",
                   attention_dropout=0.0, embedding_dropout=0.0, mlp_dropout=0.0, classifier_dropout=0.0,
                   initializer_range=0.02, initializer_cutoff_factor=2.0, tie_word_embeddings=True,
                   pad_token_id=50283, bos_token_id=50281, eos_token_id=50282, cls_token_id=50281, sep_token_id=50282)


PRESETS = {
    "modernbert-base": {**_MODERNBERT, "hidden_size": 768, "num_hidden_layers": 22, "num_attention_heads": 12,
                        "intermediate_size": 1152},
    "modernbert-large": {**_MODERNBERT, "hidden_size": 1024, "num_hidden_layers": 28, "num_attention_heads": 16,
                         "intermediate_size": 2624},
    "modernbert-tiny": {**_MODERNBERT, "hidden_size": 64, "num_hidden_layers": 3, "num_attention_heads": 4,
                        "intermediate_size": 96, "vocab_size": 1024, "max_position_embeddings": 256,
                        "local_attention": 16, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
                        "cls_token_id": 0, "sep_token_id": 2},
}

MODERNBERT = Family(
    model_type="modernbert", name="ModernBERT", model=ModernBertForMaskedLM, tensor_names=tensor_names,
    normalize=normalize, architecture="ModernBertForMaskedLM", presets=PRESETS, script="run_mlm_flax.py",
    max_length=lambda config: config.max_position_embeddings, fresh_head="mlm_head",
    heads={"sequence_classification": Head(ModernBertForSequenceClassification,
                                           "ModernBertForSequenceClassification", ("head", "classifier")),
           "question_answering": Head(ModernBertForQuestionAnswering, "ModernBertForQuestionAnswering",
                                      ("head", "classifier")),
           "token_classification": Head(ModernBertForTokenClassification, "ModernBertForTokenClassification",
                                        ("head", "classifier"))},
    head_tensor_names=head_tensor_names, normalize_for_head=normalize_for_head,
    matrices=lambda config: {("attn", "Wqkv", "kernel"): parts_of_output(3),  # [3, N, H]: q, k, v
                             ("mlp", "Wi", "kernel"): parts_of_output(2)})  # input, gate
