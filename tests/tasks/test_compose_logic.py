"""The compositional-ICL logical task suite (paper 001 Ch. 4.3.1, §9.1): paper examples, every task
against an oracle written independently here, prompts, metrics, bad input, and the lm-eval tasks."""

from __future__ import annotations

import importlib.util
import json
import re
from collections import Counter
from math import ceil

import pytest
from conftest import ROOT
from in_process import run_lm_eval_cli

from adaptguard.tasks import compose

TASK_DIR = ROOT / "lm_eval_tasks" / "compose_logic"
WORDLISTS = ROOT / "src" / "adaptguard" / "tasks" / "wordlists"

# The examples the issue requires verbatim (paper 001 Tables 4.1-4.3).
PAPER = [("A", "apple", "APPLE"), ("B", "bell ford", "ford bell"), ("B", "(farm frog)", "frog farm"),
         ("C", "twenty @ eleven", "thirty-one"), ("D", "pay", "paid"), ("E", "Above", "Below"),
         ("F", "435", "436"), ("G", "15 @ 6", "3"), ("H", "12#5", "18"), ("A+B", "(* bell * ford)", "FORD BELL"),
         ("A+F", "684 cat", "685 CAT"), ("A", "* apple", "APPLE"), ("A", "cow", "COW")]


# ------------------------------------------------------------------------------- independent oracle
def read_list(name: str) -> list[list[str]]:
    lines = (WORDLISTS / name).read_text().splitlines()
    return [line.split() for line in lines if line and not line.startswith("#")]


OBJECTS = [row[0] for row in read_list("objects.txt")]
PAST = {row[0]: row[1:] for row in read_list("past_tense.txt")}
OPPOSITE: dict[str, set[str]] = {}
for left, right in read_list("opposites.txt"):
    OPPOSITE.setdefault(left, set()).add(right)
    OPPOSITE.setdefault(right, set()).add(left)

UNITS = dict(zip("one two three four five six seven eight nine".split(), range(1, 10)))
TEENS = dict(zip("ten eleven twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen".split(),
                 range(10, 20)))
DECADES = dict(zip("twenty thirty forty fifty sixty seventy eighty ninety".split(), range(20, 100, 10)))


def words_to_int(text: str) -> int:
    if text == "one hundred":
        return 100
    head, _, tail = text.partition("-")
    if head in DECADES:
        return DECADES[head] + (UNITS[tail] if tail else 0)
    assert not tail, text
    return {**UNITS, **TEENS}[head]


ALL_NUMBER_WORDS = (list(UNITS) + list(TEENS) + [d + (f"-{u}" if u else "") for d in DECADES for u in ["", *UNITS]]
                    + ["one hundred"])
NUMBER_WORD = {words_to_int(w): w for w in ALL_NUMBER_WORDS}


def upper(word: str) -> str:
    return "".join(chr(ord(c) - 32) if "a" <= c <= "z" else c for c in word)


def styled_opposites(word: str) -> set[str]:
    found = OPPOSITE[word.lower()]
    return {o.capitalize() for o in found} if word[0].isupper() else found


def oracle(task: str, x: str) -> set[str]:
    """Accepted outputs recomputed from the documented syntax, independently of compose.py."""
    nums = [int(n) for n in re.findall(r"\d+", x)]
    words = re.findall(r"[A-Za-z][A-Za-z-]*", x)
    if task == "A":
        return {upper(" ".join(words))}
    if task == "B":
        return {" ".join(words[::-1])}
    if task == "C":
        a, b = (words_to_int(part) for part in x.split(" @ "))
        return {NUMBER_WORD[a + b]}
    if task == "D":
        return set(PAST[x])
    if task == "E":
        return styled_opposites(x)
    if task == "F":
        return {str(nums[0] + 1)}
    if task == "G":
        return {str(nums[0] - nums[1] * (nums[0] // nums[1]))}
    if task == "H":
        return {str(sum(nums) + 1)}
    if task == "A+B":
        return {f"{upper(words[1])} {upper(words[0])}"}
    if task == "A+C":
        return {upper(s) for s in oracle("C", x.replace("* ", ""))}
    if task == "A+F":
        return {f"{nums[0] + 1} {upper(words[0])}"}
    if task == "B+D":
        return {f"{p} {q}" for p in PAST[words[1]] for q in PAST[words[0]]}
    if task == "B+E":
        return {f"{p} {q}" for p in styled_opposites(words[1]) for q in styled_opposites(words[0])}
    if task == "D+F":
        return {f"{nums[0] + 1} {p}" for p in PAST[words[0]]}
    if task == "G+H":
        a, b, c = nums
        if x.index("@") < x.index("#"):  # a @ b#c
            return {str(a % b + c + 1), str(a % (b + c + 1))}
        return {str((a + b + 1) % c), str(a + b % c + 1)}
    raise AssertionError(task)

# per composite: the syntax of its simple tasks (setting-source classification) and of the composite
SIMPLE_SYNTAX = {
    "A+B": (r"\* [a-z]+", r"\([a-z]+ [a-z]+\)"),
    "A+C": (r"\* [a-z-]+( hundred)?", r"[a-z-]+ @ [a-z-]+"),
    "A+F": (r"[a-z]+", r"\d+"),
    "B+D": (r"\([a-z]+ [a-z]+\)", r"[a-z]+"),
    "B+E": (r"\([a-z]+ [a-z]+\)", r"[A-Za-z][a-z]+"),
    "D+F": (r"[a-z]+", r"\d+"),
    "G+H": (r"\d+ @ \d+", r"\d+#\d+"),
}
COMPOSITE_SYNTAX = {"A+B": r"\(\* [a-z]+ \* [a-z]+\)", "A+C": r"\* [a-z-]+ @ \* [a-z-]+", "A+F": r"\d+ [a-z]+",
                    "B+D": r"\([a-z]+ [a-z]+\)", "B+E": r"\([A-Za-z][a-z]+ [A-Za-z][a-z]+\)",
                    "D+F": r"\d+ [a-z]+", "G+H": r"\d+ @ \d+#\d+|\d+#\d+ @ \d+"}
STANDALONE_SYNTAX = {"A": r"[a-z]+", "B": r"[a-z]+ [a-z]+", "C": r"[a-z-]+ @ [a-z-]+", "D": r"[a-z]+",
                     "E": r"[A-Za-z][a-z]+", "F": r"\d+", "G": r"\d+ @ \d+", "H": r"\d+#\d+"}


def check_ranges(task: str, within: str | None, x: str) -> None:
    nums = [int(n) for n in re.findall(r"\d+", x)]
    assert all(1 <= n <= 1000 for n in nums), x
    if "@" in x and nums:  # modulus: the numbers around @ satisfy 2 <= b < a
        left, right = (int(v) for v in re.search(r"(\d+) @ (\d+)", x).groups())
        assert 2 <= right < left, x
    if task in ("C", "A+C"):
        a, b = (words_to_int(p.replace("* ", "")) for p in x.split(" @ "))
        assert a >= 1 and b >= 1 and a + b <= 100, x
    plain = re.findall(r"[a-z]+", x.lower())
    if (task, within) == ("A", "A+C"):
        assert 1 <= words_to_int(x.removeprefix("* ")) <= 100, x
    elif task in ("A", "B", "A+B", "A+F"):
        assert set(plain) <= set(OBJECTS), x
    if task in ("D", "B+D", "D+F"):
        assert set(plain) <= set(PAST), x
    if task in ("E", "B+E"):
        assert set(plain) <= set(OPPOSITE), x


# ------------------------------------------------------------------------------------------- tests
def test_paper_examples_come_out_exactly():
    assert set(PAPER) <= set(compose.PAPER_EXAMPLES)
    for task, x, y in compose.PAPER_EXAMPLES:
        assert compose.solve(task, x)[0] == y, (task, x)
        assert oracle(task, x) == {y}
    # Table 9.1: G+H accepts both orders of operations ("4 or 11"); this input gives exactly those
    assert compose.solve("G+H", "108 @ 10#2") == ["11", "4"]
    assert compose.solve("G+H", "12#5 @ 7") == ["4", "18"]
    assert compose.solve("A+C", "* twenty @ * eleven") == ["THIRTY-ONE"]
    assert compose.solve("B+D", "(pay go)") == ["went paid"]
    assert compose.solve("B+E", "(Above hot)") == ["cold Below"]
    assert compose.solve("D+F", "684 pay") == ["685 paid"]
    assert compose.solve("B+D", "(dream go)") == ["went dreamed", "went dreamt"]


def test_word_lists():
    for name in ("objects.txt", "past_tense.txt", "opposites.txt"):
        text = (WORDLISTS / name).read_text()
        assert text.startswith("#") and "no download" in text
    assert len(OBJECTS) >= 300 and len(set(OBJECTS)) == len(OBJECTS)
    assert all(re.fullmatch(r"[a-z]+", w) for w in OBJECTS)
    assert len(PAST) >= 200 and PAST["pay"] == ["paid"] and PAST["go"] == ["went"] and PAST["buy"] == ["bought"]
    assert PAST["stop"] == ["stopped"] and PAST["learn"] == ["learned", "learnt"]
    pairs = read_list("opposites.txt")
    assert len(pairs) >= 150 and all(len(p) == 2 for p in pairs) and OPPOSITE["above"] == {"below"}
    # the word class tells the operation: object words are never verbs or opposite words
    assert not set(OBJECTS) & set(PAST) and not set(OBJECTS) & set(OPPOSITE)
    assert compose.objects() == tuple(OBJECTS) and set(compose.past_tenses()) == set(PAST)


def all_formats():
    yield from ((t, None) for t in compose.SIMPLE_TASKS + compose.COMPOSITES)
    yield from ((t, pair) for pair in compose.COMPOSITES for t in pair.split("+"))


@pytest.mark.parametrize(("task", "within"), list(all_formats()))
def test_generated_items_match_independent_oracle(task, within):
    n = 100 if (task, within) == ("A", "A+C") else 200
    items = compose.generate(task, n, seed=3, within=within)
    inputs = [it["input"] for it in items]
    assert len(items) == n and len(set(inputs)) == n
    if within is None:
        syntax = COMPOSITE_SYNTAX.get(task) or STANDALONE_SYNTAX[task]
    else:
        syntax = SIMPLE_SYNTAX[within][within.split("+").index(task)]
    for it in items:
        x = it["input"]
        assert re.fullmatch(syntax, x), (task, within, x)
        check_ranges(task, within, x)
        assert set(it["outputs"]) == oracle(task, x), (task, x)
        assert it["output"] == it["outputs"][0] and len(set(it["outputs"])) == len(it["outputs"])
        assert compose.solve(task, x) == it["outputs"]
    if task == "E":  # both capitalisation styles occur and are kept
        assert {x[0].isupper() for x in inputs} == {True, False}
    if task == "G+H":  # both operator orders occur, and some items have two accepted outputs
        assert {x.index("@") < x.index("#") for x in inputs} == {True, False}
        assert any(len(it["outputs"]) == 2 for it in items)


def test_generation_is_deterministic_by_seed():
    for task in ("A", "C", "E", "G+H", "B+D"):
        assert compose.generate(task, 30, seed=5) == compose.generate(task, 30, seed=5)
        assert compose.generate(task, 30, seed=5) != compose.generate(task, 30, seed=6)
    a = compose.build_prompts("A+F", "composite", n_test=10, seed=2)
    assert a == compose.build_prompts("A+F", "composite", n_test=10, seed=2)
    b = compose.build_prompts("A+F", "composite", n_test=10, seed=3)
    assert [r["prompt"] for r in a] != [r["prompt"] for r in b]


def parse_prompt(prompt: str) -> tuple[list[tuple[str, str]], str]:
    *demos, query = prompt.split("\n\n")
    pairs = [re.fullmatch(r"input: (.*)\noutput: (.*)", d).groups() for d in demos]
    return pairs, re.fullmatch(r"input: (.*)\noutput:", query).group(1)


@pytest.mark.parametrize("pair", compose.COMPOSITES)
def test_prompt_structure(pair):
    first, second = pair.split("+")
    k, n = 7, 15
    rows = {s: compose.build_prompts(pair, s, k=k, n_test=n, seed=1) for s in compose.SETTINGS}
    source_re = {"simple1": [SIMPLE_SYNTAX[pair][0]], "simple2": [SIMPLE_SYNTAX[pair][1]],
                 "composite": list(SIMPLE_SYNTAX[pair]), "composite_icl": [COMPOSITE_SYNTAX[pair]]}
    query_re = {"simple1": SIMPLE_SYNTAX[pair][0], "simple2": SIMPLE_SYNTAX[pair][1],
                "composite": COMPOSITE_SYNTAX[pair], "composite_icl": COMPOSITE_SYNTAX[pair]}
    query_task = {"simple1": first, "simple2": second, "composite": pair, "composite_icl": pair}
    for setting, items in rows.items():
        assert len(items) == n and len({r["input"] for r in items}) == n
        for r in items:
            assert r["pair"] == pair and r["setting"] == setting
            demos, query = parse_prompt(r["prompt"])
            assert query == r["input"] and re.fullmatch(query_re[setting], query)
            assert set(r["outputs"]) == oracle(query_task[setting], query)
            assert len(demos) == k and len({x for x, _ in demos}) == k and query not in {x for x, _ in demos}
            counts = Counter(next(i for i, rx in enumerate(source_re[setting]) if re.fullmatch(rx, x))
                             for x, _ in demos)
            expected = {0: ceil(k / 2), 1: k // 2} if setting == "composite" else {0: k}
            assert counts == expected, (setting, demos)
            tasks = {"simple1": [first], "simple2": [second], "composite": [first, second], "composite_icl": [pair]}
            for x, y in demos:  # every demonstration is answered correctly (canonical output)
                assert any(re.fullmatch(rx, x) and y in oracle(t, x)
                           for rx, t in zip(source_re[setting], tasks[setting]))
    # composite and composite_icl share the queries (paired comparison) but not the demonstrations
    assert [r["input"] for r in rows["composite"]] == [r["input"] for r in rows["composite_icl"]]
    # the instruction (§9.1.2) is a prefix; the rest of the prompt is unchanged
    with_instruction = compose.build_prompts(pair, "composite", k=k, n_test=n, seed=1, instruction=True)
    for plain, instructed in zip(rows["composite"], with_instruction):
        assert instructed["prompt"] == compose.INSTRUCTIONS[pair] + "\n\n" + plain["prompt"]


def test_per_item_demonstrations_differ_and_default_k():
    rows = compose.build_prompts("B+E", "composite_icl", n_test=5)
    demos = [tuple(parse_prompt(r["prompt"])[0]) for r in rows]
    assert len(set(demos)) == 5 and all(len(d) == 10 for d in demos)
    assert len(compose.build_prompts("A+B", "simple1")) == 100


def test_as_dataset_prompt_completion_format():
    ds = compose.as_dataset(["A+B", "G+H"], ["simple1", "composite"], k=3, n_test=4, seed=0)
    assert len(ds) == 16
    assert {"prompt", "completion", "input", "output", "outputs", "pair", "setting"} <= set(ds.column_names)
    assert Counter(zip(ds["pair"], ds["setting"])) == {(p, s): 4 for p in ("A+B", "G+H")
                                                       for s in ("simple1", "composite")}
    for row in ds:
        assert row["completion"] == " " + row["output"] and row["prompt"].endswith("output:")
        assert row["output"] in row["outputs"]
    single = compose.as_dataset("A+C", "composite_icl", n_test=3)
    assert single["prompt"] == [r["prompt"] for r in compose.build_prompts("A+C", "composite_icl", n_test=3)]


def test_metrics_hand_examples():
    wem, em = compose.word_exact_match, compose.exact_match
    assert wem(" FORD BELL", ["FORD BELL"]) == 1.0 and em(" FORD BELL", ["FORD BELL"]) == 1.0
    assert wem("FORD CAT", "FORD BELL") == 0.5 and em("FORD CAT", "FORD BELL") == 0.0
    assert wem("BELL FORD", "FORD BELL") == 0.0  # position-wise
    assert wem("ford bell", "FORD BELL") == 0.0  # case-sensitive
    assert wem("685", "685 CAT") == 0.5
    assert wem("685 CAT extra", "685 CAT") == 1.0 and em("685 CAT extra", "685 CAT") == 0.0
    assert wem("4", ["11", "4"]) == 1.0 and em("4", ["11", "4"]) == 1.0  # best over accepted outputs
    assert wem("went dreamt", ["went dreamed", "went dreamt"]) == 1.0
    assert wem(" thirty-one\ninput: x", "thirty-one") == 1.0 and em(" thirty-one \ninput: x", ["thirty-one"]) == 1.0
    assert wem("ONE", "ONE HUNDRED") == 0.5
    assert wem("", "APPLE") == 0.0 and em("", "APPLE") == 0.0
    with pytest.raises(ValueError, match="outputs"):
        wem("x", [])


def test_bad_input_is_refused_with_reason():
    with pytest.raises(ValueError, match=r"unknown task 'Z'.*A, B, C, D, E, F, G, H, A\+B"):
        compose.generate("Z", 3)
    with pytest.raises(ValueError, match=r"unknown pair 'AB'.*A\+B, A\+C, A\+F, B\+D, B\+E, D\+F, G\+H"):
        compose.build_prompts("AB", "simple1")
    with pytest.raises(ValueError, match="unknown setting 'mixed'.*simple1, simple2, composite, composite_icl"):
        compose.build_prompts("A+B", "mixed")
    with pytest.raises(ValueError, match=r"k=100 needs 100 distinct demonstrations of task A in A\+C.*only 99"):
        compose.build_prompts("A+C", "simple1", k=100)
    compose.build_prompts("A+C", "simple1", k=99, n_test=1)  # the largest k the pool allows
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="k must be a positive integer"):
            compose.build_prompts("A+B", "simple1", k=bad)
        with pytest.raises(ValueError, match="n must be a positive integer"):
            compose.generate("A", bad)
    with pytest.raises(ValueError, match="n_test must be a positive integer, got 0"):
        compose.build_prompts("A+B", "simple1", n_test=0)
    with pytest.raises(ValueError, match=r"n_test=101 is more than the 100 distinct inputs of task A in A\+C"):
        compose.build_prompts("A+C", "simple1", n_test=101)
    with pytest.raises(ValueError, match="n=400 is more than the 335 distinct inputs of task A"):
        compose.generate("A", 400)
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        compose.generate("A", 3, seed=-1)
    with pytest.raises(ValueError, match="instruction must be true or false"):
        compose.build_prompts("A+B", "simple1", instruction="yes")
    with pytest.raises(ValueError, match=r"within='A\+B' composes A and B, not task 'C'"):
        compose.generate("C", 2, within="A+B")
    with pytest.raises(ValueError, match=r"not in the syntax of task A\+B, e.g. '\(\* bell \* ford\)'"):
        compose.solve("A+B", "bell ford")
    with pytest.raises(ValueError, match="not a verb"):
        compose.solve("D", "apple")
    with pytest.raises(ValueError, match="modulus by zero"):
        compose.solve("G", "5 @ 0")
    with pytest.raises(ValueError, match="defined up to one hundred"):
        compose.solve("C", "ninety @ twenty")


# ------------------------------------------------------------------------------------------ lm-eval
def load_utils():
    spec = importlib.util.spec_from_file_location("compose_logic_utils", TASK_DIR / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_yamls_are_generated_and_indexed():
    utils = load_utils()
    files = utils.yaml_files()
    assert len(files) == 29 and sorted(p.name for p in TASK_DIR.glob("compose_logic*.yaml")) == sorted(files)
    for name, text in files.items():
        assert (TASK_DIR / name).read_text() == text, f"{name} is stale: run python {TASK_DIR / 'utils.py'}"
    expected = {f"compose_logic_{p.replace('+', '').lower()}_{s}" for p in compose.COMPOSITES for s in compose.SETTINGS}
    assert set(utils.TASKS) == expected and len(expected) == 28
    scores = utils.process_results({"outputs": ["685 CAT"]}, [" 685 DOG"])
    assert scores == {"word_exact_match": 0.5, "exact_match": 0.0}

    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(TASK_DIR), include_defaults=False, metadata={"seed": 2, "k": 3})
    assert set(manager.all_tasks) == expected | {"compose_logic"}
    assert set(manager.match_tasks(["compose_logic_*"])) == expected  # the group is not matched
    loaded = manager.load_task_or_group(["compose_logic"])
    (group_tasks,) = loaded.values()
    assert set(group_tasks) == expected
    task = group_tasks["compose_logic_df_simple2"]
    docs = list(task.test_docs())
    expected_prompts = [r["prompt"] for r in compose.build_prompts("D+F", "simple2", k=3, seed=2)]
    assert [task.doc_to_text(d) for d in docs] == expected_prompts


def test_readme_example_prompt_is_current():
    readme = (TASK_DIR / "README.md").read_text()
    example = re.search(r"```\n(input: .*?output:)\n```", readme, re.DOTALL).group(1)
    row = compose.build_prompts("A+B", "composite", k=4, n_test=1, seed=0)[0]
    assert example == row["prompt"] and f"The answer is `{row['output']}`" in readme


def test_lm_eval_cli_end_to_end(tmp_path, embedded_path):
    tasks = ["compose_logic_ab_composite", "compose_logic_gh_composite_icl"]
    cmd = ["--model", "hf", "--model_args", f"pretrained={embedded_path}",
           "--tasks", ",".join(tasks), "--include_path", str(TASK_DIR), "--device", "cpu", "--batch_size", "8",
           "--limit", "3", "--log_samples", "--output_path", str(tmp_path), "--metadata", '{"seed": 1, "k": 4}']
    proc = run_lm_eval_cli(*cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results_file,) = tmp_path.rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]
    utils = load_utils()
    for name in tasks:
        for metric in ("word_exact_match,none", "exact_match,none"):
            assert 0.0 <= results[name][metric] <= 1.0
        (samples_file,) = tmp_path.rglob(f"samples_{name}_2*.jsonl")
        samples = [json.loads(line) for line in samples_file.read_text().splitlines()]
        pair, setting = utils.TASKS[name]
        expected = compose.build_prompts(pair, setting, k=4, n_test=100, seed=1)
        assert len(samples) == 3
        for s in samples:
            assert s["doc"]["prompt"] == expected[s["doc_id"]]["prompt"]  # --metadata reached the generator
            assert len(parse_prompt(s["doc"]["prompt"])[0]) == 4
            assert s["word_exact_match"] == compose.word_exact_match(s["filtered_resps"][0], s["doc"]["outputs"])
            assert s["exact_match"] == compose.exact_match(s["resps"][0][0], s["doc"]["outputs"])
        mean = sum(s["word_exact_match"] for s in samples) / 3
        assert results[name]["word_exact_match,none"] == pytest.approx(mean)
