"""The chat template a conversation is rendered with (run_sft.py), and where in the rendering each assistant turn is.

    template = resolve_template(tokenizer, "chatml")       # the tokenizer's own (None), "chatml", or a jinja file
    text, spans = render_turns(tokenizer, template, messages)   # the conversation; (start, end) of each answer

An assistant turn's span is what the template writes for it after the conversation before it and the generation
prompt: its content and whatever ends the turn (ChatML's <|im_end|>), so a model trained on the spans learns to stop.
It is found by rendering the conversation turn by turn, so a template needs no {% generation %} marker; a template
whose rendering of a conversation does not begin with its rendering of the turns before (one that drops earlier
turns' reasoning, say) cannot be split so, and is refused, never silently trained on every token.
"""
import os
import re

from flaxlm.errors import UserError

# ChatML (Qwen, NorMistral-instruct): every turn as <|im_start|>ROLE\nCONTENT<|im_end|>\n
CHATML = ("{%- for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
          "'<|im_end|>' + '\\n' }}{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
          "{%- endif %}")
CHATML_END = "<|im_end|>"
# What a template's string literals may hold as one special token: <|im_start|>, <start_of_turn>, [INST], ...
MARKER = re.compile(r"<\|[A-Za-z0-9_]+\|>|<(?:start|end)_of_turn>|\[/?INST\]")


def resolve_template(tokenizer, choice=None):
    """The jinja template: --chat_template chatml, the jinja file --chat_template names, or (None) the tokenizer's."""
    if choice == "chatml":
        return CHATML
    if choice:
        if not os.path.isfile(choice):
            raise UserError(f"--chat_template {choice} is neither chatml nor a file; pass chatml or a jinja template "
                            f"file")
        with open(choice, encoding="utf-8") as f:
            return f.read()
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("the tokenizer has no chat template (one trained with train_tokenizer.py has none); pass "
                        "--chat_template chatml, or --chat_template FILE with a jinja template")
    return tokenizer.chat_template


def missing_markers(tokenizer, template):
    """The turn markers the template writes (<|im_start|>, ...) that the tokenizer has no token for, in order."""
    vocab = tokenizer.get_vocab()
    return [m for m in dict.fromkeys(MARKER.findall(template)) if m not in vocab]


def render(tokenizer, template, messages, add_generation_prompt=False):
    return tokenizer.apply_chat_template(messages, chat_template=template, tokenize=False,
                                         add_generation_prompt=add_generation_prompt)


def render_turns(tokenizer, template, messages, answers_from=0):
    """(the conversation rendered, [(start, end)] character spans of its assistant turns from message answers_from
    on)."""
    text = render(tokenizer, template, messages)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or i < answers_from:
            continue
        before = render(tokenizer, template, messages[:i], add_generation_prompt=True) if i else ""
        through = render(tokenizer, template, messages[:i + 1])
        if not (through.startswith(before) and text.startswith(through)):
            raise UserError("the chat template renders a conversation differently from the turns before it, so the "
                            "assistant turns cannot be found by rendering it turn by turn; use --chat_template "
                            "chatml or a template that keeps earlier turns as they are, or --train_on_prompt to "
                            "train on every token")
        if len(through) > len(before):
            spans.append((len(before), len(through)))
    return text, spans


def end_of_turn(tokenizer, template):
    """The special token the template ends an assistant turn with (ChatML's <|im_end|>, Gemma's <end_of_turn>), or
    None: what generation must stop at."""
    probe = [{"role": "user", "content": "?"}, {"role": "assistant", "content": "ANSWER"}]
    text, spans = render_turns(tokenizer, template, probe)
    tail = text[spans[-1][0]:spans[-1][1]].split("ANSWER", 1)[-1]
    specials = set(tokenizer.all_special_tokens) | {t.content for t in tokenizer.added_tokens_decoder.values()
                                                     if t.special}
    found = [(tail.index(s), s) for s in specials if s and s in tail]
    return min(found)[1] if found else None
