"""MUSCLE (Echterhoff et al. §4): a compatibility adapter distilled from the old and new task models.

`losses` (eq. 2, pure torch) and `masks` (the masking strategies) are the maths; `config`/`trainer` the TRL
pair (`MUSCLEConfig`, `MUSCLETrainer`); `logit_cache` the old model's top-k cache (`adaptguard cache-logits`).
The trainer is imported lazily (`from adaptguard import MUSCLETrainer`): it pulls in TRL.
"""
