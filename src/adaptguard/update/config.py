"""`UpdateConfig`: the fields of an `adaptguard update` config file, validated before any work."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from ..models.embedded import check_model_name

# The recipes that E5 (studies/results.md §10; studies/results/e5_report.json) found to help on some update by its
# registered rule: Δ NFR against the control below 0 at run level after the family's correction, Δ accuracy above
# −2 points. `tests/update/test_update_pick.py` derives this from the committed report.
E5_HELPS: tuple[str, ...] = ()


def model_kind(spec: str) -> str | None:
    """"adapter" (a folder with adapter_config.json), "full" (config.json without it), None for a name that is not
    a local folder (a Hub id: known once loaded). A local folder that is neither is refused."""
    path = Path(spec).expanduser()
    if not path.is_dir():
        return None
    if (path / "adapter_config.json").exists():
        return "adapter"
    if (path / "config.json").exists():
        return "full"
    raise ValueError(f"{spec}: neither a PEFT adapter (adapter_config.json) nor a model (config.json)")


def adapter_base(spec: str) -> str | None:
    """The base model a local PEFT adapter was trained on (its adapter_config.json), None for a Hub id."""
    path = Path(spec).expanduser() / "adapter_config.json"
    return json.loads(path.read_text()).get("base_model_name_or_path") if path.exists() else None


def same_model(a: str, b: str) -> bool:
    """Whether two model names/paths name the same model: equal, the same folder, or a local folder whose
    config.json records the other name (a local copy of a Hub model)."""
    if a == b:
        return True
    pa, pb = Path(a).expanduser(), Path(b).expanduser()
    if pa.exists() and pb.exists():
        return pa.resolve() == pb.resolve()
    for local, name in ((pa, b), (pb, a)):
        config = local / "config.json"
        if config.exists() and json.loads(config.read_text()).get("_name_or_path") == name:
            return True
    return False


@dataclass
class UpdateConfig:
    old_base: str  # Hub id or local path of the old base model (v1); or one of ours: built:smollm2, embedded:tiny
    # ... of the new base model (v2), same vocabulary; or v1 quantized: {"quantization": {"library": "bitsandbytes",
    # "load_in_4bit": true, ...}} (that library's own config fields; "base": another model to quantize)
    new_base: str | dict
    train: str | list  # prompt/completion rows: a list, a .json/.jsonl file, a save_to_disk dir or a Hub name
    test: str | list
    # v1 as you ship it: a PEFT adapter trained on old_base (a folder with adapter_config.json, or a Hub id), or a
    # full fine-tuned model; used as is, never retrained. None: update trains v1's task adapter on old_base from train
    old_model: str | None = None
    # v2's own task adapter on new_base, used as is (every candidate starts from it). None: trained on new_base from
    # train when new_task_adapter is true
    new_adapter: str | None = None
    # the dev split: with it, update trains every candidate setting, picks one on dev by `max_accuracy_drop`'s rule
    # and scores the pick and the best control on test (see adaptguard.update.candidates)
    dev: str | list | None = None
    candidates: list = field(default_factory=list)  # [] with dev: `default_candidates()` at the compat_* settings
    max_accuracy_drop: float = 0.01  # a setting is eligible if its dev accuracy ≥ the best control's − this
    test_seeds: list = field(default_factory=list)  # seeds of the test stage's pick and control ([] = [seed])
    dev_seeds: int = 1  # the pick averages each setting's dev scores over seeds seed, seed + 1, … (cost × dev_seeds)
    output_dir: str = "update-out"
    split_train: str = "train"
    split_dev: str = "validation"
    split_test: str = "test"
    lora_r: int = 16
    lora_alpha: int = 32
    task_learning_rate: float = 1e-3
    task_epochs: float = 3.0
    compat_learning_rate: float = 1e-3
    compat_epochs: float = 3.0
    temperature: float = 2.0
    mask: str = "student_wrong"
    ce_weight: float = 0.0  # the MUSCLE arm's without dev (eq. 1 alone); candidates set their own (see below)
    batch_size: int = 16
    max_length: int = 512
    max_new_tokens: int = 32
    seed: int = 0
    # False: the update is v2 itself (e.g. a quantized v1 base), with no task adapter of its own: v2 is evaluated as
    # it is, and the compatibility and control adapters are trained fresh on it (LoRA on default targets)
    new_task_adapter: bool = True
    # the control arm: the compatibility adapter's training (same start, data, steps, learning rate, seed) on the
    # task's labels by cross-entropy, without v1's signal, so that a gain from more training is not credited to MUSCLE
    control: bool = True
    use_cpu: bool = False
    extra_args: dict = field(default_factory=dict)  # more TrainingArguments for all three trainings
    # also evaluate the three task models with lm-eval tasks (e.g. ["compat_piqa", "compat_gsm8k"]) and
    # report their flips; lm-eval options below
    lm_eval_tasks: list = field(default_factory=list)
    lm_eval_limit: int | None = None
    lm_eval_num_fewshot: int | None = None
    lm_eval_include_path: list = field(default_factory=list)
    lm_eval_metadata: dict = field(default_factory=dict)
    lm_eval_gen_kwargs: dict | None = None

    # Parameters that control where the grid's jobs run (`adaptguard.update.executors`): every training and scoring is
    # a job whose output is its folder under steps/, so the results, and what a re-run reuses, are the same anywhere
    executor: str = field(default="local", metadata={
        "help": "where each job runs: this process, one at a time; a Ray cluster; Slurm through submitit",
        "choices": ["local", "ray", "slurm"]})
    workers: int | None = field(default=None, metadata={
        "help": "jobs at once. None: 1 in this process; a local Ray cluster or submitit's local executor fills this "
                "machine's cores (cpus_per_job each); a Ray address or a Slurm partition gets every ready job"})
    cpus_per_job: int | None = field(default=None, metadata={
        "help": "CPU cores each job asks for, and its torch threads. None: this process keeps torch's threads; a "
                "local cluster splits this machine's cores among the workers; 1 on a remote cluster"})
    gpus_per_job: int = field(default=0, metadata={"help": "GPUs each training asks for (a scoring asks for 1 at most)"})
    processes_per_job: int = field(default=1, metadata={
        "help": "processes of one training, by `accelerate launch` (one per GPU: set it to gpus_per_job to span "
                "them); the batch is split among them (batch_size stays the global batch); above 1 it is in the run "
                "key, as such a run sums in another order"})
    ray_address: str | None = field(default=None, metadata={
        "help": "a running Ray cluster ('auto', 'ray://head:10001'); None: a local cluster started for the run"})
    slurm_partition: str | None = field(default=None, metadata={"help": "the Slurm partition (None: the default)"})
    slurm_time_min: int = field(default=60, metadata={"help": "each Slurm job's time limit, in minutes"})
    slurm_cluster: str = field(default="slurm", metadata={
        "help": "'local': submitit's LocalExecutor runs the same jobs as subprocesses here (to try the set-up)",
        "choices": ["slurm", "local"]})
    slurm_args: dict = field(default_factory=dict, metadata={
        "help": "more sbatch options by submitit's names, without 'slurm_' (account, qos, mem, constraint, ...)"})

    def __post_init__(self):
        """Validate everything before any work (a bad field must not surface after two adapters are trained)."""
        from ..plugins import get_muscle_mask
        from ..utils.checks import check_finite

        kinds = {"int": int, "float": (int, float), "str": str, "bool": bool, "dict": dict, "list": list}
        for f in dataclasses.fields(self):
            value, allowed = getattr(self, f.name), str(f.type).replace(" ", "").split("|")
            if value is None and "None" in allowed:
                continue
            types = tuple(t for name in allowed if name in kinds for t in
                          (kinds[name] if isinstance(kinds[name], tuple) else (kinds[name],)))
            if types and (not isinstance(value, types) or (isinstance(value, bool) and bool not in types)):
                raise ValueError(f"{f.name} must be {' or '.join(allowed)}, got {value!r}")
        check_finite(self, [f.name for f in dataclasses.fields(self) if "float" in str(f.type)])
        for name in ("lora_r", "lora_alpha", "batch_size", "max_length", "max_new_tokens", "dev_seeds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        for name in ("task_learning_rate", "task_epochs", "compat_learning_rate", "compat_epochs", "temperature"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.ce_weight < 0:
            raise ValueError(f"ce_weight must be ≥ 0, got {self.ce_weight}")
        if not 0 <= self.max_accuracy_drop < 1:
            raise ValueError(f"max_accuracy_drop must be in [0, 1), got {self.max_accuracy_drop}")
        get_muscle_mask(self.mask)  # an unknown mask name fails here, with the known ones
        self._check_executor()
        if self.candidates and self.dev is None:
            raise ValueError("candidates: choosing among them needs a dev split (set dev); the test split is only "
                             "scored after the pick")
        if self.dev is not None and self.lm_eval_tasks:
            raise ValueError("lm_eval_tasks: the lm-eval flips are reported without a dev split (the MUSCLE and control "
                             "arms); with dev, score the chosen adapter with adaptguard lm-eval / compare")
        if self.dev is not None:
            from .candidates import expand_candidates

            expand_candidates(self.candidates or self.default_candidates())
        if not all(isinstance(s, int) and not isinstance(s, bool) for s in self.test_seeds):
            raise ValueError(f"test_seeds must be a list of integers, got {self.test_seeds!r}")
        if isinstance(self.new_base, dict):
            from ..models.loading import check_quantization

            unknown = set(self.new_base) - {"quantization", "base"}
            if unknown or "quantization" not in self.new_base:
                raise ValueError(f"new_base: a model name, or {{'quantization': {{...}}}} (optionally 'base'), got "
                                 f"keys {sorted(self.new_base)}")
            check_quantization(self.new_base["quantization"], "new_base.quantization")
        from ..utils.data import check_local_path

        if self.new_adapter is not None and not self.new_task_adapter:
            raise ValueError("new_adapter: given, but new_task_adapter is false (v2 without an adapter); drop one")
        for name in ("old_model", "new_adapter"):
            value = getattr(self, name)
            if value is not None:
                check_local_path(value, name)
                try:
                    kind = model_kind(value)
                except ValueError as err:
                    raise ValueError(f"{name}: {err}") from None
                if name == "new_adapter" and kind == "full":
                    raise ValueError(f"new_adapter: {value} is a full model (config.json, no adapter_config.json), "
                                     "not an adapter; a full v2 goes in new_base, with new_task_adapter false")
        bases = ["old_base"] + (["new_base"] if isinstance(self.new_base, str) else [])
        data = [n for n in ("train", "dev", "test") if isinstance(getattr(self, n), str)]
        for name in (*bases, *data):
            value = getattr(self, name)
            if name.endswith("_base"):
                try:
                    if check_model_name(value):  # one of ours: found or built when the run starts
                        continue
                except ValueError as err:
                    raise ValueError(f"{name}: {err}") from None
            check_local_path(value, name)

    def _check_executor(self) -> None:
        """The executor's fields, and that its library is installed (which extra to install if not)."""
        import importlib.util
        import shutil

        for name in ("executor", "slurm_cluster"):
            choices = next(f for f in dataclasses.fields(self) if f.name == name).metadata["choices"]
            if getattr(self, name) not in choices:
                raise ValueError(f"{name} must be one of {', '.join(choices)}, got {getattr(self, name)!r}")
        for name in ("workers", "cpus_per_job", "processes_per_job", "slurm_time_min"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be ≥ 1, got {getattr(self, name)}")
        if self.gpus_per_job < 0:
            raise ValueError(f"gpus_per_job must be ≥ 0, got {self.gpus_per_job}")
        if self.executor == "local" and (self.workers or 1) > 1:
            raise ValueError(f"workers: {self.workers} at once needs executor 'ray' or 'slurm'; 'local' runs one job "
                             "at a time in this process")
        for name, executor in (("ray_address", "ray"), ("slurm_partition", "slurm")):
            if getattr(self, name) is not None and self.executor != executor:
                raise ValueError(f"{name}: set, but executor is {self.executor!r}; set executor to {executor!r}")
        if self.gpus_per_job and self.use_cpu:
            raise ValueError(f"gpus_per_job: {self.gpus_per_job} GPU(s) asked for, but use_cpu is true")
        if self.batch_size % self.processes_per_job:
            raise ValueError(f"processes_per_job: batch_size {self.batch_size} must split evenly among "
                             f"{self.processes_per_job} processes (it stays the global batch)")
        if self.gpus_per_job and self.processes_per_job > self.gpus_per_job:
            raise ValueError(f"processes_per_job: {self.processes_per_job} processes on {self.gpus_per_job} GPU(s); "
                             "at most one process per GPU")
        module = {"ray": "ray", "slurm": "submitit"}.get(self.executor)
        if module and importlib.util.find_spec(module) is None:
            raise ImportError(f"executor {self.executor!r}: {module} is not installed: pip install "
                              "'adaptguard[distributed]'")
        if self.executor == "slurm" and self.slurm_cluster == "slurm" and shutil.which("sbatch") is None:
            raise ValueError("executor 'slurm': no sbatch here (submit from a Slurm login node); slurm_cluster "
                             "'local' runs the same jobs as subprocesses of this machine")

    def default_candidates(self) -> list[dict]:
        """The pick's candidates when none are given, at the compat learning rate and epochs: the control and every
        recipe that E5 (studies/results.md §10) found to help on some update, with E3's settings (T = `temperature`).
        None did, so with no `candidates` update retrains on the labels: the control alone."""
        budget = {"learning_rate": [self.compat_learning_rate], "epochs": [max(1, round(self.compat_epochs))]}
        distill = {"temperature": [self.temperature]}
        return [{"recipe": "control", **budget}, *({"recipe": r, **budget, **distill} for r in E5_HELPS)]

    @property
    def old_is_full_model(self) -> bool:
        return self.old_model is not None and model_kind(self.old_model) == "full"

    @property
    def new_base_path(self) -> str:
        """The new base's name or path (when the update quantizes v1: v1's base, or v1 itself when `old_model` is a
        full model)."""
        if isinstance(self.new_base, dict):
            return self.new_base.get("base", self.old_model if self.old_is_full_model else self.old_base)
        return self.new_base

    @property
    def new_quantization(self) -> dict | None:
        return self.new_base["quantization"] if isinstance(self.new_base, dict) else None

    @classmethod
    def from_file(cls, path: str | Path) -> UpdateConfig:
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError as err:
            raise ValueError(f"{path}: no such config file") from err
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from err
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"{path}: unknown fields {sorted(unknown)}; known: {sorted(names)}")
        missing = {f.name for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING} - set(data)
        if missing:
            raise ValueError(f"{path}: missing required fields {sorted(missing)}")
        return cls(**data)
