"""Distillation (run_distill.py) end to end: a tiny GPT-2 teacher (2 layers, random weights, saved by transformers)
and a 1-layer student of the same tokenizer. Offline: the stored top-k is the teacher's own log-probabilities
(transformers' PyTorch forward pass, at two temperatures), a store cut short is finished, a resumed run continues the
same curve on the same store, another --alpha and a smaller --top_k reuse it, another temperature or k is refused.
A teacher of another vocabulary is refused. GKD: on-policy steps drawn per step, the evaluation the student's own
next-token loss (against PyTorch), the teacher never trained, a resumed run on the same curve. Conversations: gkd
teaches the last answer, offline packs as run_sft.py. --compile_for in both modes. The losses themselves against
TRL's: tests/test_distill_losses.py."""
import hashlib
import json
import os
import re
import shutil

import numpy as np
import pytest

import run_distill
from run_helpers import read_metrics
from tpu_compile import needs_libtpu
from flaxlm.errors import UserError

LENGTH, K, PROMPT = 32, 8, 16
CONVERSATIONS = [{"messages": [{"role": "user", "content": f"{a}+{b}"}, {"role": "assistant", "content": f"{a + b}"},
                               {"role": "user", "content": f"{a}*{b}"}, {"role": "assistant", "content": f"{a * b}"}]}
                 for a in range(2, 6) for b in range(3, 7)]


def _torch_checkpoint(d, **overrides):
    """Random weights of d's config (with overrides, dropout off) saved into d by transformers."""
    import torch
    import transformers
    config = transformers.AutoConfig.from_pretrained(d, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, **overrides)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(d)
    return str(d)


@pytest.fixture(scope="module")
def teacher(tiny_gpt2_dir, tmp_path_factory):
    """gpt2-tiny (2 layers): weights drawn 5x wider than GPT-2's, so that its distributions are far from uniform
    (the top k well apart, the temperatures telling apart)."""
    d = tmp_path_factory.mktemp("teacher")
    shutil.copytree(tiny_gpt2_dir, d, dirs_exist_ok=True)
    return _torch_checkpoint(d, initializer_range=0.1)


@pytest.fixture(scope="module")
def student(tiny_gpt2_dir, tmp_path_factory):
    """create_config.py's gpt2-tiny with one layer, the teacher's tokenizer, random weights (the start of a run)."""
    import create_config
    d = tmp_path_factory.mktemp("student")
    shutil.copytree(tiny_gpt2_dir, d, dirs_exist_ok=True)
    create_config.main(["--preset", "gpt2-tiny", "--output_dir", str(d), "--set", "n_layer=1",
                        "--overwrite_output_dir"])
    return _torch_checkpoint(d)


def argv(student, teacher, corpus, out, *extra):
    """64 rows of 32 tokens, 8 a step (one per device), 4 steps, a checkpoint every 2, evaluated at the end."""
    return ["--output_dir", str(out), "--model_name_or_path", student, "--teacher_model_name_or_path", teacher,
            "--train_file", corpus["train"], "--validation_file", corpus["validation"], "--max_length", str(LENGTH),
            "--max_train_samples", "64", "--max_eval_samples", "16", "--per_device_train_batch_size", "1",
            "--max_steps", "4", "--logging_steps", "1", "--eval_steps", "4", "--save_steps", "2",
            "--learning_rate", "3e-3", "--report_to", "none", *extra]


# seed 1 draws the student's samples at steps 1 and 4, the teacher's at 2 and 3: each on both sides of a resume at 2
GKD = ("--mode", "gkd", "--max_new_tokens", "8", "--max_prompt_length", str(PROMPT), "--lmbda", "0.5", "--seq_kd",
       "--seed", "1")


def text_rows(args, prompt_length=0):
    """{split: rows} as run_distill.py builds them from these flags (flaxlm.distillation.run.text_rows)."""
    from flaxlm.config.cli import parse_args
    from flaxlm.config.options import (DataArgs, DistillArgs, LoraArgs, ModelArgs, PreparedDataArgs, TextSourceArgs,
                                       TrainingArgs)
    from flaxlm.distillation import run
    from flaxlm.tokenization.loading import load_tokenizer
    model_args, source, data_args, _, prep, _, training = parse_args(
        ModelArgs, TextSourceArgs, DataArgs, DistillArgs, PreparedDataArgs, LoraArgs, TrainingArgs, argv=args,
        prog="run_distill.py")
    rows = run.text_rows(source, data_args, prep, load_tokenizer(model_args.model_name_or_path), LENGTH, training,
                         prompt_length)
    return {"train": rows["train"].materialized(), "validation": rows["validation"]}


def torch_logps(model_dir, ids_NL, temperature=1.0):
    """float64 [N, L - 1, V]: log_softmax(logits / T) of transformers' PyTorch model (float32) at each position
    but the last."""
    import torch
    import transformers
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.as_tensor(np.asarray(ids_NL), dtype=torch.long)).logits[:, :-1]
    return torch.log_softmax(logits.double() / temperature, dim=-1).numpy()


def assert_top_k_is(ids, logps, ref):
    """Stored ids and log-probabilities [N, T, k] against the reference log-probabilities [N, T, V]: each position's k
    ids distinct and, rank by rank, the reference's k likeliest (or a token within 1e-5 of it: JAX's and PyTorch's
    float32 logits differ by ~1e-6, so a near-tie may come out in either order); each log-probability the
    reference's at float16's rounding: round to nearest keeps 11 significant bits, an error of at most 2^-11 of the
    value (1e-5 more for the two float32 computations)."""
    ids, k = np.asarray(ids, np.int64), ids.shape[-1]
    ordered = np.sort(ids, axis=-1)
    assert (ordered[..., 1:] != ordered[..., :-1]).all()
    top = -np.sort(-ref, axis=-1)[..., :k]
    at_ids = np.take_along_axis(ref, ids, axis=-1)
    np.testing.assert_allclose(at_ids, top, rtol=0, atol=1e-5)
    assert (np.abs(np.asarray(logps, np.float64) - at_ids) <= np.abs(at_ids) * 2.0 ** -11 + 1e-5).all()


def mtimes(path):
    return {name: os.stat(os.path.join(path, name)).st_mtime_ns for name in sorted(os.listdir(path))}


def digest(path):
    h = hashlib.sha256()
    for name in sorted(os.listdir(path)):
        with open(os.path.join(path, name), "rb") as f:
            h.update(name.encode() + f.read())
    return h.hexdigest()


@pytest.fixture(scope="module")
def offline_run(student, teacher, corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("offline") / "run"
    run_distill.main(argv(student, teacher, corpus, out, "--top_k", str(K)))
    return out


def test_the_stored_top_k_is_the_teachers_log_probabilities(offline_run, student, teacher, corpus, tmp_path,
                                                            monkeypatch):
    """The run's store (T = 1) and one computed here at T = 2 in three shards of 24 rows, the first kept from a
    computation cut short, read back through TaughtRows with k = 5 of the 8 stored: PyTorch's top k."""
    import jax
    from flaxlm.distillation import run, teacher_store
    from flaxlm.models import load_pretrained, split_model
    from flaxlm.training.mesh import make_mesh, replicated
    rows = text_rows(argv(student, teacher, corpus, "unused"))["train"]
    store = offline_run / "teacher_logits"
    manifest = json.loads((store / "manifest.json").read_text())
    assert manifest["complete"] and (manifest["rows"], manifest["length"], manifest["k"]) == (64, LENGTH, K)
    assert manifest["temperature"] == 1.0 and manifest["rows_fingerprint"] == teacher_store.rows_fingerprint(rows)
    ids, logps = np.load(store / "shard_00000.ids.npy"), np.load(store / "shard_00000.logps.npy")
    assert ids.dtype == np.uint16 and logps.dtype == np.float16 and ids.shape == logps.shape == (64, LENGTH - 1, K)
    assert_top_k_is(ids, logps, torch_logps(teacher, rows["input_ids"]))

    monkeypatch.setattr(teacher_store, "SHARD_ROWS", 24)
    config, model = load_pretrained(teacher)
    graphdef, params = split_model(model)
    mesh = make_mesh()
    score = run.top_k_scorer(graphdef, jax.device_put(params, replicated(mesh)), K, 2.0, 8, mesh, pad_id=1)
    identity, path = teacher_store.teacher_identity(teacher), str(tmp_path / "t2")
    scored = []

    def stops_after_one_shard(chunk):
        if scored:
            raise RuntimeError("stopped")
        scored.append(len(chunk["input_ids"]))
        return score(chunk)
    with pytest.raises(RuntimeError, match="stopped"):
        teacher_store.compute_store(path, rows, K, 2.0, identity, config.vocab_size, stops_after_one_shard)
    assert teacher_store.open_store(path, rows, K, 2.0, identity, config.vocab_size) is None  # unfinished
    first = os.stat(os.path.join(path, "shard_00000.ids.npy")).st_mtime_ns
    finished = teacher_store.compute_store(path, rows, K, 2.0, identity, config.vocab_size,
                                           lambda chunk: scored.append(len(chunk["input_ids"])) or score(chunk))
    assert scored == [24, 24, 16] and os.stat(os.path.join(path, "shard_00000.ids.npy")).st_mtime_ns == first
    idx = np.array([63, 0, 30, 47, 23, 24, 5])  # across the shards, out of order
    got = teacher_store.TaughtRows(rows, finished, 5).rows_at(idx)
    np.testing.assert_array_equal(got["input_ids"], rows["input_ids"][idx])
    assert got["teacher_ids"].shape == (len(idx), LENGTH - 1, 5)
    assert_top_k_is(got["teacher_ids"], got["teacher_logps"], torch_logps(teacher, rows["input_ids"][idx], 2.0))


def test_a_resumed_offline_run_continues_the_same_curve_on_the_same_store(offline_run, student, teacher, corpus,
                                                                         tmp_path, monkeypatch, capsys):
    """Stopped when asking for the third step's rows (a checkpoint after 2), resumed to 4 in the same directory:
    the losses of the straight run, and the store read back (not rewritten)."""
    from flaxlm.data.rows import ShuffledRows
    out = tmp_path / "resumed"
    original = ShuffledRows.batch_rows

    def crash(self, step, local):
        if step == 2:
            raise RuntimeError("simulated crash")
        return original(self, step, local)
    with monkeypatch.context() as m:
        m.setattr(ShuffledRows, "batch_rows", crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_distill.main(argv(student, teacher, corpus, out, "--top_k", str(K)))
    written = mtimes(out / "teacher_logits")
    capsys.readouterr()
    run_distill.main(argv(student, teacher, corpus, out, "--top_k", str(K), "--resume_from_checkpoint", "latest"))
    assert "(computed by an earlier run)" in capsys.readouterr().out
    assert mtimes(out / "teacher_logits") == written
    straight, resumed = read_metrics(offline_run), read_metrics(out)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for key in ("loss", "kd_loss", "ce_loss"):
        assert [r[key] for r in resumed] == pytest.approx([r[key] for r in straight], rel=1e-6), key
    assert read_metrics(out, "eval")[-1]["loss"] == pytest.approx(read_metrics(offline_run, "eval")[-1]["loss"],
                                                                  rel=1e-6)


def test_the_store_is_reused_with_another_alpha_and_a_smaller_k_and_refused_at_another_temperature(
        offline_run, student, teacher, corpus, tmp_path, capsys):
    """--teacher_logits: the offline run's store read by a run of other student options (its files untouched, the
    loss alpha * KL + (1 - alpha) * CE of the first 4 tokens); another temperature, or a k above the stored one,
    one line naming what differs, the store intact."""
    store = offline_run / "teacher_logits"
    written, manifest = mtimes(store), (store / "manifest.json").read_text()
    out = tmp_path / "alpha"
    capsys.readouterr()
    run_distill.main(argv(student, teacher, corpus, out, "--teacher_logits", str(store), "--alpha", "0.9",
                          "--top_k", "4", "--max_steps", "2", "--do_eval", "false"))
    assert f"top-4 log-probabilities: {store} (computed by an earlier run)" in capsys.readouterr().out
    assert mtimes(store) == written and not (out / "teacher_logits").exists()
    first, again = read_metrics(offline_run), read_metrics(out)
    for rows, alpha in ((first, 0.5), (again, 0.9)):  # at T = 1: alpha * KL + (1 - alpha) * CE
        assert [r["loss"] for r in rows] == pytest.approx([alpha * r["kd_loss"] + (1 - alpha) * r["ce_loss"]
                                                           for r in rows], rel=1e-5)
    # the same first batch and start: the same cross-entropy, the KL over 4 tokens instead of 8
    assert again[0]["ce_loss"] == pytest.approx(first[0]["ce_loss"], rel=1e-6)
    assert abs(again[0]["kd_loss"] - first[0]["kd_loss"]) > 1e-3 * first[0]["kd_loss"]
    for flags, named in ((["--temperature", "2", "--top_k", str(K)], "temperature"),
                         (["--top_k", "16"], r"k \(8 stored, 16 asked\)")):
        with pytest.raises(UserError, match=rf"^--teacher_logits {store} holds the top-k of other {named}; ") as e:
            run_distill.main(argv(student, teacher, corpus, tmp_path / flags[0][2:], "--teacher_logits", str(store),
                                  *flags))
        assert "\n" not in str(e.value)
    assert mtimes(store) == written and (store / "manifest.json").read_text() == manifest


@pytest.mark.parametrize("damage", ["truncated", "deleted", "foreign", "manifest"])
def test_a_damaged_store_is_refused_in_one_line_and_left_as_found(offline_run, student, teacher, corpus, tmp_path,
                                                                  damage):
    """--teacher_logits whose shard is cut short, gone, of another store's shape, or whose manifest is not one: one
    line naming the file and the fix (delete the store), before any training; the store's files as they were."""
    store = tmp_path / "store"
    shutil.copytree(offline_run / "teacher_logits", store)
    shard = store / "shard_00000.logps.npy"
    if damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:-100])
    elif damage == "deleted":
        shard.unlink()
    elif damage == "foreign":
        np.save(shard, np.zeros((3, LENGTH - 1, K), np.float16))
    else:
        shard = store / "manifest.json"
        shard.write_text('{"format": ')
    before = digest(store)
    out = tmp_path / "run"
    with pytest.raises(UserError, match=rf"^the teacher store {store} is damaged: {shard} .*; delete {store} ") as e:
        run_distill.main(argv(student, teacher, corpus, out, "--teacher_logits", str(store), "--top_k", str(K)))
    assert "\n" not in str(e.value)
    assert digest(store) == before and not (out / "metrics.jsonl").exists()


def test_gkd_on_plain_text_rows_says_they_have_no_prompt_whatever_the_length(teacher):
    """--mode gkd on conversation data whose rows are plain text (no prompt to sample an answer from): one line
    saying so, where "raise --max_length" would change nothing."""
    from flaxlm.data.chat_template import CHATML
    from flaxlm.data.conversations import example
    from flaxlm.distillation.run import conversation_rows
    from flaxlm.tokenization.loading import load_tokenizer
    examples = {"train": [example({"text": f"{a} and {a + 1} make {2 * a + 1}."}, "test") for a in range(8)]}
    for max_length in (64, 4096):
        with pytest.raises(UserError, match="^none of the 8 train examples has a prompt before its answer .*; give "
                                            "conversations"):
            conversation_rows(examples, load_tokenizer(teacher), CHATML, max_length, 1, gkd=True, packing=False)


@pytest.mark.parametrize("vocab_size", [288, 320])
def test_a_teacher_of_another_vocabulary_is_refused_naming_both(model_dir_for, student, corpus, tmp_path,
                                                                vocab_size):
    """A teacher whose tokenizer was trained to another size (fewer tokens than the student's, or more): one line
    (exit 2) naming both, nothing trained."""
    other = model_dir_for("gpt2-tiny", vocab_size=vocab_size)
    args = argv(student, other, corpus, tmp_path / "run")
    message = (rf"the teacher's vocabulary \({other}: {vocab_size} tokens\) is not the student's \({student}: 304 "
               rf"tokens\); distillation compares them token by token")
    with pytest.raises(UserError, match=message) as e:
        run_distill.main(args)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "run" / "metrics.jsonl").exists()


@pytest.fixture(scope="module")
def gkd_run(student, teacher, corpus, tmp_path_factory):
    """The straight gkd run, its objective (holding the live teacher) and the teacher's files' digest before it."""
    from flaxlm.objectives import distill
    made, before = [], digest(teacher)
    original = distill.gkd_objective
    out = tmp_path_factory.mktemp("gkd") / "run"
    with pytest.MonkeyPatch.context() as m:
        m.setattr(distill, "gkd_objective", lambda *a, **k: made.append(original(*a, **k)) or made[-1])
        run_distill.main(argv(student, teacher, corpus, out, *GKD))
    return out, made[0], before


def test_gkd_draws_on_policy_steps_evaluates_the_student_and_never_trains_the_teacher(gkd_run, student, teacher,
                                                                                     corpus):
    """--lmbda 0.5 --seq_kd: the steps' sources logged as on_policy; the evaluation is the student's next-token loss
    (PyTorch's on the export); the student trained, the teacher's files and the arrays the train steps read
    unchanged; the card names the teacher."""
    import jax
    import torch
    import transformers
    from safetensors.numpy import load_file
    from flaxlm.models import load_pretrained, split_model
    from flaxlm.objectives.sft import label_weights
    out, objective, before = gkd_run
    rows = read_metrics(out)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert {r["on_policy"] for r in rows} == {0.0, 1.0}  # the seed's draws: the student's samples, the teacher's
    assert all(np.isfinite(r["loss"]) and r["loss"] >= 0 for r in rows)

    # the evaluation: the exported student's next-token loss on the held-out tokens past the prompt, in PyTorch
    held_out = text_rows(argv(student, teacher, corpus, out, *GKD), PROMPT)["validation"]
    ids = torch.as_tensor(held_out["input_ids"], dtype=torch.long)
    with torch.no_grad():
        logits = transformers.AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()(ids).logits
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].double().flatten(0, 1), ids[:, 1:].flatten(),
                                            reduction="none").numpy()
    weights = label_weights(held_out).ravel()
    assert weights.sum() == 16 * (LENGTH - PROMPT)
    evaluated = read_metrics(out, "eval")[-1]
    assert evaluated["loss"] == pytest.approx((nll * weights).sum() / weights.sum(), rel=1e-5)

    # the student trained (its export differs from its start), the teacher not: its files, and the arrays the
    # train steps read, as loaded
    start, end = load_file(os.path.join(student, "model.safetensors")), load_file(out / "model.safetensors")
    assert start.keys() == end.keys() and any(not np.array_equal(start[k], end[k]) for k in start)
    assert digest(teacher) == before
    _, params = split_model(load_pretrained(teacher)[1])
    jax.tree.map(np.testing.assert_array_equal, jax.device_get(objective.frozen), params)
    card = (out / "README.md").read_text()
    assert f"distilled on-policy from {teacher} (GKD: beta 0.5, lmbda 0.5, seq_kd; run_distill.py)" in card


def test_a_resumed_gkd_run_continues_the_same_curve(gkd_run, student, teacher, corpus, tmp_path, monkeypatch):
    """The sources and samples of each step are drawn from the seed and the step: a run stopped after 2 steps and
    resumed logs the straight run's losses and on-policy steps (the student's samples of step 4 drawn by the resumed
    parameters)."""
    from flaxlm.distillation.rows import OnPolicyRows
    out = tmp_path / "resumed"
    original = OnPolicyRows.batch_rows

    def crash(self, step, local, params):
        if step == 2:
            raise RuntimeError("simulated crash")
        return original(self, step, local, params)
    with monkeypatch.context() as m:
        m.setattr(OnPolicyRows, "batch_rows", crash)
        with pytest.raises(RuntimeError, match="simulated crash"):
            run_distill.main(argv(student, teacher, corpus, out, *GKD))
    run_distill.main(argv(student, teacher, corpus, out, *GKD, "--resume_from_checkpoint", "latest"))
    straight, resumed = read_metrics(gkd_run[0]), read_metrics(out)
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    assert [r["on_policy"] for r in resumed] == [r["on_policy"] for r in straight]
    assert [r["loss"] for r in resumed] == pytest.approx([r["loss"] for r in straight], rel=1e-6)


def test_conversations_gkd_teaches_the_last_answer_and_offline_packs_as_run_sft(teacher, student, tmp_path,
                                                                                   capsys):
    """Two assistant turns each: gkd's rows one conversation each with only its last answer taught (TRL's GKD
    collator), offline's packed with both answers taught as run_sft.py's; both modes run on them (ChatML)."""
    from flaxlm.data.chat_rows import encode, sft_rows
    from flaxlm.data.chat_template import CHATML
    from flaxlm.data.conversations import example
    from flaxlm.distillation.run import conversation_rows
    from flaxlm.tokenization.loading import load_tokenizer
    tok = load_tokenizer(teacher)
    examples = {"train": [example(c, "test") for c in CONVERSATIONS]}
    gkd_rows = conversation_rows(examples, tok, CHATML, 256, 1, gkd=True, packing=True)["train"]
    assert len(gkd_rows["input_ids"]) == len(CONVERSATIONS)  # one a row, unpacked
    for row, c in zip(zip(gkd_rows["input_ids"], gkd_rows["trained"]), CONVERSATIONS):
        ids, trained = row
        taught = np.flatnonzero(trained)
        assert (np.diff(taught) == 1).all()  # one run of tokens
        assert tok.decode(ids[taught]) == c["messages"][-1]["content"] + "<|im_end|>\n"
    offline_rows = conversation_rows(examples, tok, CHATML, 256, 1, gkd=False, packing=True)["train"]
    sft, _ = sft_rows([encode(tok, CHATML, e) for e in examples["train"]], 256, 1, True)  # run_sft.py's rows
    assert offline_rows.keys() == sft.keys()
    for name in sft:
        np.testing.assert_array_equal(offline_rows[name], sft[name])
    assert len(offline_rows["input_ids"]) < len(CONVERSATIONS)  # packed
    taught = [tok.decode(ids[(segments == s) & (trained > 0)]) for ids, segments, trained in
              zip(offline_rows["input_ids"], offline_rows["segment_ids"], offline_rows["trained"])
              for s in range(1, segments.max() + 1)]
    assert sorted(taught) == sorted(f"{c['messages'][1]['content']}<|im_end|>\n{c['messages'][3]['content']}"
                                    f"<|im_end|>\n" for c in CONVERSATIONS)  # both answers of each

    # both modes end to end on the conversations (ChatML: the tokenizer has no template of its own)
    data = tmp_path / "chats.jsonl"
    data.write_text("".join(json.dumps(c) + "\n" for c in CONVERSATIONS))
    for mode in ("offline", "gkd"):
        out = tmp_path / mode
        capsys.readouterr()
        run_distill.main(["--output_dir", str(out), "--model_name_or_path", student, "--teacher_model_name_or_path",
                          teacher, "--train_file", str(data), "--chat_template", "chatml", "--max_length", "256",
                          "--per_device_train_batch_size", "1", "--max_steps", "2", "--logging_steps", "1",
                          "--do_eval", "false", "--report_to", "none", "--mode", mode, "--top_k", "4",
                          "--max_new_tokens", "4", "--max_prompt_length", "64"])
        logged = read_metrics(out)
        assert [r["step"] for r in logged] == [1, 2] and all(np.isfinite(r["loss"]) for r in logged)
        assert load_tokenizer(str(out)).chat_template == CHATML
        printed = capsys.readouterr().out
        examples, rows = map(int, re.search(r"train: (\d+) examples in (\d+) rows of 256", printed).groups())
        if mode == "offline":  # packed, the store holding those rows
            assert rows < examples and f"top-4 log-probabilities of {rows} rows" in printed
        else:
            assert rows == examples


@needs_libtpu
@pytest.mark.parametrize("mode", ["offline", "gkd"])
def test_compile_for_a_slice_returns_the_fit(student, teacher, tmp_path, capsys, mode):
    """Nothing written; gkd: the live teacher's parameters held beside both steps (whole on each device under
    --sharding data), a row of the table."""
    import jax
    from flaxlm.models import load_pretrained, split_model
    out = tmp_path / "run"
    r = run_distill.main(["--output_dir", str(out), "--model_name_or_path", student, "--teacher_model_name_or_path",
                          teacher, "--max_length", str(LENGTH), "--per_device_train_batch_size", "1", "--mode", mode,
                          "--max_new_tokens", "8", "--compile_for", "v5e-8"])
    printed = capsys.readouterr().out
    assert "fits v5e-8" in printed and r["params"] > 0 and not out.exists()
    assert ("teacher parameters" in printed) == (mode == "gkd")
    if mode == "gkd":
        teacher_bytes = sum(x.nbytes for x in jax.tree.leaves(split_model(load_pretrained(teacher)[1])[1]))
        assert r["frozen"] == teacher_bytes > r["params"]
    else:
        assert "frozen" not in r
