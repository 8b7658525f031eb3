"""inspect_ai integration: the ``medheval/<benchmark>`` tasks and the ``medheval/<model>`` model provider,
found by inspect through the ``inspect_ai`` entry point (:mod:`medheval.integrations.inspect._registry`)."""
