"""The HTML page of `adaptguard compare --html` (issue 55): one self-contained file whose tables read without its
script, and — in a real browser, Debian's chromium driven by selenium — the rows shown equal the flips, the task and
direction filters and the search change them as they should, sorting works, and the console has no error."""

import json
import shutil
from pathlib import Path

import pytest
from in_process import run_cli
from page_rows import Rows

TS = "2026-11-27T00-00-00.000000"
CHROMIUM, DRIVER = shutil.which("chromium"), shutil.which("chromedriver")


def write_mc(folder: Path, task: str, answers: list[int], gold: list[int], words: list[str]) -> None:
    """A multiple-choice lm-eval run with prompts and choice texts in `arguments`, as lm-eval logs them."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / f"samples_{task}_{TS}.jsonl", "w") as f:
        for i, (a, g) in enumerate(zip(answers, gold)):
            choices = [f" {w}" for w in words]
            lls = [-1.0 if k == a else -5.0 for k in range(len(words))]
            f.write(json.dumps({
                "doc_id": i, "target": g, "arguments": {f"gen_args_{k}": {"arg_0": f"Question {task} {i}: pick one",
                                                                            "arg_1": c} for k, c in enumerate(choices)},
                "filtered_resps": [[str(x), "False"] for x in lls], "filter": "none", "metrics": ["acc"],
                "doc_hash": f"{task}{i}", "prompt_hash": f"p{i}", "target_hash": str(g), "acc": float(a == g)}) + "\n")


def write_gen(folder: Path, task: str, outputs: list[str], gold: list[str]) -> None:
    """A generation run scored by exact match."""
    with open(folder / f"samples_{task}_{TS}.jsonl", "w") as f:
        for i, (o, g) in enumerate(zip(outputs, gold)):
            f.write(json.dumps({
                "doc_id": i, "target": g, "arguments": {"gen_args_0": {"arg_0": f"Say the phrase number {i}",
                                                                       "arg_1": {"until": ["\n"]}}},
                "filtered_resps": [o], "filter": "none", "metrics": ["exact_match"], "doc_hash": f"{task}{i}",
                "prompt_hash": f"p{i}", "target_hash": g, "exact_match": float(o == g)}) + "\n")


def finish(folder: Path, tasks: dict) -> None:
    (folder / f"results_{TS}.json").write_text(json.dumps({"configs": {t: {"output_type": k} for t, k in
                                                                       tasks.items()}, "n-shot": {t: 0 for t in tasks}}))


@pytest.fixture(scope="module")
def known_flips(tmp_path_factory):
    """Two runs with known flips: task `alpha` (20 items, 4 choices): items 0–4 broke, 5–7 fixed; task `gamma`
    (generations): item 1 broke ("the red house" → "the blue house"), item 3 fixed."""
    root = tmp_path_factory.mktemp("page")
    gold = [i % 4 for i in range(20)]
    old = [g if i < 5 or i >= 8 else (g + 1) % 4 for i, g in enumerate(gold)]  # right on 0–4 and 8–19
    new = [g if i >= 5 else (g + 1) % 4 for i, g in enumerate(gold)]            # wrong on 0–4, right on 5–19
    words = ["apple", "pear", "plum", "fig"]
    truth = ["the big dog", "the red house", "a small cat", "one green tree"]
    for side, answers, outs in (("old", old, ["the big dog", "the red house", "x", "one tree"]),
                                ("new", new, ["the big dog", "the blue house", "x", "one green tree"])):
        write_mc(root / side, "alpha", answers, gold, words)
        write_gen(root / side, "gamma", outs, truth)
        finish(root / side, {"alpha": "multiple_choice", "gamma": "generate_until"})
    expected = {("alpha", i, "broke") for i in range(5)} | {("alpha", i, "fixed") for i in (5, 6, 7)} | \
        {("gamma", 1, "broke"), ("gamma", 3, "fixed")}
    return root, expected


def test_the_page_is_self_contained_and_reads_without_its_script(known_flips, tmp_path):
    root, expected = known_flips
    page = tmp_path / "report.html"
    proc = run_cli("compare", root / "old", root / "new", "--html", page, "--fail-on", "nfr>5%")
    assert proc.returncode in (0, 1, 3), proc.stderr[-2000:]
    text = page.read_text()
    parsed = Rows()
    parsed.feed(text)
    assert set(parsed.rows) == expected and len(parsed.rows) == len(expected)
    assert all(link.startswith("data:image/png;base64,") for link in parsed.links)  # nothing fetched
    assert "<del>red</del>" in text and "<ins>blue</ins>" in text  # the changed word, marked
    assert text.index('id="verdict"') < text.index("<h2>Per task</h2>") < text.index('id="flips"')
    assert "gate: " in text and "NFR: negative flips" in text  # the gate's outcome and the legend


def test_a_large_run_is_capped_with_a_note(known_flips):
    from adaptguard.compat.render.html import flips_section

    flips = [{"task": "t", "doc_id": i, "kind": "negative", "prompt": "p", "gold": 1, "old": 1, "new": 2}
             for i in range(12)]
    out = flips_section(flips, {"t": {"negative": 12}}, cap=5)
    parsed = Rows()
    parsed.feed(out)
    assert len(parsed.rows) == 5 and "t: 7 more negative flips not shown" in out


def test_a_page_path_that_is_a_folder_is_refused_and_nothing_written(known_flips, tmp_path):
    root, _ = known_flips
    proc = run_cli("compare", root / "old", root / "new", "--html", tmp_path, "--json", tmp_path / "c.json")
    assert proc.returncode == 2 and "is a directory" in proc.stderr and not (tmp_path / "c.json").exists()


@pytest.fixture(scope="module")
def browser():
    if not (CHROMIUM and DRIVER):
        pytest.skip("browser tests need Debian's chromium and chromedriver: apt-get install chromium chromium-driver")
    webdriver = pytest.importorskip("selenium.webdriver", reason="browser tests need selenium (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1300,1800"):
        opts.add_argument(flag)
    opts.binary_location = CHROMIUM
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield driver
    driver.quit()


def visible(driver) -> set:
    from selenium.webdriver.common.by import By

    out = set()
    for row in driver.find_elements(By.CSS_SELECTOR, "#flips tbody tr"):
        if row.is_displayed():
            cells = row.find_elements(By.TAG_NAME, "td")
            out.add((cells[0].text, int(cells[1].text), cells[2].text))
    return out


def test_in_chromium_the_rows_filters_search_and_sorting_work(browser, known_flips, tmp_path):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    root, expected = known_flips
    page = tmp_path / "report.html"
    assert run_cli("compare", root / "old", root / "new", "--html", page).returncode == 0
    browser.get(page.as_uri())
    assert visible(browser) == expected
    assert browser.find_element(By.ID, "shown").text == str(len(expected))
    Select(browser.find_element(By.ID, "task")).select_by_value("gamma")
    assert visible(browser) == {r for r in expected if r[0] == "gamma"}
    Select(browser.find_element(By.ID, "task")).select_by_value("")
    Select(browser.find_element(By.ID, "kind")).select_by_value("fixed")
    assert visible(browser) == {r for r in expected if r[2] == "fixed"}
    Select(browser.find_element(By.ID, "kind")).select_by_value("")
    browser.find_element(By.ID, "search").send_keys("phrase number 1")
    assert visible(browser) == {("gamma", 1, "broke")}
    browser.find_element(By.ID, "search").clear()
    browser.execute_script("document.getElementById('search').dispatchEvent(new Event('input'))")
    assert visible(browser) == expected
    doc_header = browser.find_elements(By.CSS_SELECTOR, "#flips th")[1]
    doc_header.click()
    docs = [int(r.find_elements(By.TAG_NAME, "td")[1].text) for r in
            browser.find_elements(By.CSS_SELECTOR, "#flips tbody tr")]
    assert docs == sorted(docs)
    doc_header.click()
    docs = [int(r.find_elements(By.TAG_NAME, "td")[1].text) for r in
            browser.find_elements(By.CSS_SELECTOR, "#flips tbody tr")]
    assert docs == sorted(docs, reverse=True)
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors
    browser.save_screenshot(str(tmp_path / "report.png"))
    assert (tmp_path / "report.png").stat().st_size > 10_000
