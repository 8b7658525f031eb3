"""Benchmark families: everything specific to one family (its annotation source, prompts, fixtures, and its protocol when it is more than answer-then-score)."""
