"""lm-evaluation-harness on the project's JAX models: the model class `flaxlm` (registered with lm-eval when this
module is imported; lm_eval_flaxlm.py runs lm-eval's own command line with it).

    python lm_eval_flaxlm.py --model flaxlm --model_args pretrained=runs/my-gpt2,dtype=bfloat16 --batch_size 8 \
        --tasks noreval --output_path results/

It builds on lm-eval's TemplateLM (its context/continuation encoding, empty contexts, request caching) and answers
the three request kinds as lm-eval's `hf` backend does, token for token: loglikelihood (the continuation's
log-probability after the context, left-truncated to max_length + 1 tokens, and whether greedy decoding gives it),
loglikelihood_rolling (a document in lm-eval's disjoint windows after the prefix token: BOS, else EOS) and
generate_until (greedy, or sampled with do_sample, with the KV cache; the text cut at the first stop string). The
scoring runs on all devices in a few compiled shapes (flaxlm.tasks.lm_scoring); generation in one left-padded batch
per group of requests with the same arguments (flaxlm.models.generation).

model_args: pretrained (the model directory), tokenizer (default: pretrained), dtype (float32, bfloat16), max_length
(default: the model's positions, at most 2048), max_gen_toks (default 256), sharding (data or fsdp), add_bos_token
(as lm-eval's hf backend), adapter (a LoRA adapter's directory, put on the model). lm-eval's --batch_size is the rows
per device of each forward pass (a number); --apply_chat_template and --fewshot_as_multiturn render the requests with
the tokenizer's chat template (run_sft.py's export) as the hf backend does.
"""
import json

from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (_add_special_kwargs, handle_stop_sequences, has_bos_prefix, normalize_gen_kwargs,
                                  postprocess_generated_text)
from tqdm.auto import tqdm

from flaxlm.errors import UserError


def _flag(value):
    """A model_args boolean ("True", "false", a bool, or None)."""
    if value is None or isinstance(value, bool):
        return value
    return str(value).lower() in ("1", "true", "yes")


@register_model("flaxlm")
class FlaxLM(TemplateLM):
    def __init__(self, pretrained, tokenizer=None, dtype="float32", batch_size=8, max_length=None, max_gen_toks=256,
                 sharding="data", add_bos_token=None, adapter=None, **unused):
        super().__init__()
        if not str(batch_size).isdigit() or int(batch_size) < 1:
            raise UserError(f"batch_size {batch_size} is not a number of rows; pass --batch_size N (rows per device)")
        from flaxlm.models.hf_io import resolve_dir
        from flaxlm.tasks.lm_scoring import CausalLM

        path = resolve_dir(pretrained)
        self.lm = CausalLM(path, tokenizer or path, pretrained, int(max_length) if max_length else None, "max_length",
                           adapter=adapter)
        self.tokenizer = self.lm.tokenizer
        self.max_gen_toks, self.add_bos_token = int(max_gen_toks), _flag(add_bos_token)
        self.lm.load(dtype, int(batch_size), sharding, desc="lm-eval")

    @property
    def eot_token_id(self):
        return self.tokenizer.eos_token_id

    @property
    def prefix_token_id(self):
        return self.lm.prefix

    @property
    def max_length(self):
        return self.lm.max_length

    @property
    def tokenizer_name(self):
        return self.tokenizer.name_or_path.replace("/", "__")

    def chat_template(self, chat_template=False):
        """The tokenizer's chat template when lm-eval's --apply_chat_template asks for it (run_sft.py's exports
        carry one), else None."""
        if chat_template is False or chat_template is None:
            return None
        if not self.tokenizer.chat_template:
            raise UserError(f"--apply_chat_template needs a chat template, which the tokenizer of {self.lm.path} "
                            f"has not; drop --apply_chat_template, or pass a model run_sft.py exported")
        return self.tokenizer.chat_template

    def apply_chat_template(self, chat_history, add_generation_prompt=True):
        """The conversation rendered by the chat template, as lm-eval's hf backend renders it (--apply_chat_template,
        --fewshot_as_multiturn): the generation prompt added, or the last turn continued; a template that refuses a
        system turn gets none."""
        import jinja2

        def render(history):
            return self.tokenizer.apply_chat_template(history, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt,
                                                      continue_final_message=not add_generation_prompt)
        try:
            return render(chat_history)
        except jinja2.exceptions.TemplateError:
            return render([m for m in chat_history if m["role"] != "system"])

    def tok_encode(self, string, add_special_tokens=None, left_truncate_len=None, **kwargs):
        """As lm-eval's hf backend: the tokenizer's special tokens unless add_bos_token says otherwise or the text
        already starts with the prefix token."""
        special = _add_special_kwargs(add_special_tokens, self.add_bos_token)
        if add_special_tokens is None and has_bos_prefix(string, self.tokenizer.decode(self.prefix_token_id)):
            special["add_special_tokens"] = False
        ids = self.tokenizer.encode(string, **special)
        return ids[-left_truncate_len:] if left_truncate_len else ids

    def tok_decode(self, tokens, skip_special_tokens=True):
        return self.tokenizer.decode(tokens, skip_special_tokens=skip_special_tokens)

    def _loglikelihood_tokens(self, requests, disable_tqdm=False, **kwargs):
        """[(log-likelihood, is_greedy)] of ((context, continuation), context ids, continuation ids) requests."""
        scored = []
        for _, context_ids, continuation_ids in requests:
            ids = (list(context_ids) + list(continuation_ids))[-(self.max_length + 1):]
            if len(continuation_ids) >= len(ids):
                raise UserError(f"a continuation of {len(continuation_ids)} tokens leaves no context within "
                                f"max_length {self.max_length}; raise max_length in --model_args")
            scored.append((ids, len(ids) - len(continuation_ids)))
        ll, greedy = self.lm.scorer(scored)
        out = [(float(a), bool(b)) for a, b in zip(ll, greedy)]
        for (pair, _, _), result in zip(requests, out):
            if pair is not None:
                self.cache_hook.add_partial("loglikelihood", pair, result)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm=False):
        """Each document's log-likelihood: lm-eval's disjoint windows of max_length after the prefix token."""
        windows, owner = [], []
        for i, (string,) in enumerate(req.args for req in requests):
            for context, continuation in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, context, continuation))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (ll, _) in zip(owner, self._loglikelihood_tokens(windows)):
            totals[i] += ll
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", (req.args[0],), total)
        return totals

    def generate_until(self, requests, disable_tqdm=False):
        """Each request's continuation: greedy (or sampled) with the KV cache until max_gen_toks or EOS, cut at the
        first stop string; requests with the same arguments share batches."""
        eos = self.tok_decode([self.eot_token_id], skip_special_tokens=False)
        groups = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        out = [None] * len(requests)
        bar = tqdm(total=len(requests), desc="lm-eval generate_until", disable=disable_tqdm)
        for indices in groups.values():
            kwargs = normalize_gen_kwargs(dict(requests[indices[0]].args[1]), self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen_toks = kwargs.pop("max_gen_toks")
            if max_gen_toks >= self.max_length:
                raise UserError(f"max_gen_toks {max_gen_toks} leaves no room for a context within max_length "
                                f"{self.max_length}")
            temperature = float(kwargs.get("temperature", 0.0)) if kwargs.get("do_sample") else 0.0
            contexts = [self.tok_encode(requests[i].args[0], left_truncate_len=self.max_length - max_gen_toks)
                        for i in indices]
            generated = self.lm.generate(
                contexts, max_gen_toks, bar=bar, temperature=temperature,
                top_p=float(kwargs.get("top_p", 1.0) or 1.0), top_k=int(kwargs.get("top_k", 0) or 0),
                seed=int(kwargs.get("seed", 0) or 0))
            for i, tokens in zip(indices, generated):
                text = postprocess_generated_text(self.tok_decode(tokens), stop=until, think_end_token=None)
                out[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        bar.close()
        return out
