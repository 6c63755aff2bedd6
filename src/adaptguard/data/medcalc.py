"""MedCalc-Bench-style items with worked answers, built offline from the `medcalc-bench` package (Apache-2.0).

MedCalc-Bench (Khandekar et al., 2024) asks a model to compute a clinical score or value from a patient note; its
gold rationales are written by each calculator's `*_explanation` function, which the PyPI package `medcalc-bench`
ships (`import medcalc`). The benchmark's patient notes (PubMed case reports) are not in the package, so the notes
here are **synthetic**: short sentences rendered from inputs sampled per calculator. An item is the note and the
question as the prompt, and the calculator's rationale followed by `Answer: <value>` as the completion.

Scoring follows MedCalc-Bench: the final answer (the text after the last `Answer:`) must equal the gold value for
integer scores, and lie within ±5 % of it for decimal values.
"""

from __future__ import annotations

import importlib
import json
import random
import re
from collections.abc import Callable
from dataclasses import dataclass

ANSWER_PREFIX = "Answer:"
NOTE_PREFIX = "Patient note:"  # starts every prompt: a generation that writes it has begun a new item


@dataclass(frozen=True)
class Calculator:
    """One calculator: where its explanation lives, how its inputs are sampled and written as a note."""

    module: str  # medcalc.<module>
    function: str  # its `*_explanation(inputs) -> {"Explanation", "Answer"}`
    question: str
    kind: str  # "integer" (exact match) or "decimal" (within ±5 %)
    sample: Callable[[random.Random], dict]
    note: Callable[[dict], str]


def _yes(flag: bool, yes: str, no: str) -> str:
    return yes if flag else no


def _centor(r: random.Random) -> dict:
    return {"age": (r.randint(4, 80), "years"),
            "temperature": (round(r.uniform(36.5, 40.0), 1), "degrees celsius"),
            "exudate_swelling_tonsils": r.random() < 0.5, "tender_lymph_nodes": r.random() < 0.5,
            "cough_absent": r.random() < 0.5}


def _centor_note(x: dict) -> str:
    return (f"A {x['age'][0]}-year-old patient presents with a sore throat. Temperature is {x['temperature'][0]} °C. "
            + _yes(x["exudate_swelling_tonsils"], "The tonsils are swollen with exudate. ",
                   "There is no tonsillar exudate or swelling. ")
            + _yes(x["tender_lymph_nodes"], "Anterior cervical lymph nodes are tender and swollen. ",
                   "There are no tender cervical lymph nodes. ")
            + _yes(x["cough_absent"], "The patient has no cough.", "The patient reports a cough."))


def _curb65(r: random.Random) -> dict:
    return {"age": (r.randint(20, 90), "years"), "sys_bp": (float(r.randint(80, 160)), "mm hg"),
            "dia_bp": (float(r.randint(45, 100)), "mm hg"),
            "respiratory_rate": (float(r.randint(12, 36)), "breaths per minute"),
            "bun": (float(r.randint(8, 45)), "mg/dL"), "confusion": r.random() < 0.3}


def _curb65_note(x: dict) -> str:
    return (f"A {x['age'][0]}-year-old patient is admitted with pneumonia. Blood pressure is "
            f"{x['sys_bp'][0]:g}/{x['dia_bp'][0]:g} mm Hg and the respiratory rate is {x['respiratory_rate'][0]:g} "
            f"breaths per minute. BUN is {x['bun'][0]:g} mg/dL. "
            + _yes(x["confusion"], "The patient is confused.", "The patient is alert and not confused."))


def _cha2ds2(r: random.Random) -> dict:
    flags = {k: r.random() < 0.3 for k in ("chf", "hypertension", "stroke", "tia", "thromboembolism",
                                            "vascular_disease", "diabetes")}
    return {"age": (r.randint(40, 90), "years"), "sex": r.choice(["Male", "Female"]), **flags}


HISTORY = {"chf": "congestive heart failure", "hypertension": "hypertension", "stroke": "a prior stroke",
           "tia": "a transient ischemic attack", "thromboembolism": "thromboembolism",
           "vascular_disease": "vascular disease", "diabetes": "diabetes"}


def _cha2ds2_note(x: dict) -> str:
    has = [v for k, v in HISTORY.items() if x[k]]
    lacks = [v for k, v in HISTORY.items() if not x[k]]
    text = f"A {x['age'][0]}-year-old {x['sex'].lower()} patient with atrial fibrillation. "
    text += f"History of {', '.join(has)}. " if has else ""
    return text + (f"No history of {', '.join(lacks)}." if lacks else "")


GCS = {"best_eye_response": ["eyes open spontaneously", "eye opening to verbal command", "eye opening to pain",
                             "no eye opening"],
       "best_verbal_response": ["oriented", "confused", "inappropriate words", "incomprehensible sounds",
                                "no verbal response"],
       "best_motor_response": ["obeys commands", "localizes pain", "withdrawal from pain", "flexion to pain",
                               "extension to pain", "no motor response"]}


def _gcs(r: random.Random) -> dict:
    return {k: r.choice(v) for k, v in GCS.items()}


def _gcs_note(x: dict) -> str:
    return (f"A patient is brought in after a fall. Examination: best eye response '{x['best_eye_response']}', "
            f"best verbal response '{x['best_verbal_response']}', best motor response "
            f"'{x['best_motor_response']}'.")


def _map(r: random.Random) -> dict:
    return {"sys_bp": (float(r.randint(90, 180)), "mm hg"), "dia_bp": (float(r.randint(50, 110)), "mm hg")}


def _map_note(x: dict) -> str:
    return f"A patient's blood pressure is {x['sys_bp'][0]:g}/{x['dia_bp'][0]:g} mm Hg."


def _bazett(r: random.Random) -> dict:
    return {"heart_rate": (r.randint(45, 150), "beats per minute"), "qt_interval": (r.randint(300, 500), "msec")}


def _bazett_note(x: dict) -> str:
    return (f"An ECG shows a heart rate of {x['heart_rate'][0]} beats per minute and a QT interval of "
            f"{x['qt_interval'][0]} msec.")


def _bmi(r: random.Random) -> dict:
    return {"weight": (float(r.randint(45, 130)), "kg"), "height": (float(r.randint(150, 200)), "cm")}


def _bmi_note(x: dict) -> str:
    return f"A patient weighs {x['weight'][0]:g} kg and is {x['height'][0]:g} cm tall."


CALCULATORS: dict[str, Calculator] = {
    "centor": Calculator("centor_score", "compute_centor_score_explanation", "What is the patient's Centor Score?",
                         "integer", _centor, _centor_note),
    "curb_65": Calculator("curb_65", "curb_65_explanation", "What is the patient's CURB-65 score?", "integer",
                          _curb65, _curb65_note),
    "cha2ds2_vasc": Calculator("cha2ds2_vasc_score", "generate_cha2ds2_vasc_explanation",
                               "What is the patient's CHA2DS2-VASc Score?", "integer", _cha2ds2, _cha2ds2_note),
    "glasgow_coma": Calculator("glasgow_coma_score", "compute_glasgow_coma_score_explanation",
                               "What is the patient's Glasgow Coma Score?", "integer", _gcs, _gcs_note),
    "mean_arterial_pressure": Calculator("mean_arterial_pressure", "mean_arterial_pressure_explanation",
                                         "What is the patient's mean arterial pressure in mm Hg?", "decimal", _map,
                                         _map_note),
    "qtc_bazett": Calculator("qt_calculator_bazett", "bazett_calculator_explanation",
                             "What is the patient's corrected QT interval in msec using the Bazett formula?",
                             "decimal", _bazett, _bazett_note),
    "bmi": Calculator("bmi_calculator", "bmi_calculator_explanation", "What is the patient's BMI in kg/m^2?",
                      "decimal", _bmi, _bmi_note),
}


def _explain(calc: Calculator, inputs: dict) -> dict:
    try:
        module = importlib.import_module(f"medcalc.{calc.module}")
    except ImportError as e:
        raise ImportError("MedCalc-style items need the medcalc-bench package: pip install 'adaptguard[medcalc]' "
                          "(or pip install medcalc-bench)") from e
    return getattr(module, calc.function)(dict(inputs))


def tidy(text: str) -> str:
    """The rationale without its source-code indentation and blank lines (the same words, fewer tokens)."""
    return "\n".join(line.strip() for line in text.strip().splitlines() if line.strip())


def format_answer(value, kind: str) -> str:
    return str(int(round(float(value)))) if kind == "integer" else f"{float(value):g}"


def medcalc_items(calculators: list[str] | tuple[str, ...], n_per_calculator: int, seed: int = 0) -> list[dict]:
    """`n_per_calculator` items of each calculator (inputs drawn from `random.Random(f"{seed}-{name}")`, distinct
    notes only), interleaved in calculator order. Each: `prompt` (note + question), `completion` (rationale +
    `Answer: <value>`), `answer`, `kind`, `calculator`, `inputs` (the sampled inputs as JSON)."""
    unknown = [c for c in calculators if c not in CALCULATORS]
    if unknown:
        raise ValueError(f"calculators: unknown {unknown}; known: {', '.join(CALCULATORS)}")
    per = {}
    for name in calculators:
        calc, rng, seen, rows = CALCULATORS[name], random.Random(f"{seed}-{name}"), set(), []
        for _ in range(100 * n_per_calculator):
            if len(rows) == n_per_calculator:
                break
            inputs = calc.sample(rng)
            note = calc.note(inputs)
            if note in seen:
                continue
            seen.add(note)
            out = _explain(calc, inputs)
            answer = format_answer(out["Answer"], calc.kind)
            rows.append({"prompt": f"{NOTE_PREFIX} {note}\nQuestion: {calc.question}\nExplanation:",
                         "completion": f" {tidy(out['Explanation'])}\n{ANSWER_PREFIX} {answer}", "answer": answer,
                         "kind": calc.kind, "calculator": name, "inputs": json.dumps(inputs)})
        if len(rows) < n_per_calculator:
            raise ValueError(f"calculator {name}: only {len(rows)} distinct notes, {n_per_calculator} asked")
        per[name] = rows
    return [per[name][i] for i in range(n_per_calculator) for name in calculators]


def medcalc_splits(calculators: list[str] | tuple[str, ...], n_train: int, n_dev: int, n_test: int, seed: int = 0
                   ) -> dict[str, list[dict]]:
    """{train, dev, test}: `n_*` items per calculator each, disjoint (every note distinct), from one draw."""
    n = n_train + n_dev + n_test
    rows = medcalc_items(calculators, n, seed)
    k = len(calculators)
    return {"train": rows[:n_train * k], "dev": rows[n_train * k:(n_train + n_dev) * k],
            "test": rows[(n_train + n_dev) * k:n * k]}


def medcalc_dataset(calculators: list[str] | tuple[str, ...] = tuple(CALCULATORS), n_per_calculator: int = 100,
                    seed: int = 0):
    """`medcalc_items` as a `datasets.Dataset` (prompt/completion rows: SFTTrainer trains on them as they are)."""
    from datasets import Dataset

    return Dataset.from_list(medcalc_items(calculators, n_per_calculator, seed))


def final_answer(text: str) -> str | None:
    """The value after the last `Answer:` of a generation (a number, possibly signed or decimal), or None."""
    tail = text.rsplit(ANSWER_PREFIX, 1)
    if len(tail) < 2:
        return None
    match = re.search(r"-?\d+(?:\.\d+)?", tail[1])
    return match.group(0) if match else None


def is_correct(generation: str, answer: str, kind: str) -> bool:
    """MedCalc-Bench's rule on the final answer: equal for integer scores, within ±5 % of the gold for decimals."""
    got = final_answer(generation)
    if got is None:
        return False
    if kind == "integer":
        return float(got) == float(answer)
    if kind == "decimal":
        gold = float(answer)
        return abs(float(got) - gold) <= 0.05 * abs(gold)
    raise ValueError(f"kind must be 'integer' or 'decimal', got {kind!r}")
