"""The findings say no more than the reports they cite (issues 66, 88): studies/results.md's claims table holds each
claim's numbers and verdict words, read here from the committed report behind it; README's findings table holds the
verdict words only, and they are results.md's, so the three cannot drift apart."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "studies" / "results"
NOTEBOOK = ROOT / "studies" / "results.md"


def claims_table(text: str) -> dict[str, list[str]]:
    """{claim: [its other cells]} from the table in `text` whose header starts with "| claim (paper) |"."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| claim (paper) |"))
    rows = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def results_table() -> dict[str, str]:
    """{claim: what we found} from studies/results.md's claims table: the numbers."""
    return {claim: cells[0] for claim, cells in claims_table(NOTEBOOK.read_text()).items()}


def row(fragment: str) -> str:
    found = [v for k, v in results_table().items() if fragment in k]
    assert len(found) == 1, f"studies/results.md's claims table has {len(found)} rows with {fragment!r}"
    return found[0]


def verdicts(text: str) -> list[str]:
    return re.findall(r"\*\*(.+?)\*\*", text)


def slug(heading: str) -> str:
    """A Markdown heading's anchor as GitHub makes it."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(text: str) -> set[str]:
    return {slug(line.lstrip("#")) for line in text.splitlines() if re.match(r"#{1,6} ", line)}


def test_readmes_table_is_results_mds_verdict_words():
    """README's findings table: the same claims in the same order as studies/results.md's, each with the same verdict
    words and the same place, and no number of its own (the numbers are results.md's, tested below)."""
    readme = claims_table(ROOT.joinpath("README.md").read_text())
    notebook = claims_table(NOTEBOOK.read_text())
    assert list(readme) == list(notebook) and len(readme) == 9
    for claim, (verdict, where) in readme.items():
        found, place = notebook[claim]
        assert verdicts(verdict) == verdicts(found) != [], claim
        assert where == place, claim
        assert not re.search(r"\d", re.sub(r"\*\*.+?\*\*", "", verdict).replace("≤ 4.5 bits", "")), verdict


def test_the_findings_links_land_on_their_sections():
    """Every link from README into studies/results.md and within results.md's claims section names a heading that
    exists, and README's own anchors too."""
    readme, notebook = ROOT.joinpath("README.md").read_text(), NOTEBOOK.read_text()
    into = re.findall(r"studies/results\.md#([\w\-]+)", readme)
    assert "what-we-found-claim-by-claim" in into and len(into) >= 10
    assert set(into) <= anchors(notebook), set(into) - anchors(notebook)
    own = re.findall(r"\]\(#([\w\-]+)\)|^\[[\w]+\]: #([\w\-]+)$", readme, flags=re.M)
    assert {a or b for a, b in own} <= anchors(readme), {a or b for a, b in own} - anchors(readme)
    section = notebook[notebook.index("## What we found, claim by claim"):notebook.index("\n## 1. ")]
    links = re.findall(r"^\[s\d+\]: #([\w\-]+)$", section, flags=re.M)
    assert len(links) == 9 and set(links) <= anchors(notebook), set(links) - anchors(notebook)


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
    # E4's H2 margin: as well as SFT when the interval's lower end is above −5 points, not when its upper end is below
    margin = "reproduced" if lo >= -0.05 else "not reproduced" if hi < -0.05 else "inconclusive"
    assert verdicts(domain) == [margin] == ["inconclusive"] and "5-point margin" in domain


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
    readme = claims_table(ROOT.joinpath("README.md").read_text())["composite demonstrations help composition in "
                                                                   "context (001)"][0]
    assert "for some pairs" in readme and 0 < len(helped) < len(separable)
    drift = [x["mean"] for x in json.loads((RESULTS / "paper000_drift_full.json").read_text())["per_r"]]
    text = row("intermediate task similarity")
    monotone = all(a > b for a, b in zip(drift, drift[1:]))
    assert verdicts(text) == ["not reproduced"] and monotone and "falls monotonically" in text


@pytest.fixture(scope="module")
def e6():
    return json.loads((RESULTS / "e6" / "report.json").read_text())


@pytest.fixture(scope="module")
def e6_text():
    """studies/e6_text.py: E6's texts rendered from its report (pure Python: no torch import)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("e6_text", ROOT / "studies" / "e6_text.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def e6_documents() -> dict[str, str]:
    return {"readme": ROOT.joinpath("README.md").read_text(), "results": ROOT.joinpath("studies", "results.md").read_text(),
            "report_md": (RESULTS / "e6" / "report.md").read_text()}


def test_every_e6_sentence_is_the_reports(e6, e6_text):
    """studies/results.md's § 11 and the E6 rows of its claims table, README's two E6 rows and e6/report.md are
    exactly what report.json renders to: every number and verdict word in them is read from the report."""
    assert e6["complete"] and not e6["not_run"]
    assert e6_text.mismatches(e6, **e6_documents()) == []


def test_an_edited_e6_number_or_verdict_fails(e6, e6_text):
    """The check above fails on any one edited number (each digit run in every E6 text, bumped by one) and on each
    verdict word turned."""
    docs = e6_documents()

    def cells(text: str) -> list[tuple[int, int]]:  # each E6 row's second cell in a claims table
        starts = [text.index(f"| {claim} | ") + len(f"| {claim} | ") for claim in e6_text.readme_rows(e6)]
        return [(start, text.index(" | ", start)) for start in starts]

    edits = 0
    for name, ranges in (("results", [e6_text.section_span(docs["results"]), *cells(docs["results"])]),
                         ("report_md", [(0, len(docs["report_md"]))]), ("readme", cells(docs["readme"]))):
        text = docs[name]
        for start, end in ranges:
            for m in re.finditer(r"\d+", text[start:end]):
                at = start + m.start()
                edited = text[:at] + str((int(text[at]) + 1) % 10) + text[at + 1:]
                assert e6_text.mismatches(e6, **{**docs, name: edited}), (name, text[at - 30:at + 30])
                edits += 1
    assert edits > 300
    turned = (("readme", "H1 does not hold", "H1 holds"), ("readme", "no single best", "quanto_int4 best"),
              ("readme", "**supported**", "**not supported**"), ("results", "**H1 does not hold**", "**H1 holds**"),
              ("results", "bits **no single best**", "bits **quanto_int4 best**"),
              ("results", "flips): supported", "flips): not supported"),
              ("results", "accuracy): does not hold", "accuracy): holds"), ("report_md", "no single best", "quanto_int4"))
    for name, word, other in turned:
        assert word in docs[name], word
        assert e6_text.mismatches(e6, **{**docs, name: docs[name].replace(word, other, 1)}), word


def test_e6_verdicts_follow_from_the_counts(e6):
    """H1 per scheme decided on integer counts (amendment 3): the statistic is min(PFR, 2·NFR − PFR) in items, the
    interval's ends are exact rationals and "supported" is the lower end above 0; a scheme without a wrong → right
    item is 0 in every resample. The floors' verdicts: a count above 0, an interval's lower end above 0."""
    from fractions import Fraction

    h1 = e6["H1"]["per_scheme"]
    n = e6["schemes"]["nf4"]["pooled"]["n"]
    for s, h in h1.items():
        neg, pos = h["right_to_wrong"], h["wrong_to_right"]
        assert neg == round(e6["schemes"][s]["pooled"]["nfr"] * n) and pos == round(e6["schemes"][s]["pooled"]["pfr"] * n)
        assert h["statistic_count"] == min(pos, 2 * neg - pos) == round(h["statistic"] * n)
        lo, hi = (Fraction(x) for x in h["ci_counts"])
        assert h["supported"] == (lo > 0) and lo <= h["statistic_count"] <= hi
        assert h["zero_by_construction"] == (pos == 0)
        if pos == 0:
            assert lo == hi == 0 and not h["supported"]
    judged = [s for s in h1 if h1[s]["above_floor"]]
    assert e6["H1"]["holds"] == (bool(judged) and all(h1[s]["supported"] for s in judged))
    assert e6["H3"]["pairs_tested"] == len(e6["H3"]["tests"]) and e6["H3"]["pairs_registered"] == 3
    for row in (e6.get("floors") or {}).get("schemes", {}).values():
        if "own_floor" in row:
            o = row["own_floor"]["pooled"]
            assert row["flips_by_batch_alone"] == (o["changed"] > 0) == (o["right_to_wrong"] + o["wrong_to_right"] > 0)
        if "excess" in row:
            assert row["beyond_own_floor"] == (row["excess"]["pooled"]["ci"][0] > 0)
