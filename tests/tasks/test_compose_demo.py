"""The composition section of `adaptguard demo` (compositional ICL on the embedded default)."""

import json
import re
from dataclasses import replace

import pytest

from adaptguard.demo.composition import (
    PRESETS,
    CompositionConfig,
    answer_labels,
    fit_k,
    meta_training_rows,
    run_composition_demo,
    scores,
)
from adaptguard.tasks.compose import SETTINGS, build_prompts, objects

MICRO = CompositionConfig(eval_pairs=("A+F", "A+B"), train_composites=("D+F", "B+D"), simple_pairs=("A+F", "A+B"),
                          k=2, n_train=3, n_test=3, steps=2, batch_size=2, max_new_tokens=6)


@pytest.fixture(scope="module")
def tokenizer(embedded_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_path)


@pytest.fixture(scope="module")
def micro(embedded_path, tmp_path_factory):
    out = tmp_path_factory.mktemp("composition")
    return out, run_composition_demo(out, seed=3, config=MICRO)


def _first_line_words(text: str) -> list[str]:
    lines = text.strip().splitlines()
    return lines[0].split() if lines else []


def _word_match(prediction: str, truth: str) -> float:
    # position-wise, case-sensitive: matched words over the truth's words
    predicted, wanted = _first_line_words(prediction), truth.split()
    return sum(1 for i, w in enumerate(wanted) if i < len(predicted) and predicted[i] == w) / len(wanted)


def test_micro_run_table_settings_and_file(micro):
    out, result = micro
    assert set(result["table"]) == {"A+F", "A+B"}
    for pair, row in result["table"].items():
        assert list(row) == list(SETTINGS)
        for setting, cell in row.items():
            assert set(cell) == {"word_exact_match", "exact_match"}
            assert all(0.0 <= v <= 1.0 for v in cell.values())
            assert len(result["predictions"][pair][setting]) == MICRO.n_test
    assert len(result["losses"]) == MICRO.steps and result["seconds"] > result["train_seconds"] > 0
    assert [p.name for p in out.iterdir()] == ["composition.json"]  # nothing else, no temp file left
    assert json.loads((out / "composition.json").read_text())["table"] == result["table"]
    md = result["markdown"]
    assert "| pair | K | simple1 | simple2 | composite | composite_icl |" in md
    for pair in ("A+F", "A+B"):
        cells = " | ".join(f"{result['table'][pair][s]['word_exact_match']:.2f} / "
                           f"{result['table'][pair][s]['exact_match']:.2f}" for s in SETTINGS)
        assert f"| {pair} | {result['ks'][pair]} | {cells} |" in md


def test_scores_recomputed_from_predictions(micro):
    _, result = micro
    for pair, row in result["predictions"].items():
        for setting, items in row.items():
            # the predictions answer exactly the evaluation prompts (seed 3, the pair's K)
            prompts = build_prompts(pair, setting, k=result["ks"][pair], n_test=MICRO.n_test, seed=3)
            assert [i["input"] for i in items] == [p["input"] for p in prompts]
            word = sum(max(_word_match(i["prediction"], o) for o in i["outputs"]) for i in items) / len(items)
            exact = sum(any(i["prediction"].strip().split("\n")[0].strip() == o for o in i["outputs"])
                        for i in items) / len(items)
            assert result["table"][pair][setting]["word_exact_match"] == pytest.approx(word)
            assert result["table"][pair][setting]["exact_match"] == pytest.approx(exact)


def test_scores_by_hand():
    items = [{"prediction": "685 cat\ninput: 7", "outputs": ["685 CAT"]},  # one of two words
             {"prediction": " FORD BELL ", "outputs": ["FORD BELL"]},
             {"prediction": "4", "outputs": ["11", "4"]},  # G+H accepts either order of operations
             {"prediction": "", "outputs": ["436"]}]
    assert scores(items) == pytest.approx({"word_exact_match": 2.5 / 4, "exact_match": 2 / 4})


def test_same_seed_same_result_other_seed_other_items(micro, embedded_path):
    import torch

    _, first = micro
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        again = run_composition_demo(None, seed=3, config=MICRO)
        assert torch.get_num_threads() == 2  # the section's single thread is undone
    finally:
        torch.set_num_threads(threads)
    assert again["predictions"] == first["predictions"] and again["table"] == first["table"]
    assert again["losses"] == first["losses"]
    other = build_prompts("A+F", "composite_icl", k=first["ks"]["A+F"], n_test=MICRO.n_test, seed=4)
    assert [p["input"] for p in other] != [i["input"] for i in first["predictions"]["A+F"]["composite_icl"]]


def test_training_never_sees_the_evaluated_composites(tokenizer):
    config = PRESETS["default"]
    rows = meta_training_rows(config, tokenizer, seed=0)
    assert {(r["pair"], r["setting"]) for r in rows} == (
        {(p, s) for p in config.simple_pairs for s in ("simple1", "simple2")}
        | {(p, "composite_icl") for p in config.train_composites})
    inputs = {line[len("input: "):] for r in rows for line in r["text"].splitlines() if line.startswith("input: ")}
    nouns = set(objects())
    # A+F composite items are "<number> <object>", A+B ones "(* <object> * <object>)"
    assert not [x for x in inputs if re.fullmatch(r"\d+ (\S+)", x) and x.split()[1] in nouns]
    assert not [x for x in inputs if "*" in x and "(" in x]
    assert any(re.fullmatch(r"\d+ [a-z]+", x) for x in inputs)  # D+F items ("684 pay") are trained on
    # every input of a composite_icl prompt (demonstrations and query) is a composite item
    evaluated = {line[len("input: "):] for pair in config.eval_pairs
                 for r in build_prompts(pair, "composite_icl", k=3, n_test=config.n_test, seed=0)
                 for line in r["prompt"].splitlines() if line.startswith("input: ")}
    assert not inputs & evaluated
    assert all(r["text"].endswith("\n") and r["text"].count("input: ") == r["k"] + 1 for r in rows)


def test_fit_k_is_the_largest_that_fits(tokenizer):
    room, n = 28, 10
    k = fit_k("A+B", SETTINGS, 10, tokenizer, room=room, n=n, seed=0, max_positions=256)
    assert 1 <= k < 10

    def longest(kk):
        return max(len(tokenizer(r["prompt"]).input_ids) for s in SETTINGS
                   for r in build_prompts("A+B", s, k=kk, n_test=n, seed=0))
    assert longest(k) + room <= 256 < longest(k + 1) + room
    assert fit_k("A+F", SETTINGS, 2, tokenizer, room=room, n=n, seed=0, max_positions=256) == 2  # capped
    with pytest.raises(ValueError, match="fits 20 positions"):
        fit_k("A+B", SETTINGS, 3, tokenizer, room=room, n=n, seed=0, max_positions=20)


def test_labels_are_exactly_the_answers(tokenizer):
    text = build_prompts("A+F", "composite_icl", k=3, n_test=1, seed=0)[0]
    full = f"{text['prompt']} {text['output']}\n"
    ids, labels = answer_labels(tokenizer, full)
    assert len(ids) == len(labels)
    supervised = tokenizer.decode([t for t in labels if t != -100])
    answers = re.findall(r"output:( [^\n]*\n)", full)
    assert len(answers) == 4 and supervised == "".join(answers)
    assert answers[-1] == f" {text['output']}\n"


@pytest.mark.parametrize("kwargs, match", [
    ({"train_composites": ("A+F",)}, "must not contain evaluated pairs"),
    ({"eval_pairs": ("A+Z",)}, "unknown pair 'A\\+Z' in eval_pairs; valid: A\\+B"),
    ({"eval_pairs": ()}, "at least one"),
    ({"k": 0}, "k must be a positive integer"),
    ({"steps": 1.5}, "steps must be a positive integer"),
    ({"learning_rate": 0.0}, "learning_rate must be positive"),
    ({"threads": 0}, "threads must be a positive integer"),
])
def test_bad_config(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CompositionConfig(**kwargs)


def test_bad_seed_and_positions(embedded_path):
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        run_composition_demo(None, seed=-1, config=MICRO)
    with pytest.raises(ValueError, match="batch_size=40 is more than the 18 meta-training prompts"):
        run_composition_demo(None, config=replace(MICRO, batch_size=40))
    with pytest.raises(ValueError, match="exceeds the model's 256 positions"):
        run_composition_demo(None, config=CompositionConfig(max_positions=300))
