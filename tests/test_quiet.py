"""Nothing printed that a user cannot act on: bitsandbytes' note about a CPU kernel download is kept off every CLI
command's screen, and said once, in the user's terms, by a run that loads a 4-bit model (issue 34)."""

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import ROOT

PREFIX = "Failed to load CPU gemm_4bit_forward from kernels-community"


def run(code: str) -> subprocess.CompletedProcess:
    # from the repository root, where the studies (`studies/`) import from
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


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


def test_experiment_runners_hide_the_kernel_line_from_their_first_import():
    """`python -m studies.<runner>` imports transformers' Trainer (hence PEFT, hence bitsandbytes,
    which logs the note at import) before its `main` runs: the studies package installs the filter first."""
    proc = run(f"""
        import logging
        import studies

        log = logging.getLogger("bitsandbytes.backends.cpu.ops")
        log.warning("{PREFIX}: %s", "No module named 'kernels'")
        log.warning("another bitsandbytes warning")
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert PREFIX not in proc.stderr and "another bitsandbytes warning" in proc.stderr


def test_no_note_when_nothing_was_hidden():
    proc = run("""
        from adaptguard.cli import main
        from adaptguard.utils.quiet import note_4bit_kernel

        assert main(["tasks-dir"]) == 0
        print(note_4bit_kernel())
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.splitlines()[-1] == "None" and "kernel" not in proc.stderr


def test_transformers_deprecation_read_by_peft_is_hidden_and_other_warnings_are_not():
    """PEFT reads transformers' deprecated `is_gradient_checkpointing` whenever it wraps a model: hidden by the CLI
    and every experiment runner alike (one filter); any other FutureWarning still shows."""
    proc = run("""
        import warnings
        from peft import LoraConfig, get_peft_model
        from transformers import AutoConfig, AutoModelForCausalLM

        from adaptguard.utils.quiet import hide_unused_library_noise

        hide_unused_library_noise()
        config = AutoConfig.for_model("gpt2", n_layer=1, n_head=2, n_embd=8, vocab_size=16, n_positions=8)
        model = AutoModelForCausalLM.from_config(config)
        model.is_gradient_checkpointing  # transformers' own deprecation, as PEFT and TRL trigger it
        get_peft_model(model, LoraConfig(r=2, target_modules=["c_attn"]))
        warnings.warn("another deprecation", FutureWarning)
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "is_gradient_checkpointing" not in proc.stderr and "another deprecation" in proc.stderr


def test_torchao_import_lines_are_hidden_and_other_torch_warnings_are_not():
    """torchao (the `schemes` extra) logs one line per CUDA kernel library a CPU torch cannot load, and torch warns
    about its enums' registration: neither shows once the filters are installed; another pytree warning still does."""
    pytest.importorskip("torchao")
    proc = run("""
        import logging
        from adaptguard.utils.quiet import hide_unused_library_noise

        hide_unused_library_noise()
        import torchao  # noqa: F401
        logging.getLogger("torch.utils._pytree").warning("another pytree warning")
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Failed to load" not in proc.stderr and "Enum subclass" not in proc.stderr
    assert "another pytree warning" in proc.stderr


def test_llm_int8_cast_note_is_said_once():
    """bitsandbytes logs "inputs will be cast" on every LLM.int8 matrix product: once on screen, not thousands."""
    if importlib.util.find_spec("bitsandbytes") is None:
        pytest.skip("bitsandbytes (the [quant] extra) not installed")
    source = (Path(importlib.util.find_spec("bitsandbytes").origin).parent / "autograd" / "_functions.py").read_text()
    assert 'logger.warning("MatMul8bitLt: inputs will be cast' in source  # an upgrade that rewords it fails here
    proc = run("""
        import logging
        from adaptguard.utils.quiet import BNB_INT8_LOGGER, hide_unused_library_noise

        hide_unused_library_noise()
        for _ in range(3):
            logging.getLogger(BNB_INT8_LOGGER).warning("MatMul8bitLt: inputs will be cast from %s to float16", "fp32")
        logging.getLogger(BNB_INT8_LOGGER).warning("another int8 warning")
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.count("inputs will be cast") == 1 and "another int8 warning" in proc.stderr
