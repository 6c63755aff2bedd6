"""Where the jobs of `adaptguard update` run: in this process (the default), on a Ray cluster, or on Slurm through
submitit.

A job (`jobs.TrainJob`, `jobs.ScoreJob`) is one picklable description — the config, the setting, the seed and the
run key the driver computed — and its output is one folder of the pick's `Store`: a job is done exactly when its
folder is finished, whichever executor ran it. A run killed on one executor therefore resumes on another and redoes
only the unfinished jobs. `scheduler.run_jobs` hands an executor the jobs whose prerequisites are finished, in the
grid's order, and names a failed one with its log while the others go on. Every executor runs a job through `run_job`
in its worker (torch's threads set to the job's CPUs, the job's output in its log) and the job through `job.run()`:
the code path of the in-process run.

Anchors: HF `Trainer.hyperparameter_search(backend="ray")` (a trial as a Ray task that asks for its CPUs and GPUs);
submitit (Meta: a Python function as a Slurm job, and its `LocalExecutor` that runs the same job as a subprocess).
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

# re-exported: the CLI, the tests and the benchmarks import the scheduler's names from here, where they were first
from .scheduler import JobError, JobsFailed, makespan, run_jobs  # noqa: F401


@dataclass(frozen=True)
class Runtime:
    """What each job of a run gets where it runs: torch's threads (None: as they are), the folder of its log, and the
    driver's working directory (where the config's relative paths start; a worker moves there when it exists)."""

    threads: int | None
    logs: str
    cwd: str | None = None

    def log(self, job) -> Path:
        return Path(self.logs) / f"{job.name}.log"


@contextmanager
def _working_dir(path: str | None):
    before = os.getcwd()
    if path and os.path.isdir(path):
        os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


@contextmanager
def _output_to(path: Path):
    """This process's stdout and stderr (file descriptors 1 and 2, so bars and C libraries too) appended to `path`
    for the block."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "a") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def run_job(job, runtime: Runtime):
    """One job in a worker of any executor (a Ray task, a Slurm or local submitit job): torch's threads set to the
    job's CPUs (so two workers on two cores do not oversubscribe them), its output and any traceback appended to its
    log, then `job.run()` — the same steps as in-process, which builds the job's `Pick` from its config. Returns the
    job's folder and its seconds here (from this call on: what the executor adds is the driver's time beyond it)."""
    start = time.perf_counter()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from ..utils.threads import torch_threads

    with _output_to(runtime.log(job)), torch_threads(runtime.threads), _working_dir(runtime.cwd):
        print(f"== {job.label} (pid {os.getpid()}, {runtime.threads or 'default'} thread(s))", flush=True)
        try:
            folder = str(job.run())
        except BaseException:
            traceback.print_exc()
            raise
    return {"folder": folder, "seconds": time.perf_counter() - start}


# -- the executors ------------------------------------------------------------------------------------------------
@dataclass(eq=False)
class _Finished:
    """An in-process job's handle: it ran when submitted."""

    result: object
    error: Exception | None


class InProcess:
    """Each job in this process, one at a time, in the grid's order (the default: `update` as it always ran). A failed
    job's traceback goes to its log; Ctrl-C stops at once."""

    name = "local"

    def __init__(self, runtime: Runtime, context=None):
        """`context`: what `job.run` reuses here (the driver's `Pick`: its tokenizers, rows and loaded v1)."""
        self.runtime, self.context, self.workers = runtime, context, 1

    def where(self) -> str:
        return "this process, one job at a time"

    def submit(self, job):
        start = time.perf_counter()
        from ..utils.threads import torch_threads

        with torch_threads(self.runtime.threads):
            try:
                folder = str(job.run(self.context))
                return _Finished({"folder": folder, "seconds": time.perf_counter() - start}, None)
            except Exception as err:  # noqa: BLE001 - named with its log; the other jobs go on
                log = self.runtime.log(job)
                log.parent.mkdir(parents=True, exist_ok=True)
                log.write_text("".join(traceback.format_exception(err)))
                return _Finished(None, err)

    def wait(self, handles: list) -> list:
        return handles

    def log(self, job, handle) -> Path:
        return self.runtime.log(job)

    def outcome(self, handle):
        if handle.error is not None:
            raise handle.error
        return handle.result

    def cancel(self, handles: list) -> None:
        pass

    def close(self) -> None:
        pass


def _warm_up() -> int:
    """What every job imports first (a Ray worker keeps it for the jobs it runs next)."""
    import peft  # noqa: F401
    import transformers.trainer  # noqa: F401
    import trl  # noqa: F401

    return os.getpid()


class RayExecutor:
    """Each job a Ray task that asks for its CPUs and GPUs, on the cluster at `address` or on a local one started
    here (and stopped at the end)."""

    name = "ray"

    def __init__(self, runtime: Runtime, workers: int | None, cpus: int, gpus: int, address: str | None = None):
        import ray

        self.runtime, self.cpus, self.gpus, self.address = runtime, cpus, gpus, address
        self.workers = workers or 1_000_000  # None: every ready job; the cluster queues what it cannot hold
        self._ours = not ray.is_initialized()
        if self._ours:
            if address:
                ray.init(address=address, log_to_driver=False)
            else:  # a local cluster of `workers` jobs (the object store only carries the jobs and their paths)
                ray.init(num_cpus=(workers or os.cpu_count() or 1) * cpus, include_dashboard=False, log_to_driver=False,
                         object_store_memory=100 * 2**20)
        self._task = ray.remote(run_job)
        # each worker imports the training libraries now, while the driver trains the task adapters and reads v1
        slots = int(ray.cluster_resources().get("CPU", 1)) // max(1, cpus)
        self._warming = [ray.remote(_warm_up).options(num_cpus=cpus).remote() for _ in range(min(self.workers, slots))]

    def where(self) -> str:
        return f"the Ray cluster at {self.address}" if self.address else "a local Ray cluster on this machine"

    def submit(self, job):
        gpus = self.gpus if job.kind == "train" else min(self.gpus, 1)  # a scoring runs on one device
        return self._task.options(num_cpus=self.cpus, num_gpus=gpus, max_retries=0, name=job.name).remote(
            job, self.runtime)

    def wait(self, handles: list) -> list:
        import ray

        done, _ = ray.wait(handles, num_returns=1)
        return done

    def log(self, job, handle) -> Path:
        return self.runtime.log(job)

    def outcome(self, handle):
        import ray

        try:
            return ray.get(handle)
        except ray.exceptions.RayTaskError as err:  # the job's own error, without Ray's wrapping
            cause = getattr(err, "cause", None)
            raise (cause if isinstance(cause, Exception) else err) from None

    def cancel(self, handles: list) -> None:
        import ray

        for handle in handles:
            ray.cancel(handle, force=True)

    def close(self) -> None:
        import ray

        if self._ours:
            ray.shutdown()


def import_submitit():
    """submitit, imported without the `logging.config.dictConfig` its import runs, which closes every logging handler
    of this process: a user's file handlers, and absl's, which closes the stream it holds (a log file, pytest's
    capture file). Its records then reach the root logger like any library's. A SUBMITIT_LOG_LEVEL set by the user is
    kept."""
    if "submitit" not in sys.modules and "SUBMITIT_LOG_LEVEL" not in os.environ:
        os.environ["SUBMITIT_LOG_LEVEL"] = "NOCONFIG"  # read once, at import
        try:
            import submitit
        finally:
            del os.environ["SUBMITIT_LOG_LEVEL"]
    import submitit

    return submitit


class SubmititExecutor:
    """Each job a Slurm job submitted by submitit (partition, time limit, CPUs and GPUs per job), or with
    `cluster="local"` submitit's `LocalExecutor`: the same job as a subprocess of this machine."""

    name = "slurm"

    def __init__(self, runtime: Runtime, workers: int | None, cpus: int, gpus: int, cluster: str = "slurm",
                 partition: str | None = None, time_min: int = 60, extra: dict | None = None, poll_s: float = 1.0):
        submitit = import_submitit()
        self.runtime, self.gpus, self.cluster, self.partition = runtime, gpus, cluster, partition
        self.workers, self.poll_s = workers or 1_000_000, poll_s
        self._executor = submitit.AutoExecutor(folder=Path(runtime.logs) / "submitit", cluster=cluster)
        self._executor.update_parameters(name="adaptguard-update", timeout_min=time_min, cpus_per_task=cpus,
                                         nodes=1, tasks_per_node=1, slurm_partition=partition,
                                         **{f"slurm_{k}": v for k, v in (extra or {}).items()})

    def where(self) -> str:
        if self.cluster == "local":
            return "submitit's local executor (subprocesses of this machine)"
        return f"Slurm partition {self.partition}" if self.partition else "Slurm (the default partition)"

    def submit(self, job):
        self._executor.update_parameters(gpus_per_node=self.gpus if job.kind == "train" else min(self.gpus, 1))
        return self._executor.submit(run_job, job, self.runtime)

    def wait(self, handles: list) -> list:
        while True:
            done = [h for h in handles if h.done()]
            if done:
                return done
            time.sleep(self.poll_s)

    def outcome(self, handle):
        from submitit.core.utils import FailedJobError

        try:
            return handle.result()
        except FailedJobError as err:  # the worker's traceback as text, between two rules: its last line
            parts = str(err).split("-" * 22 + "\n")
            lines = [line for line in (parts[1] if len(parts) > 2 else str(err)).splitlines() if line.strip()]
            raise JobError(lines[-1] if lines else str(err)) from None

    def log(self, job, handle) -> Path:
        """The job's log, or submitit's record of its process where it failed before writing one (an import)."""
        ours = self.runtime.log(job)
        return ours if ours.exists() else Path(handle.paths.stderr)

    def cancel(self, handles: list) -> None:
        for handle in handles:
            try:
                handle.cancel(check=False)
            except Exception:  # noqa: BLE001 - best effort on the way out
                pass

    def close(self) -> None:
        pass


def job_resources(cfg) -> tuple[int | None, int | None]:
    """(workers, CPUs per job) of a config: the local executor runs one job (torch's threads as they are unless
    `cpus_per_job`); a local cluster (Ray without an address, submitit's local executor) shares this machine's cores
    among its workers; elsewhere a job asks for 1 CPU by default and every ready job is submitted (workers None)."""
    if cfg.executor == "local":
        return 1, cfg.cpus_per_job
    here = cfg.executor == "ray" and not cfg.ray_address or cfg.executor == "slurm" and cfg.slurm_cluster == "local"
    cores = os.cpu_count() or 1
    if not here:
        return cfg.workers, cfg.cpus_per_job or 1
    if cfg.workers is None:
        cpus = cfg.cpus_per_job or 1
        return max(1, cores // cpus), cpus
    return cfg.workers, cfg.cpus_per_job or max(1, cores // cfg.workers)


def make_executor(cfg, context=None):
    """The executor `cfg.executor` names, with the config's resources (`job_resources`); `context` is the in-process
    executor's (the driver's `Pick`). Ray is connected (or a local cluster started) here."""
    workers, cpus = job_resources(cfg)
    runtime = Runtime(cpus, str(Path(cfg.output_dir).resolve() / "logs"), os.getcwd())
    if cfg.executor == "local":
        return InProcess(runtime, context)
    if cfg.executor == "ray":
        return RayExecutor(runtime, workers, cpus, cfg.gpus_per_job, cfg.ray_address)
    return SubmititExecutor(runtime, workers, cpus, cfg.gpus_per_job, cfg.slurm_cluster, cfg.slurm_partition,
                            cfg.slurm_time_min, cfg.slurm_args)


def describe(cfg) -> str:
    """Where the jobs will run and how many at once, from the config alone (the plan prints it before connecting)."""
    workers, cpus = job_resources(cfg)
    gpus = f", {cfg.gpus_per_job} GPU(s) per training" if cfg.gpus_per_job else ""
    each = f"{cpus} CPU(s) and torch thread(s) each{gpus}" if cpus else f"torch's threads as they are{gpus}"
    at_once = f"{workers} at a time" if workers else "every ready job at once (as many as the cluster runs)"
    if cfg.executor == "local":
        where = "this process"
    elif cfg.executor == "ray":
        where = f"the Ray cluster at {cfg.ray_address}" if cfg.ray_address else "a local Ray cluster on this machine"
    elif cfg.slurm_cluster == "local":
        where = "submitit's local executor (subprocesses of this machine)"
    else:
        where = (f"Slurm partition {cfg.slurm_partition or '(the default)'} via submitit, {cfg.slurm_time_min} min "
                 "per job")
    launch = (f"; a training spans {cfg.processes_per_job} processes (accelerate launch)"
              if cfg.processes_per_job > 1 else "")
    return f"{where}, {at_once}, {each}{launch}"
