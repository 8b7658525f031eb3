"""Only the user approves a non-local endpoint for credentialed (MIMIC) records: a grid YAML that approves its own
host is refused before anything is sent; the command line or MEDHEVAL_ALLOW_REMOTE_CREDENTIALED approves it.
What leaves is seen by a recording proxy on 127.0.0.1 (the remote hosts are reached only through it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from judge_servers import JudgeServer, recording_proxy  # noqa: F401 - a fixture
from medheval.cli import main
from medheval.judges import CredentialedDataError, JudgeRequest, make_judge
from medheval.judges.endpoints import APPROVED_ENV, approve_endpoints, set_approved_endpoints

JUDGE = "http://judge.example/v1"
FAST = dict(cache_dir=False, progress=False, max_retries=0)


@pytest.fixture(autouse=True)
def clean(monkeypatch: pytest.MonkeyPatch):
    for name in ("OPENAI_API_KEY", APPROVED_ENV, "MEDHEVAL_API_KEY_HOSTS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MEDHEVAL_PROXY_FOR", "judge.example,models.example.org")  # so an approved call is seen
    previous = set_approved_endpoints(())
    yield
    set_approved_endpoints(previous)


def _grid(tmp_path: Path, fixture: dict, model: str, benchmark: str, **extra) -> Path:
    config = {"output": str(tmp_path / "out"), "models": [model], "benchmarks": [benchmark],
              "data_dir": fixture["data_dir"], "image_roots": dict(fixture["image_roots"]), "limit": 2, **extra}
    path = tmp_path / "hostile.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


JUDGE_DICT = {"backend": "openai", "model": "j", "base_url": JUDGE}
HOSTILE = {  # where a config puts its approval -> the field the error names
    "top level": ({"judge": f"openai:j@{JUDGE}", "allow_remote_credentialed": ["judge.example"]},
                  "allow_remote_credentialed"),
    "metric option": ({"metric_options": {"sh_judge": {"judge": JUDGE_DICT, "cache_dir": False,
                                                       "allow_remote_credentialed": "judge.example"}}},
                      "metric_options.sh_judge.allow_remote_credentialed"),
    "judge dict": ({"metric_options": {"sh_judge": {"cache_dir": False, "judge": {
        **JUDGE_DICT, "allow_remote_credentialed": JUDGE}}}}, "metric_options.sh_judge.judge.allow_remote_credentialed"),
    "judge dict as JSON text": ({"metric_options": {"sh_judge": {"cache_dir": False, "judge": json.dumps(
        {**JUDGE_DICT, "allow_remote_credentialed": ["judge.example"]})}}},
        "metric_options.sh_judge.judge.allow_remote_credentialed"),
}


@pytest.mark.parametrize("where", list(HOSTILE))
def test_a_grid_config_cannot_approve_its_own_judge_for_mimic_records(where, fixture_benchmark, recording_proxy,
                                                                      tmp_path, capsys):
    extra, field = HOSTILE[where]
    with JudgeServer("openai", reply=lambda body: "An answer.") as model:
        config = _grid(tmp_path, fixture_benchmark, f"openai:m@{model.base_url}", "knowledge:open",
                       metrics=["sh_judge"], **extra)
        assert main(["run", "--config", str(config)]) == 2
        assert model.requests == [] and recording_proxy.hits == []  # refused before anything ran
    err = capsys.readouterr().err
    assert f"hostile.yaml: {field}:" in err and "judge.example" in err
    assert "--allow-remote-credentialed" in err and "a config file cannot approve" in err


@pytest.mark.parametrize("how", ["flag", "environment"])
def test_the_user_approves_the_configs_judge_on_the_command_line_or_in_the_environment(
        how, fixture_benchmark, recording_proxy, tmp_path, monkeypatch):
    extra, _ = HOSTILE["judge dict"]
    with JudgeServer("openai", reply=lambda body: "An answer.") as model:
        config = _grid(tmp_path, fixture_benchmark, f"openai:m@{model.base_url}", "knowledge:open",
                       metrics=["sh_judge"], **extra)
        argv = ["run", "--config", str(config)]
        if how == "flag":
            argv += ["--allow-remote-credentialed", "judge.example"]
        else:
            monkeypatch.setenv(APPROVED_ENV, "other.example, judge.example")
        assert main(argv) == 0
        assert model.request_count == 2
    assert recording_proxy.hits == [f"{JUDGE}/chat/completions"] * 2  # the approved judge got the records


def test_a_grid_config_cannot_approve_its_api_model_for_mimic_records(fixture_benchmark, recording_proxy,
                                                                      tmp_path, capsys):
    remote = "openai:m@http://models.example.org/v1"
    config = _grid(tmp_path, fixture_benchmark, remote, "cxr_vishal:mimic_cxr",
                   allow_remote_credentialed=["models.example.org"])
    assert main(["run", "--config", str(config), "--max-new-tokens", "4"]) == 2
    assert recording_proxy.hits == []
    err = capsys.readouterr().err
    assert "hostile.yaml: allow_remote_credentialed:" in err and "--allow-remote-credentialed models.example.org" in err
    # the same host typed on the command line: the model gets the records
    assert main(["run", "--config", str(config), "--max-new-tokens", "4", "--allow-remote-credentialed",
                 "models.example.org", "--api-option", "max_retries=0"]) == 0
    assert recording_proxy.hits and set(recording_proxy.hits) == {"http://models.example.org/v1/chat/completions"}


def test_the_environment_and_python_approve_an_endpoint_and_nothing_else(monkeypatch, recording_proxy):
    request = JudgeRequest(id="mimic-1", messages=[{"role": "user", "content": "report"}], reply_format="raw",
                           credentialed=True)
    with pytest.raises(CredentialedDataError, match="MEDHEVAL_ALLOW_REMOTE_CREDENTIALED=judge.example"):
        make_judge(f"openai:j@{JUDGE}", **FAST).run([request])
    monkeypatch.setenv(APPROVED_ENV, "judge.example.org")  # another host approves nothing here
    with pytest.raises(CredentialedDataError):
        make_judge(f"openai:j@{JUDGE}", **FAST).run([request])
    assert recording_proxy.hits == []
    monkeypatch.setenv(APPROVED_ENV, "judge.example")
    assert make_judge(f"openai:j@{JUDGE}", **FAST).run([request])[0].ok
    monkeypatch.delenv(APPROVED_ENV)
    approve_endpoints(JUDGE)  # from Python: the caller is the user
    assert make_judge(f"openai:j@{JUDGE}", **FAST).run([request])[0].ok
    assert recording_proxy.hits == [f"{JUDGE}/chat/completions"] * 2


def test_a_config_value_is_accepted_only_within_what_the_user_approved(tmp_path, fixture_benchmark):
    from medheval.run.grids import GridConfigError, check_credentialed_approvals, parse_grid_config

    def config(value):
        return parse_grid_config({"output": str(tmp_path), "models": ["tiny-random-llava"],
                                  "benchmarks": ["knowledge:open"], "allow_remote_credentialed": value}, "g.yaml")

    check_credentialed_approvals(config(["judge.example:8443", f"{JUDGE}/"]), ["judge.example"])
    check_credentialed_approvals(config([JUDGE]), [JUDGE])
    for value, typed in ((["judge.example"], [JUDGE]), (["https://judge.example/v2"], [JUDGE]),
                         (["judge.example"], ["judge.example:8443"]), (["example"], ["judge.example"])):
        with pytest.raises(GridConfigError, match=r"g.yaml: allow_remote_credentialed: approves"):
            check_credentialed_approvals(config(value), typed)
    bad = parse_grid_config({"output": str(tmp_path), "models": ["tiny-random-llava"], "benchmarks": ["knowledge:open"],
                             "metric_options": {"sh_judge": {"judge": {**JUDGE_DICT,
                                                                       "allow_remote_credentialed": True}}}}, "g.yaml")
    with pytest.raises(GridConfigError, match=r"g.yaml: metric_options.sh_judge.judge.allow_remote_credentialed: .*True"):
        check_credentialed_approvals(bad, [])



def test_run_config_from_python_holds_the_config_to_the_callers_approvals(tmp_path, fixture_benchmark, monkeypatch):
    """Was: only `medheval run --config` (apply_cli) checked a config's approvals; run_config(config) from Python
    accepted them. Now run_config checks first, whoever calls it: the caller's approvals are its argument."""
    from medheval.run import grids
    from medheval.run.grids import GridConfigError, load_grid_config, run_config

    class Loaded(Exception):
        """The first model loads: the grid was accepted."""

    def load(args):
        raise Loaded(args.model)

    monkeypatch.setattr(grids, "check_model", lambda model: None)
    config = load_grid_config(_grid(tmp_path, fixture_benchmark, "tiny-random-llava", "knowledge:open",
                                    allow_remote_credentialed=["judge.example"]))
    output = Path(config.output)
    with pytest.raises(GridConfigError, match=r"hostile.yaml: allow_remote_credentialed: approves 'judge.example' "
                                              r"for credentialed \(MIMIC\) records, but a config file cannot approve"):
        run_config(config, build_backend=load)
    assert not output.exists()
    with pytest.raises(GridConfigError):  # an approval that does not cover it approves nothing
        run_config(config, build_backend=load, allow_remote_credentialed=["other.example"])
    assert not output.exists()
    with pytest.raises(Loaded):
        run_config(config, build_backend=load, allow_remote_credentialed=["judge.example"])
    assert (output / "grid.json").is_file()

# endpoint_allowed(url, [entry]): a host entry approves that host on any port, host:port that port (a URL's port
# defaulting to its scheme's), a base URL only the same base URL; case, trailing dot and IPv6 brackets ignored
ENDPOINT_ANSWERS = [
    ("https://example.org/v1", "example.org", True),
    ("https://example.org:8080/v1", "example.org", True),
    ("https://Example.ORG./v1", "example.org", True),
    ("https://example.org/v1", "EXAMPLE.org.", True),
    ("https://a.example.org/v1", "example.org", False),
    ("https://example.org/v1", "example.org:443", True),
    ("https://example.org:443/v1", "example.org:443", True),
    ("https://example.org:8080/v1", "example.org:443", False),
    ("http://example.org/v1", "example.org:80", True),
    ("http://example.org/v1", "example.org:443", False),
    ("https://example.org/v1", "https://example.org:443/v1", True),
    ("https://example.org/v1/", "https://EXAMPLE.org./v1", True),
    ("https://example.org/v1", "https://example.org/v2", False),
    ("https://example.org/v1", "https://example.org/V1", False),  # a path is compared as written
    ("https://example.org/v1", "https://example.org", False),
    ("https://example.org/v1", "http://example.org/v1", False),
    ("https://example.org:8443/v1", "https://example.org/v1", False),
    ("https://example.org/v1", "example.org/v1", False),  # neither a host nor a URL: names nothing
    ("https://example.org/v1", "example.org/", True),  # a host typed with a trailing slash is that host
    ("https://example.org:8080/v1", "example.org:443/", False),
    ("https://[2001:db8::1]:8443/v1", "[2001:db8::1]", True),
    ("https://[2001:db8::1]:8443/v1", "2001:db8::1", True),
    ("https://[2001:db8::1]:8443/v1", "[2001:db8::1]:8443", True),
    ("https://[2001:db8::1]/v1", "[2001:db8::1]:443", True),
    ("https://[2001:db8::1]:8443/v1", "[2001:db8::1]:443", False),
    ("https://[2001:db8::1]:8443/v1", "https://[2001:DB8::1]:8443/v1", True),
]


@pytest.mark.parametrize("url, entry, allowed", ENDPOINT_ANSWERS)
def test_endpoint_allowed_known_answers(url, entry, allowed):
    from medheval.judges.endpoints import endpoint_allowed
    assert endpoint_allowed(url, (entry,)) is allowed


# entry_approved(config entry, [user entry]): covered only when everything the config entry approves is approved
ENTRY_ANSWERS = [
    ("example.org", "example.org", True),
    ("EXAMPLE.org.", "example.org", True),
    ("example.org", "example.org:443", False),  # the config's host would approve example.org:8080 too
    ("example.org", "https://example.org", False),
    ("a.example.org", "example.org", False),
    ("example.org:443", "example.org", True),
    ("example.org:443", "example.org:443", True),
    ("example.org:443", "example.org.:443", True),
    ("example.org:8443", "example.org:443", False),
    ("example.org:443", "https://example.org", False),  # a bare host:port is any scheme on that port
    ("example.org:8443", "https://example.org:8443", False),
    ("https://example.org/v1", "example.org", True),
    ("https://example.org/v1", "example.org:443", True),
    ("https://example.org:8443/v1", "example.org:443", False),
    ("http://example.org/v1", "example.org:80", True),
    ("https://example.org/v1", "example.org:80", False),
    ("https://example.org/v1", "https://EXAMPLE.org.:443/v1/", True),
    ("https://example.org/v1", "https://example.org", False),
    ("https://example.org", "https://example.org/v1", False),
    ("http://example.org/v1", "https://example.org/v1", False),
    ("[2001:db8::1]", "2001:db8::1", True),
    ("2001:db8::1", "[2001:db8::1]", True),
    ("[2001:db8::1]:8443", "[2001:db8::1]", True),
    ("[2001:db8::1]", "[2001:db8::1]:443", False),
    ("https://[2001:db8::1]:8443/v1", "[2001:db8::1]:8443", True),
    ("https://[2001:db8::1]/v1", "[2001:db8::1]:8443", False),
    ("example.org/v1", "example.org/v1", False),  # names no endpoint
    ("example.org/", "example.org", True),
    ("example.org", "example.org/", True),
    ("example.org/", "example.org:443/", False),
]


@pytest.mark.parametrize("config_entry, user_entry, covered", ENTRY_ANSWERS)
def test_entry_approved_known_answers(config_entry, user_entry, covered):
    from medheval.judges.endpoints import entry_approved
    assert entry_approved(config_entry, (user_entry,)) is covered


def test_a_host_port_approval_does_not_widen_into_the_configs_bare_host(fixture_benchmark, recording_proxy,
                                                                       tmp_path, capsys):
    """The user approves judge.example:443; a config naming judge.example (any port) is refused, and its judge on
    judge.example:8080 gets nothing, from the config or from the user's approval."""
    request = JudgeRequest(id="mimic-1", messages=[{"role": "user", "content": "report"}], reply_format="raw",
                           credentialed=True)
    approve_endpoints("judge.example:443")
    with pytest.raises(CredentialedDataError):
        make_judge("openai:j@http://judge.example:8080/v1", **FAST).run([request])
    judge = {**JUDGE_DICT, "base_url": "http://judge.example:8080/v1", "allow_remote_credentialed": "judge.example"}
    with JudgeServer("openai", reply=lambda body: "An answer.") as model:
        config = _grid(tmp_path, fixture_benchmark, f"openai:m@{model.base_url}", "knowledge:open",
                       metrics=["sh_judge"], metric_options={"sh_judge": {"cache_dir": False, "judge": judge}})
        assert main(["run", "--config", str(config), "--allow-remote-credentialed", "judge.example:443"]) == 2
        assert model.requests == []
    assert recording_proxy.hits == []
    err = capsys.readouterr().err
    assert "metric_options.sh_judge.judge.allow_remote_credentialed: approves 'judge.example'" in err


def test_a_path_without_a_scheme_is_refused_as_an_approval_wherever_it_is_given(tmp_path, monkeypatch, recording_proxy):
    """``judge.example/v1`` would approve nothing (not a host, not a base URL), while the key-host list read it as
    the whole host: it is refused where it is given, the error naming the place and both forms that work."""
    from medheval.run.grids import GridConfigError, check_credentialed_approvals, parse_grid_config

    says = (r"'judge.example/v1' is neither a host nor a URL: give either the host \(judge.example\), which names "
            r"every path on it, or a base URL with its scheme \(https://judge.example/v1\)")
    with pytest.raises(ValueError, match=r"^allow_remote_credentialed: " + says):
        make_judge(f"openai:j@{JUDGE}", allow_remote_credentialed="judge.example/v1", **FAST)
    with pytest.raises(ValueError, match=r"^allow_remote_credentialed: " + says):
        approve_endpoints("judge.example/v1")
    config = parse_grid_config({"output": str(tmp_path), "models": ["tiny-random-llava"],
                                "benchmarks": ["knowledge:open"], "allow_remote_credentialed": ["judge.example/v1"]},
                               "g.yaml")
    with pytest.raises(GridConfigError, match=r"g.yaml: allow_remote_credentialed: .*" + says):
        check_credentialed_approvals(config, ["judge.example"])
    monkeypatch.setenv(APPROVED_ENV, "judge.example/v1")
    request = JudgeRequest(id="mimic-1", messages=[{"role": "user", "content": "report"}], reply_format="raw",
                           credentialed=True)
    with pytest.raises(ValueError, match=r"^MEDHEVAL_ALLOW_REMOTE_CREDENTIALED: " + says):
        make_judge(f"openai:j@{JUDGE}", **FAST).run([request])
    assert recording_proxy.hits == []
