"""The `adaptguard drift ...` and `adaptguard select` commands, run in-process through `cli.main`."""

import json

import numpy as np
import pytest

from adaptguard.cli import main


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_drift_bound_prints_the_maximiser_below_half_and_writes_the_plot(tmp_path, capsys):
    from adaptguard.drift.theory import theorem_a2_argmax

    out = tmp_path / "bound.png"
    assert main(["drift", "bound", "--samples", "200", "--length", "16", "--mu-l", "0.1", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    expected = theorem_a2_argmax(n=200, d=16, alpha_i=0.1408, alpha_j=0.8592, delta=0.2, k_mis=1.0,
                                 lambda_l=0.5, mu_l=0.1)
    assert f"r* = {expected:.4f}" in printed and expected < 0.5
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_drift_bound_bad_delta_exits_2_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "bound.png"
    assert main(["drift", "bound", "--delta", "0.5", "--out", str(out)]) == 2
    assert "delta" in capsys.readouterr().err
    assert not out.exists()


def test_drift_corrupt_keeps_about_r_of_the_tokens(tmp_path, embedded_path, capsys):
    from transformers import AutoTokenizer

    rows = [{"text": f"the capital of country {i} is city {i * 7} and the opposite of hot is cold ."} for i in range(40)]
    data = write_jsonl(tmp_path / "data.jsonl", rows)
    out = tmp_path / "corrupt.jsonl"
    assert main(["drift", "corrupt", str(data), "--similarity", "0.5", "--tokenizer", str(embedded_path), "--length", "64",
                 "--out", str(out)]) == 0
    written = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(written) == 40
    tok = AutoTokenizer.from_pretrained(embedded_path)
    originals = [tok(r["text"], add_special_tokens=False)["input_ids"] for r in rows]
    kept = sum(int(np.sum(np.array(o) == np.array(w["input_ids"]))) for o, w in zip(originals, written))
    total = sum(map(len, originals))
    # kept tokens include substitutes that happen to equal the original, so the fraction is >= r on average
    assert 0.5 - 4 * np.sqrt(0.25 / total) < kept / total < 0.75
    assert "kept fraction" in capsys.readouterr().out


def test_drift_corrupt_bad_r_exits_2_without_output(tmp_path, embedded_path, capsys):
    data = write_jsonl(tmp_path / "data.jsonl", [{"text": "a b c"}, {"text": "d e f"}])
    out = tmp_path / "corrupt.jsonl"
    assert main(["drift", "corrupt", str(data), "--similarity", "1.5", "--tokenizer", str(embedded_path),
                 "--out", str(out)]) == 2
    assert "r" in capsys.readouterr().err and not out.exists()


def test_drift_styles_writes_the_reformatted_dataset(tmp_path, capsys):
    from adaptguard.drift.data import PROMPT_STYLES

    data = write_jsonl(tmp_path / "qa.jsonl", [{"question": "2 + 2?", "answer": "4"}, {"question": "3 + 3?", "answer": "6"}])
    out = tmp_path / "styled.jsonl"
    assert main(["drift", "styles", str(data), "--style", "question_answer", "--out", str(out)]) == 0
    first = json.loads(out.read_text().splitlines()[0])
    style = PROMPT_STYLES["question_answer"]
    assert first["prompt"] == style.prompt.format(question="2 + 2?")
    assert first["completion"] == style.completion.format(answer="4")
    assert main(["drift", "styles", str(data), "--style", "nonsense", "--out", str(tmp_path / "x.jsonl")]) == 2
    assert "question_answer" in capsys.readouterr().err and not (tmp_path / "x.jsonl").exists()


@pytest.fixture()
def qa_sets(tmp_path):
    facts = write_jsonl(tmp_path / "facts.jsonl", [{"text": f"the capital of land {i} is town {i} ."} for i in range(12)])
    facts2 = write_jsonl(tmp_path / "facts2.jsonl", [{"text": f"the capital of land {i + 50} is town {i + 50} ."}
                                                     for i in range(12)])
    counting = write_jsonl(tmp_path / "counting.jsonl", [{"text": " ".join(str(j) for j in range(i, i + 6))}
                                                         for i in range(12)])
    return facts, facts2, counting


def test_drift_risk_ranks_the_same_kind_of_data_as_most_similar(qa_sets, embedded_path, tmp_path, capsys):
    facts, facts2, counting = qa_sets
    report = tmp_path / "risk.json"
    assert main(["drift", "risk", "--finetune", str(facts), "--keep", str(facts2), str(counting),
                 "--model", str(embedded_path), "--json", str(report)]) == 0
    rows = {r["task"]: r for r in json.loads(report.read_text())["keep"]}
    assert rows[str(facts2)]["similarity"] > rows[str(counting)]["similarity"]
    assert all(0 <= r["similarity"] <= 1 and r["at_risk"] == (0.25 <= r["similarity"] <= 0.55) for r in rows.values())
    assert "similarity" in capsys.readouterr().out


def test_select_cli_writes_the_mixture(qa_sets, embedded_path, tmp_path, capsys):
    facts, facts2, counting = qa_sets
    out = tmp_path / "mix.jsonl"
    assert main(["select", "--target", str(facts), "--candidates", str(facts2), str(counting),
                 "--model", str(embedded_path), "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["selected"][0] == str(facts2)  # the most consistent candidate is always taken first
    mixture = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted({r["task"] for r in mixture}) == sorted(report["selected"])
    assert len(mixture) == 12 * len(report["selected"])


def test_select_cli_unknown_dataset_exits_2(tmp_path, embedded_path, capsys):
    assert main(["select", "--target", str(tmp_path / "missing.jsonl"), "--candidates", "also-missing.jsonl",
                 "--model", str(embedded_path)]) == 2


def test_drift_experiment_cli_writes_the_sweep(tmp_path, monkeypatch, capsys):
    import torch

    from adaptguard.drift import sweep as drift_experiment

    threads_before = torch.get_num_threads()
    # a micro sweep through the real command: the CLI passes --quick through to the quick preset
    quick = drift_experiment.DriftExperimentConfig.quick
    monkeypatch.setattr(drift_experiment.DriftExperimentConfig, "quick", classmethod(
        lambda cls, **kw: quick(length=8, n0=40, n1=10, steps=5, similarities=(0.0, 0.5), repetitions=1)))
    assert main(["drift", "experiment", "--quick", "--out", str(tmp_path / "d")]) == 0
    saved = json.loads((tmp_path / "d" / "drift.json").read_text())
    assert saved["r"] == [0.0, 0.5] and saved["settings"]["preset"] == "quick"
    printed = capsys.readouterr().out
    assert f"r = 0.500: next-bit loss on c0 {saved['loss_mean'][1]:.4f}" in printed
    assert torch.get_num_threads() == threads_before  # the command restores the process's thread count


def test_written_datasets_are_readable_by_others(tmp_path):
    import stat

    import datasets

    from adaptguard.utils.files import atomic_write_text, write_dataset

    data = datasets.Dataset.from_dict({"text": ["a", "b"]})
    for target in (write_dataset(data, tmp_path / "d.jsonl"), write_dataset(data, tmp_path / "d")):
        mode = stat.S_IMODE(target.stat().st_mode)
        assert mode & stat.S_IROTH, f"{target}: mode {oct(mode)}"
    atomic_write_text(tmp_path / "r.md", "x")
    assert stat.S_IMODE((tmp_path / "r.md").stat().st_mode) == 0o644
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "d.jsonl", "r.md"]  # no temporary left


def test_drift_styles_unknown_style_without_dataset_names_the_style(capsys):
    assert main(["drift", "styles", "--style", "bogus"]) == 2
    assert "unknown style 'bogus'" in capsys.readouterr().err
