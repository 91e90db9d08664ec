"""Prompt weighting syntaxes, parsed to (text, weight) fragments. Pure Python: no model, no tokenizer.

- `parse_a1111`: the syntax of prompts shared on model sites (AUTOMATIC1111's web UI): `(word:1.3)`, `(word)` ×1.1,
  `[word]` ÷1.1, nested brackets multiply, `\\(` `\\)` `\\[` `\\]` `\\\\` escape, and `BREAK` starts a new 75-token
  chunk. Unbalanced brackets are lenient, as A1111 is: an unclosed `(` weights everything after it, a stray `)` is
  dropped.
- `parse_compel`: the `compel` package's syntax (what Easy Diffusion uses): `word+` ×1.1 per `+`, `word-` ×0.9 per
  `-`, `(words)1.3`, `(words)++`, `"quoted words"-`, nested groups multiply, `\\(` escapes; a bracket that is not
  closed is text. compel's `.blend()`, `.and()` and `.swap()` are not supported (refused in one line).
"""

from __future__ import annotations

import re

from enginefarm.errors import ConfigError

BREAK = -1.0  # the weight of A1111's BREAK fragment: the tokens after it start a new chunk
SYNTAXES = ("a1111", "compel", "none")

# A1111's tokens: escapes, brackets, `:weight)`, runs of plain text, and a lone colon or backslash
_A1111 = re.compile(r"\\[()\[\]\\]|\\|\(|\[|:\s*([+-]?[.\d]+)\s*\)|\)|\]|[^\\()\[\]:]+|:")
_BREAK = re.compile(r"\s*\bBREAK\b\s*")
_UP, _DOWN = 1.1, 1 / 1.1


def parse(prompt: str, syntax: str) -> list[tuple[str, float]]:
    """`prompt` as (text, weight) fragments in `syntax` ("a1111", "compel", or "none": the text as it is)."""
    if syntax == "a1111":
        return parse_a1111(prompt)
    if syntax == "compel":
        return parse_compel(prompt)
    if syntax == "none":
        return [(prompt, 1.0)]
    raise ConfigError(
        f"prompt_syntax={syntax!r} is not one of {', '.join(SYNTAXES)}",
        hint='"a1111" for (word:1.3) / [word], "compel" for word+ / (words)1.3, "none" for the text as it is',
    )


def parse_a1111(prompt: str) -> list[tuple[str, float]]:
    """A1111's `parse_prompt_attention`: fragments with their weights, neighbours of equal weight merged; a BREAK
    is its own fragment of weight `BREAK`."""
    parts: list[list] = []  # [text, weight]
    round_open: list[int] = []
    square_open: list[int] = []

    def scale(start: int, by: float) -> None:
        for part in parts[start:]:
            part[1] *= by

    for match in _A1111.finditer(prompt):
        text, weight = match.group(0), match.group(1)
        if text.startswith("\\") and len(text) == 2:
            parts.append([text[1:], 1.0])
        elif text == "(":
            round_open.append(len(parts))
        elif text == "[":
            square_open.append(len(parts))
        elif weight is not None and round_open and _is_number(weight):
            scale(round_open.pop(), float(weight))
        elif text == ")" and round_open:
            scale(round_open.pop(), _UP)
        elif text == "]" and square_open:
            scale(square_open.pop(), _DOWN)
        elif weight is not None:  # `:1.2)` with no bracket open, or not a number: text, as written
            parts.append([text, 1.0])
        elif text in (")", "]"):
            continue  # A1111 drops a closing bracket that closes nothing
        else:
            for index, piece in enumerate(_BREAK.split(text)):
                if index:
                    parts.append(["BREAK", BREAK])
                parts.append([piece, 1.0])
    for start in round_open:
        scale(start, _UP)
    for start in square_open:
        scale(start, _DOWN)
    merged: list[list] = []
    for part in parts:
        if merged and merged[-1][1] == part[1] and part[1] != BREAK:
            merged[-1][0] += part[0]
        else:
            merged.append(part)
    return [(text, weight) for text, weight in merged] or [("", 1.0)]


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


# compel's weight suffixes: a run of + or -, or a number (after a group only)
_SIGNS = re.compile(r"[+]+|[-]+")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)")
_COMPEL_OPERATORS = re.compile(r"\)\s*\.(blend|and|swap)\s*\(|\.(blend|and|swap)\s*\(")


def parse_compel(prompt: str) -> list[tuple[str, float]]:
    """compel's syntax as (text, weight) fragments, neighbours of equal weight joined with a space (CLIP tokenizes
    them as compel's fragments: spaces make no tokens)."""
    operator = _COMPEL_OPERATORS.search(prompt)
    if operator:
        raise ConfigError(
            f"compel's .{operator.group(1) or operator.group(2)}() is not supported",
            hint="weight words with +, - or (words)1.3; blend prompts in your own code",
        )
    fragments = _CompelParser(prompt).parse()
    merged: list[list] = []
    for text, weight in fragments:
        if not text:
            continue
        if merged and merged[-1][1] == weight:
            merged[-1][0] += " " + text
        else:
            merged.append([text, weight])
    return [(text, weight) for text, weight in merged] or [("", 1.0)]


class _CompelParser:
    """A recursive reading of compel's grammar: words, `(group)` and `"quoted"` parts, each with an optional weight
    suffix; whatever cannot be read as that (an unclosed bracket) stays text."""

    def __init__(self, text: str) -> None:
        self.text = text

    def parse(self) -> list[tuple[str, float]]:
        fragments, _ = self._sequence(0, None)
        return fragments

    def _sequence(self, at: int, closer: str | None) -> tuple[list[tuple[str, float]], int]:
        """Fragments from `at` up to `closer` (exclusive; None: the end). Returns (fragments, index after)."""
        out: list[tuple[str, float]] = []
        word: list[str] = []
        text = self.text

        def flush(weight: float = 1.0) -> None:
            if word:
                out.append(("".join(word), weight))
                word.clear()

        while at < len(text):
            char = text[at]
            if closer is not None and char == closer:
                flush()
                return out, at
            if char == "\\" and at + 1 < len(text):
                word.append(text[at + 1])
                at += 2
            elif char.isspace():
                flush()
                at += 1
            elif char in '("':
                end_char = ")" if char == "(" else '"'
                inner, end = self._sequence(at + 1, end_char)
                if end >= len(text):  # never closed: the bracket and what follows are text
                    word.append(char)
                    at += 1
                    continue
                flush()
                weight, at = self._weight(end + 1, number=True)
                out += [(t, w * weight) for t, w in inner]
            elif char in "+-" and word and self._suffix_ends(at):
                weight, at = self._weight(at, number=False)
                flush(weight)
            else:
                word.append(char)
                at += 1
        flush()
        return out, at

    def _suffix_ends(self, at: int) -> bool:
        """Whether the run of + or - at `at` ends a word (followed by space, punctuation, a bracket or the end)."""
        match = _SIGNS.match(self.text, at)
        assert match is not None
        end = match.end()
        return end == len(self.text) or not (self.text[end].isalnum() or self.text[end] == "_")

    def _weight(self, at: int, *, number: bool) -> tuple[float, int]:
        """The weight suffix at `at` (a run of + or -, or after a group a number): (weight, index after)."""
        signs = _SIGNS.match(self.text, at)
        if signs and (not number or not _NUMBER.match(self.text, at)):
            run = signs.group(0)
            return (1.1 if run[0] == "+" else 0.9) ** len(run), signs.end()
        if number:
            found = _NUMBER.match(self.text, at)
            if found:
                return float(found.group(0)), found.end()
        return 1.0, at
