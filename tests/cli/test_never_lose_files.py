"""Never delete what we did not write (issue 13): an output directory holding a user's files is refused, before any
work, with exit 2 and a message naming the argument; our own earlier output is still replaced."""

import json

import pytest
import torch
from datasets import Dataset, load_from_disk
from in_process import run_cli

from adaptguard.muscle.logit_cache import build_logit_cache, is_logit_cache
from adaptguard.utils.files import check_replaceable, is_saved_dataset, write_dataset


@pytest.fixture
def precious(tmp_path):
    d = tmp_path / "precious"
    d.mkdir()
    (d / "thesis.txt").write_text("x")
    return d




@pytest.mark.parametrize("command", [
    lambda data, out: ["drift", "corrupt", data, "--similarity", "0.5", "--out", out],       # the reproduction
    lambda data, out: ["drift", "styles", data, "--style", "answer", "--out", out],
    lambda data, out: ["select", "--target", data, "--candidates", data, "--model", "/nonexistent", "--out", out],
    lambda data, out: ["cache-logits", "--old-model", "/nonexistent", "--dataset", data, "--out", out],
])
def test_cli_refuses_a_users_directory_and_deletes_nothing(tmp_path, precious, command):
    data = tmp_path / "data.jsonl"
    data.write_text(json.dumps({"text": "a b", "question": "q", "answer": "a"}) + "\n")
    proc = run_cli(*command(data, precious))
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert f"--out: {precious} is a non-empty directory that is not" in proc.stderr and "Traceback" not in proc.stderr
    assert [p.name for p in precious.iterdir()] == ["thesis.txt"] and (precious / "thesis.txt").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.jsonl", "precious"]  # no temporary leftovers


def test_write_dataset_replaces_only_its_own_output(tmp_path, precious):
    ds = Dataset.from_dict({"text": ["a", "b"]})
    with pytest.raises(ValueError, match="not a dataset saved by save_to_disk"):
        write_dataset(ds, precious)
    assert [p.name for p in precious.iterdir()] == ["thesis.txt"]
    out = tmp_path / "mixture"
    write_dataset(ds, out)
    assert is_saved_dataset(out) and not is_saved_dataset(precious)
    write_dataset(ds.select([1]), out)  # an earlier save_to_disk output is ours: replaced
    assert load_from_disk(str(out)).to_list() == [{"text": "b"}]
    (out / "notes.md").write_text("mine")  # a user's file inside it: no longer ours alone
    with pytest.raises(ValueError, match="refusing to replace it"):
        write_dataset(ds, out)
    assert (out / "notes.md").read_text() == "mine"
    (tmp_path / "empty").mkdir()
    write_dataset(ds, tmp_path / "empty")  # an empty directory holds nothing to lose


def test_logit_cache_replaces_only_a_logit_cache(tmp_path, precious):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=11, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    data = Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5]], "labels": [[-100, 2, 3], [-100, 5]]})

    def collate(rows):
        width = max(len(r["input_ids"]) for r in rows)
        pad = lambda xs, v: [x + [v] * (width - len(x)) for x in xs]  # noqa: E731
        return {"input_ids": torch.tensor(pad([r["input_ids"] for r in rows], 0)),
                "attention_mask": torch.tensor(pad([[1] * len(r["input_ids"]) for r in rows], 0)),
                "labels": torch.tensor(pad([r["labels"] for r in rows], -100))}

    class Tok:  # what tokenizer_fingerprint reads
        def get_vocab(self):
            return {str(i): i for i in range(11)}

    with pytest.raises(ValueError, match="out_dir: .* not a logit cache"):
        build_logit_cache(model, Tok(), data, collate, precious, k=3)
    assert [p.name for p in precious.iterdir()] == ["thesis.txt"]
    cache = build_logit_cache(model, Tok(), data, collate, tmp_path / "cache", k=3)
    assert is_logit_cache(cache)
    build_logit_cache(model, Tok(), data, collate, cache, k=4)  # our own cache: replaced
    assert json.loads((cache / "cache.json").read_text())["k"] == 4
    check_replaceable(cache, is_logit_cache, "a logit cache")
