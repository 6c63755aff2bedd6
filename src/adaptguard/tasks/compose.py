"""Compositional in-context learning: the logical task suite of Xu's thesis (Ch. 4.3.1, §9.1).

Eight simple tasks (Table 4.2) and seven composite tasks built from pairs of them (Table 4.3, §9.1.1).
A composite either composes *by parts* (each part of the input gets its own simple task: A+F, D+F) or
*by steps* (one simple task is applied to the output of the other: A+B, A+C, B+D, B+E, G+H).

Syntax (the symbols are the paper's: ``*`` marks a word to capitalize, ``( )`` swaps the two words
inside, ``@`` is the two-sum of number words (C) or the modulus of numbers (G), ``#`` is the
two-sum-plus-one (H); parts of a compose-by-parts input are separated by a space):

====  ================  =======================  ===============================================
task  name              input                    output
====  ================  =======================  ===============================================
A     capitalization    ``apple``                ``APPLE``
B     swap              ``bell ford``            ``ford bell``
C     two sum (words)   ``twenty @ eleven``      ``thirty-one``
D     past tense        ``pay``                  ``paid``
E     opposite          ``Above``                ``Below`` (the input's capitalisation kept)
F     plus one          ``435``                  ``436``
G     modular           ``15 @ 6``               ``3`` (a mod b)
H     two sum plus one  ``12#5``                 ``18`` (a + b + 1)
A+B   by steps          ``(* bell * ford)``      ``FORD BELL`` (paper, Table 4.3)
A+C   by steps          ``* twenty @ * eleven``  ``THIRTY-ONE`` (each operand marked as in A+B)
A+F   by parts          ``684 cat``              ``685 CAT`` (paper, Table 4.3)
B+D   by steps          ``(pay go)``             ``went paid`` (verbs inside the swap)
B+E   by steps          ``(Above hot)``          ``cold Below`` (opposite words inside the swap)
D+F   by parts          ``684 pay``              ``685 paid``
G+H   by steps          ``108 @ 10#2``           ``11`` or ``4`` (``a @ b#c`` or ``a#b @ c``)
====  ================  =======================  ===============================================

Inside a composite, its simple tasks are written in the composite's syntax (the simple1/simple2
settings and the demonstrations of the composite setting): in A+B, A is ``* apple`` and B is
``(farm frog)`` (Table 4.3); in A+C, A capitalizes number words (``* twenty`` -> ``TWENTY``); in B+D
and B+E, B swaps object words in parentheses. D and E have no symbol in the paper: the word class
says what applies (a verb takes its past tense, a word from the opposites list its opposite), exactly
as numbers and words do in the by-parts composites; the three word lists are disjoint where it matters
(objects vs verbs, objects vs opposite words).

G+H accepts both orders of operations (paper Table 9.1: "4 or 11"): for ``a @ b#c`` the outputs are
``(a mod b) + c + 1`` (left to right, the canonical ``output``) and ``a mod (b + c + 1)``; for
``a#b @ c`` they are ``(a + b + 1) mod c`` and ``a + (b mod c) + 1``.

Ranges (§9.1.1): numbers uniform in 1..1000; for modulus, the pair around ``@`` is uniform over
``2 <= b < a`` (b = 1 would always give 0 and b >= a would return a unchanged). Number words (C, A in
A+C) lie in one..one hundred, hyphenated (``thirty-one``, ``one hundred``): the operands of a two-sum
are uniform over the pairs with ``a + b <= 100``, so operands and sums stay in that range. Object words,
verbs and opposites come from the shipped lists in ``wordlists/`` (objects.txt, past_tense.txt,
opposites.txt); opposite words are written lowercase or Capitalized with equal probability and
answered in the same style; verbs with two past forms (dreamed/dreamt) accept both.

Prompts (four settings per composite; K = 10 demonstrations, 100 test items, §9.1.1): ``simple1`` and
``simple2`` (demonstrations and query of one simple task), ``composite`` (demonstrations from the two
simple tasks, ceil(K/2) of the first and floor(K/2) of the second, shuffled; the query composite) and
``composite_icl`` (demonstrations and query composite, the paper's gold standard)::

    input: * apple
    output: APPLE

    input: (farm frog)
    output: frog farm

    input: (* bell * ford)
    output:

The completion is `` FORD BELL``. With ``instruction=True`` the pair's instruction (§9.1.2) and a blank
line come first. Each item's demonstrations are distinct, never equal to its query, and drawn from
``numpy.random.default_rng`` seeded with (seed, a CRC of pair/setting, item index): deterministic.

Metric (§9.1.2): word-level exact match = matched words / words of the truth, where the prediction's
first line is split on whitespace and word i matches if it equals word i of the truth (position-wise,
case-sensitive; extra predicted words are not penalised), best over the accepted outputs; plus strict
exact match (the stripped first line equals an accepted output).
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from itertools import product
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from datasets import Dataset

SIMPLE_TASKS = ("A", "B", "C", "D", "E", "F", "G", "H")
COMPOSITES = ("A+B", "A+C", "A+F", "B+D", "B+E", "D+F", "G+H")
SETTINGS = ("simple1", "simple2", "composite", "composite_icl")

# (task, input, output) of Xu's thesis: Table 4.2, Table 4.3 and Table 4.1 (composite in-context).
PAPER_EXAMPLES = (
    ("A", "apple", "APPLE"), ("B", "bell ford", "ford bell"), ("C", "twenty @ eleven", "thirty-one"),
    ("D", "pay", "paid"), ("E", "Above", "Below"), ("F", "435", "436"), ("G", "15 @ 6", "3"),
    ("H", "12#5", "18"), ("A", "* apple", "APPLE"), ("B", "(farm frog)", "frog farm"), ("A", "cow", "COW"),
    ("A+B", "(* bell * ford)", "FORD BELL"), ("A+B", "(* good * zebra)", "ZEBRA GOOD"),
    ("A+B", "(* bicycle * add)", "ADD BICYCLE"), ("A+F", "684 cat", "685 CAT"),
)

# §9.1.2: an instruction naming the operators, prepended to the demonstrations when asked for.
INSTRUCTIONS = {
    "A+B": "* is a function for capitalizing the letters of the word after it, () is another function for "
           "swapping the position of 2 words.",
    "A+C": "* is a function for capitalizing the letters of the word after it, @ is another function for "
           "summing two numbers written in words.",
    "A+F": "A word is to be capitalized and a number increased by one; if both are given, do both.",
    "B+D": "() is a function for swapping the position of 2 words; a verb is to be put in the past tense.",
    "B+E": "() is a function for swapping the position of 2 words; a word is to be replaced by its opposite.",
    "D+F": "A verb is to be put in the past tense and a number increased by one; if both are given, do both.",
    "G+H": "@ is a function for taking the first number modulo the second, # is another function for "
           "summing the two numbers and then adding one.",
}

_MAX_NUMBER = 1000
_ONES = ("zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
         "sixteen seventeen eighteen nineteen").split()
_TENS = ("", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety")


# ----------------------------------------------------------------------------------------- word lists
@cache
def _rows(name: str) -> tuple[tuple[str, ...], ...]:
    text = resources.files("adaptguard.tasks").joinpath("wordlists", name).read_text(encoding="utf-8")
    return tuple(tuple(line.split()) for line in text.splitlines() if line.strip() and not line.startswith("#"))


@cache
def objects() -> tuple[str, ...]:
    """The object nouns of wordlists/objects.txt (tasks A, B and the object parts of composites)."""
    return tuple(row[0] for row in _rows("objects.txt"))


@cache
def past_tenses() -> dict[str, tuple[str, ...]]:
    """verb -> accepted past forms (canonical first), from wordlists/past_tense.txt (task D)."""
    return {row[0]: row[1:] for row in _rows("past_tense.txt")}


@cache
def opposites() -> dict[str, tuple[str, ...]]:
    """word -> its opposites (lowercase, both directions), from wordlists/opposites.txt (task E)."""
    table: dict[str, tuple[str, ...]] = {}
    for a, b in _rows("opposites.txt"):
        table[a] = (*table.get(a, ()), b)
        table[b] = (*table.get(b, ()), a)
    return table


@cache
def _sorted_opposite_words() -> tuple[str, ...]:
    return tuple(sorted(opposites()))


def number_word(n: int) -> str:
    """English words of 1 <= n <= 100, hyphenated: 31 -> 'thirty-one', 100 -> 'one hundred'."""
    if not 1 <= n <= 100:
        raise ValueError(f"number words are defined for 1..100, got {n}")
    if n == 100:
        return "one hundred"
    if n < 20:
        return _ONES[n]
    tens, ones = divmod(n, 10)
    return _TENS[tens] + (f"-{_ONES[ones]}" if ones else "")


@cache
def _word_values() -> dict[str, int]:
    return {number_word(n): n for n in range(1, 101)}


# ------------------------------------------------------------------------------ per-word operations
# Each returns the accepted alternatives for one word of the output.
def _cap(word: str) -> list[str]:
    return [word.upper()]


def _past(verb: str) -> list[str]:
    if verb not in past_tenses():
        raise ValueError(f"{verb!r} is not a verb of wordlists/past_tense.txt")
    return list(past_tenses()[verb])


def _restyle(word: str, like: str) -> str:
    """`word` in the capitalisation style of `like`: lowercase, Capitalized or UPPER."""
    if len(like) > 1 and like.isupper():
        return word.upper()
    return word[:1].upper() + word[1:] if like[:1].isupper() else word


def _opposite(word: str) -> list[str]:
    if word.lower() not in opposites():
        raise ValueError(f"{word!r} is not a word of wordlists/opposites.txt")
    return [_restyle(o, word) for o in opposites()[word.lower()]]


def _plus_one(number: str) -> list[str]:
    return [str(int(number) + 1)]


def _value(word: str) -> int:
    if word not in _word_values():
        raise ValueError(f"{word!r} is not a number word in one..one hundred")
    return _word_values()[word]


def _two_sum(a: str, b: str) -> list[str]:
    total = _value(a) + _value(b)
    if total > 100:
        raise ValueError(f"the two-sum of number words is defined up to one hundred, got {a} @ {b} = {total}")
    return [number_word(total)]


def _mod(a: int, b: int) -> int:
    if b == 0:
        raise ValueError("modulus by zero")
    return a % b


def _mod_sum(a: str, op1: str, b: str, op2: str, c: str) -> list[str]:
    """G+H: both groupings of `a op1 b op2 c`, left to right first (Table 9.1 accepts either)."""
    x, y, z = int(a), int(b), int(c)
    if op1 == op2:
        raise ValueError("a G+H input has one @ and one #, e.g. '108 @ 10#2' or '12#5 @ 7'")
    if op1 == "@":
        left, right = _mod(x, y) + z + 1, _mod(x, y + z + 1)
    else:
        left, right = _mod(x + y + 1, z), x + _mod(y, z) + 1
    return list(dict.fromkeys([str(left), str(right)]))


# ------------------------------------------------------------------------------------------- solving
@dataclass(frozen=True)
class _Rule:
    pattern: re.Pattern[str]
    words: Callable[..., list[list[str]]]  # regex groups -> per output word, its alternatives
    example: str


def _rule(pattern: str, words: Callable[..., list[list[str]]], example: str) -> _Rule:
    return _Rule(re.compile(pattern), words, example)


_WORD = r"([^\s()*@#]+)"
_RULES = {
    "A": _rule(r"(?:\* )?([A-Za-z][A-Za-z-]*|one hundred)", lambda w: [_cap(w)], "apple"),
    "B": _rule(rf"(\()?{_WORD} {_WORD}(?(1)\))", lambda _, a, b: [[b], [a]], "bell ford"),
    "C": _rule(rf"{_WORD} @ {_WORD}", lambda a, b: [_two_sum(a, b)], "twenty @ eleven"),
    "D": _rule(r"([a-z]+)", lambda v: [_past(v)], "pay"),
    "E": _rule(r"([A-Za-z]+)", lambda w: [_opposite(w)], "Above"),
    "F": _rule(r"(\d+)", lambda n: [_plus_one(n)], "435"),
    "G": _rule(r"(\d+) @ (\d+)", lambda a, b: [[str(_mod(int(a), int(b)))]], "15 @ 6"),
    "H": _rule(r"(\d+)#(\d+)", lambda a, b: [[str(int(a) + int(b) + 1)]], "12#5"),
    "A+B": _rule(rf"\(\* {_WORD} \* {_WORD}\)", lambda a, b: [_cap(b), _cap(a)], "(* bell * ford)"),
    "A+C": _rule(rf"\* {_WORD} @ \* {_WORD}", lambda a, b: [[s.upper() for s in _two_sum(a, b)]],
                 "* twenty @ * eleven"),
    "A+F": _rule(rf"(\d+) {_WORD}", lambda n, w: [_plus_one(n), _cap(w)], "684 cat"),
    "B+D": _rule(rf"\({_WORD} {_WORD}\)", lambda a, b: [_past(b), _past(a)], "(pay go)"),
    "B+E": _rule(rf"\({_WORD} {_WORD}\)", lambda a, b: [_opposite(b), _opposite(a)], "(Above hot)"),
    "D+F": _rule(rf"(\d+) {_WORD}", lambda n, v: [_plus_one(n), _past(v)], "684 pay"),
    "G+H": _rule(r"(\d+)( @ |#)(\d+)( @ |#)(\d+)",
                 lambda a, o1, b, o2, c: [_mod_sum(a, o1.strip(), b, o2.strip(), c)], "108 @ 10#2"),
}


def _check_choice(name: str, value: object, valid: Sequence[str]) -> None:
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid: {', '.join(valid)}")


def solve(task: str, input: str) -> list[str]:
    """Every accepted output of `input` under `task` ("A".."H" or a composite such as "A+B"),
    canonical first. Simple tasks also read their composite-syntax form ("* apple", "(farm frog)")."""
    _check_choice("task", task, SIMPLE_TASKS + COMPOSITES)
    rule = _RULES[task]
    match = rule.pattern.fullmatch(input.strip())
    if match is None:
        raise ValueError(f"input {input!r} is not in the syntax of task {task}, e.g. {rule.example!r}")
    return [" ".join(words) for words in product(*rule.words(*match.groups()))]


# ---------------------------------------------------------------------------------------- generation
@dataclass(frozen=True)
class _Format:
    sample: Callable[[np.random.Generator], str]  # one random input
    size: Callable[[], int]  # number of distinct inputs


def _pick(rng: np.random.Generator, seq: Sequence[str]) -> str:
    return seq[int(rng.integers(len(seq)))]


def _two(rng: np.random.Generator, seq: Sequence[str]) -> tuple[str, str]:
    i, j = rng.choice(len(seq), size=2, replace=False)
    return seq[int(i)], seq[int(j)]


def _number(rng: np.random.Generator) -> int:
    return int(rng.integers(1, _MAX_NUMBER + 1))


def _mod_pair(rng: np.random.Generator) -> tuple[int, int]:
    """(a, b) uniform over 1 <= a, b <= 1000 with 2 <= b < a (rejection keeps it uniform)."""
    while True:
        a, b = (int(v) for v in rng.integers(1, _MAX_NUMBER + 1, size=2))
        if 2 <= b < a:
            return a, b


def _word_pair(rng: np.random.Generator) -> tuple[str, str]:
    """Number words of (a, b) uniform over a, b >= 1 with a + b <= 100."""
    while True:
        a, b = (int(v) for v in rng.integers(1, 100, size=2))
        if a + b <= 100:
            return number_word(a), number_word(b)


def _styled(rng: np.random.Generator, word: str) -> str:
    return _restyle(word, "X" if rng.integers(2) else "x")


def _opposite_word(rng: np.random.Generator) -> str:
    return _styled(rng, _pick(rng, _sorted_opposite_words()))


@cache
def _verbs() -> tuple[str, ...]:
    return tuple(past_tenses())


def _verb(rng: np.random.Generator) -> str:
    return _pick(rng, _verbs())


def _mod_sum_input(rng: np.random.Generator) -> str:
    if rng.integers(2):
        a, b = _mod_pair(rng)
        return f"{a} @ {b}#{_number(rng)}"
    b, c = _mod_pair(rng)
    return f"{_number(rng)}#{b} @ {c}"


_N_MOD_PAIRS = (_MAX_NUMBER - 1) * (_MAX_NUMBER - 2) // 2  # pairs 2 <= b < a <= 1000
_N_WORD_PAIRS = 99 * 100 // 2  # pairs a, b >= 1, a + b <= 100


def _n_obj() -> int:
    return len(objects())


def _n_verbs() -> int:
    return len(past_tenses())


def _n_opp() -> int:
    return 2 * len(opposites())  # two capitalisation styles


_FORMATS: dict[tuple[str, str | None], _Format] = {
    ("A", None): _Format(lambda r: _pick(r, objects()), _n_obj),
    ("B", None): _Format(lambda r: "{} {}".format(*_two(r, objects())), lambda: _n_obj() * (_n_obj() - 1)),
    ("C", None): _Format(lambda r: "{} @ {}".format(*_word_pair(r)), lambda: _N_WORD_PAIRS),
    ("D", None): _Format(_verb, _n_verbs),
    ("E", None): _Format(_opposite_word, _n_opp),
    ("F", None): _Format(lambda r: str(_number(r)), lambda: _MAX_NUMBER),
    ("G", None): _Format(lambda r: "{} @ {}".format(*_mod_pair(r)), lambda: _N_MOD_PAIRS),
    ("H", None): _Format(lambda r: f"{_number(r)}#{_number(r)}", lambda: _MAX_NUMBER ** 2),
    # simple tasks written in a composite's syntax (Table 4.3)
    ("A", "A+B"): _Format(lambda r: f"* {_pick(r, objects())}", _n_obj),
    ("B", "A+B"): _Format(lambda r: "({} {})".format(*_two(r, objects())), lambda: _n_obj() * (_n_obj() - 1)),
    ("A", "A+C"): _Format(lambda r: f"* {number_word(int(r.integers(1, 101)))}", lambda: 100),
    ("B", "B+D"): _Format(lambda r: "({} {})".format(*_two(r, objects())), lambda: _n_obj() * (_n_obj() - 1)),
    ("B", "B+E"): _Format(lambda r: "({} {})".format(*_two(r, objects())), lambda: _n_obj() * (_n_obj() - 1)),
    # composites
    ("A+B", None): _Format(lambda r: "(* {} * {})".format(*_two(r, objects())), lambda: _n_obj() * (_n_obj() - 1)),
    ("A+C", None): _Format(lambda r: "* {} @ * {}".format(*_word_pair(r)), lambda: _N_WORD_PAIRS),
    ("A+F", None): _Format(lambda r: f"{_number(r)} {_pick(r, objects())}", lambda: _MAX_NUMBER * _n_obj()),
    ("B+D", None): _Format(lambda r: "({} {})".format(*_two(r, _verbs())),
                           lambda: _n_verbs() * (_n_verbs() - 1)),
    ("B+E", None): _Format(lambda r: "({} {})".format(*(_styled(r, w) for w in _two(r, _sorted_opposite_words()))),
                           lambda: 4 * len(opposites()) * (len(opposites()) - 1)),
    ("D+F", None): _Format(lambda r: f"{_number(r)} {_verb(r)}", lambda: _MAX_NUMBER * _n_verbs()),
    ("G+H", None): _Format(_mod_sum_input, lambda: 2 * _N_MOD_PAIRS * _MAX_NUMBER),
}


def _format(task: str, within: str | None) -> _Format:
    _check_choice("task", task, SIMPLE_TASKS + COMPOSITES)
    if within is not None:
        _check_choice("within", within, COMPOSITES)
        if task not in within.split("+"):
            raise ValueError(f"within={within!r} composes {' and '.join(within.split('+'))}, not task {task!r}")
    return _FORMATS.get((task, within), _FORMATS[(task, None)])


def _salt(*parts: object) -> int:
    return zlib.crc32("|".join(map(str, parts)).encode())


def _check_seed(seed: object) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _check_count(name: str, value: object, available: int, what: str) -> None:
    _check_positive(name, value)
    if value > available:
        raise ValueError(f"{name}={value} is more than the {available} distinct {what}")


def _distinct(rng: np.random.Generator, fmt: _Format, n: int, exclude: str | None = None) -> list[str]:
    found: dict[str, None] = {}
    while len(found) < n:
        x = fmt.sample(rng)
        if x != exclude:
            found.setdefault(x)
    return list(found)


def _item(task: str, x: str) -> dict:
    outputs = solve(task, x)
    return {"input": x, "output": outputs[0], "outputs": outputs}


def generate(task: str, n: int, seed: int = 0, *, within: str | None = None) -> list[dict]:
    """`n` items of `task` with distinct inputs: dicts with `input`, `output` (canonical answer) and
    `outputs` (all accepted answers). `within` (a composite containing `task`) writes a simple task in
    that composite's syntax, e.g. generate("A", 1, within="A+B") -> [{"input": "* apple", ...}]."""
    fmt = _format(task, within)
    _check_seed(seed)
    _check_count("n", n, fmt.size(), f"inputs of task {task}" + (f" within {within}" if within else ""))
    rng = np.random.default_rng([seed, _salt(task, within)])
    return [_item(task, x) for x in _distinct(rng, fmt, n)]


# ------------------------------------------------------------------------------------------- prompts
def _sources(pair: str, setting: str, k: int) -> tuple[str, list[tuple[str, int]]]:
    """(query task, [(demonstration task, count), ...]) of a setting."""
    first, second = pair.split("+")
    return {"simple1": (first, [(first, k)]), "simple2": (second, [(second, k)]),
            "composite": (pair, [(first, (k + 1) // 2), (second, k // 2)]),
            "composite_icl": (pair, [(pair, k)])}[setting]


def _within(task: str, pair: str) -> str | None:
    return pair if task != pair else None


def _block(x: str, y: str | None = None) -> str:
    return f"input: {x}\noutput:" + (f" {y}\n\n" if y is not None else "")


def build_prompts(pair: str, setting: str, *, k: int = 10, n_test: int = 100, seed: int = 0,
                  instruction: bool = False) -> list[dict]:
    """`n_test` few-shot prompts of one composite `pair` (e.g. "A+B") in one `setting` (SETTINGS).

    Each dict has `prompt` ("input: x\\noutput: y\\n\\n" per demonstration, then "input: <query>\\noutput:"),
    `input`, `output`, `outputs` (of the query), `pair` and `setting`."""
    _check_choice("pair", pair, COMPOSITES)
    _check_choice("setting", setting, SETTINGS)
    if not isinstance(instruction, bool):
        raise ValueError(f"instruction must be true or false, got {instruction!r}")
    _check_positive("k", k)
    _check_seed(seed)
    query_task, sources = _sources(pair, setting, k)
    _check_count("n_test", n_test, _format(query_task, _within(query_task, pair)).size(),
                 f"inputs of task {query_task} in {pair}")
    for task, count in sources:
        fmt = _format(task, _within(task, pair))
        # the query is excluded from the demonstrations, so a source of the query's task has one input less
        available = fmt.size() - (task == query_task)
        if count > available:
            raise ValueError(f"k={k} needs {count} distinct demonstrations of task {task} in {pair} but it has "
                             f"only {available} (besides the query); use a smaller k")
    head = f"{INSTRUCTIONS[pair]}\n\n" if instruction else ""
    rows = []
    for i, query in enumerate(generate(query_task, n_test, seed, within=_within(query_task, pair))):
        rng = np.random.default_rng([seed, _salt(pair, setting, "demonstrations"), i])
        demos = [_item(task, x) for task, count in sources
                 for x in _distinct(rng, _format(task, _within(task, pair)), count, exclude=query["input"])]
        if setting == "composite":
            demos = [demos[j] for j in rng.permutation(len(demos))]
        prompt = head + "".join(_block(d["input"], d["output"]) for d in demos) + _block(query["input"])
        rows.append({"prompt": prompt, **query, "pair": pair, "setting": setting})
    return rows


def as_dataset(pairs: str | Sequence[str] = COMPOSITES, settings: str | Sequence[str] = SETTINGS, *,
               k: int = 10, n_test: int = 100, seed: int = 0, instruction: bool = False) -> Dataset:
    """The prompts of every pair x setting as a `datasets.Dataset` in TRL's prompt-completion format:
    columns `prompt` (ends with "output:"), `completion` (" " + output), `input`, `output`, `outputs`,
    `pair`, `setting`. Usable for multitask SFT and evaluation alike."""
    from datasets import Dataset

    pairs = [pairs] if isinstance(pairs, str) else list(pairs)
    settings = [settings] if isinstance(settings, str) else list(settings)
    rows = [{**row, "completion": " " + row["output"]}
            for pair in pairs for setting in settings
            for row in build_prompts(pair, setting, k=k, n_test=n_test, seed=seed, instruction=instruction)]
    return Dataset.from_list(rows)


# ------------------------------------------------------------------------------------------- metrics
def _first_line(prediction: str) -> str:
    return prediction.strip().split("\n", 1)[0].strip()


def _outputs(outputs: str | Sequence[str]) -> list[str]:
    outputs = [outputs] if isinstance(outputs, str) else list(outputs)
    if not outputs or not all(o.split() for o in outputs):
        raise ValueError(f"outputs must be non-empty answers, got {outputs!r}")
    return outputs


def word_exact_match(prediction: str, outputs: str | Sequence[str]) -> float:
    """Matched words / words of the truth (Xu's thesis §9.1.2), best over the accepted `outputs`.

    The prediction's first line is split on whitespace; word i matches when it equals word i of the
    truth (position-wise, case-sensitive). Returns a value in [0, 1]."""
    predicted = _first_line(prediction).split()
    return max(sum(p == t for p, t in zip(predicted, truth)) / len(truth)
               for truth in (o.split() for o in _outputs(outputs)))


def exact_match(prediction: str, outputs: str | Sequence[str]) -> float:
    """1.0 when the stripped first line of `prediction` equals one of the accepted `outputs`, else 0.0."""
    return float(_first_line(prediction) in {o.strip() for o in _outputs(outputs)})
