#!/usr/bin/env python
"""ELECTRA pretraining (replaced-token detection) in JAX/Flax: a small generator and the discriminator, trained
together on one loss and sharing their embeddings (flaxlm.objectives.electra). The same script trains DeBERTa-v3
(deberta-v2 configs: a generator as wide as the discriminator and half as deep; --embedding_sharing gdes is the
DeBERTa-v3 paper's gradient-disentangled sharing).

Pipeline: options -> output directory -> tokenizer and the two models (new from --generator_config_name and
--config_name, or continued from --generator_name_or_path and --model_name_or_path) -> text -> fixed-length token
rows -> BERT masking -> training over all devices (generator MLM loss + --discriminator_weight x discriminator
loss) with evaluation and checkpoints -> export in Hugging Face format: the discriminator (ElectraForPreTraining;
DeBERTa: the encoder DebertaV2Model loads and its mask_predictions.* head) to --output_dir, the model to fine-tune,
and the generator (ElectraForMaskedLM / DebertaV2ForMaskedLM) to --output_dir/generator.

    python create_config.py --preset electra-small-generator --output_dir gen
    python create_config.py --preset electra-small-discriminator --output_dir disc
    python run_electra_flax.py --output_dir runs/x --config_name disc --generator_config_name gen \
        --tokenizer_name disc --train_file train.txt --validation_file valid.txt --max_seq_length 128 --max_steps 1000
    (DeBERTa-v3: --preset deberta-v3-small-generator and deberta-v3-small, and --embedding_sharing gdes)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from flaxlm.config.options import (DataArgs, ElectraArgs, MaskedLMArgs, ModelArgs, TextSourceArgs,  # noqa: E402
                                   TrainingArgs)
from flaxlm.config.cli import parse_args  # noqa: E402
from flaxlm.errors import run_main  # noqa: E402


def main(argv=None):
    model_args, electra_args, source, data_args, mlm_args, args = parse_args(
        ModelArgs, ElectraArgs, TextSourceArgs, DataArgs, MaskedLMArgs, TrainingArgs, argv=argv,
        prog="run_electra_flax.py", description=__doc__)
    import dataclasses
    from flaxlm.training import mesh as meshlib
    from flaxlm.data import rows
    from flaxlm.data.text import load_raw_text
    from flaxlm.data.mlm_masking import MLMMasker
    from flaxlm.errors import UserError
    from flaxlm.models import family_of, load_config, split_model
    from flaxlm.models.family import REPLACED_TOKEN_DETECTION as DISCRIMINATOR
    from flaxlm.objectives.electra import check_pair, electra_objective, join_params, model_params
    from flaxlm.training.output_dir import start_fresh
    from flaxlm.planning.compile_for import check_fit, compile_target, token_rows
    from flaxlm.training.opening import load_run_tokenizer
    from flaxlm.training.pipeline import (batch_sizes, export, load_model, resolve_seq_len, start_run,
                                          train_and_evaluate)
    from flaxlm.tokenization.loading import check_fits

    start_run(args, model_args)  # join the other hosts; check --output_dir and the hub before any work
    target = compile_target(args)  # --compile_for: the TPU slice (nothing written, no host joined); else None

    # Tokenizer and the two models: the discriminator (--config_name / --model_name_or_path) and the generator.
    gen_args = dataclasses.replace(model_args, model_type=None, config_name=electra_args.generator_config_name,
                                   model_name_or_path=electra_args.generator_name_or_path)
    if not (gen_args.config_name or gen_args.model_name_or_path):
        raise UserError("no generator given; pass --generator_config_name DIR (write one with create_config.py "
                        "--preset electra-small-generator) or --generator_name_or_path DIR to continue one")
    abstract = target is not None  # --compile_for: shapes only
    disc_config, discriminator = load_model(model_args, seed=args.seed, task=DISCRIMINATOR, abstract=abstract)
    shared = check_pair(load_config(gen_args.model_name_or_path or gen_args.config_name), disc_config)
    gen_config, generator = load_model(gen_args, seed=args.seed + 1, script="run_mlm_flax.py", abstract=abstract)
    tokenizer = load_run_tokenizer(model_args)
    check_fits(tokenizer, disc_config)
    seq_len = resolve_seq_len(data_args.max_seq_length, tokenizer, disc_config)
    masker = MLMMasker.from_tokenizer(tokenizer, seq_len, data_args.mlm_probability)
    (gen_graphdef, gen_params), (disc_graphdef, disc_params) = split_model(generator), split_model(discriminator)
    params = join_params(gen_params, disc_params, electra_args.embedding_sharing,  # one pytree
                         new_discriminator=not model_args.model_name_or_path, shared=shared)

    # Devices (--compile_for: the TPU slice's), batch sizes and the objective: the generator's MLM loss at the masked
    # slots + the discriminator's on its samples there.
    mesh = meshlib.make_mesh(target.devices if target else None)
    micro_batch, eval_batch, global_batch = batch_sizes(args, mesh)
    objective = electra_objective(gen_graphdef, disc_graphdef, gen_config, disc_config, masker, seq_len,
                                  electra_args.discriminator_weight, electra_args.sampling_temperature)
    if target:  # compile the steps for the slice, print what each device holds; exit 2 unless they fit
        return check_fit(target, args, model_args, params, objective, mesh, micro_batch, eval_batch,
                         token_rows(seq_len, tokenizer), disc_config.vocab_size)

    # Text -> token rows of seq_len (blocks; --line_by_line: lines, packed into rows) -> the rows of each step.
    raw = load_raw_text(source, data_args.validation_split_percentage, args.seed, include_test=args.do_predict)
    # Your own function may go here (a batch of texts in, int32 [n, seq_len] rows out); editing it re-tokenizes.
    make_rows = (rows.lines(tokenizer, seq_len, pack=mlm_args.pack_lines and rows.can_pack(raw))
                 if mlm_args.line_by_line else rows.blocks(tokenizer, seq_len))
    data = rows.from_text(raw, make_rows, seq_len, num_workers=data_args.preprocessing_num_workers,
                          overwrite_cache=data_args.overwrite_cache, max_train_samples=data_args.max_train_samples,
                          max_eval_samples=data_args.max_eval_samples)
    train_rows, eval_rows, test_rows, total_steps = rows.run_rows(data, args, global_batch)
    start_fresh(args)  # inputs all read

    # Train.
    params = train_and_evaluate(args, model_args, params, objective, train_rows, eval_rows, total_steps, mesh,
                                micro_batch, eval_batch, test_rows, config=disc_config)

    # Export in Hugging Face format: the generator under generator/, then the discriminator (and --push_to_hub).
    if params is not None:  # None: an evaluation job (--eval_checkpoints) exports nothing
        gen_out = dataclasses.replace(args, output_dir=os.path.join(args.output_dir, "generator"), push_to_hub=False)
        family = family_of(disc_config)
        export(gen_out, model_args, gen_config, model_params(params, "generator"), tokenizer,
               f"transformers.{family.architecture}")
        export(args, model_args, disc_config, model_params(params, "discriminator"), tokenizer,
               f"transformers.{family.heads[DISCRIMINATOR].architecture}")


if __name__ == "__main__":
    run_main(main)
