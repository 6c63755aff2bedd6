"""The compositional translation suite (paper 001 §4.3.2, §9.2): hand-worked translations, an
independent parser of the generated English that re-derives every logical form, the demonstration
properties of each setting, primitive coverage, WER, bad input, and a real lm-eval run."""

from __future__ import annotations

import itertools
import json

import jiwer
import pytest
from conftest import ROOT
from in_process import run_lm_eval_cli

from adaptguard.tasks import translation as T
from adaptguard.tasks.translation import NP, Clause

TASK_DIR = ROOT / "lm_eval_tasks" / "compose_translation"
N = 40  # queries per setting in the property tests

# ---- an independent reader of the generated English ------------------------------------------------
FORMS = {form: lemma for lemma, (past, participle, _) in T.VERBS.items() for form in (past, participle)}
PREPS = {"in", "on", "beside"}


def read_np(ws: list[str], i: int) -> tuple[str, int]:
    """`the cat in the box` -> ("cat in box", next index); a name -> its lower-case form."""
    if ws[i] in ("the", "a"):
        head, i = ws[i + 1], i + 2
    else:
        assert ws[i][0].isupper(), ws
        head, i = ws[i].lower(), i + 1
    if i < len(ws) and ws[i] in PREPS:
        assert ws[i + 1] in ("the", "a")
        return f"{head} {ws[i]} {ws[i + 2]}", i + 3
    return head, i


def read_clause(ws: list[str]) -> dict:
    subject, i = read_np(ws, 0)
    roles = {"agent": None, "theme": None, "recipient": None}
    if ws[i] == "was":
        verb, voice, i = FORMS[ws[i + 1]], "passive", i + 2
        roles["theme"] = subject
        if i < len(ws) and ws[i] not in ("to", "by"):  # `Liam was given the cake`
            roles["recipient"], (roles["theme"], i) = subject, read_np(ws, i)
        while i < len(ws):
            role = {"to": "recipient", "by": "agent"}[ws[i]]
            roles[role], i = read_np(ws, i + 1)
    else:
        verb, voice, i = FORMS[ws[i]], "active", i + 1
        frame = T.VERBS[verb][2]
        roles["theme" if frame == "unaccusative" else "agent"] = subject
        if frame == "transitive":
            roles["theme"], i = read_np(ws, i)
        elif frame == "dative":
            first, i = read_np(ws, i)
            if ws[i] == "to":
                roles["theme"], (roles["recipient"], i) = first, read_np(ws, i + 1)
            else:
                roles["recipient"], (roles["theme"], i) = first, read_np(ws, i)
    assert i == len(ws), ws
    return {"verb": verb, "voice": voice, "subject": subject, **roles,
            "objects": [v for r, v in roles.items() if v is not None and v != subject]}


def read(sentence: str) -> list[dict]:
    assert sentence.endswith(" .")
    ws = sentence[:-2].split()
    ws[0] = ws[0].lower() if ws[0] in ("The", "A") else ws[0]
    return [read_clause(part.split()) for part in " ".join(ws).split(" that ")]


def logical_form(clauses: list[dict]) -> str:
    return " CCOMP ".join(
        c["verb"].upper() + " (" + ", ".join((c[r] or "none").upper() for r in ("agent", "theme", "recipient")) + ")"
        for c in clauses)


def prims(clauses: list[dict]) -> set[str]:
    out = set()
    for c in clauses:
        out.add(c["verb"])
        for phrase in filter(None, (c["agent"], c["theme"], c["recipient"])):
            ws = phrase.split()
            out |= {ws[0], phrase, ws[2]} if len(ws) == 3 else {ws[0]}
    return out


def has_pp(phrase: str | None) -> bool:
    return phrase is not None and len(phrase.split()) == 3


def blocks(prompt: str) -> tuple[list[tuple[str, str]], str]:
    """(demonstrations as (input, output)), query input) of a prompt."""
    *shots, last = prompt.split("\n\n")
    demos = []
    for s in shots:
        inp, out = s.split("\n")
        assert inp.startswith("input: ") and out.startswith("output: ")
        demos.append((inp[7:], out[8:]))
    assert last.startswith("input: ") and last.endswith("\noutput:")
    return demos, last[7:-8]


def edit_distance(a: list[str], b: list[str]) -> int:
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (x != y))
    return row[-1]


@pytest.fixture(scope="module")
def prompts() -> dict[tuple[str, str], list[dict]]:
    return {(t, s): T.build_prompts(t, s, n_test=N) for t in T.TASKS for s in T.SETTINGS}


# ---- hand-worked translations -----------------------------------------------------------------------
dog, rose, liam, emma, cake = NP("dog", "the"), NP("rose", "a"), NP("liam"), NP("emma"), NP("cake", "the")
HAND = [
    (Clause("help", dog, NP("rose", "the")), "The dog helped the rose .", "HELP (DOG, ROSE, NONE)"),  # §9.2
    (Clause("hope", liam, ccomp=Clause("prefer", dog)),  # §9.2
     "Liam hoped that the dog preferred .", "HOPE (LIAM, NONE, NONE) CCOMP PREFER (DOG, NONE, NONE)"),
    (Clause("grow", theme=cake), "The cake grew .", "GROW (NONE, CAKE, NONE)"),
    (Clause("help", NP("dog", "a"), rose, passive=True), "A rose was helped by a dog .", "HELP (DOG, ROSE, NONE)"),
    (Clause("see", theme=rose, passive=True), "A rose was seen .", "SEE (NONE, ROSE, NONE)"),
    (Clause("give", emma, cake, liam), "Emma gave the cake to Liam .", "GIVE (EMMA, CAKE, LIAM)"),
    (Clause("give", emma, cake, liam, double_object=True), "Emma gave Liam the cake .", "GIVE (EMMA, CAKE, LIAM)"),
    (Clause("lend", emma, cake, liam, passive=True), "The cake was lent to Liam by Emma .",
     "LEND (EMMA, CAKE, LIAM)"),
    (Clause("send", None, cake, liam, passive=True, double_object=True), "Liam was sent the cake .",
     "SEND (NONE, CAKE, LIAM)"),
    (Clause("say", NP("cat", "the", ("in", "the", "box")),
            ccomp=Clause("offer", emma, cake, NP("girl", "a", ("on", "a", "table")), double_object=True)),
     "The cat in the box said that Emma offered a girl on a table the cake .",
     "SAY (CAT IN BOX, NONE, NONE) CCOMP OFFER (EMMA, CAKE, GIRL ON TABLE)"),
]


@pytest.mark.parametrize(("clause", "sentence", "form"), HAND)
def test_hand_worked_translations(clause, sentence, form):
    assert T.realize(clause) == sentence
    assert T.translate(clause) == form
    assert logical_form(read(sentence)) == form  # the test's reader agrees on hand-made sentences too


def test_primitives_and_positions_by_hand():
    clause = HAND[-1][0]
    assert T.primitives(clause) == ["box", "cake", "cat", "cat in box", "emma", "girl", "girl on table", "offer",
                                    "say", "table"]
    feats = T.features(HAND[3][0])  # A rose was helped by a dog .
    assert {"help@passive", "rose@subject", "dog@object"} <= feats and "dog@subject" not in feats
    assert "liam@subject" in T.features(HAND[8][0])  # Liam was sent the cake: recipient is the subject


# ---- every generated item, re-derived independently ------------------------------------------------
def test_every_prompt_line_translates_as_the_independent_reader_says(prompts):
    n = 0
    for rows in prompts.values():
        for row in rows:
            demos, query = blocks(row["prompt"])
            assert query == row["input"]
            for sentence, form in demos + [(row["input"], row["output"])]:
                assert logical_form(read(sentence)) == form, sentence
                n += 1
            assert sorted(prims(read(row["input"]))) == row["primitives"]
    assert n == 8 * N * 11


def test_items_are_uppercase_chains_of_three_argument_clauses(prompts):
    for rows in prompts.values():
        for row in rows:
            assert row["output"] == row["output"].upper()
            for clause in row["output"].split(" CCOMP "):
                pred, args = clause.split(" (", 1)
                assert pred.isalpha() and args.endswith(")") and len(args[:-1].split(", ")) == 3


# ---- settings ----------------------------------------------------------------------------------------
def test_primitive_coverage_and_demos_exclude_query(prompts):
    for (task, setting), rows in prompts.items():
        assert len(rows) == N and len({r["input"] for r in rows}) == N
        for row in rows:
            demos, query = blocks(row["prompt"])
            assert len(demos) == 10 and query not in [d for d, _ in demos]
            covered = set().union(*(prims(read(d)) for d, _ in demos))
            assert prims(read(query)) <= covered, (task, setting, query)
            assert (row["task"], row["setting"]) == (task, setting)


def test_t1_settings_phrase_recombination_and_longer_chain(prompts):
    for setting in T.SETTINGS:
        for row in prompts["t1", setting]:
            demos, query = blocks(row["prompt"])
            q, ds = read(query), [read(d) for d, _ in demos]
            assert all(c["voice"] == "active" for c in q + [c for d in ds for c in d])
            pp_subject = has_pp(q[0]["subject"])
            assert pp_subject == (setting != "simple2")
            assert len(q) in ((1, 2) if setting == "simple1" else (3, 4))
            assert not any(map(has_pp, [c["subject"] for c in q[1:]] + [o for c in q for o in c["objects"]]))
            if setting == "composite_icl":  # demos drawn from the composite distribution
                assert all(len(d) in (3, 4) and has_pp(d[0]["subject"]) for d in ds)
            else:  # short chains, PPs only on objects: the query's novelty is unseen in the demos
                assert all(len(d) <= 2 and not any(has_pp(c["subject"]) for c in d) for d in ds)
                if pp_subject:  # the subject phrase itself is seen, as an object
                    assert any(q[0]["subject"] in c["objects"] for d in ds for c in d)
    assert any(any(map(has_pp, c["objects"])) for r in prompts["t1", "simple1"] for d, _ in blocks(r["prompt"])[0]
               for c in read(d))


def test_t2_settings_passive_to_active_and_object_to_subject(prompts):
    queries = [r["input"] for r in prompts["t2", "simple1"]]
    for setting in T.SETTINGS:
        assert [r["input"] for r in prompts["t2", setting]] == queries  # the settings differ in demos only
        for row in prompts["t2", setting]:
            demos, query = blocks(row["prompt"])
            (q,) = read(query)
            assert q["voice"] == "active" and q["theme"] and row["input"].split()[0] in ("The", "A")
            clauses = [c for d, _ in demos for c in read(d)]
            verb_voices = {c["voice"] for c in clauses if c["verb"] == q["verb"]}
            noun_positions = {"subject" if c["subject"] == q["subject"] else "object"
                              for c in clauses if q["subject"] in [c["subject"], *c["objects"]]}
            if setting in ("simple1", "composite"):
                assert verb_voices == {"passive"}
            if setting in ("simple2", "composite"):
                assert noun_positions == {"object"}
            if setting == "composite_icl":
                assert "active" in verb_voices and "subject" in noun_positions
                assert all(c["voice"] == "active" for c in clauses)
    # without a restriction the verb does show up active: simple2's demos are not all passive by chance
    assert any("active" in {c["voice"] for d, _ in blocks(r["prompt"])[0] for c in read(d)
                            if c["verb"] == read(r["input"])[0]["verb"]} for r in prompts["t2", "simple2"])


def test_determinism_and_seed(prompts):
    again = T.build_prompts("t1", "composite", n_test=N)
    assert again == prompts["t1", "composite"]
    other = T.build_prompts("t1", "composite", n_test=N, seed=1)
    assert [r["input"] for r in other] != [r["input"] for r in again]
    assert T.build_prompts("t2", "simple2", n_test=5) == prompts["t2", "simple2"][:5]


def test_as_dataset_prompt_completion(prompts):
    ds = T.as_dataset("t2", "composite", n_test=N)
    assert ds.column_names == ["prompt", "completion"] and len(ds) == N
    assert ds[0]["prompt"] == prompts["t2", "composite"][0]["prompt"]
    assert ds[0]["completion"] == " " + prompts["t2", "composite"][0]["output"]


# ---- metric ------------------------------------------------------------------------------------------
def test_wer_hand_examples():
    ref = "HELP (DOG, ROSE, NONE)"
    assert T.wer("HELP (DOG, CAT, NONE)", ref) == 0.25  # 1 substitution / 4 words
    assert T.wer(" HELP (DOG, ROSE, NONE)\ninput: junk", ref) == 0.0  # first line, stripped
    assert T.wer("HELP (DOG, ROSE, NONE) CCOMP", ref) == 0.25  # 1 insertion
    assert T.wer("HELP", ref) == 0.75  # 3 deletions
    assert T.wer("", ref) == T.wer("  \n ", ref) == 1.0
    assert T.wer("a b c d e f g h", ref) == 2.0  # 4 substitutions + 4 insertions
    assert T.exact_match(" HELP (DOG, ROSE, NONE) \nmore", ref) == 1.0
    assert T.exact_match("HELP (DOG, ROSE,NONE)", ref) == 0.0
    with pytest.raises(ValueError, match="reference"):
        T.wer("x", " ")


def test_wer_matches_an_independent_edit_distance(prompts):
    rows = prompts["t1", "composite"]
    for a, b in itertools.pairwise(rows):  # other queries' answers as predictions
        ref, hyp = a["output"], b["output"]
        assert T.wer(hyp, ref) == pytest.approx(edit_distance(ref.split(), hyp.split()) / len(ref.split()))


# ---- bad input ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(("kwargs", "match"), [
    ({"task": "t3", "setting": "simple1"}, "task='t3'.*t1, t2"),
    ({"task": "t1", "setting": "simple"}, "setting='simple'.*simple1, simple2, composite, composite_icl"),
    ({"task": "t1", "setting": "simple1", "k": 0}, "k=0"),
    ({"task": "t1", "setting": "simple1", "k": 11, "pool_size": 10}, "k=11.*pool_size=10"),
    ({"task": "t1", "setting": "simple1", "n_test": 0}, "n_test=0"),
    ({"task": "t2", "setting": "simple1", "n_test": 2.5}, "n_test=2.5"),
    ({"task": "t1", "setting": "composite", "k": 1, "n_test": 5}, "k=1: only 0 of 120 .*increase k"),
])
def test_bad_input(kwargs, match):
    with pytest.raises(ValueError, match=match):
        T.build_prompts(**kwargs)


def test_bad_structures():
    with pytest.raises(ValueError, match="verb='fly' is not in the lexicon"):
        T.translate(Clause("fly", liam))
    with pytest.raises(ValueError, match="transitive frame"):
        T.realize(Clause("help", liam))  # no theme
    with pytest.raises(ValueError, match="unergative frame"):
        T.realize(Clause("sleep", liam, passive=True))


# ---- lm-eval -----------------------------------------------------------------------------------------
def test_task_index_lists_the_eight_tasks_and_the_group():
    from lm_eval.tasks import TaskManager

    names = set(TaskManager(include_path=str(TASK_DIR), include_defaults=False).all_tasks)
    tasks = {f"compose_translation_{t}_{s}" for t in T.TASKS for s in T.SETTINGS}
    assert tasks | {"compose_translation"} == names


def test_lm_eval_cli_end_to_end(tmp_path, embedded_path):
    settings = {"compose_translation_t1_composite": ("t1", "composite"), "compose_translation_t2_simple1": ("t2", "simple1")}
    tasks = list(settings)
    cmd = ["--model", "hf", "--model_args", f"pretrained={embedded_path}",
           "--tasks", ",".join(tasks), "--include_path", str(TASK_DIR), "--device", "cpu", "--batch_size", "8",
           "--limit", "3", "--log_samples", "--output_path", str(tmp_path)]
    proc = run_lm_eval_cli(*cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results,) = tmp_path.rglob("results_*.json")
    res = json.loads(results.read_text())["results"]
    for task in tasks:
        assert res[task]["wer,none"] >= 0 and 0 <= res[task]["exact_match,none"] <= 1
        (samples,) = tmp_path.rglob(f"samples_{task}_2*.jsonl")
        rows = [json.loads(line) for line in samples.read_text().splitlines()]
        expected = T.build_prompts(*settings[task], n_test=3)
        assert [r["doc"]["prompt"] for r in rows] == [e["prompt"] for e in expected]
        for r in rows:
            ref, hyp = r["doc"]["output"], r["filtered_resps"][0].strip().split("\n")[0].strip()
            assert r["target"] == ref
            assert r["wer"] == pytest.approx(jiwer.wer(ref, hyp) if hyp else 1.0)
            assert r["wer"] == pytest.approx(edit_distance(ref.split(), hyp.split()) / len(ref.split()))
            assert r["exact_match"] == float(hyp == ref)
        assert res[task]["wer,none"] == pytest.approx(sum(r["wer"] for r in rows) / len(rows))
