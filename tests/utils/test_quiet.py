"""Nothing printed that a user cannot act on: bitsandbytes' note about a CPU kernel download is kept off every CLI
command's screen, and said once, in the user's terms, by a run that loads a 4-bit model (issue 34)."""

import importlib.util
import os
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


# bitsandbytes only asks `kernels` for its fused 4-bit CPU kernel on a CPU with AVX512-BF16: this hook makes any CPU
# look like one (before bitsandbytes' CPU backend is imported), so the lines it logs there are logged here too.
AVX512BF16 = """
import importlib.abc, sys

class _AVX512BF16(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "bitsandbytes.backends.cpu.ops":
            import bitsandbytes.functional
            bitsandbytes.functional.has_avx512bf16 = lambda: True
        return None

sys.meta_path.insert(0, _AVX512BF16())
"""


def _kernels_installed() -> None:
    for name in ("bitsandbytes", "kernels", "peft"):
        if importlib.util.find_spec(name) is None:
            pytest.skip(f"{name} not installed")


def test_the_hidden_kernels_line_is_the_one_kernels_logs():
    """`kernels` logs the skipped trust check on its own logger, naming the repository bitsandbytes asks for: an
    upgrade that renames the logger, the message or the repository fails here."""
    _kernels_installed()
    import kernels

    from adaptguard.utils.quiet import KERNELS_HUB_LOGGER, KERNELS_OFFLINE_TRUST

    hub = Path(kernels.__file__).parent / "_internals" / "hf_hub.py"
    assert KERNELS_HUB_LOGGER == "kernels._internals.hf_hub"
    source = hub.read_text()
    assert "logger = logging.getLogger(__name__)" in source
    assert "Skipping publisher trust check for '{repo_id}'" in source
    ops = (Path(importlib.util.find_spec("bitsandbytes").origin).parent / "backends" / "cpu" / "ops.py").read_text()
    repository = KERNELS_OFFLINE_TRUST.prefix.split("'")[1]
    assert f'"{repository}"' in ops


@pytest.mark.parametrize("argv", [["compare", "no-such-run", "another"],
                                  ["compare", "example:fp32", "example:int8", "--fail-on", "nfr>10%"]])
def test_with_the_hub_offline_a_command_prints_only_its_own_lines(argv, tmp_path):
    """On a CPU with AVX512-BF16, with HF_HUB_OFFLINE=1 (as CI runs) and `kernels` installed (transformers ≥ 5.25
    installs it), importing PEFT made bitsandbytes ask `kernels` for a kernel not in the cache: two lines before
    every command's output, a refusal's included. adaptguard's import hides both; the same command without the
    filters shows them (the test would pass vacuously if the lines were never logged)."""
    _kernels_installed()
    code = AVX512BF16 + textwrap.dedent(f"""
        import os, sys
        if os.environ.get("WITHOUT_FILTERS"):
            import peft  # before adaptguard: the lines as a user of PEFT sees them
        from adaptguard.cli.main import main
        rc = main({argv!r})
        import peft  # noqa: F401  (a command that loads a model imports it; the lines are logged by now either way)
        from adaptguard.utils import quiet
        print("hidden:", quiet.BNB_CPU_KERNEL.hidden, quiet.KERNELS_OFFLINE_TRUST.hidden, "rc:", rc)
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "NO_COLOR": "1"}
    ours = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    theirs = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env={**env, "WITHOUT_FILTERS": "1"})
    assert ours.stdout.splitlines()[-1] in ("hidden: True True rc: 1", "hidden: True True rc: 2"), ours.stderr[-2000:]
    assert "Skipping publisher trust check" in theirs.stderr and PREFIX in theirs.stderr  # logged without the filters
    assert "kernels-community" not in ours.stderr and "kernel" not in ours.stdout
    if argv[1] == "no-such-run":
        assert ours.stdout.splitlines()[-1].endswith("rc: 2")
        assert len(ours.stderr.splitlines()) == 1 and "no-such-run" in ours.stderr, ours.stderr
    else:
        assert ours.stdout.splitlines()[-1].endswith("rc: 1") and "BREACH (nfr>10%)" in ours.stdout
        lines = ours.stderr.splitlines()  # the gate's own lines: its decision, then one per threshold
        assert lines[0].startswith("gate: FAILED") and all(line.startswith("  breach: bb_") for line in lines[1:]), lines
        assert len(lines) == 3


@pytest.mark.parametrize("reason, advice", [
    ("No module named 'kernels'", "`pip install kernels` (it downloads the kernel from the Hugging Face Hub) enables it"),
    ("Version 1 of 'kernels-community/quantization-bitsandbytes' is not available in the local cache and cannot be "
     "downloaded in offline mode", "run once without HF_HUB_OFFLINE=1 to cache it"),
    ("Kernel repository 'kernels-community/quantization-bitsandbytes' could not verify publisher trust status",
     "; Kernel repository 'kernels-community/quantization-bitsandbytes' could not verify publisher trust status"),
])
def test_the_4bit_note_says_what_to_do_for_the_reason_bitsandbytes_gave(reason, advice):
    """The note after a 4-bit load names the step that fixes what bitsandbytes reported: installing `kernels` when it
    is missing, one online run when the Hub is offline and the kernel not cached, else the refusal in its own words
    (bitsandbytes' advice to `pip install kernels` is wrong when it is installed)."""
    proc = run(f"""
        import logging
        from adaptguard.utils.quiet import hide_unused_library_noise, note_4bit_kernel

        hide_unused_library_noise()
        logging.getLogger("bitsandbytes.backends.cpu.ops").warning(
            "{PREFIX}: %s. Please make sure you already `pip install kernels` and the kernels >= 0.11.1", {reason!r})
        note_4bit_kernel()
    """)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("note: bitsandbytes' fused 4-bit CPU kernel"), lines
    assert lines[0].endswith(advice) and (advice.startswith("`pip") or "pip install kernels" not in lines[0])


def test_the_demos_section_workers_hide_the_kernel_lines(tmp_path):
    """`adaptguard demo` runs its sections in spawned workers. A spawned worker imports its initializer's module before
    running it; when that module was `demo.run` (which imports PEFT), each worker logged the kernel lines before its
    filters were in place: one line per worker atop the demo on an AVX512-BF16 CPU. Workers spawned as the demo
    spawns them now log none; workers importing PEFT with no initializer do (the test can fail)."""
    _kernels_installed()
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(AVX512BF16)  # every spawned worker looks like an AVX512-BF16 CPU too
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent("""
        import sys
        if __name__ == "__main__":
            from adaptguard.utils.quiet import hide_unused_library_noise

            hide_unused_library_noise()  # as the CLI does before any command
            if sys.argv[1] == "demo":
                from adaptguard.demo.run import run_sections

                print(run_sections({"probe": (exec, "import peft")}, 2)[0])
            else:  # spawned workers that import PEFT with no initializer
                import multiprocessing
                from concurrent.futures import ProcessPoolExecutor

                with ProcessPoolExecutor(2, mp_context=multiprocessing.get_context("spawn")) as pool:
                    print(pool.submit(exec, "import peft").result())
    """))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"),
           "PYTHONPATH": os.pathsep.join([str(hook), os.environ.get("PYTHONPATH", "")])}
    ours, theirs = (subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=300,
                                   cwd=tmp_path, env=env) for how in ("demo", "bare"))
    assert theirs.returncode == 0 and PREFIX in theirs.stderr, theirs.stderr[-2000:]  # logged in a bare worker
    assert ours.returncode == 0 and ours.stdout.strip() == "{'probe': None}", ours.stderr[-2000:]
    assert "kernels-community" not in ours.stderr and "Skipping publisher trust check" not in ours.stderr, ours.stderr
