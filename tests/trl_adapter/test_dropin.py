"""Drop-in conformance (issue 27): TALRTrainer and MUSCLETrainer put in SFTTrainer's place over SFTTrainer's
feature matrix, on tiny random models of 11 architectures built here from their transformers configs (no Hub).

Each row trains 2 steps and checks behaviour: the trained parameters changed and only those meant to (the adapter,
or every weight in full fine-tuning), the loss is finite, SFTTrainer's metrics are logged (`entropy`,
`mean_token_accuracy`, `num_tokens`, and `aux_loss` on MoE models); the data rows also check that the batches are
the ones SFTTrainer builds (same processing: completion / assistant masks, packing, padding-free), and for TALR
with `weighting="none"` that loss and gradients equal SFTTrainer's on the same batch."""

from pathlib import Path

import pytest
import torch
from conftest import ROOT
from datasets import Dataset, IterableDataset

TINY = ROOT / "src" / "adaptguard" / "models" / "embedded_models" / "tiny"
SMALL = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=64,
             max_position_embeddings=256, head_dim=8)
ARCHS = {  # model_type: what the config needs beyond SMALL to be tiny and valid
    "llama": {}, "qwen3": {}, "olmo3": {}, "cohere2": {}, "phi3": {}, "gpt_neox": {},
    "gemma2": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=8),  # logit soft-capping
    "gemma3_text": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=8),
    "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, output_router_logits=True),
    "gpt_oss": dict(num_local_experts=4, num_experts_per_tok=2, output_router_logits=True, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"],
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    "nemotron_h": dict(layers_block_type=["mamba", "attention"], mamba_num_heads=4, mamba_head_dim=8,
                       ssm_state_size=8, n_groups=1, conv_kernel=4, expand=2),  # hybrid: Mamba mixer + attention
}
MOE = {"qwen3_moe", "gpt_oss"}
FACTS = [("France", "Paris"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"), ("Peru", "Lima"),
         ("Chile", "Santiago"), ("Kenya", "Nairobi"), ("Egypt", "Cairo")]


def build_model(model_type: str, out: Path, seed: int) -> Path:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TINY)
    config = AutoConfig.for_model(model_type, vocab_size=len(tok), pad_token_id=tok.pad_token_id,
                                  eos_token_id=tok.eos_token_id, bos_token_id=tok.bos_token_id,
                                  **{**SMALL, **ARCHS[model_type]})
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """{model_type: (v2 path, old v1 path)}: two random inits of each architecture, with the tiny tokenizer."""
    root = tmp_path_factory.mktemp("archs")
    return {t: (build_model(t, root / t, 0), build_model(t, root / f"{t}-old", 1)) for t in ARCHS}


def rows(kind: str) -> list[dict]:
    out = []
    for country, capital in FACTS:
        question, answer = f"What is the capital of {country}?", f"It is {capital}."
        out.append({
            "text": {"text": f"{question} {answer}"},
            "messages": {"messages": [{"role": "user", "content": question},
                                      {"role": "assistant", "content": answer}]},
            "prompt_completion": {"prompt": question, "completion": " " + answer},
            "conversational_prompt_completion": {"prompt": [{"role": "user", "content": question}],
                                                 "completion": [{"role": "assistant", "content": answer}]},
            "custom_field": {"body": f"{question} {answer}"},
            "columns": {"q": question, "a": answer},
            "tool_call": {"messages": [
                {"role": "user", "content": f"Look up the capital of {country}."},
                {"role": "assistant", "tool_calls": [{"type": "function", "function": {
                    "name": "capital", "arguments": {"country": country}}}]},
                {"role": "tool", "name": "capital", "content": capital},
                {"role": "assistant", "content": answer}],
                "tools": '[{"type": "function", "function": {"name": "capital", "description": "Capital of a '
                         'country", "parameters": {"type": "object", "properties": {"country": {"type": "string"}}, '
                         '"required": ["country"]}}}]'},
            "harmony": {"messages": [{"role": "system", "content": "Answer briefly."},
                                     {"role": "user", "content": question},
                                     {"role": "assistant", "thinking": f"The capital of {country}.",
                                      "content": answer}],
                        "chat_template_kwargs": {"reasoning_effort": "low", "model_identity": "A tiny model."}},
        }[kind])
    return out


def trl_template(name: str) -> str:
    import trl

    return str(Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja")


def base_args(out, **kw) -> dict:
    from adaptguard.trl_adapter import no_activation_checkpointing

    args = dict(output_dir=str(out), bf16=False, use_cpu=True, report_to="none", save_strategy="no", logging_steps=1,
                per_device_train_batch_size=4, max_steps=2, learning_rate=1e-2, disable_tqdm=True, seed=0,
                max_length=64, **({} if "gradient_checkpointing" in kw else no_activation_checkpointing()))
    return {**args, **kw}


def make_trainer(which: str, model, old, out, args_kw: dict, **kw):
    """`which` = "sft" (TRL's own), "talr" or "muscle" (the old model `old`), built the same way."""
    from trl import SFTConfig, SFTTrainer

    from adaptguard import MUSCLEConfig, MUSCLETrainer, TALRConfig, TALRTrainer

    args = base_args(out, **args_kw)
    if which == "sft":
        return SFTTrainer(model=model, args=SFTConfig(**args), **kw)
    if which == "talr":
        return TALRTrainer(model=model, args=TALRConfig(**args), **kw)
    return MUSCLETrainer(model=model, args=MUSCLEConfig(**args), old_model=str(old), **kw)


def check_trains(trainer, moe: bool = False, adapter: bool = False) -> None:
    """2 steps: the trained parameters moved, and only those meant to; finite losses; SFTTrainer's metrics."""
    meant = {n for n, p in trainer.model.named_parameters() if p.requires_grad}
    if adapter:
        assert meant and all("lora_" in n or "prompt_encoder" in n for n in meant), sorted(meant)[:4]
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    after = dict(trainer.model.named_parameters())
    moved = {n for n in before if not torch.equal(before[n], after[n])}
    assert moved and moved <= meant, sorted(moved - meant)[:4]
    if not adapter:  # full fine-tuning: the weights of every layer move
        assert len(moved) > len(meant) / 2, (len(moved), len(meant))
    logs = [h for h in trainer.state.log_history if "loss" in h]
    assert len(logs) == 2 and all(torch.isfinite(torch.tensor(h["loss"])) for h in logs)
    wanted = {"entropy", "mean_token_accuracy", "num_tokens"} | ({"aux_loss"} if moe else set())
    assert all(wanted <= set(h) for h in logs), logs
    assert logs[-1]["num_tokens"] > logs[0]["num_tokens"] > 0


@pytest.mark.parametrize("which", ["talr", "muscle"])
@pytest.mark.parametrize("model_type", list(ARCHS))
def test_every_architecture_full_and_lora(model_type, which, models, tmp_path):
    """Full fine-tuning with the model given as a path, and a LoRA adapter on adaptguard's default targets (which
    work on the hybrid NemotronH, where PEFT refuses "all-linear"), on conversational data."""
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM

    from adaptguard import default_lora_targets

    path, old = models[model_type]
    data = Dataset.from_list(rows("messages"))
    check_trains(make_trainer(which, str(path), old, tmp_path / "full", {}, train_dataset=data),
                 moe=model_type in MOE)
    model = AutoModelForCausalLM.from_pretrained(path)
    lora = LoraConfig(r=4, lora_alpha=8, target_modules=default_lora_targets(model), task_type="CAUSAL_LM")
    check_trains(make_trainer(which, model, old, tmp_path / "lora", {}, train_dataset=data, peft_config=lora),
                 moe=model_type in MOE, adapter=True)


DATA_ROWS = {  # name: (dataset kind, config fields, trainer keywords)
    "language_modeling": ("text", {}, {}),
    "conversational": ("messages", {}, {}),
    "prompt_completion": ("prompt_completion", {}, {}),
    "conversational_prompt_completion": ("conversational_prompt_completion", {}, {}),
    "completion_loss_on_everything": ("prompt_completion", {"completion_only_loss": False}, {}),
    "assistant_only_loss": ("messages", {"assistant_only_loss": True}, {}),
    "dataset_text_field": ("custom_field", {"dataset_text_field": "body"}, {}),
    "formatting_func": ("columns", {}, {"formatting_func": lambda row: f"Q: {row['q']} A: {row['a']}"}),
    "packing_bfd": ("text", {"packing": True, "packing_strategy": "bfd", "max_length": 32}, {}),
    "packing_wrapped": ("text", {"packing": True, "packing_strategy": "wrapped", "max_length": 32}, {}),
    "padding_free": ("messages", {"padding_free": True, "max_length": None}, {}),
    # the templates' system prompts are long in the tiny tokenizer's tokens: no truncation
    "tool_calls": ("tool_call", {"chat_template_path": trl_template("qwen3_training"), "assistant_only_loss": True,
                                 "max_length": None}, {}),
    "harmony": ("harmony", {"chat_template_path": trl_template("gptoss_training"), "assistant_only_loss": True,
                            "max_length": None}, {}),
}


def dataset_for(kind: str, fields: dict, tokenizer):
    data = Dataset.from_list(rows(kind))
    if fields.get("pretokenized"):
        data = data.map(lambda r: {"input_ids": tokenizer(r["text"])["input_ids"]}, remove_columns=["text"])
    return data


@pytest.mark.parametrize("which", ["talr", "muscle"])
@pytest.mark.parametrize("row", list(DATA_ROWS))
def test_data_rows_build_sfttrainers_batches_and_train(row, which, models, tmp_path):
    from transformers import AutoTokenizer

    kind, fields, extra = DATA_ROWS[row]
    path, old = models["llama"]
    tok = AutoTokenizer.from_pretrained(path)
    batches = []
    for name in ("sft", which):
        trainer = make_trainer(name, str(path), old, tmp_path / name, fields, train_dataset=dataset_for(kind, fields, tok),
                               processing_class=AutoTokenizer.from_pretrained(path), **extra)
        batches.append(next(iter(trainer.get_train_dataloader())))
    sft, ours = batches
    assert set(sft) == set(ours), row
    for k in sft:
        assert torch.equal(sft[k], ours[k]) if torch.is_tensor(sft[k]) else sft[k] == ours[k], (row, k)
    scored = (ours["labels"] != -100).sum().item()
    assert 0 < scored, row
    if fields.get("assistant_only_loss") or (kind.endswith("prompt_completion") and "completion_only_loss" not in fields):
        assert scored < ours["input_ids"].numel() / 2  # the prompt / non-assistant tokens are masked
    check_trains(trainer)


@pytest.mark.parametrize("row", ["language_modeling", "conversational_prompt_completion", "packing_bfd",
                                 "padding_free", "assistant_only_loss", "label_smoothing"])
def test_talr_without_weighting_is_sfttrainer(row, models, tmp_path):
    """TALR with weighting="none": the loss and every gradient equal SFTTrainer's on the same batch (label
    smoothing included)."""
    from transformers import AutoTokenizer

    kind, fields, extra = ("messages", {"label_smoothing_factor": 0.1}, {}) if row == "label_smoothing" \
        else DATA_ROWS[row]
    path, old = models["llama"]
    results = []
    for name in ("sft", "talr"):
        tok = AutoTokenizer.from_pretrained(path)
        trainer = make_trainer(name, str(path), old, tmp_path / name,
                               {**fields, **({"weighting": "none"} if name == "talr" else {})},
                               train_dataset=dataset_for(kind, fields, tok), processing_class=tok, **extra)
        batch = next(iter(trainer.get_train_dataloader()))
        trainer.model.train()
        loss = trainer.compute_loss(trainer.model, dict(batch))
        loss.backward()
        results.append((loss.item(), {n: p.grad.clone() for n, p in trainer.model.named_parameters()}))
    (sft_loss, sft_grads), (talr_loss, talr_grads) = results
    assert talr_loss == pytest.approx(sft_loss, rel=1e-6)
    for n in sft_grads:
        torch.testing.assert_close(talr_grads[n], sft_grads[n], rtol=1e-5, atol=1e-7, msg=n)


@pytest.mark.parametrize("which", ["talr", "muscle"])
def test_pretokenized_and_streaming(which, models, tmp_path):
    from transformers import AutoTokenizer

    path, old = models["llama"]
    tok = AutoTokenizer.from_pretrained(path)
    pretokenized = dataset_for("text", {"pretokenized": True}, tok)
    check_trains(make_trainer(which, str(path), old, tmp_path / "pre", {}, train_dataset=pretokenized,
                              processing_class=tok))
    stream = IterableDataset.from_generator(lambda: iter(rows("messages")))
    check_trains(make_trainer(which, str(path), old, tmp_path / "stream", {}, train_dataset=stream,
                              processing_class=tok))


@pytest.mark.parametrize("which", ["talr", "muscle"])
@pytest.mark.parametrize("peft", ["prompt_tuning", "prefix_tuning"])
def test_prompt_learning_adapters(peft, which, models, tmp_path):
    from peft import PrefixTuningConfig, PromptTuningConfig

    path, old = models["llama"]
    config = (PromptTuningConfig if peft == "prompt_tuning" else PrefixTuningConfig)(num_virtual_tokens=4,
                                                                                     task_type="CAUSAL_LM")
    check_trains(make_trainer(which, str(path), old, tmp_path, {}, train_dataset=Dataset.from_list(rows("messages")),
                              peft_config=config), adapter=True)


@pytest.mark.parametrize("which", ["talr", "muscle"])
@pytest.mark.parametrize("reentrant", [True, False])
def test_gradient_checkpointing(reentrant, which, models, tmp_path):
    from peft import LoraConfig

    path, old = models["llama"]
    fields = {"gradient_checkpointing": True, "gradient_checkpointing_kwargs": {"use_reentrant": reentrant}}
    trainer = make_trainer(which, str(path), old, tmp_path, fields,
                           train_dataset=Dataset.from_list(rows("messages")),
                           peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
    check_trains(trainer, adapter=True)
    inner = trainer.model.base_model.model  # the Trainer switches it on when training starts
    assert getattr(inner, "is_activation_checkpointing", None) or inner.is_gradient_checkpointing


@pytest.mark.parametrize("which", ["talr", "muscle"])
def test_evaluation_with_compute_metrics(which, models, tmp_path):
    """`compute_metrics` sees the logits of every evaluated token, as with SFTTrainer."""
    path, old = models["llama"]
    seen = {}

    def compute_metrics(prediction):
        seen["shape"] = prediction.predictions.shape
        return {"mean_logit": float(prediction.predictions.mean())}

    data = Dataset.from_list(rows("messages"))
    trainer = make_trainer(which, str(path), old, tmp_path, {"eval_strategy": "steps", "eval_steps": 2,
                                                            "per_device_eval_batch_size": 4},
                           train_dataset=data, eval_dataset=data, compute_metrics=compute_metrics)
    check_trains(trainer)
    evaluated = [h for h in trainer.state.log_history if "eval_loss" in h]
    assert evaluated and all(torch.isfinite(torch.tensor(h["eval_mean_logit"])) for h in evaluated)
    vocab = trainer.model.get_output_embeddings().weight.shape[0]
    assert len(seen["shape"]) == 3 and seen["shape"][0] == len(data) and seen["shape"][2] == vocab


@pytest.mark.parametrize("which", ["talr", "muscle"])
def test_model_init_kwargs_dtype(which, models, tmp_path):
    """A model given as a string is loaded with `model_init_kwargs`, dtype strings included, as SFTTrainer does."""
    path, old = models["llama"]
    trainer = make_trainer(which, str(path), old, tmp_path, {"model_init_kwargs": {"dtype": "bfloat16"}},
                           train_dataset=Dataset.from_list(rows("messages")))
    assert next(trainer.model.parameters()).dtype == torch.bfloat16
    sft = make_trainer("sft", str(path), old, tmp_path / "sft", {"model_init_kwargs": {"dtype": "bfloat16"}},
                       train_dataset=Dataset.from_list(rows("messages")))
    assert next(sft.model.parameters()).dtype == torch.bfloat16


def test_default_lora_targets_leave_out_what_peft_refuses(models):
    """On the hybrid NemotronH, PEFT refuses LoRA on the Mamba mixer's out_proj (its fused kernel reads the weight):
    the default targets are every other linear layer; on a dense model they are PEFT's "all-linear"."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from adaptguard import default_lora_targets

    hybrid = AutoModelForCausalLM.from_pretrained(models["nemotron_h"][0])
    with pytest.raises(ValueError, match="out_proj"):
        get_peft_model(AutoModelForCausalLM.from_pretrained(models["nemotron_h"][0]),
                       LoraConfig(target_modules="all-linear", task_type="CAUSAL_LM"))
    targets = default_lora_targets(hybrid)
    assert "in_proj" in targets and "out_proj" not in targets and "lm_head" not in targets
    dense = AutoModelForCausalLM.from_pretrained(models["llama"][0])
    all_linear = get_peft_model(AutoModelForCausalLM.from_pretrained(models["llama"][0]),
                                LoraConfig(target_modules="all-linear", task_type="CAUSAL_LM"))
    assert set(default_lora_targets(dense)) == {n.split(".")[-1] for n in all_linear.peft_config["default"].target_modules}


@pytest.mark.parametrize("which", ["talr", "muscle"])
@pytest.mark.parametrize("model_type", sorted(MOE))
def test_moe_aux_loss_is_added_as_sfttrainer_adds_it(model_type, which, models, tmp_path):
    """The training loss carries `router_aux_loss_coef` × the router's load-balancing loss, the value logged as
    `aux_loss`; with the coefficient at 0 the loss is the task loss alone."""
    path, old = models[model_type]
    trainer = make_trainer(which, str(path), old, tmp_path, {"router_aux_loss_coef": 0.5},
                           train_dataset=Dataset.from_list(rows("messages")))
    assert trainer.aux_loss_enabled
    batch = next(iter(trainer.get_train_dataloader()))
    trainer.model.train()
    with_aux = trainer.compute_loss(trainer.model, dict(batch)).item()
    aux = trainer._metrics["train"]["aux_loss"][-1]
    trainer.router_aux_loss_coef = 0.0
    without = trainer.compute_loss(trainer.model, dict(batch)).item()
    assert aux > 0 and with_aux - without == pytest.approx(0.5 * aux, rel=1e-4)


def test_loss_settings_that_cannot_apply_are_refused_naming_the_alternative(models, tmp_path):
    path, old = models["llama"]
    data = Dataset.from_list(rows("messages"))
    with pytest.raises(ValueError, match="weighting='none'"):
        make_trainer("talr", str(path), old, tmp_path, {"label_smoothing_factor": 0.1}, train_dataset=data)
    for fields in ({"label_smoothing_factor": 0.1}, {"loss_type": "dft"}):
        with pytest.raises(ValueError, match="ce_weight"):
            make_trainer("muscle", str(path), old, tmp_path, fields, train_dataset=data)


@pytest.mark.parametrize("which", ["talr", "muscle"])
def test_an_sftconfig_script_runs_with_the_class_swapped(which, models, tmp_path):
    """The script's own `SFTConfig` is accepted (the method's defaults are added; its fields keep their values)."""
    from trl import SFTConfig

    from adaptguard import MUSCLEConfig, MUSCLETrainer, TALRConfig, TALRTrainer

    path, old = models["llama"]
    config = SFTConfig(**base_args(tmp_path, learning_rate=3e-3))
    trainer_class, extra = (TALRTrainer, {}) if which == "talr" else (MUSCLETrainer, {"old_model": str(old)})
    trainer = trainer_class(model=str(path), args=config, train_dataset=Dataset.from_list(rows("messages")), **extra)
    assert isinstance(trainer.args, TALRConfig if which == "talr" else MUSCLEConfig)
    assert trainer.args.learning_rate == 3e-3 and trainer.args.max_steps == 2
    check_trains(trainer)


@pytest.mark.parametrize("which", ["talr", "muscle"])
@pytest.mark.parametrize("peft", ["lora", "prompt_tuning"])
def test_a_peft_model_trains_every_adapter_weight_and_saves_only_its_own(peft, which, models, tmp_path):
    """A `PeftModel` passed as `model` (TRL's test_train_peft_model / test_prompt_tuning_peft_model): every adapter
    weight the user sees trains (MUSCLE's frozen teacher copy is not among them), and `save_model` writes the
    trained adapter alone, which loads back to the trained values."""
    from peft import LoraConfig, PeftModel, PromptTuningConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    path, old = models["llama"]
    config = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") if peft == "lora" \
        else PromptTuningConfig(num_virtual_tokens=4, task_type="CAUSAL_LM")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path), config)
    trainer = make_trainer(which, model, old, tmp_path, {}, train_dataset=Dataset.from_list(rows("messages")))
    adapter = {n: p.detach().clone() for n, p in trainer.model.named_parameters()
               if "lora" in n or "prompt_encoder" in n}
    assert adapter and all(".default." in n for n in adapter), sorted(adapter)
    check_trains(trainer, adapter=True)
    assert all(not torch.equal(p, trainer.model.get_parameter(n)) for n, p in adapter.items())
    trainer.save_model(str(tmp_path / "saved"))
    assert not any(p.is_dir() for p in (tmp_path / "saved").iterdir())  # no second adapter's folder
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path), tmp_path / "saved")
    for n, p in reloaded.named_parameters():
        if n in adapter:
            torch.testing.assert_close(p, trainer.model.get_parameter(n), msg=n)


def template_adding_tokens(path, out) -> str:
    """A tokenizer folder with `path`'s tokenizer, two new special tokens and a chat template that uses them."""
    from transformers import AutoTokenizer

    source = AutoTokenizer.from_pretrained(path)
    source.add_special_tokens({"additional_special_tokens": ["<|turn|>", "<|end_turn|>"]})
    source.chat_template = ("{% for m in messages %}<|turn|>{{ m['role'] }}\n{{ m['content'] }}<|end_turn|>\n"
                            "{% endfor %}")
    source.save_pretrained(out)
    return str(out)


@pytest.mark.parametrize("which", ["talr", "muscle"])
@pytest.mark.parametrize("adapter", [False, True])
def test_chat_template_path_that_adds_tokens(adapter, which, models, tmp_path):
    """`chat_template_path` naming a tokenizer with tokens the model lacks (TRL's clone_chat_template grows the
    student's embeddings): MUSCLE's teachers grow with it, their new rows equal to the student's, and train."""
    from peft import LoraConfig
    from transformers import AutoTokenizer

    path, old = models["llama"]
    size = AutoTokenizer.from_pretrained(path).__len__()
    trainer = make_trainer(which, str(path), old, tmp_path / "run", {"chat_template_path": template_adding_tokens(
                               path, tmp_path / "template")},
                           train_dataset=Dataset.from_list(rows("messages")),
                           peft_config=LoraConfig(r=4, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
                           if adapter else None)
    grown = trainer.model.get_input_embeddings().weight
    assert grown.shape[0] > size and "<|turn|>" in trainer.processing_class.get_vocab()
    if which == "muscle":
        for teacher in (trainer.old_model, trainer.new_model):
            if teacher is not None:
                torch.testing.assert_close(teacher.get_input_embeddings().weight[size:], grown[size:])
                assert teacher.get_output_embeddings().weight.shape == trainer.model.get_output_embeddings().weight.shape
    check_trains(trainer)  # with an adapter, SFTTrainer also trains the new tokens' rows (trainable_token_indices)


def test_chat_template_path_that_adds_tokens_refuses_a_logit_cache_without_them(models, tmp_path):
    """v1's logit cache has no logits for the tokens `chat_template_path` adds: MUSCLE refuses it, naming the fix
    (the same cache is accepted when no tokens are added)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from adaptguard import MUSCLEConfig, MUSCLETrainer
    from adaptguard.muscle.logit_cache import cache_logits_for_training

    path, old = models["llama"]
    data, tokenizer = Dataset.from_list(rows("messages")), AutoTokenizer.from_pretrained(path)
    cache = cache_logits_for_training(AutoModelForCausalLM.from_pretrained(old), tokenizer, data, tmp_path / "cache",
                                      max_length=64)

    def trainer(out, **kw):
        return MUSCLETrainer(model=str(path), args=MUSCLEConfig(**base_args(out, old_logits_cache=str(cache), **kw)),
                             train_dataset=data, processing_class=AutoTokenizer.from_pretrained(path))

    assert trainer(tmp_path / "plain").old_cache is not None
    with pytest.raises(ValueError, match="chat_template_path added tokens that old_logits_cache has no logits for: "
                                         r"cache the old model's logits with the same chat template"):
        trainer(tmp_path / "run", chat_template_path=template_adding_tokens(path, tmp_path / "template"))
