"""Default LoRA targets that work on every causal LM, hybrid and state-space models included."""

from __future__ import annotations

import torch


def default_lora_targets(model: torch.nn.Module) -> list[str]:
    """Names (last component) of the layers a default LoRA adapter adapts: every linear layer but the output head,
    as PEFT's "all-linear", except the output projection of a state-space (Mamba) mixer — a module that also holds a
    `conv1d`. Its fused kernels read that weight directly, so PEFT refuses LoRA there (NemotronH, Mamba-2,
    Falcon-H1), while "all-linear" would pick it."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    names = set()
    for parent in model.modules():
        ssm_mixer = isinstance(getattr(parent, "conv1d", None), torch.nn.Conv1d)
        for name, child in parent.named_children():
            if isinstance(child, torch.nn.Linear) and child is not head and not (ssm_mixer and name == "out_proj"):
                names.add(name)
    if not names:
        raise ValueError(f"{type(model).__name__} has no linear layer to adapt: pass peft_config with target_modules")
    return sorted(names)
