"""The model families, found by config.model_type: one Family per family (flaxlm.models.family), defined in the
family's own file. Adding a family is one more entry in FAMILIES; everything below is derived from it."""
from flaxlm.errors import UserError
from flaxlm.models import (bert, bloom, deberta_v2, electra, gemma, gemma2, gemma3, gpt2, gpt_neo, gptj, llama,
                           mistral, mixtral, modernbert, mt5, olmoe, opt, qwen2, qwen2_moe, qwen3, qwen3_moe, t5,
                           xlm_roberta)

FAMILIES = {f.model_type: f for f in (
    bert.BERT,
    bert.ROBERTA,
    t5.T5,
    gpt2.GPT2,
    opt.OPT,
    llama.LLAMA,
    mistral.MISTRAL,
    mixtral.MIXTRAL,
    qwen2.QWEN2,
    qwen2_moe.QWEN2_MOE,
    qwen3.QWEN3,
    qwen3_moe.QWEN3_MOE,
    olmoe.OLMOE,
    electra.ELECTRA,
    xlm_roberta.XLM_ROBERTA,
    xlm_roberta.CAMEMBERT,
    modernbert.MODERNBERT,
    deberta_v2.DEBERTA_V2,
    mt5.MT5,
    mt5.UMT5,
    gpt_neo.GPT_NEO,
    gptj.GPTJ,
    bloom.BLOOM,
    gemma.GEMMA,
    gemma2.GEMMA2,
    gemma3.GEMMA3,
)}

MODELS = {model_type: f.model for model_type, f in FAMILIES.items()}  # model_type -> pretraining module class
# decoder-only families (run_clm_flax.py trains them; generate.py runs them)
CAUSAL_LM_TYPES = tuple(t for t, f in FAMILIES.items() if f.script == "run_clm_flax.py")
TASK_MODEL_TYPES = tuple(t for t, f in FAMILIES.items() if f.heads)  # the families with fine-tuning heads
TASKS = tuple(dict.fromkeys(task for f in FAMILIES.values() for task in f.heads))  # the fine-tuning tasks


def check_causal_lm(config, source, does="predict", hint=""):
    """UserError unless config is a decoder-only family's: "SOURCE holds a T model, which does not DOES text left to
    right; pass a causal LM (...)HINT"."""
    if config.model_type not in CAUSAL_LM_TYPES:
        raise UserError(f"{source} holds a {config.model_type} model, which does not {does} text left to right; pass "
                        f"a causal LM ({', '.join(CAUSAL_LM_TYPES)}){hint}")


def family_of(config):
    """The Family of config.model_type; UserError naming the supported ones."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise UserError(f"unsupported model_type {model_type!r}; supported: {', '.join(FAMILIES)}")
    return FAMILIES[model_type]
