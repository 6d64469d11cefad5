"""Every command-line option of every script, declared once with everything about it, grouped as Hugging Face
grouped them.

Names follow Hugging Face's run_mlm_flax.py / TrainingArguments so old command lines keep working. An option whose
name says token, key, secret or password holds a secret, never written, sent nor printed (flaxlm.secrets). Besides
its type, default, help and choices, an option may carry:
  key       its place in train.py's nested config (flaxlm.config.experiments), e.g. trainer.summary_interval
  minimum   the least value it takes (NaN/inf never pass for a float either)
  set_by    the train.py flag that sets it (train.py's config has no key for it)
  unless    (a required option) the option whose value makes it optional (None then)
"""
import dataclasses
from dataclasses import dataclass
from typing import ClassVar

DTYPES = ("float32", "bfloat16", "float16")
PARAM_DTYPES = ("float32", "bfloat16")
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")  # flaxlm.models.layer_stack
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash")


def option(default=None, **about):
    """A dataclass field for one option (`about`: its help and what the module docstring lists); a list default is
    copied for each instance."""
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata=_metadata(**about))
    return dataclasses.field(default=default, metadata=_metadata(**about))


def required(**about):
    """An option without a default: the command line or a config file must give it. Keyword-only, so that it may
    follow an option with a default (a base class's)."""
    return dataclasses.field(kw_only=True, metadata=_metadata(**about))


def _metadata(help="", key=None, minimum=None, choices=None, aliases=(), set_by=None, unless=None):
    about = {"key": key, "minimum": minimum, "choices": choices, "aliases": aliases, "set_by": set_by,
             "unless": unless}
    return {"help": help, **{name: value for name, value in about.items() if value not in (None, ())}}


@dataclass
class ModelLoadingArgs:
    """The model and tokenizer a script loads and the dtype it computes in: the training scripts' (ModelArgs) and
    generate.py's (GenerateArgs)."""
    model_name_or_path: str | None = option(key="task.model.model_name_or_path",
                                            help="Hugging Face model directory: config.json and safetensors weights")
    tokenizer_name: str | None = option(key="task.model.tokenizer_name",
                                        help="directory holding the tokenizer (default: --model_name_or_path)")
    dtype: str = option("float32", choices=DTYPES, key="task.model.dtype",
                        help="compute dtype; parameters stay float32 unless --param_dtype says otherwise (bfloat16 "
                             "is the fast choice on TPU/GPU)")


@dataclass
class ModelArgs(ModelLoadingArgs):
    """The training scripts' model: a checkpoint to start from (a hub name too), or a new one (--config_name,
    --model_type)."""
    model_name_or_path: str | None = option(key="task.model.model_name_or_path",
                                            help="Hugging Face model directory (or hub name) to start from; omit to "
                                                 "train from scratch with --config_name")
    tokenizer_name: str | None = option(key="task.model.tokenizer_name",
                                        help="directory (or hub name) holding the tokenizer (default: "
                                             "--model_name_or_path)")
    model_type: str | None = option(key="task.model.model_type",
                                    help="model family (bert, roberta, xlm-roberta, camembert, electra, deberta-v2, "
                                         "modernbert, t5, mt5, umt5, gpt2, opt, llama, mistral, qwen2, qwen3, gemma, "
                                         "gemma2, gemma3_text, gpt_neo, gptj, bloom), checked against "
                                         "config.json; with neither --config_name nor --model_name_or_path, a new "
                                         "model of transformers' default config for it, sized to the tokenizer (as "
                                         "Hugging Face's scripts did)")
    config_overrides: str | None = option(key="task.model.default_config_overrides",
                                          help="with --model_type alone: changes to its default config, as in Hugging "
                                               "Face's run_mlm.py (hidden_size=64,num_hidden_layers=2)")
    config_name: str | None = option(key="task.model.config_name", help="directory (or hub name) holding config.json")
    rope_scaling: str | None = option(key="task.model.rope_scaling",
                                      help="extend the model's context: its RoPE replaced by these rope_parameters "
                                           "(JSON, transformers' keys), e.g. '{\"rope_type\": \"yarn\", \"factor\": "
                                           "4.0}'; original_max_position_embeddings: the model's positions unless "
                                           "given; max_position_embeddings becomes original * factor, so --block_size "
                                           "may grow to it (docs/long-context.md)")
    use_fast_tokenizer: bool = option(True, key="task.model.use_fast_tokenizer",
                                      help="accepted for compatibility; tokenizers are always fast")
    token: str | None = option(key="task.model.token",
                              help="hub token for private models and datasets (HF_TOKEN or `hf auth login` keep it off "
                                   "the command line)")
    trust_remote_code: bool = option(False, key="task.model.trust_remote_code",
                                     help="allow code from the hub (off unless asked for)")
    scan_layers: bool = option(False, key="task.model.scan_layers",
                               help="run the layers under jax.lax.scan (identical layers, or a repeating pattern "
                                    "such as Gemma 2's local/global pairs): compiles one layer (or one pattern) "
                                    "instead of N, same results (the saved weights are unchanged)")
    remat_policy: str = option("none", choices=REMAT_POLICIES, key="task.model.remat_policy",
                               help="recompute each layer's activations in the backward pass instead of keeping them: "
                                    "less memory for more compute. full keeps nothing (about one more forward pass), "
                                    "dots_saveable keeps the matmul outputs, dots_with_no_batch_dims_saveable those of "
                                    "the weight matmuls only, none keeps everything")
    param_dtype: str | None = option(choices=PARAM_DTYPES, key="task.model.param_dtype",
                                     help="dtype of the parameters and optimizer state: float32 master weights (the "
                                          "default; a bfloat16 checkpoint is read as bfloat16 and converted on the "
                                          "devices), or bfloat16 (half the memory; updates lose precision; the export "
                                          "is bfloat16); a LoRA run's frozen base: bfloat16 unless this says")
    attention_implementation: str = option("auto", choices=ATTENTION_IMPLEMENTATIONS,
                                           key="task.model.attention_implementation",
                                           help="cudnn = fused flash attention on NVIDIA GPUs, bf16/fp16 only (with "
                                                "attention dropout too, cuDNN's own masks, but not under "
                                                "--scan_layers); splash = the TPU's flash attention (Pallas; where "
                                                "there is no score bias and no attention dropout, XLA elsewhere); xla "
                                                "= XLA's; auto lets JAX choose, takes splash on a TPU where it applies "
                                                "and cuDNN on a GPU for attention dropout where it applies")
    pad_vocab_multiple: int = option(1, minimum=1, key="task.model.pad_vocab_multiple",
                                     help="a causal LM's token embeddings and LM head hold the vocabulary rounded up "
                                          "to a multiple of this in memory (128: GPT-2's 50257 -> 50304, as nanoGPT), "
                                          "for tile-aligned head matmuls on a GPU/TPU (a speed option: measure "
                                          "whether it pays on the device); the padded rows are zeros and never "
                                          "predicted, the loss is the same and the export has vocab_size rows; "
                                          "resume a run's checkpoints with the same value. 1: no padding")

    output_router_logits: bool | None = option(key="task.model.output_router_logits",
                                               help="a mixture-of-experts model: add router_aux_loss_coef times the "
                                                    "load-balancing loss to the loss, as transformers' "
                                                    "output_router_logits (default: config.json's; the released "
                                                    "models say false)")
    router_aux_loss_coef: float | None = option(minimum=0, key="task.model.router_aux_loss_coef",
                                                help="a mixture-of-experts model: the load-balancing loss's weight "
                                                     "(default: config.json's)")
    router_z_loss_coef: float | None = option(minimum=0, key="task.model.router_z_loss_coef",
                                              help="a mixture-of-experts model: the weight of ST-MoE's router z-loss "
                                                   "(the mean squared logsumexp of the router logits; default: "
                                                   "config.json's, else 0; 1e-3 in ST-MoE)")


@dataclass
class TextSourceArgs:
    dataset_name: list[str] | None = option(key="task.data.dataset_name",
                                            help="name of a `datasets` dataset (needs network unless cached); the "
                                                 "pretraining scripts mix several by --dataset_weights")
    dataset_config_name: list[str] | None = option(key="task.data.dataset_config_name",
                                                   help="configuration of --dataset_name (several datasets: one "
                                                        "each, 'default' for one without any)")
    train_file: list[str] | None = option(key="task.train_data.input_path",
                                          help="training text: txt, json, jsonl, csv or parquet; repeatable")
    validation_file: list[str] | None = option(key="task.validation_data.input_path",
                                               help="validation text, same formats as --train_file")
    test_file: list[str] | None = option(key="task.test_data.input_path",
                                         help="test text, evaluated once after training with --do_predict")
    text_column: str | None = option(key="task.data.text_column",
                                     help="column holding the text (default: 'text', else the only string column)")
    streaming: bool = option(False, key="task.data.streaming",
                             help="stream the data instead of loading it (corpora larger than memory)")
    cache_dir: str | None = option(key="task.data.cache_dir", help="where downloaded models and datasets are cached")


@dataclass
class DataArgs:
    validation_split_percentage: int = option(5, key="task.data.validation_split_percentage",
                                              help="percent of train held out when there is no validation set")
    max_seq_length: int | None = option(minimum=1, key="task.data.max_seq_length",
                                        help="tokens per example (default: the tokenizer's model_max_length, at most "
                                             "512)")
    preprocessing_num_workers: int | None = option(minimum=1, key="task.data.preprocessing_num_workers",
                                                   help="processes for tokenization")
    overwrite_cache: bool = option(False, key="task.data.overwrite_cache",
                                   help="redo tokenization even if a cached result exists")
    max_train_samples: int | None = option(minimum=1, key="task.train_data.max_samples",
                                           help="use only this many training examples (for quick runs)")
    max_eval_samples: int | None = option(minimum=1, key="task.validation_data.max_samples",
                                          help="use only this many validation examples")
    pad_to_max_length: bool = option(False, key="task.data.pad_to_max_length",
                                     help="pad every example to max_seq_length (always done: static shapes); accepted "
                                          "for compatibility")
    mlm_probability: float = option(0.15, key="task.objective.mlm_probability",
                                    help="fraction of tokens masked for the MLM loss (T5: the noise density, the "
                                         "fraction of tokens in corrupted spans)")


@dataclass
class PreparedDataArgs:
    """Token rows made once by prepare_data.py instead of text, and the weights of mixed sources (run_mlm_flax,
    run_clm_flax, run_t5_mlm_flax)."""
    prepared_data: list[str] | None = option(key="task.data.prepared_data",
                                             help="directory prepare_data.py wrote: train on its rows instead of "
                                                  "tokenizing text (made with this run's tokenizer and length); "
                                                  "several: their rows mixed (--prepared_data_weights)")
    prepared_data_weights: list[float] | None = option(key="task.data.prepared_data_weights",
                                                       help="with several --prepared_data: each one's share of the "
                                                            "training rows (default: in proportion to their rows); "
                                                            "rows drawn by weight, seeded by --seed")
    train_file_weights: list[float] | None = option(key="task.data.train_file_weights",
                                                    help="each --train_file's share of the training rows: the files "
                                                         "(or glob patterns) become sources mixed by weight, seeded "
                                                         "by --seed, each named after its file in metrics.jsonl "
                                                         "(without it, several files are one source)")
    dataset_weights: list[float] | None = option(key="task.data.dataset_weights",
                                                 help="each --dataset_name's share of the training rows: the datasets "
                                                      "become sources mixed by weight, as --train_file_weights mixes "
                                                      "files")


@dataclass
class PrepareArgs:
    """prepare_data.py: whose rows it makes (the objective's training script) and where it writes them."""
    objective: str = option("mlm", choices=("mlm", "clm", "t5"),
                            help="the rows of run_mlm_flax.py (blocks; lines with --line_by_line), run_clm_flax.py "
                                 "(documents) or run_t5_mlm_flax.py (blocks of the span corruption's raw length)")
    output_dir: str = required(help="the directory of prepared rows (a run reads it with --prepared_data DIR); "
                                    "running again with the same options continues an interrupted preparation")
    tokenizer_name: str = required(help="directory (or hub name) of the tokenizer the training runs will use")
    shard_size_mb: float = option(256.0, minimum=0.001,
                                  help="MB of text per shard (an interrupted run redoes at most one unfinished shard "
                                       "per worker)")
    seed: int = option(42, minimum=0, help="seed of the validation hold-out: the training runs' --seed")


@dataclass
class MaskedLMArgs:
    """How run_mlm_flax.py lays text into rows and masks them (the other scripts do not take these)."""
    line_by_line: bool = option(False, key="task.data.line_by_line",
                                help="one example per non-empty line instead of packed blocks")
    pack_lines: bool = option(True, key="task.data.pack_lines",
                              help="with --line_by_line: several lines share a row, each attending only to itself "
                                   "with positions restarting (--pack_lines false: one line per row)")
    whole_word_mask: bool = option(False, key="task.objective.whole_word_mask",
                                   help="mask whole words (all pieces of a word together; words as the tokenizer "
                                        "marks them: WordPiece ##, byte-level BPE Ġ, SentencePiece ▁), still "
                                        "--mlm_probability of the tokens")


@dataclass
class ElectraArgs:
    """run_electra_flax.py's generator (the discriminator is --config_name / --model_name_or_path) and loss."""
    generator_config_name: str | None = option(key="task.model.generator_config_name",
                                               help="directory holding the generator's config.json (the discriminator's "
                                                    "family, same vocabulary and embedding width; ELECTRA: narrower, "
                                                    "DeBERTa-v3: shallower)")
    generator_name_or_path: str | None = option(key="task.model.generator_name_or_path",
                                                help="generator (ElectraForMaskedLM, DebertaV2ForMaskedLM) directory to "
                                                     "continue")
    discriminator_weight: float = option(50.0, minimum=0, key="task.objective.discriminator_weight",
                                         help="weight of the discriminator's loss (the ELECTRA paper's 50)")
    sampling_temperature: float = option(1.0, minimum=1e-6, key="task.objective.sampling_temperature",
                                         help="temperature of the generator's softmax that replacements are "
                                              "sampled from")
    embedding_sharing: str = option("shared", choices=("shared", "gdes"), key="task.objective.embedding_sharing",
                                    help="shared: one set of embeddings trained by both models (ELECTRA); gdes: the "
                                         "generator's, which the discriminator's loss does not reach, plus a delta "
                                         "of the discriminator's own (DeBERTa-v3)")


@dataclass
class SpanCorruptionArgs:
    mean_noise_span_length: float | None = option(key="task.objective.mean_noise_span_length",
                                                  help="T5 span corruption: mean length of a corrupted span "
                                                       "(default: 3 tokens; 20 with a byte tokenizer, as ByT5)")


@dataclass
class CausalLMArgs:
    block_size: int | None = option(minimum=1, key="task.data.block_size",
                                    help="tokens per training example (default: the tokenizer's model_max_length, at "
                                         "most 1024 and the model's positions)")
    keep_linebreaks: bool = option(True, key="task.data.keep_linebreaks",
                                   help="keep the line breaks of .txt files (lines run on as the file's text; a text "
                                        "without a final line break is a document: EOS follows it)")
    separate_documents: bool = option(False, key="task.data.separate_documents",
                                      help="rows stay packed, but no token attends across the EOS that ends its "
                                           "document, and positions restart after it: each document is computed as "
                                           "if alone (segment ids, in XLA and splash attention alike)")


@dataclass
class MultiHostArgs:
    """The processes of a multi-host run (JAX's distributed runtime): the training scripts and prepare_data.py."""
    coordinator_address: str | None = option(key="runtime.coordinator_address",
                                             help="multi-host run: HOST:PORT of process 0's coordinator (default: "
                                                  "found from the environment on TPU pods and SLURM)")
    num_processes: int | None = option(key="runtime.num_processes",
                                       help="multi-host run: how many processes (with --coordinator_address)")
    process_id: int | None = option(key="runtime.process_id",
                                    help="multi-host run: this process's index, 0 to num_processes-1 (with "
                                         "--coordinator_address)")


@dataclass
class TrainingArgs(MultiHostArgs):
    output_dir: str = required(set_by="--model_dir", unless="compile_for",
                               help="where checkpoints, logs and the exported model go")
    max_steps: int = option(-1, key="trainer.train_steps",
                            help="optimizer steps to train; overrides --num_train_epochs")
    num_train_epochs: float = option(3.0, minimum=0, key="trainer.num_train_epochs",
                                     help="epochs to train (ignored when --max_steps > 0)")
    overwrite_output_dir: bool = option(False, key="trainer.overwrite_output_dir",
                                        help="write into a non-empty output_dir (only our files are replaced)")
    do_train: bool = option(True, set_by="--mode", help="train (on by default)")
    do_eval: bool = option(True, set_by="--mode", help="evaluate every --eval_steps and at the end (on by default)")
    do_predict: bool = option(False, key="trainer.do_predict",
                              help="after training, evaluate the test split (--test_file or the dataset's)")
    per_device_train_batch_size: int = option(8, minimum=1, key="task.train_data.per_device_batch_size",
                                              help="examples per device per micro-step")
    per_device_eval_batch_size: int = option(8, minimum=1, key="task.validation_data.per_device_batch_size",
                                             help="examples per device per eval step")
    train_batch_size: int | None = option(minimum=1, key="task.train_data.global_batch_size",
                                          help="global train batch (overrides the per-device size); must divide over "
                                               "the devices")
    eval_batch_size: int | None = option(minimum=1, key="task.validation_data.global_batch_size",
                                         help="global eval batch (overrides the per-device size)")
    gradient_accumulation_steps: int = option(1, minimum=1, key="trainer.gradient_accumulation_steps",
                                              help="micro-batches summed per optimizer step")
    cpu_chunk_tokens: int = option(1024, minimum=0, key="trainer.cpu_chunk_tokens",
                                   help="on CPU, run each device's micro-batch through the model in chunks of at least "
                                        "this many tokens (same gradient, faster in cache; 0: off)")
    lm_head_chunk_rows: int | None = option(minimum=0, key="trainer.lm_head_chunk_rows",
                                            help="rows (per device) whose LM-head logits the fused loss computes at a "
                                                 "time (default: 256 on CPU, ~64M logits on accelerators; 0: all at "
                                                 "once)")
    learning_rate: float = option(5e-5, minimum=0, key="trainer.optimizer.learning_rate", help="peak learning rate")
    weight_decay: float = option(0.0, minimum=0, key="trainer.optimizer.weight_decay",
                                 help="decoupled weight decay (not on biases and LayerNorm)")
    adam_beta1: float = option(0.9, key="trainer.optimizer.adam_beta1")
    adam_beta2: float = option(0.999, key="trainer.optimizer.adam_beta2")
    adam_epsilon: float = option(1e-8, minimum=0, key="trainer.optimizer.adam_epsilon")
    adafactor: bool = option(False, key="trainer.optimizer.adafactor", help="use Adafactor instead of AdamW (as "
                             "--optim adafactor)")
    optim: str = option("adamw", key="trainer.optimizer.optim",
                        help="adamw (transformers' adamw_torch and other AdamW names too), adafactor, muon: Muon "
                             "(optax.contrib.muon) for the hidden matrices, AdamW for embeddings, head, norms and "
                             "biases, the update scaled so that an AdamW learning rate carries over; or "
                             "schedule_free_adamw (optax.contrib's; evaluated and exported at its averaged "
                             "parameters; use with --lr_scheduler_type constant_with_warmup)")
    max_grad_norm: float = option(1.0, minimum=0, key="trainer.optimizer.max_grad_norm",
                                  help="clip gradients to this global norm (0 turns clipping off)")
    warmup_steps: int = option(0, minimum=0, key="trainer.optimizer.warmup_steps",
                               help="steps of linear warmup from 0 (then --lr_scheduler_type's decay)")
    warmup_ratio: float = option(0.0, minimum=0, key="trainer.optimizer.warmup_ratio",
                                 help="warmup as a share of the training steps, when --warmup_steps is 0 "
                                      "(transformers')")
    lr_scheduler_type: str = option("linear", key="trainer.optimizer.lr_scheduler_type",
                                    help="transformers' schedule names: linear (decay to 0, the default), cosine, "
                                         "cosine_with_restarts, polynomial, constant, constant_with_warmup, "
                                         "inverse_sqrt, cosine_with_min_lr, cosine_warmup_with_min_lr, "
                                         "warmup_stable_decay")
    lr_scheduler_kwargs: str | None = option(key="trainer.optimizer.lr_scheduler_kwargs",
                                             help="the schedule's own settings as JSON, transformers' keys (e.g. "
                                                  "'{\"num_decay_steps\": 2000}' for warmup_stable_decay, "
                                                  "'{\"min_lr_rate\": 0.1}' for cosine_with_min_lr)")
    z_loss: float = option(0.0, minimum=0, key="trainer.z_loss",
                           help="PaLM's z-loss: add this times log(Z)^2 of each predicted token's softmax to the loss "
                                "(1e-4 in PaLM; 0: off); logged as z_loss")
    train_only: list[str] | None = option(key="trainer.train_only",
                                          help="train only these parameters (continued pretraining, e.g. after "
                                               "adapt_vocabulary.py): 'embeddings' (every parameter with a "
                                               "vocabulary-sized first or last dimension: the token embeddings, the "
                                               "LM head / output embeddings and their bias) and/or regular "
                                               "expressions searched in the parameters' '/'-joined paths (embed, "
                                               "lm_head, 'layers/0/'); the others get no update and no optimizer "
                                               "state for the first --freeze_steps steps (default: the whole run)")
    freeze_steps: int | None = option(minimum=1, key="trainer.freeze_steps",
                                      help="with --train_only: train only those parameters for this many steps, then "
                                           "everything (the others' optimizer state starts at zero then; the "
                                           "learning-rate schedule goes on)")
    logging_steps: int = option(500, minimum=1, key="trainer.summary_interval",
                                help="log loss, tokens/s and MFU every N steps")
    eval_steps: int | None = option(minimum=1, key="trainer.validation_interval",
                                    help="evaluate every N steps (default: logging_steps)")
    eval_at_start: bool = option(False, key="trainer.eval_at_start",
                                 help="also evaluate before the first step (the untrained baseline)")
    save_steps: int = option(500, minimum=1, key="trainer.checkpoint_interval", help="checkpoint every N steps")
    save_total_limit: int | None = option(minimum=1, key="trainer.max_to_keep", help="keep only the last N checkpoints")
    resume_from_checkpoint: str | None = option(key="trainer.resume_from_checkpoint",
                                                help="checkpoint directory, or 'latest' in output_dir")
    async_checkpointing: bool = option(False, key="trainer.async_checkpointing",
                                       help="write checkpoints in the background while training goes on (faster; a "
                                            "hard kill during a write loses that checkpoint too)")
    skip_nonfinite_steps: int = option(0, key="trainer.skip_nonfinite_steps",
                                       help="skip up to N steps whose loss or gradient is NaN/Inf (their update is "
                                            "never applied); one more stops the run")
    seed: int = option(42, minimum=0, key="trainer.seed",
                       help="seed for initialization, data order, masking and dropout")
    push_to_hub: bool = option(False, key="export.push_to_hub",
                               help="upload the exported model to the hub (needs network)")
    hub_model_id: str | None = option(key="export.hub_model_id", help="repository name for --push_to_hub")
    hub_token: str | None = option(key="export.hub_token",
                                   help="token for --push_to_hub (HF_TOKEN or `hf auth login` keep it off the command "
                                        "line)")
    peak_flops: float | None = option(key="trainer.peak_flops",
                                      help="device peak FLOP/s for MFU (default: known table, measured on CPU)")
    report_to: list[str] | None = option(key="trainer.report_to",
                                         help="where the run reports besides OUTPUT_DIR/metrics.jsonl: tensorboard "
                                              "(the default), wandb, mlflow, trackio, all (every one installed) or "
                                              "none; several with spaces or commas (each from its own package: pip "
                                              "install -r requirements-trackers.txt); the trackers read their usual "
                                              "environment variables (WANDB_PROJECT, WANDB_MODE, "
                                              "MLFLOW_TRACKING_URI, ...)")
    run_name: str | None = option(key="trainer.run_name",
                                  help="the run's name in the trackers (default: theirs; trackio: the output "
                                       "directory's name)")
    language: list[str] | None = option(key="export.language",
                                        help="the model's languages for its model card (README.md beside the "
                                             "export), as ISO 639 codes: --language no nb nn")
    license: str | None = option(key="export.license",
                                 help="the model's license for its model card (a hub license id: apache-2.0, mit, "
                                      "cc-by-4.0, ...)")
    eval_checkpoints: str | None = option(choices=("latest", "all"), set_by="--mode",
                                          help="evaluate the checkpoints of --output_dir instead of training: "
                                               "'latest' the newest once; 'all' each one as it appears, until the "
                                               "final step (continuous evaluation beside a running training job); "
                                               "results go to eval_metrics.jsonl there")
    eval_timeout: float = option(3600.0, minimum=0, key="trainer.eval_timeout",
                                 help="with --eval_checkpoints all: stop after this many seconds without a new "
                                      "checkpoint")
    compilation_cache_dir: str = option("auto", key="runtime.compilation_cache_dir",
                                        help="where compiled steps are kept so that a rerun or a resumed run does not "
                                             "compile again ('auto': ~/.cache/flaxlm/jax or "
                                             "$XDG_CACHE_HOME/flaxlm/jax; 'none': off)")
    sharding: str = option("data", choices=("data", "fsdp", "expert"), key="runtime.sharding",
                           help="data: every device holds the whole params and optimizer state; fsdp: their large "
                                "arrays are split over the devices (models too big to replicate); expert: a mixture "
                                "of experts' experts split over an 'expert' axis of --expert_parallel_size devices "
                                "(each device holds and runs its share of the experts), everything else as fsdp")
    expert_parallel_size: int | None = option(minimum=1, key="runtime.expert_parallel_size",
                                              help="with --sharding expert: devices per expert group, the 'expert' "
                                                   "axis; each holds num_experts / N experts and the group's token "
                                                   "copies (default: the largest number up to 8 dividing both the "
                                                   "device count and num_experts)")
    context_parallel_size: int = option(1, minimum=1, key="runtime.context_parallel_size",
                                        help="split each sequence's positions over this many devices (a 'context' "
                                             "axis of the mesh, consecutive devices), for rows too long for one "
                                             "device's memory: each holds 1 / N of the activations and computes the "
                                             "attention of its own queries over the gathered keys and values, in a "
                                             "load-balanced order (causal LMs; docs/long-context.md). A row is then "
                                             "one group's: --per_device_train_batch_size counts rows per group")
    compile_for: str | None = option(key="runtime.compile_for",
                                     help="check this run for a TPU slice (v4-8, v5e-8 or v5litepod-8, v5p-8, v6e-16, "
                                          "...) on any machine: compile its train and eval steps for every device of "
                                          "the slice from shapes alone (no weights or text read, nothing written; "
                                          "fine-tuning reads its labeled examples), print what each device holds, "
                                          "and exit 0 when it fits, 2 when not (needs libtpu: pip install -r "
                                          "requirements-tpu.txt)")


@dataclass
class TokenizerArgs:
    output_dir: str = required(help="directory to save the tokenizer in (the model directory)")
    type: str = option("bpe", choices=("bpe", "gpt2", "wordpiece", "unigram", "xlmr-unigram", "byte"),
                       help="bpe: byte-level BPE as RoBERTa has it, for encoders (<s> text </s>); gpt2: byte-level "
                            "BPE as GPT-2 has it, for decoders (<|endoftext|> its one special token, nothing added "
                            "around a text); wordpiece (BERT); unigram (T5); xlmr-unigram: Unigram as XLM-RoBERTa has "
                            "it (<s> <pad> </s> <unk> first, <mask> last; loads as XLMRobertaTokenizer); byte (ByT5: "
                            "UTF-8 bytes, nothing to train)")
    vocab_size: int | None = option(minimum=1,
                                    help="vocabulary size (default: 50265 bpe, 50257 gpt2, 30522 wordpiece, 32000 "
                                         "unigram and xlmr-unigram)")
    min_frequency: int = option(2, minimum=0, help="minimum count for a merge / token")
    lowercase: bool | None = option(help="lowercase the text (default: on for wordpiece, off otherwise)")
    model_max_length: int | None = option(minimum=1, help="longest sequence the tokenizer is saved for (default: 1024 "
                                                          "gpt2, 512 otherwise)")
    max_train_samples: int | None = option(minimum=1, help="train on at most this many texts")
    overwrite_output_dir: bool = option(False, help="replace tokenizer files already in output_dir")


@dataclass
class ConfigArgs:
    """create_config.py's options; train.py reads the two with a key itself (a model pretrained from scratch)."""
    output_dir: str | None = option(help="model directory to write config.json into (usually holds the tokenizer); "
                                         "required unless --list_presets")
    preset: str = option("roberta-base", key="task.model.preset",
                         help="shape preset; see create_config.py --list_presets")
    set: list[str] | None = option(key="task.model.config_overrides",
                                   help="override config keys: --set key=value [key=value ...]")
    tokenizer_name: str | None = option(help="tokenizer directory for vocab_size and special ids (default: "
                                             "output_dir)")
    list_presets: bool = option(False, help="list the presets and exit")
    overwrite_output_dir: bool = option(False, help="replace a config.json already in output_dir")


@dataclass
class GenerateArgs(ModelLoadingArgs):
    """generate.py's options."""
    required_options: ClassVar[tuple] = ("model_name_or_path",)  # optional where training scripts take it
    prompt: list[str] | None = option(help="text to continue; repeatable (--prompt A --prompt B)")
    prompt_file: str | None = option(help="text file of prompts, one per line (blank lines skipped)")
    max_new_tokens: int = option(50, minimum=1, help="tokens to generate per prompt (fewer if EOS comes first)")
    do_sample: bool = option(False, help="sample (temperature, top_k, top_p) instead of greedy decoding")
    temperature: float = option(1.0, help="with --do_sample: divide the logits by this (> 0)")
    top_k: int = option(0, minimum=0, help="with --do_sample: draw from the k most likely tokens only (0: all)")
    top_p: float = option(1.0, help="with --do_sample: draw from the smallest set of tokens holding this "
                                    "probability mass (1: all)")
    seed: int = option(42, minimum=0, help="seed of the sampling")
    chat: bool = option(False, help="each prompt a user turn of the tokenizer's chat template (the generation prompt "
                                    "added), as apply_chat_template + generate in transformers; the answer stops at "
                                    "the end of the turn (run_sft.py's export)")
    system: str | None = option(help="with --chat: a system turn before each prompt")
    adapter: str | None = option(help="a LoRA adapter (a LoRA run's export) put on the model")


@dataclass
class EvaluateLMArgs(ModelLoadingArgs):
    """evaluate_lm.py's options."""
    required_options: ClassVar[tuple] = ("model_name_or_path",)
    adapter: str | None = option(help="a LoRA adapter (a LoRA run's export) put on the model")
    validation_file: list[str] | None = option(help="held-out text: txt (a document per line), json/jsonl, csv or "
                                                    "parquet (a document per record); repeatable")
    dataset_name: str | None = option(help="a `datasets` dataset to read instead (needs network unless cached)")
    dataset_config_name: str | None = option(help="configuration of --dataset_name")
    dataset_split: str = option("test", help="split of --dataset_name to score")
    text_column: str | None = option(help="column holding the text (default: 'text', else the only string column)")
    cache_dir: str | None = option(help="where downloaded datasets are cached")
    max_eval_samples: int | None = option(minimum=1, help="score only the first this many documents")
    max_length: int | None = option(minimum=2, help="tokens of context the model sees at once (default: its "
                                                    "positions, e.g. 1024 for GPT-2)")
    stride: int | None = option(minimum=1, help="a document longer than --max_length goes in windows moved this "
                                                "many tokens at a time, each predicting only its new tokens, so "
                                                "every token has at least max_length - stride tokens of context "
                                                "(default: half of --max_length; --max_length itself: disjoint "
                                                "windows, as lm-eval's rolling log-likelihood)")
    per_device_eval_batch_size: int = option(8, minimum=1, help="windows per device per forward pass")
    sharding: str = option("data", choices=("data", "fsdp"),
                           help="data: every device holds the whole model; fsdp: the parameters split over the "
                                "devices (models too big for one)")
    output_file: str | None = option(help="also write the JSON line of results to this file")
    output_dir: str | None = option(help="also write results.json and each document's figures "
                                         "(predictions_validation.jsonl: log_likelihood, tokens, bytes) here")
    overwrite_output_dir: bool = option(False, help="replace the files of an earlier run in --output_dir")
    loss_by_position: int | None = option(minimum=1, help="also the mean loss (nats per token) by the position in "
                                                          "the window that predicts each token, in equal buckets of "
                                                          "N: [0, N), [N, 2N), ... up to --max_length (JSON key "
                                                          "loss_by_position): whether a context extension improved "
                                                          "the far positions")
    passkey_lengths: list[int] | None = option(minimum=1, help="also passkey retrieval at these prompt lengths in "
                                                               "tokens (each at most --max_length), e.g. 1024 4096: "
                                                               "a number hidden in filler text, asked for at the "
                                                               "end, counted retrieved when greedy decoding writes "
                                                               "it (JSON key passkey; without held-out text, only "
                                                               "this)")
    passkey_depths: int = option(5, minimum=1, help="with --passkey_lengths: trials per length, the number at "
                                                    "depths evenly spaced from the filler's start to its end")


@dataclass
class FewShotArgs(ModelLoadingArgs):
    """run_fewshot.py's options (its text: TextSourceArgs)."""
    required_options: ClassVar[tuple] = ("model_name_or_path", "output_dir", "prompt")
    adapter: str | None = option(help="a LoRA adapter (a LoRA run's export) put on the model")
    output_dir: str | None = option(help="directory for predictions_validation.jsonl and results.json")
    overwrite_output_dir: bool = option(False, help="replace the predictions of an earlier run in output_dir")
    task_type: str = option("choice", choices=("choice", "generate"),
                            help="choice: each question's answer is the choice its log-likelihood ranks first; "
                                 "generate: the answer is generated (greedy, the KV cache) up to a stop string")
    prompt: str | None = option(help="the question as a template over the example's columns, e.g. 'Tekst: {text}\\n"
                                     "Sentiment:' (the answer follows it)")
    separator: str = option("\n\n", help="between the solved examples and the question")
    num_fewshot: int = option(0, minimum=0, help="solved examples from the training split before each question "
                                                 "(the same ones for every question, drawn by --seed)")
    label_column: str = option("label", help="choice: the column of the gold label")
    choices: str | None = option(help="choice: each label's verbalization as JSON, e.g. '{\"Positive\": \" positiv\", "
                                      "\"Negative\": \" negativ\"}' (what is scored after the prompt)")
    target: str | None = option(help="generate: the answer as a template over the columns, e.g. ' {nb}' (the "
                                     "solved examples' answers and the reference)")
    source_column: str | None = option(help="generate: the column the copy-the-source baseline copies (default: the "
                                            "first column the prompt names)")
    stop: list[str] = option(["\n"], help="generate: the answer ends before the first of these strings")
    max_new_tokens: int = option(64, minimum=1, help="generate: tokens generated at most per question")
    metric: str = option("chrf", choices=("chrf", "squad"),
                         help="generate: chrf: chrF and BLEU (sacrebleu) against the target; squad: exact match and "
                              "F1 as run_qa.py scores them (SQuAD's), against the target or --answers_column")
    answers_column: str | None = option(help="generate, --metric squad: a column holding each question's gold "
                                              "answers (a list; the best-matching one counts, as in SQuAD)")
    chat: bool = option(False, help="each question a user turn of the model's chat template (a run_sft.py export), "
                                     "the solved examples earlier user and assistant turns (lm-eval's "
                                     "--fewshot_as_multiturn); the answer generated to the end of its turn")
    validation_split_percentage: int = option(0, help="percent of train held out as the questions when there is no "
                                                      "--validation_file (the fine-tuning scripts' seeded split)")
    max_train_samples: int | None = option(minimum=1, help="draw the solved examples from the first this many only")
    max_eval_samples: int | None = option(minimum=1, help="ask only the first this many questions")
    max_length: int | None = option(minimum=2, help="tokens of context (default: the model's positions, at most "
                                                    "2048); a longer prompt loses its beginning")
    per_device_eval_batch_size: int = option(8, minimum=1, help="rows per device per forward pass")
    seed: int = option(42, minimum=0, help="seed of the solved examples' draw and of the held-out split")


@dataclass
class SentencePredictionArgs:
    task_name: str | None = option(key="task.sentence_prediction.task_name",
                                   help="a GLUE task name (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli) picks "
                                        "its metric and columns; any other task: set the columns yourself")
    sentence1_column: str | None = option(key="task.sentence_prediction.sentence1_column",
                                          help="column of the (first) sentence (default: 'sentence' or 'text', else "
                                               "the first string column)")
    sentence2_column: str | None = option(key="task.sentence_prediction.sentence2_column",
                                          help="column of the second sentence of a pair task")
    label_column: str = option("label", key="task.sentence_prediction.label_column",
                               help="column of the label (class name, class id or a number)")
    is_regression: bool = option(False, key="task.sentence_prediction.is_regression",
                                 help="predict a number (mean squared error) instead of a class")
    metric: str | None = option(key="task.sentence_prediction.metric",
                                help="the metrics every evaluation reports besides the loss, comma-separated: "
                                     "accuracy, f1 (of class 1 when there are two), macro_f1 (the mean over the "
                                     "classes), matthews (classification); pearson, spearman (regression) (default: "
                                     "GLUE's for --task_name, else accuracy or pearson)")


@dataclass
class TokenClassificationArgs:
    tag_column: str = option("upos", key="task.token_classification.tag_column",
                             help="CoNLL-U files: the column of the tags: upos, xpos, or misc:KEY for KEY=tag in "
                                  "MISC (NorNE's entities: misc:name)")
    tokens_column: str = option("tokens", key="task.token_classification.tokens_column",
                                help="JSON lines or --dataset_name: the key of each sentence's list of words")
    tags_column: str = option("tags", key="task.token_classification.tags_column",
                              help="JSON lines or --dataset_name: the key of each sentence's list of tags (one "
                                   "per word; ClassLabel ids: their names)")
    label_all_tokens: bool = option(False, key="task.token_classification.label_all_tokens",
                                    help="train on every sub-token of a word (B-X becomes I-X after the first), "
                                         "not only its first; predictions are read at the first either way")
    metric: str | None = option(choices=("seqeval", "accuracy"), key="task.token_classification.metric",
                                help="seqeval: entity-level precision/recall/F1 of BIO tags besides accuracy; "
                                     "accuracy: per-word accuracy only (default: seqeval when the tags are BIO)")


@dataclass
class QuestionAnsweringArgs:
    version_2_with_negative: bool = option(False, key="task.squad.version_2_with_negative",
                                           help="SQuAD v2.0: some questions have no answer in the context")
    doc_stride: int = option(128, minimum=0, key="task.squad.doc_stride",
                             help="tokens of overlap between the windows a long context is split into")
    n_best_size: int = option(20, minimum=1, key="task.squad.n_best_size",
                              help="start and end candidates considered per window")
    max_answer_length: int = option(30, minimum=1, key="task.squad.max_answer_length",
                                    help="longest answer in tokens")
    null_score_diff_threshold: float = option(0.0, key="task.squad.null_score_diff_threshold",
                                              help="SQuAD v2.0: predict no answer when the null score beats the best "
                                                   "span's by more than this")


@dataclass
class Seq2SeqArgs:
    """run_seq2seq.py's options (flag names of Hugging Face's run_summarization_flax.py where it has them)."""
    source_column: str | None = option(key="task.seq2seq.source_column",
                                       help="column of the source text (default: --text_column, else 'source')")
    target_column: str = option("target", aliases=("--summary_column",), key="task.seq2seq.target_column",
                                help="column of the target text")
    source_prefix: str = option("", key="task.seq2seq.source_prefix",
                                help="text put before every source (T5's task prefixes, e.g. 'translate nn to nb: ')")
    max_source_length: int = option(512, minimum=1, key="task.seq2seq.max_source_length",
                                    help="source tokens kept (longer sources are truncated)")
    max_target_length: int = option(128, minimum=1, key="task.seq2seq.max_target_length",
                                    help="target tokens kept, EOS included (longer targets are truncated)")
    generation_max_length: int | None = option(minimum=2, key="task.seq2seq.generation_max_length",
                                               help="decoder length of evaluation's generation, counting the start "
                                                    "token as transformers' max_length does (default: "
                                                    "--max_target_length)")
    num_beams: int = option(1, minimum=1, key="task.seq2seq.num_beams",
                            help="beams of evaluation's generation (1: greedy); transformers' beam search")
    length_penalty: float = option(1.0, key="task.seq2seq.length_penalty",
                                   help="beam search scores a finished hypothesis sum(logprob) / length**this")
    predict_with_generate: bool = option(True, key="task.seq2seq.predict_with_generate",
                                         help="accepted for compatibility: every evaluation generates and reports "
                                              "BLEU, chrF and ROUGE")


@dataclass
class ChatTemplateArgs:
    """What the chat scripts (run_sft.py, run_dpo.py, run_grpo.py) share: the chat template (TRL's name)."""
    chat_template: str | None = option(aliases=("--chat_template_path",), key="task.chat.chat_template",
                                       help="the chat template conversations are rendered with: the tokenizer's own "
                                            "(default), chatml, or a jinja template file; the export's tokenizer "
                                            "keeps it")


@dataclass
class ChatArgs(ChatTemplateArgs):
    """What run_sft.py and run_dpo.py share: the chat template and the length of a training sequence (TRL's names)."""
    max_length: int | None = option(minimum=2, aliases=("--max_seq_length",), key="task.chat.max_length",
                                    help="tokens of a training sequence (TRL's max_length, max_seq_length in older "
                                         "TRL; longer ones are cut from their end; default: the tokenizer's "
                                         "model_max_length, at most 1024 and the model's positions)")


@dataclass
class SFTArgs(ChatArgs):
    """run_sft.py's options (TRL's SFTConfig names where it has them)."""
    train_on_prompt: bool = option(False, key="task.sft.train_on_prompt",
                                   help="train on every token, not only the assistant turns (a prompt's completion)")
    packing: bool = option(True, key="task.sft.packing",
                           help="lay whole examples into rows best-fit (each attends only to itself, positions from "
                                "0); false: one example per row")
    long_examples: str = option("truncate", choices=("truncate", "drop"), key="task.sft.long_examples",
                                help="an example longer than --max_length: cut to it (TRL's), or left out")


@dataclass
class DPOArgs(ChatArgs):
    """run_dpo.py's options (TRL's DPOConfig names)."""
    beta: float = option(0.1, minimum=0, key="task.dpo.beta",
                         help="how far the policy may move from the reference (DPO's beta)")
    loss_type: str = option("sigmoid", choices=("sigmoid", "ipo", "hinge"), key="task.dpo.loss_type",
                            help="sigmoid (DPO), ipo or hinge, as TRL defines them")
    label_smoothing: float = option(0.0, minimum=0, key="task.dpo.label_smoothing",
                                    help="with sigmoid: the share of pairs taken to be flipped (conservative DPO)")
    max_prompt_length: int | None = option(minimum=1, key="task.dpo.max_prompt_length",
                                           help="tokens of the prompt kept, from its end (default: all)")
    reference_model: str | None = option(key="task.dpo.reference_model",
                                         help="the reference's directory (default: the starting model); its "
                                              "log-probabilities are computed once, before the first step")
    precompute_ref_log_probs: bool = option(True, key="task.dpo.precompute_ref_log_probs",
                                            help="compute the reference's log-probabilities once, before the first "
                                                 "step (false, with LoRA: in every step, as the base with the "
                                                 "adapters off, as TRL does with a PEFT model)")


@dataclass
class GRPOArgs(ChatTemplateArgs):
    """run_grpo.py's options (TRL's GRPOConfig names): sampling, rewards and the loss."""
    reward_funcs: list[str] = option(["token_f1"], key="task.grpo.reward_funcs",
                                     help="reward functions: built-in names (exact_match, token_f1, format, length) "
                                          "or FILE.py:FUNCTION, TRL's signature f(prompts, completions, **columns) -> "
                                          "list of floats or None")
    reward_weights: list[float] | None = option(key="task.grpo.reward_weights",
                                                help="one weight per reward function (default: 1 each)")
    answer_column: str = option("answer", key="task.grpo.answer_column",
                                help="the column exact_match and token_f1 compare with (a string, a list of them, "
                                     "or SQuAD's answers)")
    reward_format_pattern: str = option(r"<answer>.*?</answer>", key="task.grpo.reward_format_pattern",
                                        help="the regular expression the format reward looks for in a completion")
    soft_punish_cache: int = option(64, minimum=0, key="task.grpo.soft_punish_cache",
                                    help="the length reward: tokens before --max_completion_length where its "
                                         "penalty starts (TRL's soft overlong punishment)")
    num_generations: int = option(8, minimum=2, key="task.grpo.num_generations",
                                  help="completions sampled for each prompt (a group)")
    max_prompt_length: int | None = option(minimum=1, key="task.grpo.max_prompt_length",
                                           help="tokens of a prompt kept, from its end (default: the longest prompt)")
    max_completion_length: int = option(256, minimum=1, key="task.grpo.max_completion_length",
                                        help="tokens a completion may have; one still going then is truncated")
    temperature: float = option(1.0, minimum=0, key="task.grpo.temperature",
                                help="sampling temperature (the log-probabilities are scored at it too, as TRL)")
    top_p: float = option(1.0, minimum=0, key="task.grpo.top_p", help="nucleus sampling's mass (1: off)")
    top_k: int = option(0, minimum=0, key="task.grpo.top_k", help="sample among the k likeliest tokens (0: off)")
    loss_type: str = option("dapo", choices=("grpo", "bnpo", "dr_grpo", "dapo"), key="task.grpo.loss_type",
                            help="how token losses are averaged: grpo (per completion), bnpo (per batch piece), "
                                 "dr_grpo (by max_completion_length), dapo (over the batch's tokens; TRL's default)")
    scale_rewards: str = option("group", choices=("group", "batch", "none"), key="task.grpo.scale_rewards",
                                help="divide advantages by the reward std of the group, the batch, or not (Dr. GRPO)")
    epsilon: float = option(0.2, minimum=0, key="task.grpo.epsilon", help="the ratio's lower clip: 1 - epsilon")
    epsilon_high: float | None = option(minimum=0, key="task.grpo.epsilon_high",
                                        help="the ratio's upper clip: 1 + epsilon_high (default: epsilon; DAPO: 0.28)")
    importance_sampling_level: str = option("token", choices=("token", "sequence"),
                                            key="task.grpo.importance_sampling_level",
                                            help="one ratio per token, or per sequence (GSPO)")
    num_iterations: int = option(1, minimum=1, key="task.grpo.num_iterations",
                                 help="optimizer steps on each batch of completions (the sampling policy's "
                                      "log-probabilities kept for the ratio)")
    beta: float = option(0.0, minimum=0, key="task.grpo.beta",
                         help="weight of the KL estimate to the reference (the starting model; with LoRA the base "
                              "with the adapters off); 0: no reference")
    use_bias_correction_kl: bool = option(True, key="task.grpo.use_bias_correction_kl",
                                          help="weigh each token's KL estimate by its importance ratio (TRL's default; "
                                               "the unbiased gradient of the KL to the reference)")
    mask_truncated_completions: bool = option(False, key="task.grpo.mask_truncated_completions",
                                              help="leave completions cut at --max_completion_length out of the loss")
    log_completions: bool = option(False, key="task.grpo.log_completions",
                                   help="write sample completions to completions.jsonl (and a W&B table) every "
                                        "--log_completions_steps")
    log_completions_steps: int | None = option(minimum=1, key="task.grpo.log_completions_steps",
                                               help="steps between completion samples (default: --logging_steps; "
                                                    "sets --log_completions)")


@dataclass
class DistillArgs(ChatArgs):
    """run_distill.py's options (TRL's GKDConfig names where it has them: lmbda, beta, temperature, seq_kd,
    max_new_tokens)."""
    mode: str = option("offline", choices=("offline", "gkd"), key="task.distill.mode",
                       help="offline: the teacher's top-k log-probabilities computed once, the student taught by the "
                            "forward KL on them; gkd: the teacher live beside the student (TRL's GKDTrainer)")
    teacher_model_name_or_path: str = required(key="task.distill.teacher", help="the teacher decoder's directory "
                                               "(or hub name); its tokenizer must be the student's")
    teacher_param_dtype: str | None = option(choices=PARAM_DTYPES, key="task.distill.teacher_param_dtype",
                                             help="the teacher's parameters' dtype (default: --param_dtype's; "
                                                  "bfloat16 halves a live teacher's memory)")
    data_format: str = option("auto", choices=("auto", "text", "conversations"), key="task.distill.data_format",
                              help="text: documents in blocks of --max_length, every token taught; conversations: "
                                   "the chat template, the answers taught; auto: text for .txt files and "
                                   "--prepared_data, else conversations")
    teacher_logits: str | None = option(key="task.distill.teacher_logits",
                                        help="offline: the directory of the teacher's top-k (default: "
                                             "OUTPUT_DIR/teacher_logits); reused when it holds these rows' top-k "
                                             "from this teacher at this temperature")
    top_k: int = option(32, minimum=1, key="task.distill.top_k",
                        help="offline: the teacher's likeliest tokens kept per position")
    tail: str = option("renormalize", choices=("renormalize", "bucket"), key="task.distill.tail",
                       help="offline: the teacher's mass outside its top k: both distributions renormalized over the "
                            "k (renormalize), or one more category holding the rest (bucket)")
    alpha: float = option(0.5, minimum=0, key="task.distill.alpha",
                          help="offline: the loss is alpha * T^2 * KL + (1 - alpha) * next-token cross-entropy")
    temperature: float | None = option(minimum=0, key="task.distill.temperature",
                                       help="offline: of the teacher's stored and the student's distributions "
                                            "(default 1); gkd: of sampling, as TRL's (default 0.9)")
    beta: float = option(0.5, minimum=0, key="task.distill.beta",
                         help="gkd: the generalized JSD's interpolation: 0 the forward KL, 1 the reverse KL")
    lmbda: float = option(0.5, minimum=0, key="task.distill.lmbda",
                          help="gkd: the share of steps trained on the student's own completions (on-policy)")
    seq_kd: bool = option(False, key="task.distill.seq_kd",
                          help="gkd: the other steps train on the teacher's completions instead of the data's")
    max_new_tokens: int = option(128, minimum=1, key="task.distill.max_new_tokens",
                                 help="gkd: the longest completion sampled (KV cache)")
    packing: bool = option(True, key="task.distill.packing",
                           help="offline, conversations: whole examples laid into rows best-fit (as run_sft.py)")
    max_prompt_length: int | None = option(minimum=1, key="task.distill.max_prompt_length",
                                           help="gkd: the prompt's tokens kept, from its end (text rows: the first "
                                                "this many tokens prompt; default: half of --max_length)")


@dataclass
class LoraArgs:
    """LoRA adapters on a decoder (run_sft.py, run_clm_flax.py, run_dpo.py, run_grpo.py), PEFT's names (flaxlm.models.lora)."""
    lora_rank: int | None = option(minimum=1, key="task.lora.rank",
                                   help="train LoRA adapters of this rank on the frozen base (held in bfloat16 unless "
                                        "--param_dtype says); the export is a PEFT adapter")
    lora_alpha: float = option(8.0, minimum=0, key="task.lora.alpha",
                               help="the adapters' output is scaled by alpha / rank (PEFT's lora_alpha)")
    lora_dropout: float = option(0.0, minimum=0, key="task.lora.dropout", help="dropout of the adapters' input")
    lora_target_modules: list[str] | None = option(key="task.lora.target_modules",
                                                   help="the layers that get adapters: module names (q_proj v_proj, "
                                                        "c_attn, ...) or one regular expression of whole module names "
                                                        "(default: every linear layer of attention and MLP)")
    lora_target_parameters: list[str] | None = option(key="task.lora.target_parameters",
                                                      help="the expert parameters of a mixture of experts that get "
                                                           "adapters, per expert (PEFT's target_parameters: "
                                                           "mlp.experts.gate_up_proj mlp.experts.down_proj; default: "
                                                           "none)")
    merge_lora: bool = option(False, key="task.lora.merge_lora",
                              help="export the base with the adapters multiplied in (a full model in the family's "
                                   "format) instead of the PEFT adapter")
    lora_adapter: str | None = option(key="task.lora.adapter",
                                      help="continue training the adapter in this directory (a LoRA run's export) on "
                                           "--model_name_or_path")
    lora_trainable_tokens: list[int] | None = option(key="task.lora.trainable_tokens",
                                                     help="token ids whose embedding (and untied LM head) rows train "
                                                          "with the adapters (PEFT's trainable_token_indices); the "
                                                          "tokens a chat template adds always do")
    merge_dtype: str | None = option(choices=DTYPES, key="task.lora.merge_dtype",
                                     help="the dtype of --merge_lora's export (default: the base checkpoint's)")


EXPERIMENT_MODES = ("train", "eval", "train_and_eval", "continuous_eval")


@dataclass
class DriverArgs:
    """train.py's own flags (its --config_file is flaxlm.config.cli's, read by flaxlm.config.experiments)."""
    experiment: str = required(help="the registered experiment to run, e.g. roberta/mlm or bert/sentence_prediction")
    mode: str = option("train_and_eval", choices=EXPERIMENT_MODES,
                       help="train; eval (the newest checkpoint in model_dir, once); train_and_eval; continuous_eval "
                            "(each checkpoint as it appears in model_dir, until the final one: an evaluation job "
                            "beside a running training job)")
    model_dir: str | None = option(help="the run's directory: checkpoints, logs, the export and experiment.yaml "
                                        "(the script's --output_dir)")
    params_override: list[str] | None = option(
        help="dotted key=value pairs, comma-separated (trainer.optimizer.learning_rate=2e-5,task.data.max_seq_length"
             "=128), or a yaml/json mapping; repeatable; wins over the config files")
    print_config: bool = option(False, help="print the resolved config (each key with its flag) and exit")


# The options of a script's groups that the script never reads, by script (its file name less .py): its --help does
# not list them, its command line and its section of a config file refuse them, train.py's config for it has no key
# for them, and its instances of the groups keep their defaults. The fine-tuning scripts hold their examples in
# memory (no `datasets` tokenization to spread over processes or cache, no masking); the chat scripts' length is
# --max_length (--max_seq_length its alias) and they read TRL's columns of a train and a validation split.
_IN_MEMORY = ("preprocessing_num_workers", "overwrite_cache", "mlm_probability")
_CHAT = (*_IN_MEMORY, "max_seq_length", "pad_to_max_length", "text_column", "test_file", "do_predict")
LEFT_OUT = {
    "run_clm_flax": ("mlm_probability", "pad_to_max_length"),
    "run_classification": _IN_MEMORY,
    "run_token_classification": (*_IN_MEMORY, "text_column"),
    "run_qa": (*_IN_MEMORY, "validation_split_percentage", "dataset_config_name", "text_column", "cache_dir"),
    "run_seq2seq": (*_IN_MEMORY, "max_seq_length", "pad_to_max_length"),
    "run_sft": _CHAT,
    "run_dpo": _CHAT,
    "run_grpo": _CHAT,
    "run_distill": ("mlm_probability", "max_seq_length", "pad_to_max_length", "text_column", "test_file",
                    "do_predict"),  # (text rows: tokenized with `datasets`, in processes, as run_clm_flax.py's)
}


def script_fields(groups, script=None):
    """The fields of the option groups that `script` (run_sft, or run_sft.py) reads: all but its LEFT_OUT."""
    left_out = LEFT_OUT.get(str(script).removesuffix(".py"), ())
    return [f for g in groups for f in dataclasses.fields(g) if f.name not in left_out]


def declared_fields():
    """Every option field declared here, each once (a field two groups share through a base class once too)."""
    groups = [g for g in globals().values() if isinstance(g, type) and dataclasses.is_dataclass(g)]
    return list({id(f): f for g in groups for f in dataclasses.fields(g)}.values())


@dataclass
class AdaptArgs:
    """adapt_vocabulary.py's options."""
    required_options: ClassVar[tuple] = ("model_name_or_path", "tokenizer_name", "output_dir")
    model_name_or_path: str | None = option(help="model directory to adapt (config.json, weights, its tokenizer)")
    tokenizer_name: str | None = option(help="directory of the new tokenizer (train_tokenizer.py)")
    output_dir: str | None = option(help="new, empty directory for the adapted model and its tokenizer")
    method: str = option("mean", choices=("random", "overlap", "mean", "focus"),
                         help="how new rows start: random (the family's initializer), overlap (shared tokens "
                              "copied), mean (FVT: the mean of the old pieces), focus (FOCUS, needs "
                              "--focus_train_file)")
    extend_vocabulary: int | None = option(minimum=1, help="keep the old vocabulary and tokenizer and append this "
                                                            "many tokens of the new tokenizer (rows by mean)")
    focus_train_file: str | None = option(help="text in the new language (one text per line): FOCUS's auxiliary "
                                               "embeddings; with --extend_vocabulary, ranks the new tokens")
    seed: int = option(0, minimum=0, help="seed of the random rows and of FOCUS's auxiliary embeddings")
    language: list[str] | None = option(help="the model's languages for its model card (README.md): --language no")
    license: str | None = option(help="the model's license for its model card (a hub license id)")


@dataclass
class UpcycleArgs:
    """upcycle_moe.py's options."""
    required_options: ClassVar[tuple] = ("model_name_or_path", "output_dir", "num_experts", "num_experts_per_tok")
    model_name_or_path: str | None = option(help="dense model directory (or hub name) to upcycle: config.json, "
                                                 "weights, its tokenizer (qwen3)")
    output_dir: str | None = option(help="new, empty directory for the mixture-of-experts model and the tokenizer")
    num_experts: int | None = option(minimum=2, help="experts per layer (at least 2: one would be the dense model), "
                                                   "each a copy of the dense layer's MLP")
    num_experts_per_tok: int | None = option(minimum=1, help="experts each token is routed to (at most "
                                                             "--num_experts)")
    router_init_std: float | None = option(minimum=0.0, help="standard deviation of the new routers' normal "
                                                             "weights (default: config.json's initializer_range)")
    seed: int = option(0, minimum=0, help="seed of the routers' weights")
    language: list[str] | None = option(help="the model's languages for its model card (README.md): --language no")
    license: str | None = option(help="the model's license for its model card (a hub license id)")


@dataclass
class SuiteArgs:
    """evaluate_suite.py's options."""
    model_name_or_path: str = required(help="the pretrained model directory to fine-tune on each task (config.json, "
                                            "weights, tokenizer)")
    suite: str = required(help="the suite's yaml file: its tasks, their files and flags (configs/suites/)")
    output_dir: str = required(help="directory for each task's run (OUTPUT_DIR/<task>) and results.json / .md")
    data_dir: str | None = option(help="folder the suite's file paths are relative to (default: $FLAXLM_DATA_DIR, "
                                       "else ../shared/data from the scripts' folder if it exists, else each "
                                       "task's dataset on the Hugging Face hub)")
    tasks: list[str] | None = option(help="run only these tasks of the suite (by name)")
    max_steps: int | None = option(minimum=1, help="train every task this many steps (quick runs; overrides the "
                                                   "suite's epochs)")
    bootstrap_resamples: int = option(1000, minimum=1, help="resamples of the validation examples behind each "
                                                           "score's 95 percent interval")
    bootstrap_seed: int = option(0, minimum=0, help="seed of the bootstrap resamples")
    baseline_model: str | None = option(help="a second causal LM whose bits per byte go beside the model's in the "
                                             "bits_per_byte tasks (e.g. the source of an adapted model)")
    overwrite_output_dir: bool = option(False, help="run into an output_dir that holds an earlier suite's runs "
                                                    "(each task's predictions are removed before it runs)")
    report_to: list[str] = option(["none"], help="trackers the results also go to (wandb, mlflow, trackio, "
                                                 "tensorboard, all; as the training scripts' --report_to); they are "
                                                 "always in OUTPUT_DIR/metrics.jsonl")
    run_name: str | None = option(help="the suite's run name in the trackers")
