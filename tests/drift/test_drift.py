"""adaptguard.drift: bit-string subpopulations (paper 000 App. A/B), Algorithm C1 corruption,
Table C2 prompt styles, atomic dataset writing and the drift_bsc_* lm-eval tasks."""

import json
import math

import numpy as np
import pytest
from conftest import ROOT
from datasets import Dataset, load_from_disk
from in_process import run_lm_eval_cli

from adaptguard import drift
from adaptguard.drift import data as drift_data
from adaptguard.utils.files import write_dataset

TASKS = ROOT / "lm_eval_tasks" / "drift_bsc"


# --- similarity (Def. 4, A6, A7) ------------------------------------------------------------

def test_similarity_hand_examples():
    a = [0, 1, 1, 0, 1, 0, 0, 1]
    b = [0, 1, 0, 0, 1, 1, 0, 1]  # differs at positions 2 and 5
    assert drift.similarity(a, b) == 6 / 8
    assert drift.similarity(a, a) == 1.0
    assert drift.similarity(a, [1 - x for x in a]) == 0.0
    # A7 compares with the reference's prefix of the sample's length
    assert drift.sample_similarity([0, 0, 1], a) == 2 / 3
    assert drift.sample_similarity([1], a) == 0.0


@pytest.mark.parametrize("r, length, flips", [(3 / 8, 64, 40), (0.25, 10, 8), (0.34, 10, 7), (1.0, 7, 0),
                                              (0.0, 7, 7), (0.9, 3, 0)])
def test_similar_reference_flips_round_one_minus_r_times_length(r, length, flips):
    assert drift.flip_count(r, length) == flips  # hand values; 7.5 rounds up to 8
    c = drift.reference_string(length, 5)
    other = drift.similar_reference(c, r, np.random.default_rng(1))
    assert int(np.sum(c != other)) == flips
    assert drift.similarity(c, other) == pytest.approx((length - flips) / length)


def test_similar_reference_random_positions_and_seeded():
    c = drift.reference_string(64, 0)
    a, b = drift.similar_reference(c, 0.5, 1), drift.similar_reference(c, 0.5, 2)
    assert np.array_equal(a, drift.similar_reference(c, 0.5, 1))
    assert not np.array_equal(a, b)
    # positions are spread over the string, not the first k
    flipped = np.mean([c != drift.similar_reference(c, 0.75, s) for s in range(400)], axis=0)
    assert flipped.min() > 0.1 and flipped.max() < 0.45  # each position flipped w.p. 16/64


def test_reference_string_is_uniform_bits_and_seeded():
    c = drift.reference_string(4000, 0)
    assert c.dtype == np.uint8 and c.shape == (4000,) and set(np.unique(c)) == {0, 1}
    assert abs(c.mean() - 0.5) < 4 * 0.5 / math.sqrt(4000)
    assert np.array_equal(c, np.random.default_rng(0).integers(0, 2, 4000, dtype=np.uint8))
    assert np.array_equal(drift.reference_string(8, np.random.default_rng(3)), drift.reference_string(8, 3))


# --- BSC samples (Def. 1, Assumption 1) -----------------------------------------------------

def test_bsc_samples_lengths_and_flip_rate():
    c = drift.reference_string(32, 1)
    n, delta = 4000, 0.2
    samples = drift.bsc_samples(c, n, delta, np.random.default_rng(2), min_length=4)
    lengths = np.array([z.size for z in samples])
    assert len(samples) == n and lengths.min() == 4 and lengths.max() == 32
    # l ~ U{4..32}: mean 18, variance ((29)^2 - 1)/12
    assert abs(lengths.mean() - 18) < 4 * math.sqrt((29 ** 2 - 1) / 12 / n)
    flips = np.concatenate([z != c[: z.size] for z in samples])
    assert abs(flips.mean() - delta) < 4 * math.sqrt(delta * (1 - delta) / flips.size)
    assert all(np.array_equal(z, c[: z.size]) for z in drift.bsc_samples(c, 50, 0.0, 3))
    assert drift.bsc_samples(c, 0, 0.1, 3) == []


def _prefix_similarity_mean(c_i, c_j):
    """(1/L) Σ_l r_l with r_l the similarity of the first l bits: E over l ~ U{1..L} for fixed strings."""
    equal = (c_i == c_j).astype(float)
    return float(np.mean(np.cumsum(equal) / np.arange(1, equal.size + 1)))


def test_expected_sample_similarity_fixed_strings_monte_carlo():
    c_i = drift.reference_string(24, 7)
    c_j = drift.similar_reference(c_i, 0.5, 8)
    delta = 0.3
    values = np.array([drift.sample_similarity(z, c_j) for z in drift.bsc_samples(c_i, 20000, delta, 9)])
    exact = delta + (1 - 2 * delta) * _prefix_similarity_mean(c_i, c_j)
    assert abs(values.mean() - exact) < 4 * values.std() / math.sqrt(values.size)


@pytest.mark.parametrize("r, delta", [(0.25, 0.2), (0.75, 0.1), (0.5, 0.4)])
def test_expected_sample_similarity_identity(r, delta):
    """E r_j(z) = (1 − 2δ) r(i, j) + δ (text after A7), over random flip positions and samples."""
    rng = np.random.default_rng(11)
    c_j = drift.reference_string(32, rng)
    values = []
    for _ in range(3000):
        c_i = drift.similar_reference(c_j, r, rng)
        (z,) = drift.bsc_samples(c_i, 1, delta, rng)
        values.append(drift.sample_similarity(z, c_j))
    values = np.array(values)
    assert abs(values.mean() - ((1 - 2 * delta) * r + delta)) < 4 * values.std() / math.sqrt(values.size)


@pytest.mark.parametrize("r", [0.0, 3 / 8, 1.0])
def test_expected_sample_similarity_exact_at_delta_zero(r):
    c_j = drift.reference_string(64, 4)
    c_i = drift.similar_reference(c_j, r, 5)
    for z in drift.bsc_samples(c_i, 5, 0.0, 6, min_length=64):
        assert drift.sample_similarity(z, c_j) == (1 - 2 * 0.0) * drift.similarity(c_i, c_j) + 0.0 == r


def test_bad_input():
    c = drift.reference_string(8, 0)
    for bad in (-0.1, 1.1, float("nan"), "0.5"):
        with pytest.raises(ValueError, match="r:"):
            drift.similar_reference(c, bad, 0)
    with pytest.raises(ValueError, match="delta:.*no longer identifies the reference"):
        drift.bsc_samples(c, 3, 0.5, 0)
    for bad in (-0.01, 0.7):
        with pytest.raises(ValueError, match="delta:"):
            drift.bsc_samples(c, 3, bad, 0)
    for bad in (0, -3, 2.5):
        with pytest.raises(ValueError, match="length:"):
            drift.reference_string(bad, 0)
    with pytest.raises(ValueError, match="n:"):
        drift.bsc_samples(c, -1, 0.1, 0)
    with pytest.raises(ValueError, match="min_length:"):
        drift.bsc_samples(c, 1, 0.1, 0, min_length=9)
    with pytest.raises(ValueError, match="reference: bits must be 0 or 1"):
        drift.bsc_samples([0, 2, 1], 1, 0.1, 0)
    with pytest.raises(ValueError, match="b: reference strings must have equal lengths"):
        drift.similarity([0, 1], [0, 1, 1])
    with pytest.raises(ValueError, match="sample: longer"):
        drift.sample_similarity([0, 1, 1], [0, 1])
    with pytest.raises(ValueError, match="rng:"):
        drift.reference_string(4, None)
    with pytest.raises(ValueError, match="text:"):
        drift.text_to_bits("0110")


# --- text for language models ---------------------------------------------------------------

def test_bits_text_round_trip():
    assert drift.bits_to_text([0, 1, 1, 0]) == "0 1 1 0"
    c = drift.reference_string(50, 3)
    assert np.array_equal(drift.text_to_bits(drift.bits_to_text(c)), c)


def test_bpe_trained_on_bit_texts_gives_one_token_per_bit():
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    data = drift.drift_training_texts(300, 100, 0.5, length=32, seed=1)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.train_from_iterator(data.texts, trainers.BpeTrainer(
        vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    for text in data.texts[:50]:
        assert len(tok.encode(text).ids) == text.count(" ") + 1


def test_drift_training_texts():
    n0, n1, r, length = 40, 24, 0.25, 16
    data = drift.drift_training_texts(n0, n1, r, length=length, delta=0.0, seed=7)
    assert np.array_equal(data.base, drift.reference_string(length, 7))  # what drift_bsc_* evaluates
    assert drift.similarity(data.base, data.other) == 1 - 12 / 16
    assert len(data.texts) == n0 + n1 and data.source.sum() == n1
    assert 0 < data.source[:n0].sum() < n1  # shuffled, not base block then other block
    for text, src in zip(data.texts, data.source):  # delta = 0: samples are prefixes of their reference
        bits = drift.text_to_bits(text)
        assert np.array_equal(bits, (data.other if src else data.base)[: bits.size])
    again = drift.drift_training_texts(n0, n1, r, length=length, delta=0.0, seed=7)
    assert again.texts == data.texts
    assert drift.drift_training_texts(n0, n1, r, length=length, delta=0.0, seed=8).texts != data.texts
    noisy = drift.drift_training_texts(n0, n1, r, length=length, delta=0.2, seed=7)
    assert np.array_equal(noisy.base, data.base) and np.array_equal(noisy.other, data.other)


def test_next_bit_docs_rebuild_the_training_text():
    c = drift.reference_string(12, 2)
    docs = drift.next_bit_docs(c)
    assert [d["t"] for d in docs] == list(range(12)) and docs[0]["context"] == ""
    for d in docs:
        assert d["context"] + d["choices"][d["label"]] == drift.bits_to_text(c[: d["t"] + 1])
        assert d["label"] == c[d["t"]]
    ds = drift_data.next_bit_dataset(seed=2, length=12)["test"]
    assert ds.to_list() == docs


def test_next_bit_scores_hand_example():
    s = drift.next_bit_scores([math.log(0.2), math.log(0.6)], 1)  # renormalised: 0.25 / 0.75
    assert s["acc"] == 1.0
    assert s["nll"] == pytest.approx(-math.log(0.75))
    assert s["nll_raw"] == pytest.approx(-math.log(0.6))
    assert drift.next_bit_scores([math.log(0.2), math.log(0.6)], 0)["nll"] == pytest.approx(-math.log(0.25))
    with pytest.raises(ValueError, match="logliks:"):
        drift.next_bit_scores([0.0, 0.0, 0.0], 0)


# --- Algorithm C1 ---------------------------------------------------------------------------

def test_corrupt_tokens_algorithm_c1():
    s1, s2 = [10, 11, 12, 13, 14], [20, 21, 22]
    assert drift.corrupt_tokens(s1, s2, 1.0, 0)[0].tolist() == s1
    out, kept = drift.corrupt_tokens(s1, s2, 0.0, 0)
    assert out.tolist() == [20, 21, 22, 20, 21] and not kept.any()  # same position, wrapping past the end
    out, kept = drift.corrupt_tokens(s1, s2, 0.5, 3)
    assert out.tolist() == [a if k else s2[i % 3] for i, (a, k) in enumerate(zip(s1, kept))]


@pytest.fixture(scope="module")
def tokenizer(embedded_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(embedded_path)


@pytest.fixture(scope="module")
def texts_dataset():
    words = ["alpha", "beta", "gamma", "delta", "river", "stone", "blue", "seven"]
    return Dataset.from_dict({
        "text": [f"{words[i % 8]} and {words[(3 * i) % 8]} make {i * 7 % 101} things." for i in range(300)],
        "id": list(range(300))})


@pytest.mark.parametrize("r", [0.3, 0.7])
def test_corrupt_to_similarity_kept_fraction(texts_dataset, tokenizer, r):
    out = drift_data.corrupt_to_similarity(texts_dataset, r, tokenizer, length=64, seed=0)
    original = tokenizer(list(texts_dataset["text"]), add_special_tokens=False)["input_ids"]
    n = sum(len(ids) for ids in original)
    assert list(out["id"]) == list(texts_dataset["id"])
    assert [len(ids) for ids in out["input_ids"]] == [len(ids) for ids in original]
    assert abs(drift_data.kept_fraction(out) - r) < 4 * math.sqrt(r * (1 - r) / n)
    equal = sum(int(np.sum(np.array(a) == np.array(b))) for a, b in zip(out["input_ids"], original))
    assert equal >= sum(out["n_kept"])  # substituted tokens may coincide with the originals
    assert set(out["string_index"]) == set(range(8))
    assert out[0]["text"] == tokenizer.decode(out[0]["input_ids"])


def test_corrupt_to_similarity_extremes_and_seed(texts_dataset, tokenizer):
    same = drift_data.corrupt_to_similarity(texts_dataset, 1.0, tokenizer, length=64)
    assert list(same["text"]) == list(texts_dataset["text"]) and drift_data.kept_fraction(same) == 1.0
    noise = drift_data.corrupt_to_similarity(texts_dataset, 0.0, tokenizer, length=64)
    assert sum(noise["n_kept"]) == 0
    vocab = {t for ids in tokenizer(list(texts_dataset["text"]), add_special_tokens=False)["input_ids"] for t in ids}
    assert {t for ids in noise["input_ids"] for t in ids} <= vocab
    first_of = {}  # rows built from the same string agree position by position
    for ids, s in zip(list(noise["input_ids"]), list(noise["string_index"])):
        ref = first_of.setdefault(s, ids)
        m = min(len(ref), len(ids))
        assert ids[:m] == ref[:m]
    a = drift_data.corrupt_to_similarity(texts_dataset, 0.5, tokenizer, length=64, seed=3)
    assert list(a["text"]) == list(drift_data.corrupt_to_similarity(texts_dataset, 0.5, tokenizer, length=64, seed=3)["text"])
    assert list(a["text"]) != list(drift_data.corrupt_to_similarity(texts_dataset, 0.5, tokenizer, length=64, seed=4)["text"])
    with pytest.raises(ValueError, match="text_column: column 'body'"):
        drift_data.corrupt_to_similarity(texts_dataset, 0.5, tokenizer, text_column="body")
    with pytest.raises(ValueError, match="r:"):
        drift_data.corrupt_to_similarity(texts_dataset, 1.5, tokenizer)
    with pytest.raises(ValueError, match="n_strings:"):
        drift_data.corrupt_to_similarity(texts_dataset, 0.5, tokenizer, n_strings=0)


# --- Table C2 prompt styles -----------------------------------------------------------------

TABLE_C2 = {  # as printed in the paper (math markup and typographic quotes of the PDF)
    "a": "Question: Solve $24 = 1601*c - 1605*c$ for $c$ . Solution: -6",
    "b": "Question: Solve $24 = 1601*c - 1605*c$ for $c$ . Answer: -6",
    "c": "Solve $24 = 1601*c - 1605*c$ for $c$ . Solution: -6",
    "d": "Solve $24 = 1601*c - 1605*c$ for $c$ . Answer: -6",
    "e": "Question: ‘Solve $24 = 1601*c - 1605*c$ for $c$ .’ Solution: “-6”",
    "f": "Question: ‘Solve $24 = 1601*c - 1605*c$ for $c$ .’ Answer: “-6”",
    "g": "‘Solve $24 = 1601*c - 1605*c$ for $c$ .’ Solution: ‘-6’",
    "h": "‘Solve $24 = 1601*c - 1605*c$ for $c$ .’ Answer: ‘-6’",
    "i": 'def solve_linear_equation(): """ Solve $24 = 1601*c - 1605*c$ for $c$ . """ return (-6)',
}


def _plain(printed: str) -> str:
    for a, b in (("$", ""), (" .", "."), ("‘", "'"), ("’", "'"), ("“", '"'), ("”", '"')):
        printed = printed.replace(a, b)
    return printed


@pytest.fixture(scope="module")
def math_row():
    return Dataset.from_list([{"problem": "Solve 24 = 1601*c - 1605*c for c.", "solution": "-6", "n": 1}])


def test_prompt_styles_match_table_c2(math_row):
    assert sorted(s.index for s in drift_data.PROMPT_STYLES.values()) == list("abcdefghi")
    for name, style in drift_data.PROMPT_STYLES.items():
        row = drift_data.reformat_prompt_style(math_row, name, question_column="problem", answer_column="solution")[0]
        assert " ".join(row["text"].split()) == _plain(TABLE_C2[style.index]), name
        assert row["text"] == row["prompt"] + row["completion"] and row["n"] == 1
        assert not row["prompt"][-1].isspace()


def test_prompt_styles_hand_output(math_row):
    kw = {"question_column": "problem", "answer_column": "solution"}
    row = drift_data.reformat_prompt_style(math_row, "question_quoted_solution", **kw)[0]
    assert (row["prompt"], row["completion"]) == ("Question: 'Solve 24 = 1601*c - 1605*c for c.'\nSolution:", ' "-6"')
    row = drift_data.reformat_prompt_style(math_row, "python_function", **kw)[0]
    assert row["text"] == 'def solve_linear_equation():\n    """ Solve 24 = 1601*c - 1605*c for c. """\n    return (-6)'


def test_prompt_style_bad_input(math_row):
    with pytest.raises(ValueError, match=r"style: unknown prompt style 'z'.*'python_function'"):
        drift_data.reformat_prompt_style(math_row, "z", question_column="problem", answer_column="solution")
    with pytest.raises(ValueError, match="question_column: column 'question'"):
        drift_data.reformat_prompt_style(math_row, "answer", answer_column="solution")
    with pytest.raises(ValueError, match="answer_column: column 'answer'"):
        drift_data.reformat_prompt_style(math_row, "answer", question_column="problem")


# --- write_dataset --------------------------------------------------------------------------

def test_write_dataset_jsonl_and_directory(tmp_path):
    ds = Dataset.from_dict({"text": ["a", "ü b"], "input_ids": [[1, 2], [3]]})
    path = write_dataset(ds, tmp_path / "out" / "d.jsonl")
    assert [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()] == ds.to_list()
    target = tmp_path / "out" / "d"
    write_dataset(ds, target)
    write_dataset(ds.select([1]), target)  # replaces the older directory
    assert load_from_disk(str(target)).to_list() == ds.select([1]).to_list()
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["d", "d.jsonl"]  # no temp leftovers
    write_dataset(ds.select([0]), path)  # a .jsonl file is replaced
    assert len(path.read_text().splitlines()) == 1
    (tmp_path / "plain").write_text("keep")
    with pytest.raises(ValueError, match="path: .* is a file"):
        write_dataset(ds, tmp_path / "plain")
    assert (tmp_path / "plain").read_text() == "keep"
    (tmp_path / "x.jsonl").mkdir()
    with pytest.raises(ValueError, match="path: .* is a directory"):
        write_dataset(ds, tmp_path / "x.jsonl")


# --- lm-eval tasks through the real CLI -----------------------------------------------------

def test_drift_bsc_tasks_lm_eval_cli(embedded_path, tmp_path):
    cmd = ["--model", "hf", "--model_args", f"pretrained={embedded_path}",
           "--tasks", "drift_bsc_next_bit,drift_bsc_samples", "--include_path", str(TASKS), "--device", "cpu",
           "--batch_size", "8", "--limit", "5", "--metadata", json.dumps({"seed": 3, "length": 16}),
           "--log_samples", "--output_path", str(tmp_path)]
    proc = run_lm_eval_cli(*cmd)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (results_file,) = tmp_path.rglob("results_*.json")
    results = json.loads(results_file.read_text())["results"]
    nb, sm = results["drift_bsc_next_bit"], results["drift_bsc_samples"]
    assert 0 <= nb["acc,none"] <= 1 and 0 <= nb["nll,none"] <= nb["nll_raw,none"]
    assert sm["nll_per_bit,none"] > 0

    (nb_file,) = tmp_path.rglob("samples_drift_bsc_next_bit_2*.jsonl")
    logged = [json.loads(line) for line in nb_file.read_text().splitlines()]
    c0 = drift.reference_string(16, 3)  # the metadata reached the loader
    assert [r["doc"] for r in logged] == drift.next_bit_docs(c0)[:5]
    for r in logged:
        l0, l1 = (float(resp[0]) for resp in r["filtered_resps"])
        gold = l1 if r["doc"]["label"] else l0
        assert r["nll"] == pytest.approx(-gold + math.log(math.exp(l0) + math.exp(l1)))
        assert r["nll_raw"] == pytest.approx(-gold) and r["acc"] == float(gold == max(l0, l1))
    assert nb["nll,none"] == pytest.approx(np.mean([r["nll"] for r in logged]))

    (sm_file,) = tmp_path.rglob("samples_drift_bsc_samples_2*.jsonl")
    logged = [json.loads(line) for line in sm_file.read_text().splitlines()]
    assert [r["doc"] for r in logged] == drift_data.bsc_sample_dataset(seed=3, length=16)["test"].to_list()[:5]
    for r in logged:
        assert r["nll_per_bit"] == pytest.approx(-float(r["filtered_resps"][0]) / r["doc"]["n_bits"])
