"""README's results table says no more than the reports it cites (issue 66): each row's verdict word and numbers are
read here from the committed report behind it, so the two cannot drift apart."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "results"


def results_table() -> dict[str, str]:
    """{claim: what we found} from README's results table."""
    lines = ROOT.joinpath("README.md").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| claim (paper) |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1]
    return rows


def row(fragment: str) -> str:
    found = [v for k, v in results_table().items() if fragment in k]
    assert len(found) == 1, f"README's results table has {len(found)} rows with {fragment!r}"
    return found[0]


def verdicts(text: str) -> list[str]:
    return re.findall(r"\*\*(.+?)\*\*", text)


@pytest.fixture(scope="module")
def e5():
    return json.loads((RESULTS / "e5_report.json").read_text())


def points(x: float) -> str:
    return f"{100 * x:+.1f}".replace("-", "−")


def test_e2_row_says_what_e5_decided(e5):
    assert verdicts(row("one-token answers")) == ["inconclusive"]
    assert {c["verdict"] for c in e5["E2"]["comparisons"]} == {"inconclusive"}


def test_e4_rows_say_what_e5_decided(e5):
    text = row("long worked answers")
    talr = e5["E4"]["comparisons"]["TALR"]
    assert verdicts(text) == [talr["h1"]] == ["not reproduced"]
    lo, hi = talr["adjusted_ci"]
    assert f"Δ NFR {points(talr['diff'])[1:] if talr['diff'] > 0 else points(talr['diff'])} points" in text
    assert f"CI {points(lo)} to {points(hi)}" in text
    domain = row("learns the domain")
    lo, hi = talr["domain_ci"]
    assert f"CI {round(100 * lo):+d} to {round(100 * hi):+d}".replace("-", "−") in domain


def test_muscle_and_recipe_rows_say_what_e5_decided(e5):
    assert "not re-decidable" in e5["E1"]["note"]
    muscle = row("MUSCLE forgets less")
    assert "not re-decidable at run level" in muscle and verdicts(muscle) == ["inconclusive"]
    arms = [(u, a, x) for u, up in e5["E3"]["updates"].items() for a, x in up["arms"].items() if "vs_control" in x]
    assert all(x["vs_control"]["verdict"] == "inconclusive" and len(x["seeds"]) == 8
               for u, a, x in arms if a == "muscle" and u != "generative")
    recipes = row("reading v1")
    assert verdicts(recipes) == ["not shown", "inconclusive"] and e5["E3"]["helps"] == []
    n = len(arms)
    inconclusive = sum(x["vs_control"]["verdict"] == "inconclusive" for _, _, x in arms)
    assert n == e5["E3"]["family"] == 12 and f"{inconclusive} of {n}" in recipes
    seeds = sorted(len(x["seeds"]) for _, _, x in arms)
    assert seeds == [3, 3, 3] + [8] * 9 and "8 seeds each; 3 for three of U3's" in recipes


def test_one_run_rows_say_what_their_runs_show():
    quant = json.loads((RESULTS / "quantization_flips_full.json").read_text())["tasks"]
    nfr = sorted(t["nfr"] for t in quant.values())
    assert f"§5's int8 run: {round(100 * nfr[0])}–{round(100 * nfr[-1])} % per task" in row("quantization flips")
    pairs = json.loads((RESULTS / "paper001_composition_full.json").read_text())["pairs"]
    separable = [p for p in pairs if p["separable"]]
    helped = [p for p in separable if p["icl_minus_composite"] > 0 and p["mcnemar_p"] < 0.05]
    text = row("composite demonstrations")
    assert verdicts(text) == ["reproduced"] and f"{len(helped)} of {len(separable)} separable pairs" in text
    drift = [x["mean"] for x in json.loads((RESULTS / "paper000_drift_full.json").read_text())["per_r"]]
    text = row("intermediate task similarity")
    monotone = all(a > b for a, b in zip(drift, drift[1:]))
    assert verdicts(text) == ["not reproduced"] and monotone and "falls monotonically" in text


@pytest.fixture(scope="module")
def e6():
    return json.loads((RESULTS / "e6" / "report.json").read_text())


def test_quantization_rows_say_what_e6_decided(e6):
    """E6's two rows: H1's verdict and how many schemes support it; every NFR quoted is the report's pooled NFR
    (every runnable scheme quoted); H3's and H2's verdict words as decided."""
    assert e6["complete"] and not e6["not_run"]
    runnable = [s for s in e6["schemes"] if s != "fp32_floor"]
    hidden = e6["H1"]["per_scheme"]
    text = row("accuracy hides")
    assert verdicts(text) == ["H1 holds" if e6["H1"]["holds"] else "H1 does not hold"]
    assert f"for {sum(h['supported'] for h in hidden.values())} of {len(runnable)} schemes" in text
    fewest = row("fewest answers")
    quoted = dict(re.findall(r"\b(" + "|".join(runnable) + r") (\d+\.\d) %", fewest))
    assert sorted(quoted) == sorted(runnable)
    for scheme, value in quoted.items():
        assert value == f"{100 * e6['schemes'][scheme]['pooled']['nfr']:.1f}", scheme
    h3 = "no single best" if e6["H3"]["best"] is None else f"{e6['H3']['best']} best"
    assert verdicts(fewest) == [h3, "supported" if e6["H2"]["supported"] else "not supported"]
    assert f"ρ {e6['H2']['rho']:.2f}" in fewest and f"({len(e6['H2']['schemes'])} schemes)" in fewest
    assert f"over {e6['schemes']['nf4']['pooled']['n']:,} items" in fewest
