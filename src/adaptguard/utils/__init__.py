"""Small shared utilities: atomic writes, figures, label shifting, dataset loading, torch threads."""
