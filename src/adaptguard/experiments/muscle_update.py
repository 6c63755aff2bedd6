"""Moved to `adaptguard.update` (and `generate_answers` to `adaptguard.utils.generation`, `finished_dir` to
`adaptguard.utils.files`); this re-export goes in the next release."""

import warnings

from ..update import run_update, run_update_seeds  # noqa: F401
from ..update.config import UpdateConfig  # noqa: F401
from ..update.presets import paraphrase_split, tiny_preset  # noqa: F401
from ..update.report import seeds_markdown, update_markdown  # noqa: F401
from ..utils.files import finished_dir  # noqa: F401
from ..utils.generation import generate_answers  # noqa: F401

warnings.warn("adaptguard.experiments.muscle_update moved to adaptguard.update; import it from there",
              DeprecationWarning, stacklevel=2)
