"""Each secret reaches only the party it belongs to (security audit: key choice by config, image credentials per
host, plain http, short passwords, terminal escapes), checked by what a 127.0.0.1 server receives."""

from __future__ import annotations

import base64
import http.server
import json
import logging
import os
import threading
from pathlib import Path

import pytest

from judge_servers import JudgeServer, Reply
from medheval.cli import main
from medheval.cli.main import build_parser, cli_key_hosts
from medheval.data.images import URLTemplateSource, _host_env_prefix
from medheval.judges import JudgeError, JudgeRequest, make_judge
from medheval.net import keys
from medheval.net.hosts import host_entry
from medheval.net.secrets import SHORT_MIN_LENGTH, redact, register_basic_auth, register_environment, register_secrets
from medheval.net.untrusted import printable

KEY = "sk-dest-canary-Rr52-openai"
FAST = dict(cache_dir=False, progress=False, max_retries=0)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.endswith(("_USERNAME", "_PASSWORD", "_API_KEY")) or name in (
                keys.KEY_HOSTS_ENV, "MEDHEVAL_IMAGE_HOST", "NETRC", "AZURE_OPENAI_ENDPOINT"):
            monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    previous = keys.set_key_hosts(())
    yield
    keys.set_key_hosts(previous)


def _ask(judge) -> None:
    judge.run([JudgeRequest(id="r", messages=[{"role": "user", "content": "q"}], reply_format="raw")])


# -- which key, to which host ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["HF_TOKEN", "PHYSIONET_PASSWORD", "MEDHEVAL_IMAGE_PASSWORD", "HF_API_KEY",
                                  "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY"])
def test_api_key_env_names_only_api_key_variables(name, monkeypatch):
    monkeypatch.setenv(name, "hf_VictimSecret0123456789")
    with JudgeServer("openai", reply=lambda body: "ok") as server:
        monkeypatch.setenv(keys.KEY_HOSTS_ENV, server.base_url)  # even at a host the user named
        with pytest.raises(JudgeError, match=r"api_key_env names .*_API_KEY"):
            make_judge({"backend": "openai", "model": "m", "base_url": server.base_url, "api_key_env": name}, **FAST)
        assert server.requests == []


def test_an_environment_key_goes_to_a_loopback_server_only_when_the_user_names_it(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with JudgeServer("openai", reply=lambda body: "ok") as server:
        _ask(make_judge(f"openai:m@{server.base_url}", **FAST))  # as a config file would name it
        assert "Authorization" not in server.requests[-1].headers
        monkeypatch.setenv(keys.KEY_HOSTS_ENV, f"other.example.org, 127.0.0.1:{server.port}")
        _ask(make_judge(f"openai:m@{server.base_url}", **FAST))
        assert server.requests[-1].headers["Authorization"] == f"Bearer {KEY}"
        monkeypatch.delenv(keys.KEY_HOSTS_ENV)
        keys.set_key_hosts(cli_key_hosts(build_parser().parse_args(
            ["run", "--judge", f"openai:m@{server.base_url}", "--output", "x"])))  # typed on the command line
        _ask(make_judge(f"openai:m@{server.base_url}", **FAST))
        assert server.requests[-1].headers["Authorization"] == f"Bearer {KEY}"


def test_a_named_api_key_env_is_refused_at_a_host_the_user_did_not_name(monkeypatch):
    monkeypatch.setenv("MY_JUDGE_API_KEY", KEY)
    with JudgeServer("openai", reply=lambda body: "ok") as server:
        spec = {"backend": "openai", "model": "m", "base_url": server.base_url, "api_key_env": "MY_JUDGE_API_KEY"}
        with pytest.raises(JudgeError) as info:
            make_judge(spec, **FAST)
        message = str(info.value)
        assert f"127.0.0.1:{server.port}" in message and keys.KEY_HOSTS_ENV in message and "--api-key-host" in message
        keys.allow_key_hosts(server.base_url)  # from Python: the caller names it
        _ask(make_judge(spec, **FAST))
        assert server.requests[-1].headers["Authorization"] == f"Bearer {KEY}"


@pytest.mark.parametrize("spec", ["openai:gpt-4o@https://judge.example.org/v1",
                                  {"backend": "anthropic", "model": "c", "base_url": "https://judge.example.org"},
                                  {"backend": "azure", "model": "d", "base_url": "https://evil.openai.azure.com"}])
def test_an_environment_key_is_refused_at_a_remote_host_nobody_named(spec, monkeypatch):
    for name in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY", "AZURE_OPENAI_API_KEY"):
        monkeypatch.setenv(name, KEY)
    monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", "https://mine.openai.azure.com")
    with pytest.raises(JudgeError, match=r"not sent to 'judge.example.org'|not sent to 'evil.openai.azure.com'"):
        make_judge(spec, **FAST)
    monkeypatch.setenv(keys.KEY_HOSTS_ENV, "judge.example.org,evil.openai.azure.com")
    make_judge(spec, **FAST)  # named: built (nothing is sent here)


def test_the_providers_own_host_keeps_its_key(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    for spec in ("openai:gpt-4o", "openai:gpt-4o@https://api.openai.com/v1", "anthropic:claude-x"):
        assert make_judge(spec, **FAST).key_withheld is None


def test_a_withheld_key_is_named_in_the_refusal_hint(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with JudgeServer("openai", reply=lambda body: "ok", api_key=KEY) as server:
        with pytest.raises(JudgeError, match=r"OPENAI_API_KEY is set but was not sent .*MEDHEVAL_API_KEY_HOSTS"):
            _ask(make_judge(f"openai:m@{server.base_url}", **FAST))


def _hostile_config(tmp_path: Path, judge: str) -> Path:
    path = tmp_path / "hostile.yaml"
    path.write_text(f"output: {tmp_path / 'out'}\nmodels: [tiny-random-llava]\nbenchmarks: [knowledge:open]\n"
                    f"metric_options:\n  sh_judge:\n    judge: {judge}\n")
    return path


@pytest.mark.parametrize("judge, expected", [
    ("{{backend: openai, model: m, base_url: '{url}', api_key_env: HF_TOKEN}}", "_API_KEY"),
    ("{{backend: openai, model: m, base_url: '{url}', api_key_env: MY_JUDGE_API_KEY}}", "MEDHEVAL_API_KEY_HOSTS"),
    ("'openai:gpt-4o@https://judge.example.org/v1'", "'judge.example.org'"),
])
def test_a_grid_config_cannot_choose_where_a_key_goes(judge, expected, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", "hf_WriteTokenOfTheVictim0123456789")
    monkeypatch.setenv("MY_JUDGE_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with JudgeServer("openai", reply=lambda body: "ok") as server:
        config = _hostile_config(tmp_path, judge.format(url=server.base_url))
        assert main(["run", "--config", str(config)]) == 2
        assert server.requests == []
    err = capsys.readouterr().err
    assert "hostile.yaml: metric_options.sh_judge.judge:" in err and expected in err
    assert KEY not in err and "hf_WriteToken" not in err


def test_a_host_named_on_the_command_line_lets_the_configs_judge_have_the_key(tmp_path, monkeypatch):
    from medheval.run.grids import apply_cli, check_config_policy, given_options, load_grid_config

    monkeypatch.setenv("MY_JUDGE_API_KEY", KEY)
    url = "https://judge.example.org/v1"
    config = _hostile_config(tmp_path, f"{{backend: openai, model: m, base_url: '{url}', api_key_env: MY_JUDGE_API_KEY}}")
    argv = ["run", "--config", str(config), "--api-key-host", "judge.example.org"]
    args = build_parser().parse_args(argv)
    with pytest.raises(Exception, match="judge.example.org"):
        check_config_policy(apply_cli(load_grid_config(config), args, given_options(argv[1:])))
    keys.set_key_hosts(cli_key_hosts(args))
    check_config_policy(apply_cli(load_grid_config(config), args, given_options(argv[1:])))



def test_run_config_from_python_sends_no_key_to_a_host_the_config_names(tmp_path, monkeypatch):
    """Was: only `medheval run --config` (apply_cli) checked where a config's judge sends a key; run_config(config)
    from Python did not. A host named from Python (keys.allow_key_hosts) lets it through."""
    from medheval.run import grids
    from medheval.run.grids import GridConfigError, load_grid_config, run_config

    monkeypatch.setenv("MY_JUDGE_API_KEY", KEY)
    monkeypatch.setattr(grids, "check_model", lambda model: None)
    judge = "{backend: openai, model: m, base_url: 'https://judge.example.org/v1', api_key_env: MY_JUDGE_API_KEY}"
    config = load_grid_config(_hostile_config(tmp_path, judge))
    with pytest.raises(GridConfigError, match="hostile.yaml: metric_options.sh_judge.judge: .*judge.example.org"):
        run_config(config, build_backend=lambda args: pytest.fail("a model loaded"))
    assert not Path(config.output).exists()
    keys.allow_key_hosts("judge.example.org")
    grids.check_config_policy(config)

def test_a_model_named_on_the_command_line_gets_its_key(fixture_benchmark, tmp_path, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with JudgeServer("openai", reply=lambda body: "Yes", api_key=KEY) as server:
        code = main(["run", "--benchmark", "mm_vishal:slake", "--model", f"openai:m@{server.base_url}",
                     "--output", str(tmp_path / "run"), "--data-dir", fixture_benchmark["data_dir"],
                     "--image-root", f"slake={fixture_benchmark['image_roots']['slake']}", "--limit", "1",
                     "--max-new-tokens", "4"])
        assert code == 0
        assert server.requests and {r.headers["Authorization"] for r in server.requests} == {f"Bearer {KEY}"}
    assert keys.named_key_hosts() == set()  # main() leaves no host named behind


# -- plain http ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [
    {"base_url": "http://judge.example.org/v1", "api_key": KEY},
    {"base_url": "http://user:pass-word-1@judge.example.org/v1"},
    {"base_url": "http://judge.example.org/v1", "headers": {"X-Api-Key": KEY}},
    {"base_url": "http://10.0.0.5:8000/v1?api-key=" + KEY},
])
def test_a_key_never_crosses_plain_http_to_another_machine(spec):
    with pytest.raises(JudgeError, match="plain http .*https://"):
        make_judge({"backend": "openai", "model": "m", **spec}, **FAST)


def test_a_key_over_http_to_loopback_is_fine():
    with JudgeServer("openai", reply=lambda body: "ok") as server:
        _ask(make_judge({"backend": "openai", "model": "m", "base_url": server.base_url, "api_key": KEY}, **FAST))
        assert server.requests[-1].headers["Authorization"] == f"Bearer {KEY}"


def test_image_credentials_never_cross_plain_http_to_another_machine(monkeypatch):
    monkeypatch.setenv("PHYSIONET_USERNAME", "reader")
    monkeypatch.setenv("PHYSIONET_PASSWORD", "physio-pass-1")
    with pytest.raises(ValueError, match="plain http to 'physionet.org'.*https://"):
        URLTemplateSource("http://physionet.org/files/mimic-cxr-jpg/2.1.0/files/{path}")
    with pytest.raises(ValueError, match="plain http"):
        URLTemplateSource("http://images.example.org/{path}", auth=("u", "p"))
    URLTemplateSource("https://physionet.org/files/mimic-cxr-jpg/2.1.0/files/{path}")  # https: fine


# -- image credentials belong to one host --------------------------------------------------------------------
class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list = []

    def do_GET(self):  # noqa: N802
        type(self).seen.append(self.headers.get("Authorization"))
        _reply(self)

    def log_message(self, *args):
        pass


def _reply(handler: http.server.BaseHTTPRequestHandler, location: str | None = None) -> None:
    """A PNG signature with status 200, or an empty 302 to ``location``."""
    body = b"" if location else b"\x89PNG\r\n\x1a\n"
    handler.send_response(302 if location else 200)
    if location:
        handler.send_header("Location", location)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


@pytest.fixture()
def image_server():
    handler = type("Handler", (_Recorder,), {"seen": []})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", handler.seen
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_the_netrc_default_entry_is_sent_to_no_host(image_server, tmp_path):
    url, seen = image_server
    netrc = tmp_path / "netrc"
    netrc.write_text("machine physionet.org login alice password PhysioNetPw1\n"
                     "default login alice password DefaultPw123\n")
    netrc.chmod(0o600)
    source = URLTemplateSource(url + "/{path}", netrc_file=str(netrc))
    source.open_bytes("a.png")
    assert source.auth_origin == "no credentials" and seen == [None]


@pytest.mark.parametrize("netrc_text", ["default login alice password DefaultPw123\n",
                                        "machine 127.0.0.1 login alice password MachinePw123\n"])
def test_requests_never_reads_the_netrc_itself(netrc_text, image_server):
    """A session that uses the environment (one for a remote host without credentialed data) would have requests
    read ~/.netrc and send its default entry to any host, over a judge's own key too: no request of
    medheval.net.transport carries anything the caller did not give. (Image sources read a host's own machine
    entry themselves.)"""
    from medheval.net import transport

    url, seen = image_server
    home = Path(os.environ["HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / ".netrc").write_text(netrc_text)
    (home / ".netrc").chmod(0o600)
    session = transport.session_for("https://images.example.org/", credentialed=False)
    assert session.trust_env  # the environment's proxies may be used here (NO_PROXY covers 127.0.0.1)
    for headers in ({}, {"Authorization": "Bearer judge-key"}):
        transport.request(session, "GET", f"{url}/a.png", headers, timeout=5, deadline=10, max_bytes=4096)
    session.auth = ("bob", "OwnPw1234")  # a caller's own credentials still go
    transport.request(session, "GET", f"{url}/a.png", timeout=5, deadline=10, max_bytes=4096)
    assert seen == [None, "Bearer judge-key", "Basic " + base64.b64encode(b"bob:OwnPw1234").decode()]


def test_the_hub_probe_sends_no_netrc_credentials(monkeypatch):
    """medheval.publish.hub_access probes the Hub (or $HF_ENDPOINT, a mirror) with a plain requests.head: requests
    then read ~/.netrc and sent its default entry (a PhysioNet login kept there) as basic auth to that host."""
    from medheval.publish import hub_access

    home = Path(os.environ["HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / ".netrc").write_text("default login alice password DefaultPw123\n")
    (home / ".netrc").chmod(0o600)
    seen: list = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_HEAD(self):  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    hub_access._probe.cache_clear()
    try:
        assert hub_access._probe(f"http://127.0.0.1:{httpd.server_address[1]}") == (True, None)
    finally:
        hub_access._probe.cache_clear()
        httpd.shutdown()
        httpd.server_close()
    assert seen == [None]


def test_generic_image_credentials_go_only_to_the_host_medheval_image_host_names(image_server, monkeypatch):
    url, seen = image_server
    monkeypatch.setenv("MEDHEVAL_IMAGE_USERNAME", "bob")
    monkeypatch.setenv("MEDHEVAL_IMAGE_PASSWORD", "ImagePw9")
    with pytest.raises(ValueError, match="MEDHEVAL_IMAGE_HOST=127.0.0.1"):
        URLTemplateSource(url + "/{path}")
    monkeypatch.setenv("MEDHEVAL_IMAGE_HOST", "images.example.org")
    URLTemplateSource(url + "/{path}").open_bytes("a.png")
    monkeypatch.setenv("MEDHEVAL_IMAGE_HOST", "images.example.org, 127.0.0.1")
    URLTemplateSource(url + "/{path}").open_bytes("a.png")
    assert seen == [None, "Basic " + base64.b64encode(b"bob:ImagePw9").decode()]


def test_medheval_image_host_with_a_port_names_that_port_only(image_server, monkeypatch):
    url, seen = image_server  # http://127.0.0.1:PORT
    port = int(url.rsplit(":", 1)[1])
    monkeypatch.setenv("MEDHEVAL_IMAGE_USERNAME", "bob")
    monkeypatch.setenv("MEDHEVAL_IMAGE_PASSWORD", "ImagePw9")
    # another port of the same host: not this server (the port used to be ignored; now matched as --api-key-host)
    monkeypatch.setenv("MEDHEVAL_IMAGE_HOST", f"127.0.0.1:{port + 1 if port < 65535 else port - 1}")
    URLTemplateSource(url + "/{path}").open_bytes("a.png")
    monkeypatch.setenv("MEDHEVAL_IMAGE_HOST", f"http://127.0.0.1:{port}/images")
    URLTemplateSource(url + "/{path}").open_bytes("a.png")
    assert seen == [None, "Basic " + base64.b64encode(b"bob:ImagePw9").decode()]


@pytest.mark.parametrize("host, prefix", [
    ("images.example.com", "IMAGES_EXAMPLE_COM"), ("images-example.com", "IMAGES__EXAMPLE_COM"),
    ("images.example-com", "IMAGES_EXAMPLE__COM"), ("www.images-example.com", "IMAGES__EXAMPLE_COM"),
    ("a--b.example.com", "A____B_EXAMPLE_COM"), ("under_score.example.com", None), ("-bad.example.com", None),
    ("physionet.org", "PHYSIONET"),
])
def test_each_host_has_its_own_credential_prefix(host, prefix, monkeypatch):
    assert _host_env_prefix(host) == prefix
    monkeypatch.setenv("IMAGES_EXAMPLE_COM_USERNAME", "bob")
    monkeypatch.setenv("IMAGES_EXAMPLE_COM_PASSWORD", "CorpImagePw9")
    source = URLTemplateSource(f"https://{host}/{{path}}")
    assert (source.auth_origin == "env IMAGES_EXAMPLE_COM_USERNAME/IMAGES_EXAMPLE_COM_PASSWORD") == (
        host == "images.example.com")


# -- one host however it is written: credentials by the canonical host, never to another -------------------
NETRC_AUTH = "Basic " + base64.b64encode(b"alice:NetrcPw77").decode()


class _Redirecting(http.server.BaseHTTPRequestHandler):
    """Records (path, Authorization) of each GET; ``/go/<n>`` answers 302 to ``moves[n]``, anything else an image."""
    seen: list = []
    moves: dict = {}

    def do_GET(self):  # noqa: N802
        type(self).seen.append((self.path, self.headers.get("Authorization")))
        _reply(self, self.moves.get(self.path.removeprefix("/go/")) if self.path.startswith("/go/") else None)

    def log_message(self, *args):
        pass


@pytest.fixture()
def recording_servers():
    """Two loopback servers (another port is another origin): yields [(port, seen, moves), ...]."""
    servers = []
    for _ in range(2):
        handler = type("Handler", (_Redirecting,), {"seen": [], "moves": {}})
        httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append((httpd, handler))
    try:
        yield [(httpd.server_address[1], handler.seen, handler.moves) for httpd, handler in servers]
    finally:
        for httpd, _ in servers:
            httpd.shutdown()
            httpd.server_close()


def _netrc(tmp_path, machine: str) -> str:
    path = tmp_path / "netrc"
    path.write_text(f"machine {machine} login alice password NetrcPw77\n")
    path.chmod(0o600)
    return str(path)


def _mapped_reachable(port: int) -> None:
    """Skip where this machine cannot reach 127.0.0.1 through its IPv4-mapped IPv6 address (no IPv6 stack)."""
    import socket

    try:
        socket.create_connection(("::ffff:127.0.0.1", port), timeout=2).close()
    except OSError:
        pytest.skip("no IPv6 socket reaches ::ffff:127.0.0.1 here")


@pytest.mark.parametrize("machine, host", [
    ("127.0.0.1", "[::ffff:127.0.0.1]"), ("127.0.0.1", "[::FFFF:7F00:1]"), ("::ffff:127.0.0.1", "127.0.0.1"),
    ("[::ffff:7f00:1]", "127.0.0.1"), ("127.0.0.1", "127.0.0.1"),
])
def test_a_netrc_machine_names_its_host_however_either_is_spelled(recording_servers, tmp_path, machine, host):
    [(port, seen, _), _] = recording_servers
    if host.startswith("["):
        _mapped_reachable(port)
    source = URLTemplateSource(f"http://{host}:{port}/img/{{path}}", netrc_file=_netrc(tmp_path, machine))
    assert source.auth_origin.startswith("netrc") and source.host == "127.0.0.1"
    source.open_bytes("a.png")
    assert seen == [("/img/a.png", NETRC_AUTH)]


@pytest.mark.parametrize("machine", ["localhost", "127.0.0.2", "127.0.0.1:{other}", "http://127.0.0.1",
                                     "[::ffff:127.0.0.2]", "alice@127.0.0.1", "127.0.0.1/img"])
def test_a_netrc_machine_for_another_host_port_or_form_sends_nothing(recording_servers, tmp_path, machine):
    [(port, seen, _), (other, _, _)] = recording_servers
    source = URLTemplateSource(f"http://127.0.0.1:{port}/img/{{path}}",
                               netrc_file=_netrc(tmp_path, machine.format(other=other)))
    source.open_bytes("a.png")
    assert source.auth_origin == "no credentials" and seen == [("/img/a.png", None)]


@pytest.mark.parametrize("machine, template", [
    ("2001:db8::1", "https://[2001:0DB8::1]/{path}"), ("[2001:DB8:0:0::1]", "https://[2001:db8::1]:8443/{path}"),
    ("images.example.org", "https://Images.Example.ORG./{path}"), ("IMAGES.example.org.", "https://images.example.org/{path}"),
])
def test_a_netrc_machine_is_compared_as_the_hosts_of_every_host_list_are(tmp_path, machine, template):
    assert URLTemplateSource(template, netrc_file=_netrc(tmp_path, machine)).auth_origin.startswith("netrc")


def test_the_generic_image_credentials_hint_names_the_canonical_host(monkeypatch):
    monkeypatch.setenv("MEDHEVAL_IMAGE_USERNAME", "bob")
    monkeypatch.setenv("MEDHEVAL_IMAGE_PASSWORD", "ImagePw9")
    with pytest.raises(ValueError, match=r"Set MEDHEVAL_IMAGE_HOST=127\.0\.0\.1 if"):
        URLTemplateSource("http://[::ffff:7f00:1]:8080/{path}")
    monkeypatch.setenv("MEDHEVAL_IMAGE_HOST", "127.0.0.1")  # the value it names matches the template's host
    assert URLTemplateSource("http://[::ffff:7f00:1]:8080/{path}").auth_origin.startswith("env MEDHEVAL_IMAGE")


@pytest.mark.parametrize("mapped", [False, True])
def test_image_credentials_never_follow_a_redirect_to_another_host(recording_servers, tmp_path, mapped):
    """Whichever way the image host is written, a redirect to another origin (another port, or the same server
    under another host name) is refused: the credentials went to the named host only, once."""
    from medheval.data.images import ImageFetchError

    [(port, seen, moves), (other, elsewhere, _)] = recording_servers
    host = "[::ffff:127.0.0.1]" if mapped else "127.0.0.1"
    if mapped:
        _mapped_reachable(port)
    moves.update({"1": f"http://127.0.0.1:{other}/x.png", "2": f"http://localhost:{port}/x.png",
                  "3": f"http://{'127.0.0.1' if mapped else '[::ffff:7f00:1]'}:{port}/moved.png"})
    source = URLTemplateSource(f"http://{host}:{port}/go/{{path}}", netrc_file=_netrc(tmp_path, "127.0.0.1"))
    for ref in ("1", "2"):
        with pytest.raises(ImageFetchError, match="another host"):
            source.open_bytes(ref)
    assert elsewhere == [] and seen == [("/go/1", NETRC_AUTH), ("/go/2", NETRC_AUTH)]
    if not mapped:
        _mapped_reachable(port)
    source.open_bytes("3")  # the same origin written the other way: followed, as one host
    assert seen[2:] == [("/go/3", NETRC_AUTH), ("/moved.png", NETRC_AUTH)]


# -- a user-info in an image root or a base URL never reaches an error ---------------------------------------
# each piece holds "qz": no error, describe() or repr may hold it in any letter case (a host is lower-cased)
HOSTILE_USERINFOS = ["uQz1:pQz2://Qz3", "Qz1://Qz2:Qz3", "uQz1:pQz2@Qz3", "uQz1:Qz2@Qz3://Qz4", "uQz1:pQz2%40Qz3",
                     "uQz1:Qz2:Qz3", "uQz1:pQz2/Qz3", "uQz1:80/Qz2", "uQz1:pQz2?Qz3", "uQz1:[Qz2]", "[Qz1"]


@pytest.mark.parametrize("host", ["images.example.org", "127.0.0.1:9", "10.0.0.1", "example.org:abc",
                                  "[fe80::1%25eth0]"])
@pytest.mark.parametrize("userinfo", HOSTILE_USERINFOS)
@pytest.mark.parametrize("scheme", ["https", "http"])
def test_no_part_of_a_user_info_reaches_an_image_or_judge_error(scheme, userinfo, host):
    from medheval.data.images import parse_image_root

    url = f"{scheme}://{userinfo}@{host}"
    said = []
    for build in (lambda: parse_image_root(url + "/files/{path}"), lambda: URLTemplateSource(url + "/files/"),
                  lambda: make_judge(f"openai:m@{url}/v1", **FAST)):
        try:
            built = build()
            said += [repr(built), json.dumps(built.describe(), default=str)]
        except (ValueError, JudgeError) as error:
            said.append(str(error))
    assert not [text for text in said if "qz" in text.lower()], said


# -- short passwords -----------------------------------------------------------------------------------------
def test_short_passwords_are_redacted_as_whole_words(monkeypatch):
    register_basic_auth("user", "Qz7k")
    register_secrets("Jx9w2", min_length=SHORT_MIN_LENGTH)
    register_secrets("Zq1")  # 1-3 characters: never registered
    monkeypatch.setenv("SHORTIE_PASSWORD", "Vb4t")
    monkeypatch.setenv("SHORTIE_TOKEN", "true")  # named like a secret, yet a flag: from 8 characters only
    register_environment()
    assert redact("login Qz7k refused; jx9w2 and Vb4t") == "login *** refused; *** and ***"
    assert redact("Qz7kx Zq1 true 'Qz7k'") == "Qz7kx Zq1 true '***'"


# -- terminal escapes ----------------------------------------------------------------------------------------
EVIL = "\x1b]0;pwned\x07\x1b[2K\r\x1b[32mAll scored OK\x1b[0m\x1b]52;c;Y3VybA==\x07\u202e"


def test_printable_escapes_control_and_format_characters():
    assert printable(EVIL) == ("\\x1b]0;pwned\\x07\\x1b[2K\\x0d\\x1b[32mAll scored OK\\x1b[0m"
                               "\\x1b]52;c;Y3VybA==\\x07\\u202e")
    assert printable("line 1\n\tline 2 — é") == "line 1\n\tline 2 — é"


def test_an_endpoints_error_text_reaches_the_terminal_without_control_sequences(fixture_benchmark, tmp_path,
                                                                              capsys, caplog):
    with JudgeServer("openai") as server:
        server.script(Reply(401, {"error": {"message": EVIL}}))
        code = main(["run", "--benchmark", "mm_vishal:slake", "--model", f"openai:m@{server.base_url}",
                     "--output", str(tmp_path / "run"), "--data-dir", fixture_benchmark["data_dir"],
                     "--image-root", f"slake={fixture_benchmark['image_roots']['slake']}", "--limit", "1",
                     "--api-option", "max_retries=0"])
    err = capsys.readouterr().err
    assert code == 2 and "All scored OK" in err and "\\x1b]52;" in err
    (line,) = [line for line in err.split("\n") if line.startswith("error:")]
    assert not any(ch in line for ch in "\x1b\x07\r\u202e") and "\x1b]" not in err and "\x07" not in err
    logging.getLogger("medheval.test").warning("server said %s", EVIL)
    assert "\x1b" not in caplog.records[-1].getMessage()


def test_cli_key_hosts_come_from_the_typed_specs_only():
    args = build_parser().parse_args(["run", "--model", "vllm:qwen", "--judge", "openai:m@https://gw.example.org/v1",
                                      "--metric-option", 'sh_judge.judge={"base_url": "https://j.example.org:8443/v1"}',
                                      "--api-key-host", "keys.example.org", "--output", "x"])
    hosts = {host_entry(h) for h in cli_key_hosts(args)}
    assert hosts == {"localhost:8000", "gw.example.org", "j.example.org:8443", "keys.example.org"}


def test_a_short_placeholder_key_is_not_redacted_from_model_outputs(monkeypatch):
    # OPENAI_API_KEY=EMPTY is the standard keyless-vLLM placeholder: the word must survive in predictions
    monkeypatch.setenv("OPENAI_API_KEY", "EMPTY")
    keys.set_key_hosts(["http://127.0.0.1:8000/v1"])
    judge = make_judge("openai:qwen@http://127.0.0.1:8000/v1", **FAST)
    assert judge._api_key == "EMPTY"  # still sent: the user named the host
    register_environment()
    text = "The costophrenic angle is EMPTY; emptying of the bladder; Empty"
    assert redact(text) == text and judge._redact(text) == text
    register_secrets("Kb7q2x", min_length=8)  # an API key under 8 characters: never registered
    assert redact("key Kb7q2x") == "key Kb7q2x"
    register_secrets("NOT-NEEDED", min_length=SHORT_MIN_LENGTH)  # a placeholder, whatever the rule
    assert redact("not-needed NOT-NEEDED") == "not-needed NOT-NEEDED"


def test_a_short_basic_auth_password_is_still_redacted():
    judge = make_judge("openai:qwen@http://alice:Hq4z9p@127.0.0.1:8000/v1", **FAST)
    assert redact("login alice:Hq4z9p refused") == "login alice:*** refused"
    assert judge._redact("server echoed hq4z9p") == "server echoed ***"


# -- a key from the environment and a plain-http LAN endpoint ------------------------------------------------
LAN = "http://10.1.2.3:8000/v1"


@pytest.mark.parametrize("named", [True, False])
def test_an_environment_key_is_withheld_from_plain_http_to_another_machine(named, monkeypatch):
    from medheval.judges.spec import _env_key

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    if named:  # typed on the command line (--model openai:qwen@http://10.1.2.3:8000/v1)
        keys.set_key_hosts([LAN])
    key, why = _env_key("openai", LAN, None)
    assert key is None
    assert "OPENAI_API_KEY" in why and "https://" in why and "SSH tunnel to 127.0.0.1" in why
    assert "--model" not in why and "--api-key-host" not in why and keys.KEY_HOSTS_ENV not in why  # no advice that fails
    monkeypatch.setenv("MY_JUDGE_API_KEY", KEY)
    assert _env_key("openai", LAN, "MY_JUDGE_API_KEY")[0] is None
    keys.set_key_hosts(["https://10.1.2.3:8443/v1"])
    assert _env_key("openai", "https://10.1.2.3:8443/v1", None) == (KEY, None)  # https: sent to a named host


def test_a_typed_plain_http_lan_model_works_without_the_environment_key(monkeypatch, caplog):
    from medheval.judges import http as judge_http
    from medheval.judges import spec as judge_spec

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setattr(judge_spec, "_warned", set())
    keys.set_key_hosts([LAN])
    sent: list[dict] = []

    def post(session, url, data, headers, **kwargs):
        sent.append({"url": url, "headers": dict(headers), "auth": session.auth})
        raise judge_http.transport.TransportError("no network in tests")

    monkeypatch.setattr(judge_http.transport, "post", post)
    with caplog.at_level(logging.WARNING, logger="medheval.judges.spec"):
        judge = make_judge(f"openai:qwen@{LAN}", **FAST)  # no error
        make_judge(f"openai:qwen@{LAN}", **FAST)
    _ask(judge)
    assert sent and all(not any(name.lower() == "authorization" for name in s["headers"]) and s["auth"] is None
                        and KEY not in str(s) for s in sent)
    warnings = [r.getMessage() for r in caplog.records if "OPENAI_API_KEY" in r.getMessage()]
    assert len(warnings) == 1 and "was not sent to 10.1.2.3:8000" in warnings[0]
    assert judge.key_withheld == warnings[0]


def test_a_key_written_into_the_spec_is_refused_over_plain_http_naming_its_origin(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    with pytest.raises(JudgeError, match=r"the API key written into the spec \(api_key=\).*https://"):
        make_judge({"backend": "openai", "model": "m", "base_url": LAN, "api_key": "sk-written-123456"}, **FAST)
    with pytest.raises(JudgeError, match=r"password in the base URL"):
        make_judge("openai:m@http://u:pw-9zq@10.1.2.3:8000/v1", **FAST)


@pytest.mark.parametrize("base_url", ["https://api.openai.com:443/v1/@x", "https://gw.example.org:8443/v1?user=a@b.org",
                                      "https://api.openai.com:abc/v1"])
def test_a_base_url_no_host_is_read_from_is_refused_for_what_it_is_with_a_key_set(base_url, monkeypatch):
    """With a key in the environment, the key rule read the host first and said the key was 'not sent to' an
    empty host the user did not name, whose advice (--api-key-host with nothing after it) could not be followed.
    Now the refusal is the judge's own, naming what to percent-encode, with or without a key."""
    from medheval.judges.spec import check_key_destination

    for key in (None, KEY):
        if key:
            monkeypatch.setenv("OPENAI_API_KEY", key)
        for build in (lambda: make_judge(f"openai:m@{base_url}", **FAST),
                      lambda: check_key_destination({"backend": "openai", "model": "m", "base_url": base_url})):
            try:
                build()
            except JudgeError as error:
                message = str(error)
            else:
                assert not key  # without a key, the config check has nothing to say
                continue
            assert message.startswith("the openai endpoint's base_url: '") and "not sent to" not in message
            assert "holds an '@' after its host" in message or "is not a host name" in message


@pytest.mark.parametrize("template", ["https://cdn.example.org:8443/{path}?who=me@example.org&sig=tok-canary-77",
                                      "https://cdn.example.org:8443/gh/org/repo@main/{path}"])
def test_an_image_root_with_an_at_after_its_host_and_port_is_refused_saying_where_to_encode_it(template):
    """The refusal names the '@' after the host and port and says how to write either reading (the root, masked up
    to its last '@', no longer shows its host): not only 'its host cannot be read'."""
    from medheval.net.hosts import AT_AFTER_PORT

    with pytest.raises(ValueError) as info:
        URLTemplateSource(template)
    message = str(info.value)
    assert message.endswith(f"' {AT_AFTER_PORT}") and "an '@' in the path or query as %40" in message
    assert "tok-canary-77" not in message and "cannot be read" not in message


@pytest.mark.parametrize("template, reason", [
    ("https://cdn.example.org:99999/{path}?sig=tok-canary-79", "Port out of range"),
    ("https://cdn.example.org:99999/{path}?sig=tok;canary-79", "Port out of range"),  # a ';' inside a value
    ("https://u:pw-canary-79@cdn.example.org:99999/{path}", "its host or port cannot be read"),  # the parser may quote the password
    ("https://[fe80::1%25eth0]/{path}?sig=tok-canary-79", "names an IP address with a zone id"),
    ("https://cdn.example.org\\.physionet.org/{path}?sig=tok-canary-79", "holds a backslash before its path"),
])
def test_an_image_root_whose_host_cannot_be_read_is_refused_for_its_reason(template, reason):
    """The refusal gave one generic sentence for every reason parse_address has; it now gives that reason, with the
    root masked as parse_address masks it (user-info, every query value)."""
    with pytest.raises(ValueError) as info:
        URLTemplateSource(template)
    message = str(info.value)
    assert message.startswith("URL template '") and reason in message and "percent-encoded" in message
    assert "canary-79" not in message


@pytest.mark.parametrize("template", ["https://cdn.example.org:8443/{path}@x?code=tok-canary-78",
                                      "https://cdn.example.org:8443/{path}@x?a=1;sig=tok-canary-78",
                                      "https://cdn.example.org:8443/{path}@x?sig=tok;tok-canary-78",
                                      "https://cdn.example.org:8443/{path}@x?id=1&hmac=tok-canary-78",
                                      "https://u:pw@cdn.example.org:8443/{path}@x#access_token=tok-canary-78"])
def test_an_image_root_with_an_at_after_its_port_shows_no_query_or_fragment_value(template):
    """Reproduction: the refusal quoted the root through _redact_url, which masks only secret-named values of
    '&'-separated query items: '?code=', '?hmac=', a ';sig=' were shown, while parse_address's own message (and
    register_url, which takes every query value of a template for a secret) masks every value. A fragment's
    '#access_token=' was shown by both."""
    with pytest.raises(ValueError) as info:
        URLTemplateSource(template)
    assert "tok-canary-78" not in str(info.value) and "an '@' in the path or query as %40" in str(info.value)
    with pytest.raises(JudgeError) as info:  # a judge's base URL: parse_address's message
        make_judge(f"openai:m@{template.replace('{path}', 'v1')}", **FAST)
    assert "tok-canary-78" not in str(info.value) and "an '@' in the path or query as %40" in str(info.value)


@pytest.mark.parametrize("root, path, auth", [
    ("http://127.0.0.1:{port}/gh/org/repo%40main/{{path}}", "/gh/org/repo%40main/a.png", None),
    ("http://u:pa%2Fss%40x@127.0.0.1:{port}/repo%40main/{{path}}", "/repo%40main/a.png", "u:pa/ss@x"),
])
def test_an_image_root_with_a_port_written_as_the_refusal_says_reaches_its_path(root, path, auth):
    """Written as the refusal says (%40 in the path, %2F / %40 in a password), a root with a port reaches its own
    host with the path as written, the credentials decoded, on a loopback server."""
    class Handler(_Recorder):
        seen: list = []

        def do_GET(self):  # noqa: N802
            type(self).seen.append((self.path, self.headers.get("Authorization")))
            _reply(self)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        source = URLTemplateSource(root.format(port=httpd.server_address[1]))
        assert source.host == "127.0.0.1"
        assert source.open_bytes("a.png").startswith(b"\x89PNG")
    finally:
        httpd.shutdown()
        httpd.server_close()
    basic = None if auth is None else "Basic " + base64.b64encode(auth.encode()).decode()
    assert Handler.seen == [(path, basic)]


def test_an_image_root_with_an_at_in_its_path_and_no_port_is_read_as_written():
    """jsDelivr's ``repo@version`` and npm's ``@scope`` hold an '@' in the path; with no ':' before it, no password
    can have been cut short there, so the root is read as every URL parser reads it."""
    source = URLTemplateSource("https://cdn.jsdelivr.net/gh/org/repo@main/{path}")
    assert source.host == "cdn.jsdelivr.net"


@pytest.mark.parametrize("url", ["https://cdn.example.org/img?who=me@example.org&sig=tok-canary-77",
                                 "https://u:pa/ss@cdn.example.org/{path}?token=tok-canary-77",
                                 "https://cdn.example.org:8443/@scope/{path}?X-Goog-Signature=tok-canary-77"])
def test_an_image_url_shown_in_a_message_keeps_its_secret_query_values_masked(url):
    """_redact_url masked the user-info first: an '@' in the path or query then ended it, the '?' went with it,
    and the ?sig= / &token= after it was shown as part of the host."""
    from medheval.data.images import _redact_url

    shown = _redact_url(url)
    assert "tok-canary-77" not in shown and "pa/ss" not in shown and shown.endswith("=***")
    with pytest.raises(ValueError) as info:  # no '{path}', or an '@' after the host: the error shows the root
        URLTemplateSource(url)
    assert "tok-canary-77" not in str(info.value)


def test_physionet_credentials_never_go_to_a_host_written_before_a_backslash(monkeypatch):
    """``https://evil.example\\.physionet.org/{path}`` (an image root a grid config may set) was a physionet.org
    subdomain to urlsplit, so it took PHYSIONET_USERNAME/PASSWORD, while requests connects to evil.example."""
    monkeypatch.setenv("PHYSIONET_USERNAME", "alice")
    monkeypatch.setenv("PHYSIONET_PASSWORD", "physio-canary-pass-4410")
    for root in ("https://evil.example\\.physionet.org/files/{path}", "https://evil.example\\x.physionet.org/{path}"):
        with pytest.raises(ValueError) as info:
            URLTemplateSource(root)
        assert "backslash" in str(info.value) and "physio-canary-pass-4410" not in str(info.value)


def test_old_style_credential_variables_of_a_hyphenated_host_are_not_sent_but_pointed_out(monkeypatch, caplog):
    from medheval.data import images

    monkeypatch.setattr(images, "_renamed_warned", set())
    monkeypatch.setenv("IMAGES_EXAMPLE_COM_USERNAME", "bob")  # the name images-example.com read before '-' -> '__'
    monkeypatch.setenv("IMAGES_EXAMPLE_COM_PASSWORD", "CorpImagePw9")
    with caplog.at_level(logging.WARNING, logger="medheval.data.images"):
        source = URLTemplateSource("https://images-example.com/{path}")
        URLTemplateSource("https://images-example.com/{path}")  # said once
    assert source._auth is None and source._session.auth is None and source.auth_origin == "no credentials"
    notices = [r.getMessage() for r in caplog.records if "IMAGES_EXAMPLE_COM_USERNAME" in r.getMessage()]
    assert len(notices) == 1
    assert "no longer sent to images-example.com" in notices[0] and "IMAGES__EXAMPLE_COM_USERNAME/" in notices[0]
    assert "CorpImagePw9" not in notices[0]
    assert "IMAGES__EXAMPLE_COM_USERNAME/IMAGES__EXAMPLE_COM_PASSWORD" in source._auth_hint()  # in the 401 error
    # the host those names belong to now gets them, with no notice; the new names end the notice
    assert URLTemplateSource("https://images.example.com/{path}").renamed_credentials is None
    monkeypatch.setenv("IMAGES__EXAMPLE_COM_USERNAME", "bob")
    monkeypatch.setenv("IMAGES__EXAMPLE_COM_PASSWORD", "CorpImagePw9")
    renamed = URLTemplateSource("https://images-example.com/{path}")
    assert renamed.renamed_credentials is None and renamed._auth == ("bob", "CorpImagePw9")


def test_a_key_host_with_a_path_but_no_scheme_is_refused_not_widened_to_the_host(monkeypatch):
    """``gateway.example.org/v1`` used to name the whole host as a key host while naming nothing as an approval:
    both lists now refuse it, naming the variable and the two forms that work; no key is sent."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv(keys.KEY_HOSTS_ENV, "gateway.example.org/v1")
    with pytest.raises(ValueError, match=r"^MEDHEVAL_API_KEY_HOSTS: 'gateway.example.org/v1' is neither a host nor "
                                         r"a URL: give either the host \(gateway.example.org\)"):
        make_judge("openai:m@https://gateway.example.org/v1", **FAST)
    monkeypatch.setenv(keys.KEY_HOSTS_ENV, "https://gateway.example.org/v1")  # a URL names its host, as before
    assert keys.key_host_named("https://gateway.example.org:443/v2")
