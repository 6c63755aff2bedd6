"""Experiment E5 (issue 57, docs/preregistration.md § E5): seeds, not items.

Part B (`--stage runs`): E3's arms at their frozen dev choices on more seeds — U2 (continued training) and U1 (NF4)
every arm, U3 (NF4, matrixshapes) the control and focal — through E3's own runner, so the rows, items, scoring and
store keys are E3's. Before an update's new seeds, the rebuilt v1 and v2 task models are scored under names of
their own, so their agreement with the recorded reference answers can be reported. After every finished run the
small records are exported (only what is not already in E3's records), ready to commit.

    python -m adaptguard.experiments.seeds_not_items --stage runs --out /work/e5-out --export docs/results/e5_records

Resuming: copy `docs/results/e3_records/*` and then `docs/results/e5_records/*` into `--out` (the command does it
when `--out` is new).
"""

from __future__ import annotations

import filecmp
import json
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ..utils.quiet import hide_unused_library_noise
from ..utils.store import export_records
from ..utils.sweeps import machine_info
from .recipes_vs_control import E3, E3Config

E3_RECORDS = Path("docs/results/e3_records")
# registered order (cheapest first) and arms per update
PLAN = {"continued": ["control", "muscle", "ll_l", "focal", "kd"],
        "quantized": ["control", "muscle", "ll_l", "focal", "kd"],
        "generative": ["control", "focal"]}
NEW_SEEDS = [3, 4, 5, 6, 7]


def export_new(out: Path, to: Path, reference: Path = E3_RECORDS) -> int:
    """Export `out`'s records to `to`, leaving out every file that `reference` (E3's committed records) already holds
    unchanged. Returns the number of files written."""
    with tempfile.TemporaryDirectory() as tmp:
        export_records(out, Path(tmp))
        n = 0
        for path in sorted(Path(tmp).rglob("*")):
            rel = path.relative_to(tmp)
            old = reference / rel
            if path.is_file() and not (old.is_file() and filecmp.cmp(path, old, shallow=False)):
                target = to / rel
                if not (target.is_file() and filecmp.cmp(path, target, shallow=False)):
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(path, target)
                    n += 1
    return n


def seed_records(out: Path, sources: list[Path]) -> None:
    """Copy committed records into a new `out` (E3's first, then E5's), so the store resumes from them."""
    for src in sources:
        if src.is_dir():
            shutil.copytree(src, out, dirs_exist_ok=True)


class E5Runs:
    def __init__(self, cfg: E3Config, export: Path | None, say=print):
        self.e3, self.export, self.say = E3(cfg, say=say), export, say
        self.choices = json.loads(self.e3.choices_path.read_text())

    def update(self, name: str):
        """(E1 steps, kind, setting) of a decided update, from its frozen dev choice (no gate is re-walked)."""
        entry = self.choices[name]
        if name == "generative":
            e = self.e3.generative(entry["task"])
        else:
            e = self.e3.multiple_choice()
        return e, entry["kind"], entry["setting"]

    def rebuilt_check(self, name: str) -> dict:
        """The rebuilt v1 and v2 task models' test answers, stored under their own names, against the recorded."""
        e, kind, setting = self.update(name)
        lr = e.task_lr
        if e.store.find(f"scores/test/v1_{lr:g}", {**e.common, "lr": lr, "split": "test"}) is None:
            raise SystemExit(f"E5: {name}: the recorded v1 test answers are not in {e.root}: copy "
                             f"{E3_RECORDS} into it first (they are the reference of every seed)")
        machine = machine_info().get("cpu", "")
        common = {**e.common, "lr": e.task_lr, "rebuilt_on": machine}
        v1 = e.scores("v1_rebuilt", common, "test", e.v1_task_model)
        _, _, extra = e.update_base(kind, setting)
        v2 = e.scores(f"v2_{kind}_rebuilt", {**common, **extra}, "test", lambda: e.v2_task_model(kind, setting))
        rec_v1, rec_v2 = e.v1_scores("test"), e.v2_scores(kind, setting, "test")
        agree = {"v1": sum(a == b for a, b in zip(v1, rec_v1)) / len(v1),
                 "v2": sum(a == b for a, b in zip(v2, rec_v2)) / len(v2), "machine": machine}
        self.say(f"E5: {name}: rebuilt v1 agrees with the recorded on {agree['v1']:.3f} of test items, "
                 f"v2 on {agree['v2']:.3f}")
        self._export()
        return agree

    def run(self, updates: list[str], seeds: list[int]) -> None:
        for name in updates:
            e, kind, setting = self.update(name)
            self.rebuilt_check(name)
            chosen = self.choices[name]["chosen"]
            for seed in seeds:
                for arm in PLAN[name]:
                    c = chosen[arm]
                    self.e3.arm_scores(e, kind, setting, arm, c["learning_rate"], c["epochs"], seed, "test")
                    self._export()

    def _export(self) -> None:
        if self.export is not None:
            n = export_new(self.e3.root, self.export)
            if n:
                self.say(f"E5: {n} record file(s) exported to {self.export}")


def main(argv: list[str] | None = None) -> None:
    from transformers import HfArgumentParser

    @dataclass
    class Cli:
        stage: str = field(default="runs", metadata={"help": "runs: Part B's new seeds."})
        out: str = field(default="e5-out", metadata={"help": "The store (E3's records are copied in when new)."})
        export: str = field(default="", metadata={"help": "Copy each finished run's new records here (to commit)."})
        updates: list[str] = field(default_factory=lambda: list(PLAN), metadata={
            "help": "continued (U2), quantized (U1), generative (U3), in the registered order."})
        seeds: list[int] = field(default_factory=lambda: list(NEW_SEEDS))

    hide_unused_library_noise()
    (cli,) = HfArgumentParser(Cli).parse_args_into_dataclasses(argv)
    if cli.stage != "runs":
        raise SystemExit(f"--stage: unknown stage {cli.stage!r}; known: runs")
    out = Path(cli.out)
    if not out.exists():
        seed_records(out, [E3_RECORDS] + ([Path(cli.export)] if cli.export else []))
    cfg = E3Config(out=str(out), seeds=[0, 1, 2, *cli.seeds])
    E5Runs(cfg, Path(cli.export) if cli.export else None).run(cli.updates, cli.seeds)


if __name__ == "__main__":
    main()
