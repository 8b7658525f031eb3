"""Model-based radiology-report metrics: RadGraph F1 and RaTEScore.

Each metric is split in two so the arithmetic can be checked by hand without any model:

- ``radgraph_rewards`` / ``ratescore_scoring``: pure functions over extracted entities (and, for
  RaTEScore, their embeddings); no model, no torch import for RadGraph.
- ``radgraph_model`` / ``ratescore_model``: loading the models from user-given local paths (or an
  explicit Hub reference) and running them; errors say which option or environment variable to set.
- ``tiny_models``: tiny random-weight models with the real folder layouts (tests, docs, demos).

Importing this package imports nothing heavy; the model modules import torch/transformers (and, for
RadGraph, the ``radgraph`` package) only when a model is loaded.
"""
