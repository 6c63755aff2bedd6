"""Real evaluation data that installs offline from PyPI: BIG-bench task JSONs (`bigbench`, as rows and as lm-eval
task folders) and MedCalc-Bench-style items with worked answers (`medcalc`)."""
