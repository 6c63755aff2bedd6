"""`adaptguard demo`: the end-to-end demo on the embedded default model, offline — the TALR/SFT trade-off, an update
kept compatible by MUSCLE, in-context composition and the drift sweep, in one report."""
