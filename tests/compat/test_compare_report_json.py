"""`report.json` keeps its schema and numbers now that the compare report is typed (issue 73, item 3): every kind of
entry — one run, replicates, churn, a loglikelihood task, several candidates, similarity with a compatible run, mixed
formats, a run evaluated until decided — written by `adaptguard compare` and compared with the JSON the dict-based
report wrote on the same runs (`compare_report_before.json`, made by this file's `write_before` before the change)."""

import json
import math
from pathlib import Path

from adaptguard.cli.main import main

TS = "2026-11-27T00-00-00.000000"
BEFORE = Path(__file__).with_name("compare_report_before.json")


def _mc(folder: Path, task: str, correct, n_choices: int = 4, output_type: str = "multiple_choice") -> None:
    """A `--log_samples` task: multiple choice (gold i mod n_choices, the next choice when wrong), or with
    `output_type` loglikelihood one [ll, is_greedy] per document."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"samples_{task}_{TS}.jsonl", "w") as f:
        for i, ok in enumerate(correct):
            gold = i % n_choices
            if output_type == "loglikelihood":
                resps = [[str(-2.0 - (not ok)), str(bool(ok))]]
            else:
                lls = [-5.0] * n_choices
                lls[gold if ok else (gold + 1) % n_choices] = -1.0
                resps = [[str(x), "False"] for x in lls]
            f.write(json.dumps({"doc_id": i, "target": gold, "filtered_resps": resps, "filter": "none",
                                "metrics": ["acc"], "doc_hash": f"d{i}", "prompt_hash": f"p{i}",
                                "target_hash": str(gold), "acc": float(ok)}) + "\n")
    results = folder / f"results_{TS}.json"
    configs = json.loads(results.read_text())["configs"] if results.exists() else {}
    results.write_text(json.dumps({"configs": {**configs, task: {"output_type": output_type}},
                                   "n-shot": {t: 0 for t in [*configs, task]}}))


def _pattern(n: int, every: int, shift: int = 0) -> list[bool]:
    return [(i + shift) % every != 0 for i in range(n)]


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path.name


def cases(root: Path) -> dict[str, list[str]]:
    """The runs under `root` (paths relative to it, so the JSON names them alike anywhere) and each case's
    arguments to `adaptguard compare`."""
    out = {"shipped": ["example:fp32", "example:int8", "--fail-on", "nfr>10%", "--fail-on", "acc_drop>1%",
                       "--fail-on", "overall:acc_drop>1%", "--show-flips", "2"]}
    for r in range(2):  # replicates: reruns that differ a little; a binary task at chance beside
        _mc(root / f"old{r}", "t", _pattern(40, 4, r))
        _mc(root / f"new{r}", "t", _pattern(40, 3, r))
        _mc(root / f"old{r}", "coin", [i % 2 == r for i in range(40)], 2)
        _mc(root / f"new{r}", "coin", [i % 4 < 2 for i in range(40)], 2)
    out["replicates"] = ["old0,old1", "new0,new1", "--fail-on", "nfr>2%", "--fail-on", "excess_nfr>20%"]
    for side, every in (("old", 5), ("new", 3), ("again", 5)):
        _mc(root / side, "t", _pattern(30, every))
        _mc(root / side, "coin", [i % (2 if side != "new" else 4) < 1 for i in range(40)], 2)
        _mc(root / side, "ll", _pattern(20, every + 1), output_type="loglikelihood")
    out["candidates"] = ["old", "new", "again", "--include-churn", "--fail-on", "nfr>5%", "--significance", "off"]
    words = ["red fox", "blue sky", "green tea", "black cat", "white snow", "dark night", "warm sun", "cold rain"]
    sides = {}
    for side, k in (("old", 0), ("new", 1), ("compat", 2)):
        rows = []
        for i, w in enumerate(words * 3):
            said = w if (i + k) % (3 + k) else w.split()[0] + " thing"
            rows.append({"task": "qa", "id": i, "correct": said == w, "answer": said, "target": w, "input": f"q{i}"})
            rows.append({"task": "graded", "id": i, "score": round(((i * (k + 2)) % 7) / 7, 3),
                         "answer": said if i % 2 else w, "target": w})
        sides[side] = _jsonl(root / f"{side}.jsonl", rows)
    out["similarity"] = [sides["old"], sides["new"], "--similarity", "rouge1", "--compatible", sides["compat"]]
    _mc(root / "mixed_old", "t", _pattern(30, 4))
    mixed = _jsonl(root / "mixed_new.jsonl", [{"task": "t", "id": i, "correct": ok}
                                              for i, ok in enumerate(_pattern(30, 3))])
    out["mixed_formats"] = ["mixed_old", mixed, "--fail-on", "nfr>1%"]
    from adaptguard.compat.reading.records import RECORD, task_order

    _mc(root / "seq_old", "t", _pattern(200, 6))
    order = task_order(list(range(200)), 0, "t")
    done = order[:80]
    _mc(root / "seq_new", "t", [i % 4 != 0 for i in range(200)])
    lines = (root / "seq_new" / f"samples_t_{TS}.jsonl").read_text().splitlines()
    (root / "seq_new" / f"samples_t_{TS}.jsonl").write_text("".join(lines[d] + "\n" for d in sorted(done)))
    (root / "seq_new" / RECORD).write_text(json.dumps({"seed": 0, "tasks": {"t": {"order": order, "done": 80,
                                                                                   "looks": [40, 80]}}}))
    out["sequential"] = ["seq_old", "seq_new", "--fail-on", "nfr>2%", "--fail-on", "acc_drop>5%"]
    return out


def reports(root: Path) -> dict[str, dict]:
    """Each case's `report.json`, written by `adaptguard compare` run in `root`, and its exit status."""
    got = {}
    for name, args in cases(root).items():
        code = main(["compare", *args, "--json", f"{name}.json"])
        got[name] = {"exit": code, "report": json.loads((root / f"{name}.json").read_text())}
    return got


def same(a, b, where="") -> None:
    """Equal parsed JSON; floats to 1e-12 relative (another machine's last bits)."""
    if isinstance(a, float) and isinstance(b, float):
        assert math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-15), where
    elif isinstance(a, dict) and isinstance(b, dict):
        assert list(a) == list(b), (where, list(a), list(b))
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def test_report_json_is_the_dict_reports_json(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    got = reports(tmp_path)
    capsys.readouterr()
    same(got, json.loads(BEFORE.read_text()))


def test_the_report_is_typed_and_its_json_leaves_out_the_items(tmp_path, monkeypatch):
    from adaptguard.compat.compare import Comparison, TaskComparison, compare_runs

    monkeypatch.chdir(tmp_path)
    cases(tmp_path)
    report = compare_runs(["old0", "old1"], [["new0", "new1"]])
    assert isinstance(report, Comparison) and all(isinstance(e, TaskComparison) for e in report.tasks.values())
    entry = report.tasks["t"]
    assert entry.correct == (entry.runs[0][0], entry.runs[1][0]) and len(entry.run_samples[0]) == 2
    assert entry["nfr"] == report["tasks"]["t"]["nfr"]  # read as the JSON's mapping too
    assert "correct" not in json.loads(report.to_json())["tasks"]["t"]
    assert not any(k.startswith("_") for e in json.loads(report.to_json())["tasks"].values() for k in e)


def write_before(path: Path = BEFORE) -> None:  # pragma: no cover - run once, on the code before the change
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        here = os.getcwd()
        os.chdir(tmp)
        try:
            got = reports(Path(tmp))
        finally:
            os.chdir(here)
    lines = [f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in got.items()]  # a case a line
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")


if __name__ == "__main__":
    write_before()
