import sys

import pytest
import torch
from conftest import ROOT


def test_builtin_weightings_registered():
    from adaptguard.plugins import token_weightings

    assert {"talr", "none", "dft"} <= set(token_weightings())


def test_unknown_weighting_lists_known_ones():
    from adaptguard.plugins import get_token_weighting

    with pytest.raises(ValueError) as err:
        get_token_weighting("nope")
    msg = str(err.value)
    assert "nope" in msg and "talr" in msg and "none" in msg and "dft" in msg


@pytest.fixture()
def focal_installed(tmp_path, monkeypatch):
    """Make plugins/adaptguard-focal-loss discoverable through a real entry point: a dist-info with
    entry_points.txt on sys.path, which is what `pip install` leaves behind."""
    dist = tmp_path / "adaptguard_focal_loss-0.1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: adaptguard-focal-loss\nVersion: 0.1.0\n")
    (dist / "entry_points.txt").write_text("[adaptguard]\nfocal_loss = adaptguard_focal_loss\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(ROOT / "plugins" / "adaptguard-focal-loss" / "src"))
    from adaptguard.plugins import get_plugin_manager

    get_plugin_manager.cache_clear()
    yield
    sys.modules.pop("adaptguard_focal_loss", None)
    get_plugin_manager.cache_clear()


def test_third_party_weighting_by_name(focal_installed, tiny, tmp_path):
    from conftest import cpu_args
    from datasets import Dataset

    from adaptguard import TALRTrainer
    from adaptguard.plugins import get_token_weighting

    focal = get_token_weighting("focal_loss")
    with pytest.raises(ValueError, match=r"Unknown weighting 'focal'; known weightings: .*focal_loss"):
        get_token_weighting("focal")  # `focal` is the update recipe (focal distillation), not a weighting

    class Args:
        weighting_kwargs = {"gamma": 2.0}

    nll = torch.tensor([[0.0, torch.log(torch.tensor(2.0))]])
    w, _ = focal(nll, torch.ones(1, 2, dtype=torch.bool), Args())
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.25]]))

    model, tok = tiny
    data = Dataset.from_list([{"prompt": "the opposite of hot is", "completion": " cold ."}] * 8)
    trainer = TALRTrainer(model=model, args=cpu_args(tmp_path, weighting="focal_loss", max_steps=2,
                                                     weighting_kwargs={"gamma": 1.0}),
                          train_dataset=data, processing_class=tok)
    trainer.train()
    assert all(torch.isfinite(torch.tensor(h["loss"])) for h in trainer.state.log_history if "loss" in h)


def test_unknown_weighting_in_config_fails_before_training(tiny, tmp_path):
    from conftest import cpu_args
    from datasets import Dataset

    from adaptguard import TALRTrainer

    model, tok = tiny
    with pytest.raises(ValueError, match=r"known weightings: .*none.*talr"):
        TALRTrainer(model=model, args=cpu_args(tmp_path, weighting="typo"),
                    train_dataset=Dataset.from_list([{"text": "hello"}]), processing_class=tok)
