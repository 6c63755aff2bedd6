"""How `adaptguard update` runs a grid of jobs on an executor (`executors`), and how long that takes.

`run_jobs` hands an executor the jobs whose prerequisites are finished (a scoring waits for its training), at most
`workers` at a time and in the grid's order (one worker: the order of the in-process loop); it prints one line per
finished job and a bar over the grid, and names a failed job with its log while the others go on. `makespan` follows
the same order on given durations: the plan's wall-time estimate. An executor is reached only through its `workers`,
`submit`, `wait`, `outcome`, `log` and `cancel`, so this module imports none of them: `executors` builds on it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable


class JobsFailed(RuntimeError):
    """Some jobs failed; the others are stored (a re-run redoes only the failed ones)."""


class JobError(RuntimeError):
    """A job's own error as its worker reported it in text (`ValueError: ...`), where the exception itself does not
    come back."""


def run_jobs(executor, jobs: Iterable, say: Callable[[str], None] = print, bar: bool = True) -> dict[str, dict]:
    """Run `jobs` (each with `name`, `label`, `kind`, `needs`: the names of the jobs it waits for) on `executor`: the
    ready ones in the given order, at most `executor.workers` at a time; one line per finished job and a bar over
    them all. A failed job is named with its log and the others go on (a job that needs it is not started); then
    `JobsFailed` lists them. Returns, per finished job, its `folder`, `seconds` as the driver saw them (from its
    submission: start-up and any queueing included) and `in_job_s` (from `executors.run_job`'s start in the worker)."""
    from ..utils.progress import progress_bar

    jobs = list(jobs)
    names = {job.name for job in jobs}
    pending, running, seconds, failed = list(jobs), {}, {}, {}
    with progress_bar(len(jobs), "update: jobs", unit="job", show=bar and bool(jobs)) as progress:
        try:
            while pending or running:
                for job in [j for j in pending if any(n in failed for n in j.needs)]:
                    pending.remove(job)
                    failed[job.name] = "not run: a job it needs failed"
                    progress.update(1)
                ready = [j for j in pending if all(n in seconds or n not in names for n in j.needs)]
                for job in ready[:max(0, executor.workers - len(running))]:
                    pending.remove(job)
                    running[executor.submit(job)] = (job, time.perf_counter())
                if not running:
                    break
                for handle in executor.wait(list(running)):
                    job, start = running.pop(handle)
                    try:
                        result = executor.outcome(handle)
                    except Exception as err:  # noqa: BLE001 - named with its log; the others go on
                        last = (str(err).strip().splitlines() or [""])[-1][:300]
                        why = last if isinstance(err, JobError) else f"{type(err).__name__}: {last}"
                        failed[job.name] = f"{why} (log: {executor.log(job, handle)})"
                        say(f"update: job FAILED: {job.label}: {failed[job.name]}")
                    else:
                        seconds[job.name] = {"folder": result["folder"], "seconds": time.perf_counter() - start,
                                             "in_job_s": result["seconds"]}
                        say(f"update: job done ({len(seconds)}/{len(jobs)}): {job.label}, "
                            f"{seconds[job.name]['seconds']:.0f} s")
                    progress.update(1)
        except BaseException:
            executor.cancel(list(running))
            raise
    if failed:
        lines = [f"  {name}: {why}" for name, why in failed.items()]
        raise JobsFailed(f"{len(failed)} of {len(jobs)} jobs failed ({len(seconds)} finished and stored; a re-run "
                         "redoes only the others):\n" + "\n".join(lines))
    return seconds


def makespan(durations: list[float], needs: list[tuple[int, ...]], workers: int | None) -> float:
    """Seconds to run jobs of these `durations` (`needs`: the indices each waits for) as `run_jobs` does — whenever a
    worker is free, the first ready job in order — on `workers` (None: every ready job at once): the plan's wall-time
    estimate."""
    n, clock = len(durations), 0.0
    done, running, started = set(), [], set()
    while len(done) < n:
        ready = [i for i in range(n) if i not in started and all(j in done for j in needs[i])]
        for i in ready[:max(0, (workers or n) - len(running))]:
            started.add(i)
            running.append((clock + durations[i], i))
        if not running:
            raise ValueError("makespan: a job waits for one that never runs")
        running.sort()
        clock, i = running.pop(0)
        done.add(i)
    return clock
