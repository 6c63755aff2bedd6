"""A model's last hidden states and output layer, read as the tiled and exact losses need them (shared by the trainer
and the logit caches)."""

from __future__ import annotations

import torch

from ..utils.sharding import full_tensor
from .tiled import LMHead


def backbone_outputs(model, inputs: dict):
    """The model's backbone outputs (`last_hidden_state`: (B, L, H) after the final norm; `router_logits` of an MoE
    model asked for them); the LM head is not run. A `PeftModel`'s LoRA layers sit inside the backbone, so the
    active adapter applies (prompt-learning adapters do not: they act in `PeftModel.forward`)."""
    from peft import PeftModel

    if isinstance(model, PeftModel):
        model = model.base_model.model
    return model.base_model(**inputs)


def last_hidden_state(model, inputs: dict) -> torch.Tensor:
    """(B, L, H) hidden states after the final norm (`backbone_outputs`)."""
    return backbone_outputs(model, inputs).last_hidden_state


def output_head(model) -> LMHead:
    """The model's LM head as an `LMHead`: its weight and bias, and the config's logit soft-capping and scale (read
    as TRL's DistillationTrainer reads them). TRL's SFTTrainer refuses a PEFT adapter on the LM head, so the
    weight is the head's own."""
    layer = model.get_output_embeddings()
    # Under FSDP2 a head outside its model's forward is a sharded DTensor: gathered once here (an all-gather; its
    # backward reduce-scatters), as TRL's DistillationTrainer does. Inside the forward it is already whole.
    weight, bias = full_tensor(layer.weight), getattr(layer, "bias", None)
    bias = None if bias is None else full_tensor(bias)
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    scale = getattr(config, "logit_scale", None)
    if scale is None:
        scale = getattr(config, "output_multiplier", None) or getattr(config, "lm_head_multiplier", None)
    if scale is None and getattr(config, "logits_scaling", None) is not None:
        scale = config.logits_scaling if config.model_type == "hyperclovax" else 1 / config.logits_scaling
    return LMHead(weight, bias, getattr(config, "final_logit_softcapping", None), 1.0 if scale is None else float(scale))
