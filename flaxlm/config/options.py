"""Every command-line option of every script, defined once, grouped as Hugging Face grouped them.

Names follow Hugging Face's run_mlm_flax.py / TrainingArguments so old command lines keep working.
"""
from dataclasses import dataclass

from flaxlm.config.cli import option, required

DTYPES = ("float32", "bfloat16", "float16")
REMAT_POLICIES = ("none", "full", "dots_saveable", "dots_with_no_batch_dims_saveable")  # flaxlm.models.layer_stack
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn")


@dataclass
class ModelArgs:
    model_name_or_path: str | None = option(help="Hugging Face model directory (or hub name) to start from; "
                                                 "omit to train from scratch with --config_name")
    model_type: str | None = option(help="model family, checked against config.json (bert, roberta, t5, gpt2, "
                                         "opt, llama)")
    config_name: str | None = option(help="directory (or hub name) holding config.json")
    tokenizer_name: str | None = option(help="directory (or hub name) holding the tokenizer")
    use_fast_tokenizer: bool = option(True, help="accepted for compatibility; tokenizers are always fast")
    dtype: str = option("float32", choices=DTYPES,
                        help="compute dtype; parameters stay float32 (bfloat16 is the fast choice on TPU/GPU)")
    token: str | None = option(help="hub token for private models and datasets")
    trust_remote_code: bool = option(False, help="allow code from the hub (off unless asked for)")
    scan_layers: bool = option(False, help="run the identical layers under jax.lax.scan: compiles one layer instead "
                                           "of N, same results (the saved weights are unchanged)")
    remat_policy: str = option("none", choices=REMAT_POLICIES,
                               help="recompute each layer's activations in the backward pass instead of keeping them: "
                                    "less memory for more compute. full keeps nothing (about one more forward pass), "
                                    "dots_saveable keeps the matmul outputs, dots_with_no_batch_dims_saveable those of "
                                    "the weight matmuls only, none keeps everything")
    attention_implementation: str = option("auto", choices=ATTENTION_IMPLEMENTATIONS,
                                           help="cudnn = fused flash attention on NVIDIA GPUs, bf16/fp16 only (used "
                                                "where attention dropout is off: eval, or a rate of 0); xla = "
                                                "XLA's; auto lets JAX choose")


@dataclass
class TextSourceArgs:
    dataset_name: str | None = option(help="name of a `datasets` dataset (needs network unless cached)")
    dataset_config_name: str | None = option(help="configuration of --dataset_name")
    train_file: list[str] | None = option(help="training text: txt, json, jsonl, csv or parquet; repeatable")
    validation_file: list[str] | None = option(help="validation text, same formats as --train_file")
    test_file: list[str] | None = option(help="test text, evaluated once after training with --do_predict")
    text_column: str | None = option(help="column holding the text (default: 'text', else the only string column)")
    streaming: bool = option(False, help="stream the data instead of loading it (corpora larger than memory)")
    cache_dir: str | None = option(help="where downloaded models and datasets are cached")


@dataclass
class DataArgs:
    validation_split_percentage: int = option(5, help="percent of train held out when there is no validation set")
    max_seq_length: int | None = option(help="tokens per example (default: the tokenizer's model_max_length, "
                                             "at most 512)")
    preprocessing_num_workers: int | None = option(help="processes for tokenization")
    overwrite_cache: bool = option(False, help="redo tokenization even if a cached result exists")
    max_train_samples: int | None = option(help="use only this many training examples (for quick runs)")
    max_eval_samples: int | None = option(help="use only this many validation examples")
    line_by_line: bool = option(False, help="one example per non-empty line instead of packed blocks")
    pack_lines: bool = option(True, help="with --line_by_line: several lines share a row, each attending only to "
                                         "itself with positions restarting (--pack_lines false: one line per row)")
    pad_to_max_length: bool = option(False, help="pad every example to max_seq_length (always done: static "
                                                 "shapes); accepted for compatibility")
    mlm_probability: float = option(0.15, help="fraction of tokens masked for the MLM loss (T5: the noise "
                                               "density, the fraction of tokens in corrupted spans)")


@dataclass
class SpanCorruptionArgs:
    mean_noise_span_length: float = option(3.0, help="T5 span corruption: mean length of a corrupted span")


@dataclass
class CausalLMArgs:
    block_size: int | None = option(help="tokens per training example (default: the tokenizer's model_max_length, "
                                         "at most 1024 and the model's positions)")
    keep_linebreaks: bool = option(True, help="keep the line breaks of .txt files (lines run on as the file's text; "
                                              "a text without a final line break is a document: EOS follows it)")


@dataclass
class TrainingArgs:
    output_dir: str = required(help="where checkpoints, logs and the exported model go")
    overwrite_output_dir: bool = option(False, help="write into a non-empty output_dir (only our files are replaced)")
    do_train: bool = option(True, help="train (on by default)")
    do_eval: bool = option(True, help="evaluate every --eval_steps and at the end (on by default)")
    do_predict: bool = option(False, help="after training, evaluate the test split (--test_file or the dataset's)")
    per_device_train_batch_size: int = option(8, help="examples per device per micro-step")
    per_device_eval_batch_size: int = option(8, help="examples per device per eval step")
    train_batch_size: int | None = option(help="global train batch (overrides the per-device size); "
                                               "must divide over the devices")
    eval_batch_size: int | None = option(help="global eval batch (overrides the per-device size)")
    gradient_accumulation_steps: int = option(1, help="micro-batches summed per optimizer step")
    cpu_chunk_tokens: int = option(1024, help="on CPU, run each device's micro-batch through the model in chunks "
                                              "of at least this many tokens (same gradient, faster in cache; 0: off)")
    lm_head_chunk_rows: int | None = option(help="rows (per device) whose LM-head logits the fused loss computes at "
                                                 "a time (default: 256 on CPU, ~64M logits on accelerators; 0: "
                                                 "all at once)")
    learning_rate: float = option(5e-5, help="peak learning rate")
    weight_decay: float = option(0.0, help="decoupled weight decay (not on biases and LayerNorm)")
    adam_beta1: float = option(0.9)
    adam_beta2: float = option(0.999)
    adam_epsilon: float = option(1e-8)
    adafactor: bool = option(False, help="use Adafactor instead of AdamW")
    max_grad_norm: float = option(1.0, help="clip gradients to this global norm (0 turns clipping off)")
    num_train_epochs: float = option(3.0, help="epochs to train (ignored when --max_steps > 0)")
    max_steps: int = option(-1, help="optimizer steps to train; overrides --num_train_epochs")
    warmup_steps: int = option(0, help="linear warmup steps, then linear decay to 0")
    logging_steps: int = option(500, help="log loss, tokens/s and MFU every N steps")
    eval_steps: int | None = option(help="evaluate every N steps (default: logging_steps)")
    eval_at_start: bool = option(False, help="also evaluate before the first step (the untrained baseline)")
    save_steps: int = option(500, help="checkpoint every N steps")
    save_total_limit: int | None = option(help="keep only the last N checkpoints")
    resume_from_checkpoint: str | None = option(help="checkpoint directory, or 'latest' in output_dir")
    async_checkpointing: bool = option(False, help="write checkpoints in the background while training goes on "
                                                   "(faster; a hard kill during a write loses that checkpoint too)")
    skip_nonfinite_steps: int = option(0, help="skip up to N steps whose loss or gradient is NaN/Inf (their "
                                               "update is never applied); one more stops the run")
    seed: int = option(42, help="seed for initialization, data order, masking and dropout")
    push_to_hub: bool = option(False, help="upload the exported model to the hub (needs network)")
    hub_model_id: str | None = option(help="repository name for --push_to_hub")
    hub_token: str | None = option(help="token for --push_to_hub")
    peak_flops: float | None = option(help="device peak FLOP/s for MFU (default: known table, measured on CPU)")
    report_to: str | None = option(help="accepted for compatibility; TensorBoard and metrics.jsonl are always written")
    eval_checkpoints: str | None = option(choices=("latest", "all"),
                                          help="evaluate the checkpoints of --output_dir instead of training: "
                                               "'latest' the newest once; 'all' each one as it appears, until the "
                                               "final step (continuous evaluation beside a running training job); "
                                               "results go to eval_metrics.jsonl there")
    eval_timeout: float = option(3600.0, help="with --eval_checkpoints all: stop after this many seconds without "
                                              "a new checkpoint")
    compilation_cache_dir: str = option("auto", help="where compiled steps are kept so that a rerun or a resumed "
                                                      "run does not compile again ('auto': ~/.cache/flaxlm/jax or "
                                                      "$XDG_CACHE_HOME/flaxlm/jax; 'none': off)")
    sharding: str = option("data", choices=("data", "fsdp"),
                           help="data: every device holds the whole params and optimizer state; fsdp: their large "
                                "arrays are split over the devices (models too big to replicate)")
    coordinator_address: str | None = option(help="multi-host run: HOST:PORT of process 0's coordinator (default: "
                                                  "found from the environment on TPU pods and SLURM)")
    num_processes: int | None = option(help="multi-host run: how many processes (with --coordinator_address)")
    process_id: int | None = option(help="multi-host run: this process's index, 0 to num_processes-1 "
                                         "(with --coordinator_address)")


@dataclass
class TokenizerArgs:
    output_dir: str = required(help="directory to save the tokenizer in (the model directory)")
    type: str = option("bpe", choices=("bpe", "wordpiece", "unigram"),
                       help="byte-level BPE (RoBERTa/GPT-2), WordPiece (BERT) or Unigram (T5)")
    vocab_size: int | None = option(help="vocabulary size (default: 50265 bpe, 30522 wordpiece, 32000 unigram)")
    min_frequency: int = option(2, help="minimum count for a merge / token")
    lowercase: bool | None = option(help="lowercase the text (default: on for wordpiece, off otherwise)")
    model_max_length: int = option(512, help="longest sequence the tokenizer is saved for")
    max_train_samples: int | None = option(help="train on at most this many texts")
    overwrite_output_dir: bool = option(False, help="replace tokenizer files already in output_dir")


@dataclass
class ConfigArgs:
    output_dir: str | None = option(help="model directory to write config.json into (usually holds the "
                                         "tokenizer); required unless --list_presets")
    preset: str = option("roberta-base", help="shape preset; see create_config.py --list_presets")
    set: list[str] | None = option(help="override config keys: --set key=value [key=value ...]")
    tokenizer_name: str | None = option(help="tokenizer directory for vocab_size and special ids "
                                             "(default: output_dir)")
    list_presets: bool = option(False, help="list the presets and exit")
    overwrite_output_dir: bool = option(False, help="replace a config.json already in output_dir")


@dataclass
class GenerateArgs:
    model_name_or_path: str = required(help="causal LM directory holding config.json and model.safetensors")
    tokenizer_name: str | None = option(help="directory holding the tokenizer (default: model_name_or_path)")
    prompt: list[str] | None = option(help="text to continue; repeatable (--prompt A --prompt B)")
    prompt_file: str | None = option(help="text file of prompts, one per line (blank lines skipped)")
    max_new_tokens: int = option(50, help="tokens to generate per prompt (fewer if EOS comes first)")
    do_sample: bool = option(False, help="sample (temperature, top_k, top_p) instead of greedy decoding")
    temperature: float = option(1.0, help="with --do_sample: divide the logits by this (> 0)")
    top_k: int = option(0, help="with --do_sample: draw from the k most likely tokens only (0: all)")
    top_p: float = option(1.0, help="with --do_sample: draw from the smallest set of tokens holding this "
                                    "probability mass (1: all)")
    seed: int = option(42, help="seed of the sampling")
    dtype: str = option("float32", choices=DTYPES, help="compute dtype; parameters stay float32")


@dataclass
class SentencePredictionArgs:
    task_name: str | None = option(help="a GLUE task name (cola, sst2, mrpc, qqp, stsb, mnli, qnli, rte, wnli) picks "
                                        "its metric and columns; any other task: set the columns yourself")
    sentence1_column: str | None = option(help="column of the (first) sentence (default: 'sentence' or 'text', "
                                               "else the first string column)")
    sentence2_column: str | None = option(help="column of the second sentence of a pair task")
    label_column: str = option("label", help="column of the label (class name, class id or a number)")
    is_regression: bool = option(False, help="predict a number (mean squared error) instead of a class")
    metric: str | None = option(help="the metrics every evaluation reports besides the loss, comma-separated: accuracy, "
                                     "f1 (of class 1 when there are two), macro_f1 (the mean over the classes), "
                                     "matthews (classification); pearson, spearman (regression) (default: GLUE's for "
                                     "--task_name, else accuracy or pearson)")


@dataclass
class QuestionAnsweringArgs:
    version_2_with_negative: bool = option(False, help="SQuAD v2.0: some questions have no answer in the context")
    doc_stride: int = option(128, help="tokens of overlap between the windows a long context is split into")
    n_best_size: int = option(20, help="start and end candidates considered per window")
    max_answer_length: int = option(30, help="longest answer in tokens")
    null_score_diff_threshold: float = option(0.0, help="SQuAD v2.0: predict no answer when the null score beats "
                                                        "the best span's by more than this")


EXPERIMENT_MODES = ("train", "eval", "train_and_eval", "continuous_eval")


@dataclass
class DriverArgs:  # train.py's own flags (its --config_file is added by flaxlm.config.cli: repeatable, nested yaml)
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
