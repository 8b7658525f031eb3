"""Secrets are redacted by value, wherever they appear (issue 31, class 2), tried from the attacker's side.

A loopback model server echoes back what it was given: a key header whose name says nothing
(``X-Password``), an ``api_key`` field of ``extra_body``, the Bearer key, a basic-auth header; a base URL
carries ``?key=`` into an error; an image server answers a credentialed download with an error echoing
its ``Authorization``. Each secret string must appear in no file under the output folder and nowhere in
what the run printed.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from judge_servers import JudgeServer, Reply
from medheval.cli import main

HEADER = "hdr-canary-X9q2-passw0rd"
BODY = "body-canary-Lm27-apikey"
ENV = "sk-env-canary-Pp31-openai"
QUERY = "query-canary-T5v8-urlkey"
IMAGE_PASSWORD = "physio-canary-Wd44-pass"


def _leaks(folder: Path, printed: str, secrets: list[str]) -> list[str]:
    """Where each secret was found (any spelling a file or console could use), as 'secret in place'."""
    found = []
    for secret in secrets:
        spellings = {secret, json.dumps(secret)[1:-1]}
        for path in (p for p in folder.rglob("*") if p.is_file()):
            data = path.read_bytes()
            found += [f"{secret} in {path}" for s in spellings if s.encode() in data][:1]
        found += [f"{secret} in the console" for s in spellings if s in printed][:1]
    return found


def _run(fixture, output: Path, model: str, *extra: str) -> int:
    return main(["run", "--benchmark", "mm_vishal:slake", "--model", model, "--output", str(output),
                 "--data-dir", fixture["data_dir"], *[a for s, r in fixture["image_roots"].items()
                                                      for a in ("--image-root", f"{s}={r}")],
                 "--max-new-tokens", "48", "--api-option", "max_retries=0", *extra])


def _echo_run(fixture, monkeypatch, tmp_path, echo) -> tuple[int, JudgeServer]:
    """A run against a loopback model server answering ``echo(body, headers)``, given the ``X-Password`` header
    ``HEADER``, the ``extra_body`` key ``BODY`` and ``OPENAI_API_KEY=ENV``: (exit code, the server)."""
    monkeypatch.setenv("OPENAI_API_KEY", ENV)
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    servers: list[JudgeServer] = []
    with JudgeServer("openai", reply=lambda body: echo(body, servers[0].requests[-1].headers)) as server:
        servers.append(server)
        code = _run(fixture, tmp_path / "run", f"openai:m@{server.base_url}",
                    "--api-option", json.dumps({"X-Password": HEADER}).join(("headers=", "")),
                    "--api-option", f'extra_body={{"api_key": "{BODY}", "seed": 0}}')
    return code, server


def test_secrets_a_server_echoes_reach_no_file_and_no_console(fixture_benchmark, monkeypatch, tmp_path, capsys):
    code, server = _echo_run(fixture_benchmark, monkeypatch, tmp_path, lambda body, headers: (
        f"Yes. {headers.get('X-Password')} {body.get('api_key')} {headers.get('Authorization')}"))
    assert server.requests and server.requests[0].headers["X-Password"] == HEADER  # they were sent ...
    assert server.requests[0].json["api_key"] == BODY
    printed = "".join(capsys.readouterr())
    assert code == 0, printed
    predictions = (tmp_path / "run" / "predictions.jsonl").read_text()
    assert "Yes. *** *** Bearer ***" in predictions  # ... and echoed back
    assert (tmp_path / "run" / "report.html").is_file()
    assert not _leaks(tmp_path, printed, [HEADER, BODY, ENV])


def test_secrets_echoed_upper_cased_or_inside_base64_are_redacted_too(fixture_benchmark, monkeypatch, tmp_path,
                                                                       capsys):
    """A server that echoes the header upper-cased and the ``extra_body`` key and the Bearer line inside base64
    blobs (as in an encoded debug header or a JWT-like payload), at each of the 3 byte offsets base64 can put
    them: no file and no console line holds any of those spellings."""
    blobs: list[str] = []

    def echo(body: dict, headers) -> str:
        blobs[:] = [base64.b64encode(f"{pad}{{\"k\": \"{body.get('api_key')}\", \"a\": \"{headers.get('Authorization')}\"}}"
                                     .encode()).decode() for pad in ("", "x", "xy")]
        return f"Yes. {str(headers.get('X-Password')).upper()} {' '.join(blobs)}"

    code, _ = _echo_run(fixture_benchmark, monkeypatch, tmp_path, echo)
    printed = "".join(capsys.readouterr())
    assert code == 0, printed
    predictions = (tmp_path / "run" / "predictions.jsonl").read_text()
    assert "Yes. *** " in predictions and predictions.count("***") >= 1 + 2 * 3  # header, then key and Bearer ×3
    files = b"".join(p.read_bytes() for p in (tmp_path / "run").rglob("*") if p.is_file())
    for blob in blobs:  # the blobs as sent hold the secrets; none reached a file or the console whole
        assert blob.encode() not in files and blob not in printed
        assert any(form in blob for form in _base64_of(BODY) + _base64_of(ENV))
    assert HEADER.upper().encode() not in files and HEADER.upper() not in printed
    assert not _leaks(tmp_path, printed, [HEADER, BODY, ENV])


def _base64_of(secret: str) -> list[str]:
    """The base64 characters of ``secret`` at byte offsets 0, 1 and 2 of a longer text (worked out here by
    encoding with 0-2 filler bytes, independently of medheval.net.secrets)."""
    forms = []
    for k, skip in ((0, 0), (1, 2), (2, 3)):
        encoded = base64.b64encode(b"\0" * k + secret.encode()).decode()
        forms.append(encoded[skip: (8 * (k + len(secret))) // 6])
    return forms


def test_a_key_in_the_base_url_is_not_printed_in_the_error(fixture_benchmark, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("OPENAI_API_KEY", ENV)
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    with JudgeServer("openai") as server:  # answers a 404 naming the URL with its key, and the client names it too
        server.script(*[Reply(404, {"error": {"message": f"no route /v1/chat/completions?key={QUERY}"}})] * 50)
        code = _run(fixture_benchmark, tmp_path / "run", f"openai:m@{server.base_url}?key={QUERY}")
        assert server.requests[0].path == f"/v1/chat/completions?key={QUERY}"  # the key reached the server
    printed = "".join(capsys.readouterr())
    assert code == 2 and "404" in printed
    assert not _leaks(tmp_path, printed, [QUERY, ENV])


def test_image_credentials_echoed_by_the_image_server_are_not_printed(fixture_benchmark, monkeypatch, tmp_path,
                                                                       capsys):
    import http.server
    import threading

    class Echo(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            body = f"denied for {self.headers.get('Authorization')}".encode()
            self.send_response(403, f"denied for {self.headers.get('Authorization')}")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_HEAD = _answer

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Echo)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    monkeypatch.setenv("PHYSIONET_USERNAME", "reader")
    monkeypatch.setenv("PHYSIONET_PASSWORD", IMAGE_PASSWORD)
    monkeypatch.setenv("OPENAI_API_KEY", ENV)
    try:
        with JudgeServer("openai", reply=lambda body: "Yes") as server:
            code = main(["run", "--benchmark", "mm_vishal:slake", "--model", f"openai:m@{server.base_url}",
                         "--output", str(tmp_path / "run"), "--data-dir", fixture_benchmark["data_dir"],
                         "--image-root", f"slake=http://reader:{IMAGE_PASSWORD}@127.0.0.1:{httpd.server_address[1]}/{{path}}"])
    finally:
        httpd.shutdown()
        httpd.server_close()
    printed = "".join(capsys.readouterr())
    assert code == 2 and "403" in printed
    token = base64.b64encode(f"reader:{IMAGE_PASSWORD}".encode()).decode()
    assert not _leaks(tmp_path, printed, [IMAGE_PASSWORD, token])


def test_tracebacks_and_log_records_are_redacted():
    """What the process prints on its own: a log record with the secret and an uncaught traceback."""
    script = ("import logging\n"
              "from medheval.net.secrets import install_redacting_hooks, register_named\n"
              f"register_named({{'auth': {{'password': {BODY!r}}}}})\n"
              "install_redacting_hooks()\n"
              "logging.basicConfig()\n"
              f"logging.getLogger('medheval.x').error('the server said %s', {BODY!r})\n"
              "try:\n"
              f"    raise ValueError('inner ' + {BODY!r})\n"
              "except ValueError:\n"
              "    logging.getLogger('medheval.x').exception('failed')\n"
              f"raise RuntimeError('boom ' + {BODY!r})\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
    assert done.returncode == 1 and "boom ***" in done.stderr and "the server said ***" in done.stderr
    assert "inner ***" in done.stderr and BODY not in done.stderr + done.stdout


def test_the_registry_redacts_each_spelling_of_a_value_and_only_secret_named_fields():
    import html

    from medheval.net.secrets import redact, register_named

    secret = 'q"uo<te>&sp ace-Zz91'
    register_named({"max_tokens": 987654321, "options": [{"client_secret": secret}]})
    for spelling in (secret, json.dumps(secret)[1:-1], html.escape(secret), "q%22uo%3Cte%3E%26sp%20ace-Zz91"):
        assert redact(f"before {spelling} after") == "before *** after"
    assert redact("max_tokens=987654321") == "max_tokens=987654321"  # a count, not a secret
    assert redact(f"echo {secret.upper()}!") == "echo ***!"  # any letter case
    key = "sk-case-and-b64-Kq81"
    register_named({"api_key": key})
    for filler in ("", "a", "ab"):  # the 3 offsets base64 can put a value at inside a longer encoded text
        encoded = base64.b64encode(f"{filler}key={key};".encode()).decode()
        assert "***" in redact(encoded) and not any(form in redact(encoded) for form in _base64_of(key))
    plain = base64.b64encode(b"an ordinary payload with no key in it").decode()
    assert redact(plain) == plain



def test_fields_named_like_secrets_that_hold_none_are_not_registered():
    """``allow_remote_credentialed`` matches "credential", ``api_key_env`` "key", ``tokenizer_path`` "token": a grid
    config's whole mapping is registered when it is read, and its approved host then read *** in every message
    and file (the refusal naming the host to approve, a results.json naming the judge's host)."""
    from medheval.net.secrets import redact, register_named

    key = "sk-field-canary-Tz40-key"
    register_named({"allow_remote_credentialed": ["judge-host.example.invalid"], "judge": {
        "api_key_env": "FIELD_CANARY_API_KEY", "tokenizer_path": "/models/field-canary-tok", "api_key": key,
        "allow_remote_credentialed": "judge-host2.example.invalid"}})
    text = ("approve judge-host.example.invalid or judge-host2.example.invalid; set FIELD_CANARY_API_KEY; "
            "tokenizer /models/field-canary-tok")
    assert redact(text) == text
    assert redact(f"key {key}") == "key ***"

JUDGE_QUERY = "judge-canary-Qk72-urlkey"
SPEC_PASSWORD = "spec-canary-Rb18-passwd"


def test_a_judge_key_in_the_url_is_redacted_though_no_metric_builds_the_judge(fixture_benchmark, monkeypatch,
                                                                             tmp_path, capsys):
    """Close-ended splits never build the judge, so its URL was registered nowhere and reached results.json."""
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    with JudgeServer("openai", reply=lambda body: "Yes") as server:
        code = _run(fixture_benchmark, tmp_path / "run", f"openai:m@{server.base_url}",
                    "--judge", f"openai:gpt-4o@https://judge.example.invalid/v1?api-key={JUDGE_QUERY}")
    printed = "".join(capsys.readouterr())
    assert code == 0, printed
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert "judge.example.invalid" in json.dumps(results)  # the judge is recorded, its key is not
    assert not _leaks(tmp_path, printed, [JUDGE_QUERY])


def test_a_spec_refused_before_its_client_is_built_is_printed_redacted(fixture_benchmark, monkeypatch, tmp_path,
                                                                       capsys):
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    code = _run(fixture_benchmark, tmp_path / "run",
                f"openai:m@https://bob:{SPEC_PASSWORD}@api.example.invalid/v1?api-key={JUDGE_QUERY}",
                "--api-option", "timeout=0")
    printed = "".join(capsys.readouterr())
    assert code == 2 and "timeout must be positive" in printed and "bob:***@api.example.invalid" in printed
    assert not _leaks(tmp_path, printed, [SPEC_PASSWORD, JUDGE_QUERY])


def test_the_shell_working_folder_is_no_secret_but_a_key_next_to_it_is():
    """``PWD`` matched the secret-name pattern: every path under the current folder printed as ``***``, and a
    predictions run could not resume from another folder (its recorded path changed)."""
    from medheval.net.secrets import redact, register_environment

    folder = "/home/reader/projects/medheval-canary-Wt63"
    register_environment({"PWD": folder, "OLDPWD": folder + "-old", "MY_SERVICE_API_KEY": "svc-canary-Hn40-key"})
    assert redact(f"{folder}/predictions.jsonl") == f"{folder}/predictions.jsonl"
    assert redact(f"{folder}-old/x") == f"{folder}-old/x"
    assert redact("key svc-canary-Hn40-key") == "key ***"


def test_secret_names_include_a_signature_and_sig_only_as_a_word_of_its_own():
    """``sig`` (an Azure SAS or CDN URL's signature) joined SECRET_NAME when it replaced images' own query-name
    pattern; as a substring it would also mark ``design``, ``signal`` or ``SIGTERM``. ``tokens`` stays a count, as
    in ``max_tokens``. A URL's query names are read more broadly (:func:`is_secret_query_name`): ``sig`` or
    ``token`` anywhere in the name (``urlsig``, ``hmacsig``, ``tokens``), as images' own pattern did; masking a
    harmless ``design`` in a URL shown on screen costs nothing."""
    from medheval.data.images import _redact_url
    from medheval.net.secrets import SECRET_NAME

    secret = ["sig", "Sig", "X-Sig", "sig_v2", "AZURE_STORAGE_SIG", "X-Amz-Signature", "api_key", "X-Auth-Token",
              "PHYSIONET_PASSWORD", "session"]
    plain = ["design", "signal", "assign", "SIGTERM", "signed", "insignia", "apiSig", "max_tokens", "sv", "se", "sp"]
    assert [name for name in secret if not SECRET_NAME.search(name)] == []
    assert [name for name in plain if SECRET_NAME.search(name)] == []
    url = ("https://acct.blob.core.windows.net/c/{path}?sv=2022-11-02&sig=c2lnbmF0dXJl&design=a&token=t&tokens=9"
           "&urlsig=u&hmacsig=h&apisig=a&esig=e&se=2030")
    assert _redact_url(url) == ("https://acct.blob.core.windows.net/c/{path}?sv=2022-11-02&sig=***&design=***"
                                "&token=***&tokens=***&urlsig=***&hmacsig=***&apisig=***&esig=***&se=2030")


def test_every_letter_case_of_a_key_is_redacted_also_beside_its_exact_spelling():
    """Was: once the exact spelling was found, the other letter cases in the same text were left as they were."""
    from medheval.net.secrets import redact, register_secrets

    key = "sk-case-canary-Hq73-mixed"
    register_secrets(key)
    assert redact(f"{key} then {key.upper()} then {key.swapcase()}") == "*** then *** then ***"
    assert redact(f"{key.upper()} alone") == "*** alone"
    assert redact(f"{key.upper()} and {key.lower()}", [f"extra-{key}"]) == "*** and ***"


def test_a_word_like_key_is_still_redacted_everywhere_and_the_user_is_warned_once(caplog):
    """``Quokkafield7`` reads like a word: redacted all the same (it may be the real key), every occurrence, with
    one warning naming the variable and never the value; a random-looking key is redacted without a warning."""
    import logging

    from medheval.net.secrets import redact, register_environment

    word, number, random_key = "Quokkafield7", "31415926535", "q7-Zr81xWv-k3Lm0"
    with caplog.at_level(logging.WARNING, logger="medheval.net.secrets"):
        register_environment({"WORDY_API_KEY": word, "NUMBER_TOKEN": number, "RANDOM_API_KEY": random_key})
        register_environment({"WORDY_API_KEY": word})  # registered again: no second warning
    warnings = [record.getMessage() for record in caplog.records]
    assert len(warnings) == 2, warnings
    assert warnings[0].startswith("the value of WORDY_API_KEY looks like an ordinary word or number")
    assert warnings[1].startswith("the value of NUMBER_TOKEN looks like an ordinary word or number")
    assert all(word not in w and number not in w and "***" in w and "openssl rand" in w for w in warnings)
    text = f"the {word} field, {word.upper()}s, pi={number}, key={random_key}"
    assert redact(text) == "the *** field, ***s, pi=***, key=***"


@pytest.mark.parametrize("value, word_like", [
    ("testtest", True), ("password1", True), ("Radiology2024", True), ("20240101", True),
    ("Radiology20240", False),  # five digits after the letters
    ("sk-proj-Ab12", False), ("a3f9c2e1b7d4", False), ("my-local-key", False), ("test test", False),
])
def test_looks_like_word_known_answers(value, word_like):
    from medheval.net.secrets import looks_like_word

    assert looks_like_word(value) is word_like


LOGIN_TOKEN = "hf_loginfile-canary-Jq58Tz"


def test_a_hub_token_from_hf_auth_login_echoed_by_the_hub_is_not_printed(tmp_path):
    """The token `hf auth login` keeps in a file (no HF_TOKEN variable, so register_environment never sees it):
    a hostile or broken Hub endpoint answering the repo creation with ``{"url": <the Authorization header>}``
    makes huggingface_hub raise ``Invalid HF URI 'hf://Bearer <token>'``; the error the publish command prints
    holds ``***`` in its place."""
    import http.server
    import threading

    class EchoHub(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps({"url": self.headers.get("Authorization", "")}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = _answer

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EchoHub)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    home = tmp_path / "hf_home"
    home.mkdir()
    (home / "token").write_text(LOGIN_TOKEN)  # where `hf auth login` writes it
    env = {key: value for key, value in os.environ.items() if key not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                                                                          "HF_TOKEN_PATH")}
    env.update(PYTHONPATH=str(REPO), HF_HOME=str(home), HF_ENDPOINT=f"http://127.0.0.1:{httpd.server_address[1]}",
               HF_HUB_OFFLINE="0", HF_HUB_DISABLE_XET="1")
    try:
        done = subprocess.run([sys.executable, "-m", "medheval", "publish", "--to", str(tmp_path / "hub_out"),
                               "--push", "--org", "my-org", "--kind", "metrics", "--name", "chair"],
                              capture_output=True, text=True, cwd=tmp_path, env=env, timeout=300)
    finally:
        httpd.shutdown()
        httpd.server_close()
    printed = done.stdout + done.stderr
    assert done.returncode == 2 and "Bearer ***" in printed, printed  # the echo reached the message ...
    assert not _leaks(tmp_path / "hub_out", printed, [LOGIN_TOKEN])  # ... without the token


CONFIG_KEY = "cfg-url-canary-Hx73-Qk2"


def test_a_key_in_a_grid_configs_model_url_names_no_folder_and_reaches_no_file(fixture_benchmark, monkeypatch,
                                                                                  tmp_path, capsys):
    """A grid YAML whose model is ``openai:m@http://127.0.0.1:PORT/v1?api-key=KEY``: grid.json (its plan is written
    before the model registers its key) and the cell folder's name (``..._v1_api-key_KEY``) held the key. And the
    grid resumes: its grid.json, written with ***, was compared with the plan holding the key, and the second run
    was refused ("holds a grid over other axes (changed: models …?api-key=*** → …?api-key=***)")."""
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    with JudgeServer("openai", reply=lambda body: "Yes") as server:
        config = tmp_path / "grid.yaml"
        config.write_text(json.dumps({"output": str(tmp_path / "grid"), "benchmarks": ["mm_vishal:slake"],
                                      "models": [f"openai:m@{server.base_url}?api-key={CONFIG_KEY}"]}))
        args = ["run", "--config", str(config), "--data-dir", fixture_benchmark["data_dir"], "--limit", "2",
                "--image-root", f"slake={fixture_benchmark['image_roots']['slake']}", "--api-option", "max_retries=0"]
        code = main(args)
        assert server.requests[0].path == f"/v1/chat/completions?api-key={CONFIG_KEY}"  # sent as configured
        assert code == 0, "".join(capsys.readouterr())
        sent = len(server.requests)
        code = main(args)  # the same grid again: it resumes (nothing left to generate)
        assert len(server.requests) == sent
    printed = "".join(capsys.readouterr())
    assert code == 0, printed
    assert (tmp_path / "grid" / "grid.json").is_file()
    names = [path.name for path in (tmp_path / "grid").rglob("*")]
    assert [name for name in names if name.startswith("openai_m_http")], names  # the cell's folder
    assert not [name for name in names if CONFIG_KEY.casefold() in name.casefold()], names
    assert not _leaks(tmp_path / "grid", printed, [CONFIG_KEY])


def test_registering_the_hub_token_at_a_commands_start_makes_no_request(tmp_path):
    """register_hub_credentials() runs at every command's start: it reads HF_TOKEN or the token file and asks
    nothing of the Hub. huggingface_hub's get_token() mints an OIDC token (HF_OIDC_RESOURCE) or refreshes an
    expiring login over the network: `medheval list` posted to <HF_ENDPOINT>/oauth/token."""
    import http.server
    import threading

    hits: list[str] = []

    class Hub(http.server.BaseHTTPRequestHandler):
        def _answer(self) -> None:
            hits.append(f"{self.command} {self.path}")
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps({"access_token": "hf_minted-canary-Wq81Lz", "expires_in": 3600}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hub)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    home = tmp_path / "hf_home"
    home.mkdir()
    (home / "token").write_text(LOGIN_TOKEN + "\n")
    env = {key: value for key, value in os.environ.items() if key not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                                                                          "HF_TOKEN_PATH")}
    env.update(PYTHONPATH=str(REPO), HF_HOME=str(home), HF_ENDPOINT=f"http://127.0.0.1:{httpd.server_address[1]}",
               HF_HUB_OFFLINE="0", HF_OIDC_RESOURCE="user/me", HF_OIDC_ID_TOKEN="oidc-id-token-Zr4")
    script = ("from medheval.publish.hub_access import register_hub_credentials\n"
              "from medheval.net.secrets import redact\n"
              f"register_hub_credentials()\nprint(redact('token: {LOGIN_TOKEN}'))\n")
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, env=env,
                              timeout=120)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert done.returncode == 0, done.stderr
    assert hits == []  # no request at a command's start
    assert done.stdout.strip() == "token: ***"  # the login file's token is registered all the same
