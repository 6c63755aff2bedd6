"""MUSCLE (Echterhoff et al. §4): a compatibility adapter distilled from the old and new task models.

The maths (pure torch): `losses` (eq. 2), `masks` (the masking strategies), `exact` (the forward KL through each
teacher's m = Wᵀq, at the cost of cross-entropy) and `tiled` (the loss on (token × vocabulary) tiles, no (B, L, V)
logits). The glue: `loss_paths` (the three ways a batch's loss is computed, one chosen per run), `config`/`trainer`
the TRL pair (`MUSCLEConfig`, `MUSCLETrainer`), `logit_cache` the old model's top-k cache (`adaptguard cache-logits`).
The trainer is imported lazily (`from adaptguard import MUSCLETrainer`): it pulls in TRL.
"""
