"""Log lines of other libraries about features adaptguard's commands do not use, kept off the user's screen.

bitsandbytes (0.50) tries, on importing its CPU backend on a CPU with AVX512-BF16, to fetch a fused 4-bit kernel
from the Hugging Face Hub through the `kernels` package, and logs a warning when it cannot: `kernels` absent, or (since
transformers 5.25 installs `kernels`) the kernel not in the local cache with the Hub offline, in which case `kernels`
also logs that it skipped the publisher's trust check. PEFT imports bitsandbytes whenever it is installed, so every
command, refusals included, would open with those lines, 4-bit model or not. The CLI and the studies hide
them before their first import of PEFT; a run that does load a 4-bit model says once what it means for the user
(`note_4bit_kernel`).

PEFT (0.21) and TRL read transformers' deprecated `is_gradient_checkpointing` when they wrap a model: a warning
about those libraries that nobody running a command or an experiment can act on.

torchao (0.18) logs, on import, one "Failed to load …so" line per CUDA kernel library its wheel ships when the
machine cannot load it (a CPU-only torch), and torch warns that torchao registers an enum the old way: neither says
anything about the CPU paths a user of a torchao scheme runs here. bitsandbytes' LLM.int8 says on every matrix
product that fp32 inputs are cast to fp16: said once.
"""

from __future__ import annotations

import logging
import sys
import warnings


class _HideMessage(logging.Filter):
    """Drops records whose message starts with `prefix` (and holds `contains`) and remembers that one was dropped."""

    def __init__(self, prefix: str, contains: str = "", once: bool = False):
        super().__init__()
        self.prefix, self.contains, self.once, self.hidden, self.explained = prefix, contains, once, False, False
        self.shown, self.last = False, ""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(self.prefix) and self.contains in message:
            if self.once and not self.shown:  # said once, then kept off the screen
                self.shown = True
                return True
            self.hidden, self.last = True, message
            return False
        return True


BNB_CPU_KERNEL = _HideMessage("Failed to load CPU gemm_4bit_forward from kernels-community")
BNB_CPU_LOGGER = "bitsandbytes.backends.cpu.ops"
# `kernels` (0.19), asked by bitsandbytes for that kernel with HF_HUB_OFFLINE=1: only for that repository
KERNELS_OFFLINE_TRUST = _HideMessage("Skipping publisher trust check for 'kernels-community/quantization-bitsandbytes'")
KERNELS_HUB_LOGGER = "kernels._internals.hf_hub"
TORCHAO_KERNELS = _HideMessage("Failed to load ")  # only on torchao's own logger: its optional CUDA kernels
# LLM.int8 logs this on every matrix product of an fp32 model (thousands per evaluation): once is enough
BNB_INT8_CAST = _HideMessage("MatMul8bitLt: inputs will be cast", once=True)
BNB_INT8_LOGGER = "bitsandbytes.autograd._functions"
# torchao's enums (KernelPreference, ScaleCalculationMode, ...) registered the old way
TORCH_PYTREE_ENUM = _HideMessage("<enum '", contains="is an Enum subclass and is now natively supported")


def hide_unused_library_noise() -> None:
    """Install the filters (idempotent: `addFilter` adds a filter once, `filterwarnings` moves an equal one first)."""
    logging.getLogger(BNB_CPU_LOGGER).addFilter(BNB_CPU_KERNEL)
    logging.getLogger(KERNELS_HUB_LOGGER).addFilter(KERNELS_OFFLINE_TRUST)
    logging.getLogger(BNB_INT8_LOGGER).addFilter(BNB_INT8_CAST)
    logging.getLogger("torchao").addFilter(TORCHAO_KERNELS)
    logging.getLogger("torch.utils._pytree").addFilter(TORCH_PYTREE_ENUM)
    warnings.filterwarnings("ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def note_4bit_kernel() -> str | None:
    """Called after a 4-bit model is loaded: the hidden bitsandbytes warning, said once in the user's terms (and
    printed on stderr); None when there was nothing to say or it was said already."""
    if not BNB_CPU_KERNEL.hidden or BNB_CPU_KERNEL.explained:
        return None
    BNB_CPU_KERNEL.explained = True
    if "No module named 'kernels'" in BNB_CPU_KERNEL.last:
        how = "`pip install kernels` (it downloads the kernel from the Hugging Face Hub) enables it"
    elif "not available in the local cache" in BNB_CPU_KERNEL.last:  # `kernels` is there, the Hub offline
        how = "bitsandbytes fetches it from the Hugging Face Hub: run once without HF_HUB_OFFLINE=1 to cache it"
    else:  # `kernels` is there and the Hub refused or could not be reached: its own words
        how = BNB_CPU_KERNEL.last.split(": ", 1)[-1].split(". Please make sure")[0]
    note = ("note: bitsandbytes' fused 4-bit CPU kernel (for AVX512-BF16 CPUs) is not available, so 4-bit layers run "
            f"on its default CPU path; {how}")
    print(note, file=sys.stderr)
    return note
