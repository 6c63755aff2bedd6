"""TALR and its domain-SFT baselines (Lin et al.): `losses` (the maths, pure torch), `config`/`trainer` (the TRL
pair `TALRConfig`, `TALRTrainer`) and `callbacks` (Wise-FT, token analysis)."""
