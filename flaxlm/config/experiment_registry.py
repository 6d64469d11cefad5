"""The experiments train.py knows: each name maps to a run_*.py script, the option groups its main() parses, and
the defaults its typed config starts from (where they differ from flaxlm/config/options.py's).

Pretraining defaults follow the published recipes (Hugging Face's Norwegian RoBERTa/T5/GPT-2 recipes in
configs/, the BERT, OPT and Llama papers); fine-tuning defaults follow BERT's GLUE and SQuAD settings as Hugging
Face's run_glue.py / run_qa.py examples use them, with global batches that divide over 8 devices.
"""
import dataclasses
import difflib

from flaxlm.config.experiments import DRIVER_READ, config_class
from flaxlm.config.options import (CausalLMArgs, ConfigArgs, DataArgs, DPOArgs, GRPOArgs, LoraArgs, MaskedLMArgs, ModelArgs,
                                   PreparedDataArgs, QuestionAnsweringArgs, SentencePredictionArgs, SFTArgs,
                                   SpanCorruptionArgs, TextSourceArgs, TrainingArgs, script_fields)
from flaxlm.errors import UserError

# What each --mode sets of the options train.py owns (their set_by is --mode).
MODE_OPTIONS = {
    "train": {"do_train": True, "do_eval": False},
    "train_and_eval": {"do_train": True, "do_eval": True},
    "eval": {"eval_checkpoints": "latest"},
    "continuous_eval": {"eval_checkpoints": "all"},
}


@dataclasses.dataclass(frozen=True)
class Experiment:
    name: str
    script: str  # module of the run_*.py script at the repository root
    groups: tuple  # the option dataclasses its main() parses, in order
    pretraining: bool  # True: without config_name / model_name_or_path, task.model.preset names the architecture
    defaults: dict  # {dotted key: value} where this experiment's defaults differ from options.py's
    about: str

    def config_class(self):
        """The typed config of this experiment (one class per experiment: its instances compare equal)."""
        if self.name not in _CLASSES:
            fields = script_fields(self.groups, self.script)  # less the options the script does not read
            fields += [f for f in dataclasses.fields(ConfigArgs) if f.name in DRIVER_READ]
            _CLASSES[self.name] = config_class(self.name, fields, self.defaults)
        return _CLASSES[self.name]


_CLASSES = {}


MLM = (ModelArgs, TextSourceArgs, DataArgs, MaskedLMArgs, PreparedDataArgs, TrainingArgs)
CLM = (ModelArgs, TextSourceArgs, DataArgs, CausalLMArgs, PreparedDataArgs, LoraArgs, TrainingArgs)
SPAN = (ModelArgs, TextSourceArgs, DataArgs, SpanCorruptionArgs, PreparedDataArgs, TrainingArgs)
SENTENCE = (ModelArgs, TextSourceArgs, DataArgs, SentencePredictionArgs, TrainingArgs)
SQUAD = (ModelArgs, TextSourceArgs, DataArgs, QuestionAnsweringArgs, TrainingArgs)
SFT = (ModelArgs, TextSourceArgs, DataArgs, SFTArgs, LoraArgs, TrainingArgs)
DPO = (ModelArgs, TextSourceArgs, DataArgs, DPOArgs, LoraArgs, TrainingArgs)
GRPO = (ModelArgs, TextSourceArgs, DataArgs, GRPOArgs, LoraArgs, TrainingArgs)


def _optimizer(**values):
    return {f"trainer.optimizer.{k}": v for k, v in values.items()}


_EXPERIMENTS = [
    Experiment("roberta/mlm", "run_mlm_flax", MLM, True, {
        "task.model.preset": "roberta-base", "task.model.model_type": "roberta", "task.data.max_seq_length": 128,
        **_optimizer(learning_rate=3e-4, warmup_steps=1000, weight_decay=0.01, adam_beta2=0.98)},
        "RoBERTa masked-LM pretraining (Hugging Face's Norwegian RoBERTa-base recipe)"),
    Experiment("bert/mlm", "run_mlm_flax", MLM, True, {
        "task.model.preset": "bert-base-uncased", "task.model.model_type": "bert", "task.data.max_seq_length": 128,
        **_optimizer(learning_rate=1e-4, warmup_steps=10000, weight_decay=0.01)},
        "BERT masked-LM pretraining (the BERT paper's optimizer)"),
    Experiment("t5/span_corruption", "run_t5_mlm_flax", SPAN, True, {
        "task.model.preset": "t5-v1_1-base", "task.model.model_type": "t5", "task.data.max_seq_length": 512,
        **_optimizer(adafactor=True, learning_rate=5e-3, weight_decay=1e-3, warmup_steps=2000)},
        "T5 span-corruption pretraining (Hugging Face's Norwegian T5 v1.1-base recipe)"),
    Experiment("gpt2/clm", "run_clm_flax", CLM, True, {
        "task.model.preset": "gpt2", "task.model.model_type": "gpt2", "task.data.block_size": 512,
        **_optimizer(learning_rate=5e-3, warmup_steps=1000, weight_decay=0.01, adam_beta2=0.98)},
        "GPT-2 causal-LM pretraining (Hugging Face's Norwegian GPT-2 recipe)"),
    Experiment("opt/clm", "run_clm_flax", CLM, True, {
        "task.model.preset": "opt-125m", "task.model.model_type": "opt", "task.data.block_size": 1024,
        **_optimizer(learning_rate=6e-4, warmup_steps=2000, weight_decay=0.1, adam_beta2=0.95)},
        "OPT causal-LM pretraining or fine-tuning (the OPT paper's 125M optimizer)"),
    Experiment("llama/clm", "run_clm_flax", CLM, True, {
        "task.model.preset": "llama-100m", "task.model.model_type": "llama", "task.data.block_size": 1024,
        **_optimizer(learning_rate=3e-4, warmup_steps=2000, weight_decay=0.1, adam_beta2=0.95)},
        "Llama-style causal-LM pretraining (the Llama paper's optimizer)"),
    Experiment("bert/sentence_prediction", "run_classification", SENTENCE, False, {
        "task.model.preset": None, "task.data.max_seq_length": 128, "task.train_data.global_batch_size": 32,
        "trainer.num_train_epochs": 3.0, **_optimizer(learning_rate=2e-5)},
        "fine-tune a BERT/RoBERTa checkpoint to classify (or score) sentences and sentence pairs (GLUE)"),
    Experiment("bert/squad", "run_qa", SQUAD, False, {
        "task.model.preset": None, "task.data.max_seq_length": 384, "task.train_data.global_batch_size": 32,
        "trainer.num_train_epochs": 2.0, **_optimizer(learning_rate=3e-5)},
        "fine-tune a BERT/RoBERTa checkpoint for extractive question answering (SQuAD v1.1 / v2.0)"),
    Experiment("decoder/sft", "run_sft", SFT, False, {
        "task.model.preset": None, "task.train_data.global_batch_size": 8, "trainer.num_train_epochs": 3.0,
        **_optimizer(learning_rate=2e-5)},
        "supervised fine-tuning of a decoder on conversations (TRL's SFTTrainer defaults: lr 2e-5, 3 epochs)"),
    Experiment("decoder/dpo", "run_dpo", DPO, False, {
        "task.model.preset": None, "task.train_data.global_batch_size": 8, "trainer.num_train_epochs": 1.0,
        **_optimizer(learning_rate=1e-6)},
        "preference tuning of a decoder with DPO (TRL's DPOTrainer defaults: lr 1e-6, 1 epoch, beta 0.1)"),
    Experiment("decoder/grpo", "run_grpo", GRPO, False, {
        "task.model.preset": None, "task.train_data.global_batch_size": 64, "trainer.num_train_epochs": 1.0,
        **_optimizer(learning_rate=1e-6)},
        "online RL of a decoder with verifiable rewards: GRPO, DAPO, Dr. GRPO, GSPO (TRL's GRPOTrainer defaults: lr "
        "1e-6, 8 completions a prompt, loss dapo, beta 0)"),
]
EXPERIMENTS = {e.name: e for e in _EXPERIMENTS}


def get_experiment(name):
    """The registered experiment; UserError listing the known ones otherwise."""
    if name not in EXPERIMENTS:
        near = difflib.get_close_matches(str(name), list(EXPERIMENTS), n=1)
        hint = f"did you mean {near[0]}? " if near else ""
        raise UserError(f"unknown experiment '{name}'; {hint}known experiments: {', '.join(EXPERIMENTS)}")
    return EXPERIMENTS[name]
