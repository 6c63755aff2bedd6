"""adaptguard.drift_experiment: the synthetic drift experiment of paper 000 App. B (Fig. B1)."""

import itertools
import json
import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from adaptguard import drift
from adaptguard.drift import sweep as dx

# a configuration small enough for a test: 1 layer, width 16, 30 steps
MICRO = {"similarities": (0.0, 0.5), "repetitions": 2, "length": 16, "n0": 240, "n1": 40, "n_layer": 1,
         "n_head": 2, "n_embd": 16, "steps": 30, "batch_size": 16}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    # models this small gain nothing from a second thread, and on a busy machine thread hand-offs cost 10x
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def micro_result(tmp_path_factory, one_thread):
    out = tmp_path_factory.mktemp("drift")
    seen = []
    return out, dx.run_drift_experiment(out, progress=seen.append, **MICRO), seen


# --- the sweep and its outputs ---------------------------------------------------------------

def test_outputs_written_with_required_keys_and_nothing_else(micro_result):
    out, result, seen = micro_result
    assert sorted(p.name for p in out.iterdir()) == ["drift.json", "drift.png"]  # no temp files left
    assert (out / "drift.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    on_disk = json.loads((out / "drift.json").read_text())
    assert on_disk == json.loads(json.dumps(result))
    for key in ("r", "loss_mean", "loss_min", "loss_max", "accuracy_mean", "losses", "accuracies", "runs",
                "peak_r", "bayes_loss_mean", "optimal_loss", "settings", "seconds"):
        assert key in on_disk, key
    assert on_disk["r"] == [0.0, 0.5]
    settings = on_disk["settings"]
    assert settings["length"] == 16 and settings["steps"] == 30 and settings["preset"] == "default"
    assert settings["paper"]["length"] == 64 and settings["paper"]["n0"] == 100000 and settings["paper"]["n1"] == 16384
    assert on_disk["optimal_loss"] == pytest.approx(-math.log(0.8))
    assert len(seen) == 4 and seen == result["runs"]  # the progress callback saw every run
    assert on_disk["seconds"] >= sum(run["seconds"] for run in on_disk["runs"]) > 0


def test_summary_consistent_with_the_runs(micro_result):
    _, result, _ = micro_result
    for i, r in enumerate(result["r"]):
        runs = [run for run in result["runs"] if run["r"] == r]
        assert sorted(run["repetition"] for run in runs) == [0, 1]
        per_rep = [run["loss"] for run in sorted(runs, key=lambda run: run["repetition"])]
        assert result["losses"][i] == per_rep
        assert result["loss_mean"][i] == pytest.approx(sum(per_rep) / len(per_rep), abs=1e-12)
        assert result["loss_min"][i] <= result["loss_mean"][i] <= result["loss_max"][i]
        assert result["loss_min"][i] == min(per_rep) and result["loss_max"][i] == max(per_rep)
        assert all(0.0 <= a <= 1.0 for a in result["accuracies"][i])
        assert result["bayes_loss_mean"][i] == pytest.approx(np.mean([run["bayes_loss"] for run in runs]))
        # the realised similarity of the second reference is exactly r (r * 16 is an integer)
        assert all(run["similarity"] == r for run in runs)
        # a 30-step model is worse than chance on nothing: losses are finite and positive
        assert all(0.0 < loss < 2.0 for loss in per_rep)
    assert result["peak_r"] == result["r"][int(np.argmax(result["loss_mean"]))]


def test_quick_preset_and_overrides(tmp_path):
    quick = dx.DriftExperimentConfig.quick()
    default = dx.DriftExperimentConfig()
    assert quick.repetitions < default.repetitions and replace(quick, repetitions=default.repetitions) == default
    assert default.similarities == tuple(k / 8 for k in range(8))
    assert dx.DriftExperimentConfig.quick(steps=7).steps == 7
    # the default keeps the paper's ratio n1 / n0 = 16384 / 100000
    assert default.n1 / default.n0 == pytest.approx(16384 / 100000, rel=1e-3)
    result = dx.run_drift_experiment(tmp_path, quick=True, **{**MICRO, "similarities": (0.25,), "repetitions": 1,
                                                              "steps": 2})
    assert result["settings"]["preset"] == "quick" and len(result["runs"]) == 1


# --- determinism -----------------------------------------------------------------------------

def test_same_seed_same_losses_and_other_seed_differs():
    config = dx.DriftExperimentConfig(**MICRO)
    a, b = dx.run_single(config, 0.5, 0), dx.run_single(config, 0.5, 0)
    for key in ("loss", "accuracy", "train_loss", "bayes_loss", "similarity"):
        assert a[key] == b[key], key
    assert dx.run_single(config, 0.5, 1)["loss"] != a["loss"]
    assert dx.run_single(dx.DriftExperimentConfig(**{**MICRO, "seed": 5}), 0.5, 0)["loss"] != a["loss"]


# --- evaluation: next-bit NLL on c0 ----------------------------------------------------------

class FixedLogits(torch.nn.Module):
    """A 'model' whose next-token logits are given per position; it checks the inputs it is fed."""

    def __init__(self, logits, expected_inputs):
        super().__init__()
        self.logits, self.expected = logits, expected_inputs

    def forward(self, input_ids):
        assert input_ids.tolist() == [self.expected]
        return SimpleNamespace(logits=self.logits[None])


def test_next_bit_eval_hand_set_logits():
    c0 = np.array([1, 0, 0, 1], dtype=np.uint8)
    p1 = [0.8, 0.7, 0.1, 0.4]  # the model's P(next bit = 1) at each position
    # the BOS logit (column 2) is huge: the loss must be normalised over the two bits only
    logits = torch.tensor([[0.0, math.log(p / (1 - p)), 50.0] for p in p1])
    model = FixedLogits(logits, expected_inputs=[dx.BOS, 1, 0, 0])  # teacher-forced: BOS then c0[:-1]
    nll, acc = dx.next_bit_eval(model, c0)
    expected = -(math.log(0.8) + math.log(0.3) + math.log(0.9) + math.log(0.4)) / 4
    assert nll == pytest.approx(expected, rel=1e-6)
    assert acc == 0.5  # right at positions 0 and 2, wrong at 1 and 3
    # the same as drift.next_bit_scores' "nll" averaged over positions
    assert nll == pytest.approx(np.mean([drift.next_bit_scores(row[:2].tolist(), int(b))["nll"]
                                         for row, b in zip(logits, c0)]), rel=1e-6)


def test_next_bit_eval_matches_a_recomputation_on_a_real_model():
    config = dx.DriftExperimentConfig(**MICRO)
    model = dx.build_model(config, seed=3)
    c0 = drift.reference_string(16, 3)
    nll, acc = dx.next_bit_eval(model, c0)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([[dx.BOS, *c0[:-1].tolist()]])).logits[0].double().numpy()
    z = logits[:, :2]
    log_p = z[np.arange(16), c0] - np.log(np.exp(z).sum(axis=1))
    assert nll == pytest.approx(-log_p.mean(), rel=1e-5)
    assert acc == pytest.approx(np.mean((z[:, 1] > z[:, 0]) == (c0 == 1)))
    assert model.training  # evaluation restores the mode it found


def test_encode_samples_hand_example_and_padding_does_not_leak():
    inputs, labels = dx.encode_samples([np.array([1, 0, 1], np.uint8), np.array([0], np.uint8)], 4)
    assert inputs.tolist() == [[2, 1, 0, 2], [2, 2, 2, 2]]
    assert labels.tolist() == [[1, 0, 1, -100], [0, -100, -100, -100]]
    # right padding needs no attention mask: the real positions' predictions ignore what follows
    model = dx.build_model(dx.DriftExperimentConfig(**MICRO), seed=0).eval()
    with torch.no_grad():
        padded = dx.bit_log_probs(model, torch.tensor([[2, 1, 0, 2, 2, 2], [2, 1, 0, 1, 1, 0]]))
    assert torch.allclose(padded[0, :3], padded[1, :3], atol=1e-6)
    with pytest.raises(ValueError, match="samples"):
        dx.encode_samples([np.zeros(5, np.uint8)], 4)


def test_bayes_loss_hand_values():
    c0 = np.array([0, 1, 1, 0], np.uint8)
    assert dx.bayes_next_bit_loss(c0, c0, 10, 3, 0.2) == pytest.approx(-math.log(0.8))
    # c1 differs only at position 0: there the prior weight n1/(n0+n1) = 1/4 predicts the wrong bit
    c1 = np.array([1, 1, 1, 0], np.uint8)
    p0 = 0.75 * 0.8 + 0.25 * 0.2
    assert dx.bayes_next_bit_loss(c0, c1, 3, 1, 0.2) == pytest.approx((-math.log(p0) - 3 * math.log(0.8)) / 4)
    # c1 differs at positions 0 and 1: at position 1 the c0 prefix cut c1's weight by delta/(1-delta) = 1/4
    c2 = np.array([1, 0, 1, 0], np.uint8)
    w1 = 0.25 * 0.25 / (0.75 + 0.25 * 0.25)
    p1 = (1 - w1) * 0.8 + w1 * 0.2
    assert dx.bayes_next_bit_loss(c0, c2, 3, 1, 0.2) == pytest.approx((-math.log(p0) - math.log(p1)
                                                                       - 2 * math.log(0.8)) / 4)


# --- training data ----------------------------------------------------------------------------

@pytest.mark.parametrize("r", [0.0, 0.375, 0.875])
def test_training_data_mixture_and_similarity(r):
    n0, n1, length, delta = 3000, 1000, 32, 0.2
    data = dx.drift_training_bits(n0, n1, r, length=length, delta=delta, seed=7)
    assert len(data.samples) == n0 + n1 and data.source.mean() == n1 / (n0 + n1)
    assert drift.similarity(data.base, data.other) == r  # r * 32 is an integer
    assert all(1 <= z.size <= length for z in data.samples)
    # shuffled: the second subpopulation is not a block at the end
    assert data.source[: n0].mean() == pytest.approx(n1 / (n0 + n1), abs=0.05)
    # samples of c1 agree with c1 at rate 1 - delta, and with c0 at the rate A7 implies given where c1 differs
    ones = [z for z, s in zip(data.samples, data.source) if s]
    assert np.mean([drift.sample_similarity(z, data.other) for z in ones]) == pytest.approx(1 - delta, abs=0.02)
    expected = np.mean([(1 - 2 * delta) * drift.similarity(data.base[: z.size], data.other[: z.size]) + delta
                        for z in ones])
    assert np.mean([drift.sample_similarity(z, data.base) for z in ones]) == pytest.approx(expected, abs=0.02)
    zeros = [z for z, s in zip(data.samples, data.source) if not s]
    assert np.mean([drift.sample_similarity(z, data.base) for z in zeros]) == pytest.approx(1 - delta, abs=0.02)


def test_training_bits_are_the_drift_training_texts():
    bits = dx.drift_training_bits(50, 20, 0.5, length=16, delta=0.1, seed=4)
    texts = drift.drift_training_texts(50, 20, 0.5, length=16, delta=0.1, seed=4)
    assert [drift.bits_to_text(z) for z in bits.samples] == texts.texts
    assert np.array_equal(bits.base, texts.base) and np.array_equal(bits.source, texts.source)


def test_learning_rate_schedule():
    factors = [dx._lr_factor(step, 100, 0.1) for step in range(100)]
    assert factors[0] == pytest.approx(0.1) and factors[10] == pytest.approx(1.0)
    assert factors[5] == pytest.approx(0.55)  # linear warmup from peak/10 to peak
    assert factors[55] == pytest.approx(0.5)  # cosine halfway through the decay
    assert all(a >= b for a, b in itertools.pairwise(factors[10:])) and factors[-1] < 0.001


# --- bad input --------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, field", [
    ({"similarities": (0.5, 1.5)}, "similarities"), ({"similarities": ()}, "similarities"),
    ({"similarities": (-0.1,)}, "similarities"), ({"delta": 0.5}, "delta"), ({"delta": -0.1}, "delta"),
    ({"n0": 0}, "n0"), ({"n1": 0}, "n1"), ({"length": 0}, "length"), ({"repetitions": 0}, "repetitions"),
    ({"steps": 0}, "steps"), ({"batch_size": 2.5}, "batch_size"), ({"n_embd": 30, "n_head": 4}, "n_head"),
    ({"peak_lr": 0}, "peak_lr"), ({"warmup_fraction": 1.0}, "warmup_fraction"), ({"seed": -1}, "seed"),
    ({"n_layer": True}, "n_layer"), ({"color": "red"}, "overrides"),
])
def test_bad_input_names_the_field_and_writes_nothing(tmp_path, overrides, field):
    with pytest.raises(ValueError, match=field):
        dx.run_drift_experiment(tmp_path / "out", **overrides)
    assert not (tmp_path / "out").exists()


def test_the_demo_sections_side_by_side_give_this_process_results(tmp_path, micro_result, capsys):
    """`adaptguard demo` runs its sections in worker processes, one core each: the drift sweep there gives the same
    runs as here (one thread each, same kernels); its bar and lines are drawn in this process; a section that fails
    raises here, with its own message, once the others are done."""
    from functools import partial

    from adaptguard.demo.run import _drift, run_sections

    _, here, _ = micro_result
    sections = {"drift": (partial(_drift, **MICRO), tmp_path), "bad": (partial(_drift, color="red"), tmp_path / "bad")}
    with pytest.raises(ValueError, match="overrides"):
        run_sections(sections, workers=2)
    results, seconds = run_sections({"drift": sections["drift"]}, workers=1)
    beside = results["drift"]
    assert [run["loss"] for run in beside["runs"]] == pytest.approx([run["loss"] for run in here["runs"]], rel=1e-6)
    assert beside["peak_r"] == here["peak_r"] and (tmp_path / "drift" / "drift.json").exists()
    assert 0 < seconds["drift"] and not (tmp_path / "bad").exists()
    captured = capsys.readouterr()
    assert "drift: training runs: 100%" in captured.err.replace("\r", "\n")
    assert f"drift: highest loss at r = {here['peak_r']:.3f}" in captured.out  # the worker's line, said here
