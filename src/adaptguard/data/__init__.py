"""Real evaluation data that installs offline from PyPI: BIG-bench task JSONs (`bigbench`) and the chat-format QA
sets of OpenAI's `evals` (`openai_evals`), as rows and as lm-eval task folders."""
