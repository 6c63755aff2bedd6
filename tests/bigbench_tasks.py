"""Two small BIG-bench tasks in BIG-bench's task.json form: shared by tests/data/test_bigbench.py and
tests/studies/test_real_experiments.py."""

TOY = {"task_prefix": "Is it true?", "append_choices_to_input": False, "examples": [
    {"input": "The sky is blue.", "target_scores": {"T": 1, "F": 0}},
    {"input": "Fish fly.", "target_scores": {"T": 0, "F": 1}},
    {"input": "Ambiguous.", "target_scores": {"T": 1, "F": 1}},  # no single right answer: dropped
    {"input": "Generative only.", "target": "x"},  # not multiple choice: dropped
]}
QA = {"examples": [{"input": "2 + 2?", "target_scores": {"3": 0, "4": 1, "5": 0}}]}
