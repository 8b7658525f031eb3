"""ClinHallu (stage-wise hallucination in medical VQA reasoning traces): trace parsing,
prompts, the stage-replacement protocol. The builder is ``datasets/clinhallu/`` and the
metric ``metrics/clinhallu/``."""
