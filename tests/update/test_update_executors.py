"""Issue 77: `adaptguard update`'s grid as jobs on any executor. The grid on a local Ray cluster (2 workers) gives the
in-process run's pick, `dev_choices.json`, test report and every stored step byte for byte; a run killed in-process
resumes on submitit's local executor (a subprocess per job, the Slurm path), redoes only the unfinished jobs and ends
with the same results; a failed job is named with its log while the others go on; the plan says where the jobs run
and for how long; a bad executor config fails before any work. (Each submitit subprocess imports torch anew: the
resumed run's 7 jobs test that path at about half the cost of a whole grid.)"""

import dataclasses
import json
import os
import shutil
from pathlib import Path

import pytest

# two runs (control and kd), each kept after epochs 1 and 2: four settings, two trainings that can run at once, and
# a pick that is not the control (kd at 2 epochs on this toy), so the test stage scores both arms
GRID = [{"recipe": "control", "learning_rate": [2e-3], "epochs": [1, 2]},
        {"recipe": "kd", "learning_rate": [2e-3], "epochs": [1, 2]}]


def grid_config(out: Path, **kw):
    """The preset task on tiny → tiny-v2, 24 dev and 24 test items, task adapters that fit v1 (8 epochs at 3e-3);
    each job at one torch thread, as a 2-worker cluster on 2 cores gives it."""
    from adaptguard.update import tiny_preset

    cfg = tiny_preset(str(out))
    rows = cfg.test
    return dataclasses.replace(cfg, **{"task_epochs": 8, "task_learning_rate": 3e-3, "dev": rows[:24],
                                       "test": rows[24:48], "candidates": GRID, "cpus_per_job": 1, **kw})


def with_task_adapters(reference: Path, out: Path) -> Path:
    """`out` holding the reference run's task adapters (found by their marker, reused: the driver's part of the run,
    not the jobs', so each executor's grid starts from the same v1 and v2)."""
    for name in ("v1_task_adapter", "v2_task_adapter"):
        shutil.copytree(reference / name, out / name)
    return out


def step_files(out: Path) -> dict[str, bytes]:
    """Every stored step's results (scores, adapters, the run's settings), by relative path."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted((out / "steps").rglob("*"))
            if p.name in ("scores.json", "adapter_model.safetensors", "done.json")}


def assert_same_results(reference: Path, out: Path) -> None:
    assert (out / "dev_choices.json").read_bytes() == (reference / "dev_choices.json").read_bytes()
    ref, got = (json.loads((d / "report.json").read_text()) for d in (reference, out))
    assert (got["dev"], got["test"], got["verdict"]) == (ref["dev"], ref["test"], ref["verdict"])
    assert step_files(out) == step_files(reference)
    assert (out / "chosen/adapter_model.safetensors").read_bytes() == \
        (reference / "chosen/adapter_model.safetensors").read_bytes()


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The driver at one torch thread too: the task adapters and v1's teacher vectors it builds before the jobs are
    then the same bits in every test of the module, as the jobs' own steps are (cpus_per_job 1)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The grid in this process (the default executor): what every other executor must reproduce."""
    from adaptguard.update import run_update

    out = tmp_path_factory.mktemp("executors") / "local"
    report = run_update(grid_config(out))
    assert report["dev"]["chosen_setting"]["recipe"] == "kd"  # the pick is not the control: both arms are tested
    assert not (out / "logs").exists()  # in-process jobs print where they run; only a failure writes a log
    return out


@pytest.fixture(scope="module")
def ray_cluster():
    """One local Ray cluster of 2 CPUs for the module (an executor uses a cluster it finds, and leaves it running)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20)
    yield
    ray.shutdown()


@pytest.mark.slow
def test_ray_with_two_workers_gives_the_in_process_results(reference, ray_cluster, tmp_path, capsys):
    from adaptguard.update import run_update

    out = with_task_adapters(reference, tmp_path / "ray")
    run_update(grid_config(out, executor="ray", workers=2))
    assert_same_results(reference, out)
    printed = capsys.readouterr().out
    assert "jobs: each training and scoring on a local Ray cluster on this machine, 2 at a time, 1 CPU(s)" in printed
    assert "update: 8 job(s) (2 training(s), 6 scoring(s)) on a local Ray cluster" in printed  # the dev stage
    assert printed.count("update: job done (") == 8 + 4  # one line per finished job (dev, then test)
    logs = sorted(p.stem for p in (out / "logs").glob("*.log"))  # every job ran in a worker, its output in its log
    assert logs == sorted(p.name for p in (out / "steps").iterdir() if not p.name.startswith("v1_vectors"))
    pids = {(out / "logs" / f"{name}.log").read_text().split("(pid ")[1].split(",")[0] for name in logs}
    assert str(os.getpid()) not in pids


@pytest.mark.slow
def test_a_failed_job_is_named_with_its_log_and_the_others_go_on(reference, ray_cluster, tmp_path):
    """A training whose worker computes another run key than the driver's (another adaptguard there, other files)
    fails and stores nothing; the job that needs it is not started, the independent one finishes."""
    from adaptguard.update.executors import JobsFailed, RayExecutor, Runtime, run_jobs
    from adaptguard.update.jobs import ScoreJob, TrainJob
    from adaptguard.update.pick import Pick

    out = with_task_adapters(reference, tmp_path / "fail")
    pick = Pick(grid_config(out))
    pick.prepare()  # the copied task adapters, reused
    good = TrainJob.of(pick, pick.settings[0], 0)
    bad = dataclasses.replace(good, key={**good.key, "seed": 99})
    after = ScoreJob.of(pick, "dev", (pick.settings[0], 0), needs=(bad.name,))
    v1 = ScoreJob.of(pick, "dev", "v1")
    executor = RayExecutor(Runtime(1, str(out / "logs")), workers=2, cpus=1, gpus=0)
    lines = []
    with pytest.raises(JobsFailed, match=r"2 of 3 jobs failed \(1 finished and stored"):
        run_jobs(executor, [bad, after, v1], say=lines.append, bar=False)
    failed = next(line for line in lines if "FAILED" in line)
    assert "train control (lr 0.002) seed 0: RuntimeError" in failed and str(out / "logs" / f"{bad.name}.log") in failed
    assert "this worker computes the run" in (out / "logs" / f"{bad.name}.log").read_text()
    assert not (out / "steps" / bad.name).exists() and not (out / "steps" / after.name).exists()
    assert (out / "steps" / v1.name / "done.json").exists()


@pytest.mark.slow
def test_a_run_killed_in_process_resumes_on_submitit_redoing_only_the_unfinished_jobs(reference, tmp_path,
                                                                                       monkeypatch, capsys):
    """Killed in this process as kd's training starts, then restarted on submitit's local executor (each job a
    subprocess, as on Slurm): only kd's training, its scorings and the test stage run there, nothing finished is
    rewritten, and the pick, dev_choices.json, the test report and every step are the in-process run's."""
    from adaptguard.update import jobs as jobs_module
    from adaptguard.update import run_update

    out = with_task_adapters(reference, tmp_path / "resumed")
    real = jobs_module.TrainJob.run

    def killed_at_kd(self, pick=None):
        if self.setting.recipe == "kd":
            raise KeyboardInterrupt  # Ctrl-C as the second training starts
        return real(self, pick)

    monkeypatch.setattr(jobs_module.TrainJob, "run", killed_at_kd)
    with pytest.raises(KeyboardInterrupt):
        run_update(grid_config(out))
    monkeypatch.undo()
    finished = {p.parent.name: p.stat().st_mtime_ns for p in (out / "steps").glob("*/done.json")}
    assert len([n for n in finished if not n.startswith("v1_vectors")]) == 5  # v1, v2, control's run and scores
    assert not list(out.rglob("*.partial"))
    capsys.readouterr()

    run_update(grid_config(out, executor="slurm", slurm_cluster="local", workers=2))
    printed = capsys.readouterr().out
    assert "on submitit's local executor (subprocesses of this machine), 2 at a time" in printed
    assert "update: 3 job(s) (1 training(s), 2 scoring(s)) on submitit's local executor" in printed  # dev: kd's
    assert {p.parent.name: p.stat().st_mtime_ns for p in (out / "steps").glob("*/done.json")
            if p.parent.name in finished} == finished
    ran = sorted(p.stem for p in (out / "logs").glob("*.log"))
    assert ran == sorted(set(p.name for p in (out / "steps").iterdir()) - set(finished))  # 3 dev + 4 test jobs
    assert len(ran) == 7 and list((out / "logs" / "submitit").glob("*_log.out"))  # submitit's own records too
    assert_same_results(reference, out)


@pytest.mark.slow
def test_a_training_spread_over_two_processes_keeps_the_global_batch(reference, tmp_path):
    """`processes_per_job` 2: the training job runs under `accelerate launch` (two CPU processes here, one per GPU on
    a cluster), each on half the batch: the same steps per epoch, the adapters written once, the run keyed apart."""
    from adaptguard.update.jobs import TrainJob
    from adaptguard.update.pick import Pick

    out = with_task_adapters(reference, tmp_path / "ddp")
    pick = Pick(grid_config(out, processes_per_job=2, candidates=GRID[:1]))
    pick.prepare()
    job = TrainJob.of(pick, pick.settings[0], 0)
    assert job.key["processes"] == 2 and job.name not in {p.name for p in (reference / "steps").iterdir()}
    run = job.run(pick)
    history = json.loads((run / "log_history.json").read_text())
    assert history[-1]["step"] == 2 * 7  # 108 rows at a global batch of 16, 2 epochs
    assert sorted(p.name for p in run.iterdir()) == ["done.json", "epoch-1", "epoch-2", "log_history.json"]


# -- fast: the scheduler, the plan, the checks ---------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Fake:
    name: str
    needs: tuple = ()
    fails: bool = False
    kind: str = "score"

    @property
    def label(self) -> str:
        return f"fake {self.name}"

    def run(self, context=None):
        context.append(self.name)
        if self.fails:
            raise ValueError(f"{self.name} broke")
        return self.name


def test_run_jobs_in_order_a_failure_named_with_its_log_and_the_rest_kept(tmp_path):
    from adaptguard.update.executors import InProcess, JobsFailed, Runtime, run_jobs

    ran, lines = [], []
    jobs = [Fake("a"), Fake("b", fails=True), Fake("c", needs=("b",)), Fake("d", needs=("a",)), Fake("e", needs=("x",))]
    executor = InProcess(Runtime(None, str(tmp_path / "logs")), context=ran)
    with pytest.raises(JobsFailed) as err:
        run_jobs(executor, jobs, say=lines.append, bar=False)
    assert ran == ["a", "b", "d", "e"]  # in order; c waits for b, which failed; x is no job here (stored before)
    assert str(err.value).splitlines() == [
        "2 of 5 jobs failed (3 finished and stored; a re-run redoes only the others):",
        f"  b: ValueError: b broke (log: {tmp_path / 'logs' / 'b.log'})", "  c: not run: a job it needs failed"]
    assert "ValueError: b broke" in (tmp_path / "logs" / "b.log").read_text()  # the traceback
    assert [line.split(":")[1].strip() for line in lines] == ["job done (1/5)", "job FAILED", "job done (2/5)",
                                                              "job done (3/5)"]


def test_makespan_follows_the_order_and_the_prerequisites():
    from adaptguard.update.executors import makespan

    durations, needs = [1, 1, 4, 2, 4, 2], [(), (), (), (2,), (), (4,)]  # v1, v2, train, its score, train, its score
    assert makespan(durations, needs, 1) == sum(durations)
    assert makespan(durations, needs, 2) == 7  # v1 and v2, then both trainings, then both scores
    assert makespan(durations, needs, None) == 6  # every ready job at once: the longest chain


def test_the_plan_says_where_the_jobs_run_and_the_wall_time_on_that_many_workers(tmp_path, monkeypatch, capsys):
    from adaptguard.update import run_update
    from adaptguard.update.pick import Pick

    monkeypatch.setattr(Pick, "measure", lambda self: {"step_s": 0.4, "item_s": 0.2})
    run_update(grid_config(tmp_path / "out", executor="ray", workers=2, task_epochs=1), dry_run=True)
    printed = capsys.readouterr().out
    # 14 steps per run (108 rows, batch 16: 7 per epoch, 2 epochs) at 0.4 s, kd's counted 1.5×: 5.6 and 8.4 s; a
    # scoring 24 items at 0.2 s: 4.8 s; the task adapters first, 2 × 7 steps: 5.6 s. One worker: 5.6 + dev (2 × 4.8
    # + 5.6 + 8.4 + 4 × 4.8) + test (4 × 4.8) = 67.6 s. Two: 5.6 + dev 22.8 ([v1, control's run, its first score, kd's
    # first], [v2, kd's run, control's second score, kd's second]) + test 9.6 = 38 s
    assert "jobs: each training and scoring on a local Ray cluster on this machine, 2 at a time, 1 CPU(s)" in printed
    assert "time: about 68 s at most" in printed
    assert "on 2 workers: about 38 s (the jobs' own start-up" in printed
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("change, error", [
    (dict(executor="spark"), r"executor must be one of local, ray, slurm, got 'spark'"),
    (dict(workers=2), r"workers: 2 at once needs executor 'ray' or 'slurm'"),
    (dict(executor="ray", workers=0), r"workers must be ≥ 1, got 0"),
    (dict(ray_address="auto"), r"ray_address: set, but executor is 'local'; set executor to 'ray'"),
    (dict(executor="ray", gpus_per_job=1), r"gpus_per_job: 1 GPU\(s\) asked for, but use_cpu is true"),
    (dict(processes_per_job=3), r"processes_per_job: batch_size 16 must split evenly among 3 processes"),
    (dict(executor="slurm"), r"executor 'slurm': no sbatch here .* slurm_cluster 'local' runs the same jobs"),
    (dict(executor="slurm", slurm_cluster="lsf"), r"slurm_cluster must be one of slurm, local, got 'lsf'"),
])
def test_a_bad_executor_config_fails_before_any_work(tmp_path, monkeypatch, change, error):
    import shutil as sh

    monkeypatch.setattr(sh, "which", lambda name: None)  # no Slurm here, whatever the machine has
    with pytest.raises(ValueError, match=error):
        grid_config(tmp_path / "out", **change)
    assert not (tmp_path / "out").exists()


def test_a_missing_library_names_the_extra_and_the_flag_goes_through_the_same_checks(tmp_path, monkeypatch, capsys):
    import importlib.util

    from adaptguard.cli.main import main

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a))
    with pytest.raises(ImportError, match=r"executor 'ray': ray is not installed: pip install 'adaptguard\[distributed\]'"):
        grid_config(tmp_path / "out", executor="ray")
    monkeypatch.undo()
    config = tmp_path / "c.json"
    cfg = grid_config(tmp_path / "out")
    config.write_text(json.dumps({k: getattr(cfg, k) for k in ("old_base", "new_base", "train", "dev", "test",
                                                                "candidates", "output_dir")}))
    assert main(["update", str(config), "--executor", "local", "--workers", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["adaptguard update: error: workers: 2 at once needs executor 'ray' or 'slurm'; 'local' runs one job "
                   "at a time in this process"]
    assert not (tmp_path / "out").exists()


def test_failed_jobs_end_the_command_with_their_names_and_status_1(tmp_path, monkeypatch, capsys):
    import adaptguard.update
    from adaptguard.cli.main import main
    from adaptguard.update.executors import JobsFailed

    def failing(cfg, dry_run=False):
        raise JobsFailed("1 of 8 jobs failed (7 finished and stored; a re-run redoes only the others):\n  run_kd_x: "
                         "ValueError: broke (log: out/logs/run_kd_x.log)")

    monkeypatch.setattr(adaptguard.update, "run_update", failing)
    cfg = grid_config(tmp_path / "out")
    (tmp_path / "c.json").write_text(json.dumps({k: getattr(cfg, k) for k in ("old_base", "new_base", "train", "dev",
                                                                              "test", "output_dir")}))
    assert main(["update", str(tmp_path / "c.json")]) == 1
    assert capsys.readouterr().err.splitlines() == [
        "adaptguard update: 1 of 8 jobs failed (7 finished and stored; a re-run redoes only the others):",
        "  run_kd_x: ValueError: broke (log: out/logs/run_kd_x.log)"]


def test_choosing_submitit_keeps_the_logging_handlers_of_the_process(tmp_path):
    """submitit's import runs `logging.config.dictConfig`, which closes every handler of the process (a user's log
    file; absl's handler then closes pytest's capture file, and every later test of the worker errors). Imported
    through the executor, the handlers stay open and the user's SUBMITIT_LOG_LEVEL, if any, is theirs to set."""
    import subprocess
    import sys

    code = f"""
import logging, os
handler = logging.FileHandler({str(tmp_path / 'user.log')!r})
logging.getLogger("user").addHandler(handler)
from adaptguard.update.executors import Runtime, SubmititExecutor
SubmititExecutor(Runtime(1, {str(tmp_path / 'logs')!r}), workers=1, cpus=1, gpus=0, cluster="local")
assert handler.stream is not None and not handler.stream.closed, "the user's log file was closed"
assert "SUBMITIT_LOG_LEVEL" not in os.environ
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
