"""The prompt-weighting parsers on their own (no model): A1111's syntax against weights worked out by hand from its
rules, compel's against the compel package's own parser (token by token: spaces make no CLIP tokens), and odd input
(unbalanced brackets, stray escapes) parsed leniently instead of raising."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enginefarm.diffusion.prompt_weights import BREAK, parse, parse_a1111, parse_compel
from enginefarm.errors import ConfigError

UP, DOWN = 1.1, 1 / 1.1


def _close(got, want):
    assert [t for t, _ in got] == [t for t, _ in want], got
    assert [w for _, w in got] == pytest.approx([w for _, w in want]), got


@pytest.mark.parametrize(
    "prompt, want",
    [
        ("a cat", [("a cat", 1.0)]),
        ("a (red:1.3) cat", [("a ", 1.0), ("red", 1.3), (" cat", 1.0)]),
        ("(word)", [("word", UP)]),
        ("((word))", [("word", UP * UP)]),
        ("[word]", [("word", DOWN)]),
        ("[[word]]", [("word", DOWN * DOWN)]),
        ("(a [b] c:1.5) d", [("a ", 1.5), ("b", 1.5 * DOWN), (" c", 1.5), (" d", 1.0)]),
        ("(a:0.5) (b : 2 )", [("a", 0.5), (" ", 1.0), ("b ", 2.0)]),
        (r"\(not weighted\) \[nor this\]", [("(not weighted) [nor this]", 1.0)]),
        (r"a \\ b", [("a \\ b", 1.0)]),
        ("x (y", [("x ", 1.0), ("y", UP)]),  # an unclosed bracket weights what follows, as A1111 does
        ("x [y", [("x ", 1.0), ("y", DOWN)]),
        ("stray ) and ] dropped", [("stray  and  dropped", 1.0)]),
        ("ratio 16:9 photo", [("ratio 16:9 photo", 1.0)]),
        ("(a:1.2.3)", [("a:1.2.3)", UP)]),  # not a number: text, and the bracket stays open
        ("", [("", 1.0)]),
        ("a BREAK b", [("a", 1.0), ("BREAK", BREAK), ("b", 1.0)]),
        ("(a:1.1) (b:1.1)", [("a", 1.1), (" ", 1.0), ("b", 1.1)]),
    ],
)
def test_a1111_weights(prompt, want):
    _close(parse_a1111(prompt), want)


def test_a1111_merges_neighbours_of_equal_weight_and_keeps_breaks_apart():
    assert parse_a1111("(a)(b)") == [("ab", pytest.approx(UP))]
    assert [w for _, w in parse_a1111("a BREAK BREAK b")].count(BREAK) == 2


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet='ab ()[]:\\.,+-0123456789BREAK"', max_size=40))
def test_any_text_parses_without_raising(prompt):
    for syntax in ("a1111", "compel"):
        fragments = parse(prompt, syntax)
        assert fragments and all(isinstance(t, str) and w == w for t, w in fragments)  # no NaN weight


def test_an_unknown_syntax_and_compel_operators_are_one_line():
    with pytest.raises(ConfigError, match="prompt_syntax='sdnext'"):
        parse("a", "sdnext")
    with pytest.raises(ConfigError, match=r"\.blend\(\) is not supported"):
        parse('("a cat", "a dog").blend(0.5, 0.5)', "compel")
    assert parse("(a:2)", "none") == [("(a:2)", 1.0)]


COMPEL_CASES = [
    "a cat+ on a mat",
    "a (red cat)1.3 sat--",
    "a (b (c)-)++ d",
    '"quoted words"1.2 x',
    r"a \(paren\) b",
    "a ((b)) c",
    "unbalanced (a b",
    "x, y+, z",
    "a+ b-",
    "cat1.3",
    "(a)0.5 b",
    "word+++ more",
    "",
    "(x)",
    "a-b c",
    "pic, (dog)1.2. red",
    "a (b)- c",
    "(a b)0.0 c",
    "end+",
    "a ( b c )1.5",
    "red+-",
    "x++, y",
    "(a, b)1.1, c-",
    'a "b c',
    "one two+ three four-- five",
    "(masterpiece)1.4, best quality, (blurry)0.6",
]


def _by_token(fragments):
    """Weight runs with the spaces taken out: what CLIP's tokenizer sees (a space makes no token)."""
    runs: list[tuple[str, float]] = []
    for text, weight in fragments:
        text = text.replace(" ", "")
        if not text:
            continue
        if runs and runs[-1][1] == pytest.approx(weight):
            runs[-1] = (runs[-1][0] + text, runs[-1][1])
        else:
            runs.append((text, weight))
    return [(t, round(w, 6)) for t, w in runs]


@pytest.mark.parametrize("prompt", COMPEL_CASES)
def test_compel_syntax_matches_compels_parser(prompt):
    compel = pytest.importorskip("compel")
    theirs = [(f.text, f.weight) for f in compel.Compel.parse_prompt_string(prompt).prompts[0].children]
    assert _by_token(parse_compel(prompt)) == _by_token(theirs)
