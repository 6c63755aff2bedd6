"""`adaptguard update --preset tiny`: Echterhoff et al.'s experiment on the embedded bases, ready to run."""

from __future__ import annotations

from .config import UpdateConfig

# The preset task: the embedded models' knowledge asked in six question phrasings. Test items are other
# (entity, phrasing) pairs than the training ones, so a task adapter must generalise across phrasings —
# where the two bases' adapters disagree item by item (the regressions MUSCLE targets).
FACT_TEMPLATES = ("question : capital of {x} ? answer :", "question : what is the capital of {x} ? answer :",
                  "question : which city is the capital of {x} ? answer :",
                  "question : name the capital of {x} . answer :", "question : {x} has which capital ? answer :",
                  "question : the capital city of {x} ? answer :")
OPPOSITE_TEMPLATES = tuple(t.replace("capital city", "opposite word").replace("capital", "opposite")
                           .replace("which city", "which word") for t in FACT_TEMPLATES)


def paraphrase_split(train_fraction: float = 0.3, seed: int = 0) -> tuple[list[dict], list[dict]]:
    """Prompt/completion rows of the preset task (360 of them), shuffled with `seed` and split."""
    import random

    from ..models.embedded import ANTONYMS, EMBEDDED_MODELS, world_facts

    items = [(t, c, city) for c, city in world_facts(EMBEDDED_MODELS["tiny"]) for t in FACT_TEMPLATES]
    for a, b in ANTONYMS:
        items += [(t, a, b) for t in OPPOSITE_TEMPLATES] + [(t, b, a) for t in OPPOSITE_TEMPLATES]
    rows = [{"prompt": t.format(x=x), "completion": f" {y} ."} for t, x, y in items]
    random.Random(seed).shuffle(rows)
    n_train = int(len(rows) * train_fraction)
    return rows[:n_train], rows[n_train:]


def tiny_preset(output_dir: str = "update-out", split_seed: int = 0, seed: int = 0) -> UpdateConfig:
    """Echterhoff et al.'s experiment on the embedded bases `tiny` → `tiny-v2` (larger, trained longer).

    The mask is LL_L (`old_likelier_token`, Echterhoff et al. §6.5), not eq. 1's `student_wrong`: the task
    adapters here fit every training token, so "the student is wrong" never happens on the training
    set and eq. 1 leaves the adapter unchanged (measured, docs/muscle.md); LL_L compares the two task
    models' probabilities of the label and still finds the tokens where v1 is the better teacher.
    `split_seed` shuffles the 360 rows before the train/test split; `seed` seeds the trainings.
    """
    from ..models.embedded import embedded_model_path

    train, test = paraphrase_split(seed=split_seed)
    return UpdateConfig(old_base=str(embedded_model_path("tiny")), new_base=str(embedded_model_path("tiny-v2")),
                        train=train, test=test, output_dir=output_dir, lora_r=16, lora_alpha=32,
                        task_learning_rate=1e-3, task_epochs=30, compat_learning_rate=2e-3, compat_epochs=3,
                        mask="old_likelier_token", batch_size=16, max_length=64, max_new_tokens=8, seed=seed,
                        use_cpu=True)
