"""Trainer callbacks: Wise-FT interpolation and token-level analysis (Lin et al. §4.2, §4.3)."""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
from pathlib import Path

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from transformers import TrainerCallback

from ..utils.figures import new_figure, save_figure
from ..utils.files import atomic_write_text, replace_dir
from .losses import wise_ft_interpolate

logger = logging.getLogger(__name__)


def _retie(model, state_dict: dict[str, torch.Tensor]) -> None:
    """Point tied weights (e.g. an LM head tied to the input embeddings) at their source's entry again, so that
    `save_pretrained` stores the source once; interpolation replaced only the source's tensor."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PeftModel's transformers model
    prefix = "" if base is model else "base_model.model."
    for target, source in (getattr(base, "all_tied_weights_keys", None) or {}).items():
        if prefix + source in state_dict:
            state_dict[prefix + target] = state_dict[prefix + source]


class WiseFTCallback(TrainerCallback):
    """Wise-FT (Wortsman et al., 2022): after training, save `θ = (1 − α) θ₀ + α θ_ft` as its own
    checkpoint in `<output_dir>/<subdir>`; the trained model itself is left untouched.

    θ₀ is taken from `init_params` ({name: tensor}) or, when omitted, at the end of the Trainer's
    `__init__` (before any checkpoint is resumed). For LoRA adapters whose `lora_B` starts at zero
    (PEFT's default) the interpolation is exact on the merged weights: `A = A_ft`, `B = α B_ft`, so
    `W₀ + α B_ft A_ft`; interpolating A and B separately would not be.
    """

    def __init__(self, alpha: float = 0.5, init_params=None, subdir: str = "wise-ft"):
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"wise_ft_alpha must be in [0, 1], got {alpha}")
        self.alpha, self.subdir = alpha, subdir
        self.init = None if init_params is None else self._snapshot(init_params)

    @staticmethod
    def _snapshot(named) -> dict[str, torch.Tensor]:
        items = named.items() if isinstance(named, dict) else named
        return {n: p.detach().to("cpu", copy=True) for n, p in items}

    def on_init_end(self, args, state, control, model=None, **kwargs):
        if self.init is None and model is not None:
            self.init = self._snapshot((n, p) for n, p in model.named_parameters() if p.requires_grad)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.init is None:
            logger.warning("WiseFTCallback was added after the Trainer was built: θ₀ = the weights at train start.")
            self.on_init_end(args, state, control, model=model)

    def interpolated(self, finetuned: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`(1 − α) θ₀ + α θ_ft` for the trained parameters, from the fine-tuned weights {name: whole tensor}."""
        finetuned = {n: finetuned[n].detach().cpu() for n in self.init if n in finetuned}
        mixed = wise_ft_interpolate(self.init, finetuned, self.alpha)
        for name in self.init:
            if "lora_A" in name:
                b_name = name.replace("lora_A", "lora_B")
                if b_name in self.init and not self.init[b_name].any():
                    mixed[name] = finetuned[name]
                    mixed[b_name] = self.alpha * finetuned[b_name]
        return mixed

    def on_train_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if model is None:
            return
        # The whole weights, on the CPU of the main process. Under FSDP2 they are sharded: gathering them is
        # collective, so every rank takes part; the others get an empty dict.
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if not state.is_world_process_zero:
            return
        state_dict = {**full, **self.interpolated(full)}
        _retie(model, state_dict)
        target = Path(args.output_dir) / self.subdir
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.subdir}-", dir=target.parent))
        try:
            model.save_pretrained(tmp, state_dict=state_dict, safe_serialization=True)
            if processing_class is not None:
                processing_class.save_pretrained(tmp)
            (tmp / "wise_ft.json").write_text(json.dumps({"alpha": self.alpha}))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        replace_dir(tmp, target)
        logger.info("Wise-FT (alpha=%s) checkpoint written to %s", self.alpha, target)


class TokenAnalysisCallback(TrainerCallback):
    """Token-level analysis (Lin et al. §4.3) for a `TALRTrainer`.

    Before training and at every epoch end, scores the first `args.token_analysis_max_examples`
    training rows with the current model and records the distribution of the supervised tokens'
    probabilities (quantiles, histogram) and the curriculum signal `frac_p_gt_0.2`. Writes
    `<output_dir>/token_analysis/token_analysis.json` (one entry per epoch) and heatmaps `heatmap_epoch<e>.png`
    (the `token_analysis_examples`, titled with method, learning rate and epoch); logs
    `token_analysis/frac_p_gt_0.2` into the log history.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.records: list[dict] = []

    @property
    def out_dir(self) -> Path:
        return Path(self.trainer.args.output_dir) / "token_analysis"

    def token_probabilities(self) -> list[tuple[list[int], torch.Tensor]]:
        """Per analysed row: its token ids (L,) without padding and each token's probability under the current
        model (L,), NaN where the token is not supervised (the prompt)."""
        trainer = self.trainer
        rows = []
        for batch, out in trainer.score_rows(trainer.train_dataset, trainer.args.token_analysis_max_examples):
            ids, attention = batch["input_ids"].cpu(), batch.get("attention_mask")
            supervised, probs = out.label_mask.cpu(), out.log_probs.float().exp().cpu()
            for i in range(ids.shape[0]):
                p = torch.full(ids[i].shape, float("nan"))
                p[1:][supervised[i]] = probs[i][supervised[i]]  # position t + 1 is predicted at t
                real = attention[i].cpu().bool() if attention is not None else torch.ones_like(p, dtype=torch.bool)
                rows.append((ids[i][real].tolist(), p[real]))
        return rows

    def analyse(self, epoch: float, step: int) -> dict:
        rows = self.token_probabilities()
        probs = torch.cat([p[~p.isnan()] for _, p in rows]) if rows else torch.zeros(0)
        if probs.numel() == 0:
            record = {"epoch": epoch, "step": step, "n_tokens": 0}
        else:
            qs = torch.quantile(probs, torch.tensor([0.1, 0.25, 0.5, 0.75, 0.9]))
            hist = torch.histc(probs, bins=20, min=0.0, max=1.0)
            record = {
                "epoch": epoch, "step": step, "n_tokens": int(probs.numel()),
                "frac_p_gt_0.2": float((probs > 0.2).float().mean()), "mean_p": float(probs.mean()),
                "quantiles": dict(zip(["p10", "p25", "p50", "p75", "p90"], [float(q) for q in qs])),
                "histogram": {"bin_edges": [i / 20 for i in range(21)], "counts": [int(c) for c in hist]},
            }
        tokenizer = self.trainer.processing_class
        examples = [(f"example {i}", [tokenizer.decode([t]) if tokenizer is not None else str(t) for t in rows[i][0]],
                     rows[i][1].tolist()) for i in self.trainer.args.token_analysis_examples if 0 <= i < len(rows)]
        if examples:
            args = self.trainer.args
            lora = " + LoRA" if hasattr(self.trainer.model, "peft_config") else ""
            save_heatmap(examples, self.out_dir / f"heatmap_epoch{epoch:g}.png",
                         title=f"{method_label(args)}{lora}, lr {args.learning_rate:g}, epoch {epoch:g}")
        return record

    def _record(self, state, epoch: float) -> None:
        # Every rank scores the rows: under FSDP/ZeRO-3 the forward gathers sharded weights from all ranks, so
        # a rank-0-only forward would hang. Only the main process writes files and logs.
        if not state.is_world_process_zero:
            self.token_probabilities()
            return
        record = self.analyse(epoch, state.global_step)
        self.records.append(record)
        atomic_write_text(self.out_dir / "token_analysis.json", json.dumps({"epochs": self.records}, indent=2))
        if "frac_p_gt_0.2" in record:
            state.log_history.append({"token_analysis/frac_p_gt_0.2": record["frac_p_gt_0.2"],
                                      "token_analysis/median_p": record["quantiles"]["p50"],
                                      "epoch": epoch, "step": state.global_step})

    def on_train_begin(self, args, state, control, **kwargs):
        self._record(state, 0.0 if state.epoch is None else float(state.epoch))

    def on_epoch_end(self, args, state, control, **kwargs):
        self._record(state, float(round(state.epoch or 0.0, 4)))


def method_label(args) -> str:
    """A short name of the training method a `TALRConfig` describes, e.g. "TALR + KL β=0.001"."""
    name = {"none": "SFT", "talr": "TALR"}.get(args.weighting, args.weighting)
    extras = [f"L2 λ={args.l2_lambda:g}" if args.l2_lambda else "", f"KL β={args.kl_beta:g}" if args.kl_beta else "",
              "FLOW" if args.flow else "", f"Wise-FT α={args.wise_ft_alpha:g}" if args.wise_ft_alpha is not None else ""]
    return " + ".join([name, *filter(None, extras)])


def save_heatmap(examples: list[tuple[str, list[str], list[float]]], path: Path, title: str = "", width: int = 16,
                 context: int = 24) -> None:
    """Token-probability heatmap (Lin et al. Fig. 3a), written atomically as PNG. `examples`: (label, tokens,
    probabilities) with NaN for unsupervised tokens; each example starts a new line and wraps every `width`
    tokens. Supervised tokens are shaded by p (darker = more confident); the prompt is shown in grey as
    context, its last `context` tokens before the first supervised one."""
    shown = []
    for label, tokens, probs in examples:
        first = next((i for i, p in enumerate(probs) if not math.isnan(p)), len(probs))
        cut = max(0, first - context)
        shown.append((label, (["…"] if cut else []) + tokens[cut:], ([float("nan")] if cut else []) + probs[cut:]))
    width = max(1, min(width, max(len(tokens) for _, tokens, _ in shown)))
    lines, texts, labels = [], [], []
    for label, tokens, probs in shown:
        for start in range(0, max(1, len(tokens)), width):
            labels.append(label if start == 0 else "")
            lines.append(probs[start:start + width] + [float("nan")] * (width - len(probs[start:start + width])))
            texts.append(tokens[start:start + width])
    grid = torch.tensor(lines, dtype=torch.float32)
    fig = new_figure(figsize=(0.75 * width + 2.5, 0.38 * len(lines) + 1.3))
    ax = fig.add_subplot()
    im = ax.imshow(grid.numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for row, (tokens, probs) in enumerate(zip(texts, lines)):
        for col, tok in enumerate(tokens):
            p = probs[col]
            ax.text(col, row, tok.replace("\n", "\\n")[:10], ha="center", va="center", fontsize=7,
                    color="grey" if math.isnan(p) else "white" if p > 0.6 else "black")
    ax.set_xticks([])
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    ax.tick_params(left=False)
    ax.set_title(f"{title}\nshaded: supervised tokens by p(token); grey text: prompt (not scored)", fontsize=9)
    fig.colorbar(im, ax=ax, label="p(token)", fraction=0.03)
    save_figure(fig, path, dpi=100, bbox_inches="tight")
