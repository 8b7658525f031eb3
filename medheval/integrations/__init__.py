"""Our benchmarks inside other evaluation harnesses: lmms-eval tasks, inspect_ai tasks and model provider,
and the Hub's benchmark registration (``eval.yaml``).

Prompts, generation settings and scorers come from the same code that ``medheval run`` uses, so a split
scored through any harness gives the numbers ``medheval run --predictions`` gives on the same outputs.
"""
