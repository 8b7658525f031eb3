"""Issue 32, point 2: ``-M mitigation=…`` in the forms inspect's CLI hands over (tests/test_interop_inspect_provider.py
runs them through inspect's own parser); these need no inspect install."""

from __future__ import annotations

import pytest

from medheval.integrations.inspect.model_args import EXPECTED, mitigation_spec, resolve_mitigation
from medheval.mitigations import MitigationError, get_mitigation

VCD = get_mitigation("vcd:alpha=1,beta=0.1").spec()


@pytest.mark.parametrize("value", ["vcd:alpha=1,beta=0.1", ["vcd:alpha=1", "beta=0.1"], ["vcd:alpha=1", " beta=0.1"],
                                   {"name": "vcd", "alpha": 1, "beta": 0.1}])
def test_every_accepted_form_is_the_same_mitigation(value):
    assert resolve_mitigation(value).spec() == VCD


def test_list_options_and_no_mitigation():
    assert mitigation_spec({"name": "pai", "layers": [0, 2]}) == "pai:layers=0/2"
    assert mitigation_spec({"name": "vcd"}) == "vcd"
    assert resolve_mitigation(None) is None and resolve_mitigation("none") is None


@pytest.mark.parametrize("value, received", [
    (["vcdd:alpha=1", "beta=0.1"], "received ['vcdd:alpha=1', 'beta=0.1'] (read as 'vcdd:alpha=1,beta=0.1'): "
                                   "unknown mitigation 'vcdd'"),
    (3, "received 3 (int)"),
    ({"alpha": 1}, "received {'alpha': 1} (dict)"),
    ("vcd:alpha", "received 'vcd:alpha': mitigation option 'alpha' in 'vcd:alpha' is not key=value"),
])
def test_a_bad_value_names_what_was_received_and_what_is_expected(value, received):
    with pytest.raises(MitigationError) as caught:
        resolve_mitigation(value)
    assert received in str(caught.value) and str(caught.value).endswith(EXPECTED)
