"""Dataset loaders and per-sample scores of the drift_bsc_* tasks (the logic is in adaptguard.drift and adaptguard.drift.data).

lm-eval passes the task metadata merged with `--metadata` (and the model arguments) as keyword
arguments to the loaders: only the keys named here are used.
"""

from adaptguard import drift
from adaptguard.drift import data


def next_bit_dataset(seed=0, length=64, **_):
    return data.next_bit_dataset(seed=seed, length=length)


def next_bit_results(doc, results):
    return drift.next_bit_scores([ll for ll, _ in results], doc["label"])


def sample_dataset(seed=0, length=64, delta=0.2, n_samples=64, **_):
    return data.bsc_sample_dataset(seed=seed, length=length, delta=delta, n_samples=n_samples)


def sample_results(doc, results):
    (loglik,) = results
    return {"nll_per_bit": -loglik / doc["n_bits"]}
