"""Where the demo's section workers start (`run.run_sections`). A spawned worker imports its initializer's module
before it runs it, so the initializer lives here, apart from `run`: `run` imports PEFT, whose bitsandbytes import
logs the fused-kernel lines (on AVX512-BF16 CPUs) that the filters must be in place to hide."""

from __future__ import annotations


def start(channel) -> None:
    """A section worker: the libraries' lines filtered first, as in the parent, then its bars and lines sent to the
    parent."""
    from ..utils.quiet import hide_unused_library_noise

    hide_unused_library_noise()  # before anything imports PEFT (and with it bitsandbytes)
    import datasets
    import transformers

    from ..utils.progress import relay_to

    relay_to(channel)
    datasets.disable_progress_bars()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
