"""run_seq2seq.py end to end on a tiny T5 (metrics, predictions file, export into transformers), its metrics
against sacrebleu and rouge-score called directly, and an empty target."""
import json
import os

import pytest

import run_seq2seq
from run_helpers import expect_user_error, read_metrics
from flaxlm.tasks.seq2seq import WordTokenizer, copy_baseline, text_metrics


@pytest.fixture(scope="module")
def model_dir(model_dir_for):
    """A Unigram tokenizer with sentinels and a tiny T5 v1.1 config, written by our own scripts."""
    return model_dir_for("t5-v1_1-tiny", "unigram")


def write_pairs(path, pairs):
    with open(path, "w", encoding="utf-8") as f:
        for source, target in pairs:
            f.write(json.dumps({"nn": source, "nb": target}, ensure_ascii=False) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def pairs_file(corpus, tmp_path_factory):
    """40 pairs: a line of the demo corpus and its words in reverse order."""
    lines = [line.strip() for line in open(corpus["validation"], encoding="utf-8") if len(line.split()) > 3]
    pairs = [(" ".join(line.split()[:8]), " ".join(line.split()[:8][::-1])) for line in lines[:40]]
    return write_pairs(tmp_path_factory.mktemp("pairs") / "pairs.jsonl", pairs)


def args_for(model_dir, pairs_file, out, *extra):
    return ["--output_dir", str(out), "--config_name", model_dir, "--tokenizer_name", model_dir,
            "--train_file", pairs_file, "--source_column", "nn", "--summary_column", "nb",
            "--validation_split_percentage", "20", "--max_source_length", "24", "--max_target_length", "16",
            "--per_device_train_batch_size", "1", "--per_device_eval_batch_size", "1", "--learning_rate", "3e-3",
            "--warmup_steps", "1", "--logging_steps", "1", *extra]


def test_end_to_end_predictions_metrics_and_export(model_dir, pairs_file, tmp_path):
    out = tmp_path / "run"
    run_seq2seq.main(args_for(model_dir, pairs_file, out, "--max_steps", "4", "--eval_steps", "4",
                              "--num_beams", "2", "--length_penalty", "0.8", "--predict_with_generate"))
    final = read_metrics(out, "eval")[-1]
    assert final["step"] == 4 and set(final) >= {"loss", "bleu", "chrf", "rouge1", "rouge2", "rougeL"}

    with open(out / "predictions_validation.jsonl", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == 8 and all(set(r) == {"source", "reference", "prediction"} for r in rows)
    assert all(r["reference"] == " ".join(r["source"].split()[::-1]) for r in rows)
    scores = text_metrics([r["prediction"] for r in rows], [r["reference"] for r in rows])
    assert scores == pytest.approx({k: final[k] for k in scores})  # the file holds what was scored

    from transformers import AutoModelForSeq2SeqLM
    from flaxlm.models import count_params, load_pretrained
    hf = AutoModelForSeq2SeqLM.from_pretrained(out)
    _, ours = load_pretrained(str(out))
    assert sum(p.numel() for p in hf.parameters()) == count_params(ours)


def test_metrics_equal_the_libraries():
    import sacrebleu
    from rouge_score import rouge_scorer
    predictions = ["Eg har ikkje sett han.", "Det regner i dag", "hun bor på en gård"]
    references = ["Jeg har ikke sett ham.", "Det regner i dag.", "Hun bor på en gård."]
    scores = text_metrics(predictions, references)
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(predictions, [references]).score)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(predictions, [references]).score)
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2", "rougeL"], tokenizer=WordTokenizer())
    for kind in ("rouge1", "rouge2", "rougeL"):
        mean = sum(scorer.score(r, p)[kind].fmeasure for p, r in zip(predictions, references)) / 3
        assert scores[kind] == pytest.approx(100 * mean)
    assert scores["rouge1"] == pytest.approx(100 * (0.4 + 1 + 1) / 3)  # 2 of 5 words shared; "." is no word
    assert copy_baseline(predictions, references) == pytest.approx({k: scores[k] for k in ("bleu", "chrf")})


def test_empty_target_is_a_user_error_and_overwrites_nothing(model_dir, tmp_path):
    bad = write_pairs(tmp_path / "bad.jsonl", [("ei setning", "en setning"), ("to ord", "")] * 5)
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text("kept\n")
    expect_user_error(run_seq2seq.main, args_for(model_dir, bad, out, "--overwrite_output_dir"),
                      r"no text in column 'nb'")
    assert (out / "metrics.jsonl").read_text() == "kept\n"
    assert os.listdir(out) == ["metrics.jsonl"]
