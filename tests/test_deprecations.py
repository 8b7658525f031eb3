"""No deprecation from our own code: the test configuration turns deprecations raised from medheval (or its
metric and mitigation folders) into errors, and decoding on every family logs no transformers deprecation."""

from __future__ import annotations

import logging
import warnings

import pytest
import torch

from medheval.decoding import internals
from medheval.mitigations import selftest


def _warn_from(module: str, category: type[Warning]) -> None:
    warnings.warn_explicit("old API", category, filename=f"{module.replace('.', '/')}.py", lineno=1, module=module)


@pytest.mark.parametrize("category", [FutureWarning, DeprecationWarning])
@pytest.mark.parametrize("module", ["medheval.decoding.internals", "medheval", "medheval_units.metrics.chair",
                                    "evaluate_modules.metrics.chair.0123abcd.chair",
                                    "transformers_modules.vcd.custom_generate.generate"])
def test_deprecations_from_our_code_are_errors(module, category):
    with pytest.raises(category, match="old API"):
        _warn_from(module, category)


@pytest.mark.parametrize("module", ["transformers.generation.utils", "datasets.load", "medhevalish.other", "tests_x"])
def test_deprecations_inside_third_party_code_stay_warnings(module):
    with pytest.warns(FutureWarning, match="old API"):
        _warn_from(module, FutureWarning)


@pytest.mark.skipif(internals.cache_argument() != "cache", reason="the installed transformers predates the `cache` name")
def test_the_old_cache_name_from_our_code_fails_the_tests():
    """What transformers 5.24 did to the decoding core: the old name only warned (from our call site)."""
    model, processor = selftest._build("llava")
    inputs = selftest._inputs(processor, [0])
    with pytest.warns(FutureWarning, match="past_key_values"):  # attributed to this test module: a warning
        model.prepare_inputs_for_generation(inputs["input_ids"], past_key_values=internals.new_cache(model),
                                            is_first_iteration=True)
    with pytest.raises(FutureWarning, match="past_key_values"):
        internals.prepare_step_inputs(model, inputs["input_ids"], {"past_key_values": internals.new_cache(model)},
                                      first=True)


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.mark.parametrize("family", ["llava", "qwen2_5_vl", "gemma3"])
def test_decoding_logs_no_transformers_deprecation(family):
    """transformers announces some deprecations through its logger (once per process): none from any mitigation."""
    from transformers.utils import logging as hf_logging

    model, processor = selftest._build(family)
    inputs = selftest._inputs(processor, [0, 2])
    handler = _Records()
    logger = logging.getLogger("transformers")
    hf_logging.warning_once.cache_clear()
    logger.addHandler(handler)
    try:
        for name, case in selftest.METHODS.items():
            if family in case.families:
                with torch.no_grad():
                    out = model.generate(**inputs, max_new_tokens=3, do_sample=False, custom_generate=case.moving(),
                                         return_dict_in_generate=True)
                assert out.sequences.shape[0] == 2
                if case.two_stream:
                    model.generate(**inputs, max_new_tokens=3, do_sample=False, custom_generate=case.moving().two_pass())
    finally:
        logger.removeHandler(handler)
    deprecations = [m for m in handler.messages if "deprecat" in m.lower()]
    assert deprecations == []
