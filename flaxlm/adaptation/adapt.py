"""adapt_vocabulary.py's steps: load the model and both tokenizers, build the rules, rebuild the vocabulary rows,
write the model with the new config and tokenizer."""
import copy
import os

from flaxlm.adaptation.extend import extend_tokenizer
from flaxlm.adaptation.rows import check_rows, rebuild
from flaxlm.models.vocabulary_tensors import vocabulary_axes
from flaxlm.adaptation.vocabulary import build_rules, check_roles, coverage
from flaxlm.errors import UserError
from flaxlm.files import check_new_dir
from flaxlm.models import create_model, family_of, load_config, load_pretrained, save_pretrained, split_model
from flaxlm.models.presets import special_ids
from flaxlm.tokenization.loading import load_tokenizer

_MASKED_LM_SCRIPTS = ("run_mlm_flax.py", "run_electra_flax.py")


def needed_roles(config):
    """The special tokens the family's pretraining objective needs."""
    script = family_of(config).script
    if script in _MASKED_LM_SCRIPTS:
        return ("mask_token", "pad_token")
    return ("pad_token", "eos_token") if script == "run_t5_mlm_flax.py" else ("eos_token",)


def check_inputs(args):
    """Every check that needs no model weights, before anything is loaded or written."""
    check_new_dir(args.output_dir)
    if args.method == "focus" and not args.focus_train_file:
        raise UserError("--method focus needs --focus_train_file (text in the new language)")
    if args.focus_train_file and not os.path.isfile(args.focus_train_file):
        raise UserError(f"--focus_train_file {args.focus_train_file} does not exist")
    if args.extend_vocabulary and args.method != "mean":
        raise UserError(f"--extend_vocabulary starts the added rows by mean, not --method {args.method}; drop "
                        f"--method")


def new_config(config, tokenizer, vocab_size):
    config = copy.deepcopy(config)
    config.vocab_size = vocab_size
    for key, value in special_ids(tokenizer, bool(getattr(config, "is_encoder_decoder", False))).items():
        setattr(config, key, value)
    return config


def adapt(args):
    """Write the adapted model into args.output_dir; returns the line that says what each rule covered."""
    check_inputs(args)
    old_tok = load_tokenizer(args.model_name_or_path, local_only=True)
    new_tok = load_tokenizer(args.tokenizer_name, local_only=True)
    config = load_config(args.model_name_or_path)
    if len(old_tok) > config.vocab_size:
        raise UserError(f"the source's tokenizer has {len(old_tok)} tokens but its embeddings only "
                        f"{config.vocab_size} rows; pass a model directory whose tokenizer matches its weights")
    if args.extend_vocabulary and args.extend_vocabulary > len(new_tok):
        raise UserError(f"--extend_vocabulary {args.extend_vocabulary} is larger than the new tokenizer's "
                        f"{len(new_tok)} tokens")
    if not args.extend_vocabulary:
        check_roles(new_tok, needed_roles(config))
    axes = vocabulary_axes(config)
    config, model = load_pretrained(args.model_name_or_path)  # the weights, once the inputs are known good
    params = split_model(model)[1]
    check_rows(params, axes, config.vocab_size)
    if args.extend_vocabulary:
        new_tok, rules, kinds = extend_tokenizer(old_tok, new_tok, args.extend_vocabulary, config.vocab_size,
                                                 args.focus_train_file)
        vocab_size = max(config.vocab_size, len(new_tok))
    else:
        rules, kinds = build_rules(args.method, new_tok, old_tok, args.focus_train_file, args.seed)
        vocab_size = len(new_tok)
    config = new_config(config, new_tok, vocab_size)
    fresh = split_model(create_model(config, seed=args.seed))[1]
    save_pretrained(args.output_dir, config, rebuild(params, fresh, axes, rules))
    new_tok.save_pretrained(args.output_dir)
    return f"{vocab_size} rows: {coverage(kinds, vocab_size)}"
