"""Nothing printed that a user cannot act on: bitsandbytes' note about a CPU kernel download is kept off every CLI
command's screen, and said once, in the user's terms, by a run that loads a 4-bit model (issue 34)."""

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PREFIX = "Failed to load CPU gemm_4bit_forward from kernels-community"


def run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300)


def test_the_hidden_line_is_the_one_bitsandbytes_logs():
    """The filter matches bitsandbytes' own logger and message: an upgrade that renames either fails here."""
    if importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("bitsandbytes (the [quant] extra) not installed")
    from adaptguard.utils.quiet import BNB_CPU_LOGGER

    ops = Path(importlib.util.find_spec("bitsandbytes").origin).parent / "backends" / "cpu" / "ops.py"
    assert BNB_CPU_LOGGER == "bitsandbytes.backends.cpu.ops"
    source = ops.read_text()
    assert PREFIX in source and "logger = logging.getLogger(__name__)" in source


def test_the_cli_hides_the_kernel_line_and_a_4bit_load_explains_it_once():
    proc = run(f"""
        import logging
        from adaptguard.cli import main
        from adaptguard.utils.quiet import note_4bit_kernel

        assert main(["tasks-dir"]) == 0
        log = logging.getLogger("bitsandbytes.backends.cpu.ops")  # as bitsandbytes logs it on an AVX512-BF16 CPU
        log.warning("{PREFIX}: %s. Please make sure you already `pip install kernels`", "No module named 'kernels'")
        log.warning("another bitsandbytes warning")
        print(note_4bit_kernel() is not None, note_4bit_kernel() is None)
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "True True"
    assert PREFIX not in proc.stderr
    assert "another bitsandbytes warning" in proc.stderr  # only that line is hidden
    assert proc.stderr.count("fused 4-bit CPU kernel") == 1 and "pip install kernels" in proc.stderr


def test_no_note_when_nothing_was_hidden():
    proc = run("""
        from adaptguard.cli import main
        from adaptguard.utils.quiet import note_4bit_kernel

        assert main(["tasks-dir"]) == 0
        print(note_4bit_kernel())
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "None" and "kernel" not in proc.stderr
