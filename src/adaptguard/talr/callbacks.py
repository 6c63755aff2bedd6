"""Trainer callbacks: Wise-FT interpolation and token-level analysis (paper 003 §4.2, §4.3)."""

from __future__ import annotations

import json
import logging
import math
import shutil
import tempfile
from pathlib import Path

import torch
from transformers import TrainerCallback

from ..utils.figures import new_figure, save_figure
from ..utils.files import atomic_write_text, replace_dir
from .losses import wise_ft_interpolate

logger = logging.getLogger(__name__)


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

    def interpolated(self, model) -> dict[str, torch.Tensor]:
        params = dict(model.named_parameters())
        finetuned = {n: params[n].detach().cpu() for n in self.init}
        mixed = wise_ft_interpolate(self.init, finetuned, self.alpha)
        for name in self.init:
            if "lora_A" in name:
                b_name = name.replace("lora_A", "lora_B")
                if b_name in self.init and not self.init[b_name].any():
                    mixed[name] = finetuned[name]
                    mixed[b_name] = self.alpha * finetuned[b_name]
        return mixed

    def on_train_end(self, args, state, control, model=None, processing_class=None, **kwargs):
        if not state.is_world_process_zero or model is None:
            return
        params = dict(model.named_parameters())
        mixed = self.interpolated(model)
        target = Path(args.output_dir) / self.subdir
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{self.subdir}-", dir=target.parent))
        backup = {n: params[n].detach().clone() for n in mixed}
        try:
            with torch.no_grad():
                for n, value in mixed.items():
                    params[n].copy_(value)
            model.save_pretrained(tmp, safe_serialization=True)
            if processing_class is not None:
                processing_class.save_pretrained(tmp)
            (tmp / "wise_ft.json").write_text(json.dumps({"alpha": self.alpha}))
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        finally:
            with torch.no_grad():
                for n, value in backup.items():
                    params[n].copy_(value)
        replace_dir(tmp, target)
        logger.info("Wise-FT (alpha=%s) checkpoint written to %s", self.alpha, target)


class TokenAnalysisCallback(TrainerCallback):
    """Token-level analysis (paper 003 §4.3) for a `TALRTrainer`.

    Before training and at every epoch end, scores the first `args.token_analysis_max_examples`
    training rows with the current model and records the distribution of the supervised tokens'
    probabilities (quantiles, histogram) and the curriculum signal `frac_p_gt_0.2`. Writes
    `<output_dir>/token_analysis/token_analysis.json` (one entry per epoch) and heatmaps
    `heatmap_example<i>_epoch<e>.png`; logs `token_analysis/frac_p_gt_0.2` into the log history.
    """

    def __init__(self, trainer):
        self.trainer = trainer
        self.records: list[dict] = []

    @property
    def out_dir(self) -> Path:
        return Path(self.trainer.args.output_dir) / "token_analysis"

    def token_probabilities(self) -> list[tuple[list[int], torch.Tensor]]:
        """[(label token ids, probabilities)] of the supervised tokens of each analysed row."""
        trainer = self.trainer
        rows = []
        for batch, out in trainer.score_rows(trainer.train_dataset, trainer.args.token_analysis_max_examples):
            labels = batch["labels"][:, 1:]
            for i in range(labels.shape[0]):
                keep = out.label_mask[i]
                rows.append((labels[i][keep].tolist(), out.log_probs[i][keep].float().exp().cpu()))
        return rows

    def analyse(self, epoch: float, step: int) -> dict:
        rows = self.token_probabilities()
        probs = torch.cat([p for _, p in rows]) if rows else torch.zeros(0)
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
        for index in self.trainer.args.token_analysis_examples:
            if 0 <= index < len(rows):
                ids, p = rows[index]
                tokens = [tokenizer.decode([t]) for t in ids] if tokenizer is not None else [str(t) for t in ids]
                save_heatmap(tokens, p.tolist(), self.out_dir / f"heatmap_example{index}_epoch{epoch:g}.png",
                             title=f"example {index}, epoch {epoch:g}")
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


def save_heatmap(tokens: list[str], probs: list[float], path: Path, title: str = "", width: int = 16) -> None:
    """Token-probability heatmap (paper 003 Fig. 3a): tokens in reading order, `width` per row, darker =
    more confident. Written atomically as PNG."""
    width = max(1, min(width, len(tokens)))
    rows = max(1, math.ceil(len(tokens) / width))
    grid = torch.full((rows, width), float("nan"))
    grid.view(-1)[: len(probs)] = torch.tensor(probs, dtype=torch.float32)
    fig = new_figure(figsize=(min(1.0 * width + 2, 18), 0.6 * rows + 1.2))
    ax = fig.add_subplot()
    im = ax.imshow(grid.numpy(), cmap="Blues", vmin=0, vmax=1, aspect="auto")
    for i, tok in enumerate(tokens):
        ax.text(i % width, i // width, tok.replace("\n", "\\n")[:10], ha="center", va="center", fontsize=7,
                color="white" if probs[i] > 0.6 else "black")
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="p(token)")
    save_figure(fig, path, dpi=100, bbox_inches="tight")
