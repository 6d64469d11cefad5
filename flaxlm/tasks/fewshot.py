"""Few-shot prompts for judging a decoder: k solved examples from the training split, then the question.

    template = PromptTemplate("Tekst: {text}\\nSentiment:", target="{label}", separator="\\n\\n")
    template.check(columns, where)                   # every {column} it names exists, else one line
    shots = draw_shots(train_rows, k=4, seed=0)      # the same k examples for every question, drawn by seed
    prompt = template.prompt(shots, row, answer_of)  # "Tekst: ..\\nSentiment: positiv\\n\\nTekst: ..\\nSentiment:"

A solved example is the prompt filled from its row followed by its answer (the verbalization of its label for a
choice task, its target for a generation task); the examples and the question are joined by the separator. The
question's prompt ends where the answer would begin: a choice's verbalization is scored after it, a generation
starts there.
"""
import dataclasses
import string

import numpy as np

from flaxlm.errors import UserError


def template_columns(template):
    """The column names a str.format template names ({text} -> text)."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


@dataclasses.dataclass(frozen=True)
class PromptTemplate:
    prompt_text: str  # str.format template over a row's columns, e.g. "Tekst: {text}\nSentiment:"
    separator: str = "\n\n"  # between the solved examples and the question

    def check(self, columns, where):
        """UserError when the template names a column the data does not have (or is not a template)."""
        try:
            named = template_columns(self.prompt_text)
        except ValueError as e:
            raise UserError(f"{where}: the prompt {self.prompt_text!r} is not a template ({e}); write columns as "
                            f"{{column}} and a literal brace as {{{{ or }}}}") from None
        for name in named:
            if name not in columns:
                raise UserError(f"{where}: the prompt names the column {{{name}}}, which the data does not have "
                                f"(columns: {', '.join(columns)}); fix the prompt or the data")
        if not named:
            raise UserError(f"{where}: the prompt {self.prompt_text!r} names no column; name the text's column in "
                            f"braces, e.g. {{text}}")

    def fill(self, row):
        return self.prompt_text.format(**row)

    def prompt(self, shots, row, answer_of):
        """The k solved examples (each its filled prompt + answer_of(shot)) and the question's filled prompt."""
        solved = [self.fill(shot) + answer_of(shot) for shot in shots]
        return self.separator.join([*solved, self.fill(row)])


def draw_shots(train_rows, k, seed):
    """k training rows drawn without replacement by seed (all of them when there are fewer), in drawn order."""
    if k <= 0 or not train_rows:
        return []
    picked = np.random.default_rng(seed).choice(len(train_rows), size=min(k, len(train_rows)), replace=False)
    return [train_rows[int(i)] for i in picked]


def check_choices(choices, where):
    """{label: verbalization} with each label's verbalization distinct and non-empty; a UserError otherwise."""
    if not isinstance(choices, dict) or len(choices) < 2:
        raise UserError(f"{where}: choices must map each label to its verbalization, at least two of them (e.g. "
                        f"choices: {{Positive: ' positiv', Negative: ' negativ'}})")
    seen = {}
    for label, text in choices.items():
        if not isinstance(text, str) or not text.strip():
            raise UserError(f"{where}: the choice of label {label!r} is {text!r}; give every label some text")
        if text in seen:
            raise UserError(f"{where}: labels {seen[text]!r} and {label!r} have the same verbalization {text!r}; "
                            f"give each label its own")
        seen[text] = label
    return {str(label): text for label, text in choices.items()}
