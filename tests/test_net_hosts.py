"""The one parser of what names a host (medheval.net.hosts.parse_address) and the one host-list rule
(medheval.net.named.UserNamedHosts.covers), by known answers."""

from __future__ import annotations

import re

import pytest

from medheval.net.hosts import Address, host_and_port, host_entry, parse_address
from medheval.net.named import UserNamedHosts

ENV = "MEDHEVAL_TEST_NAMED_HOSTS"


@pytest.mark.parametrize("text, address", [
    ("example.org", Address("", "example.org", None)),
    ("  example.org:8080 ", Address("", "example.org", 8080)),
    ("[::1]:8080", Address("", "[::1]", 8080)),
    ("::1", Address("", "[::1]", None)),  # a bare IPv6 literal, not host ":" port ":1"
    ("2001:DB8::1", Address("", "[2001:db8::1]", None)),
    ("https://User:Pw@Images.Example.ORG:8443/files/x?token=t", Address("https", "images.example.org", 8443)),
    ("HTTP://example.org/v1", Address("http", "example.org", None)),
    ("example.org/some/path", Address("", "example.org", None)),
    ("Example.org.", Address("", "example.org.", None)),  # the trailing dot is kept in host ...
    ("", Address("", "", None)),
])
def test_parse_address_known_answers(text, address):
    assert parse_address(text) == address


def test_address_forms():
    address = parse_address("https://Example.org.:8443/v1")
    assert (address.name, address.netloc, address.entry) == ("example.org", "example.org.:8443", "example.org:8443")
    assert parse_address("https://example.org.").default_port == 443  # ... and dropped in name and entry
    assert parse_address("http://example.org").default_port == 80
    assert parse_address("example.org").default_port is None
    assert parse_address("ftp://example.org").default_port is None


@pytest.mark.parametrize("text", ["example.org:abc", "example.org:99999", "[::1", "https://example.org:-1/"])
def test_parse_address_names_the_text_it_cannot_parse(text):
    with pytest.raises(ValueError, match=r"is not a host name, host:port or URL"):
        parse_address(text)


@pytest.mark.parametrize("text, pair, entry", [
    ("https://Example.org./v1", ("example.org", 443), "example.org"),  # a URL without a port: its host, any port
    ("http://[::1]:8080/v1", ("[::1]", 8080), "[::1]:8080"),
    ("example.org:8080", ("example.org", 8080), "example.org:8080"),
    ("example.org:abc", ("", None), ""),  # unparseable: names no host
])
def test_host_and_port_and_host_entry(text, pair, entry):
    assert host_and_port(text) == pair and host_entry(text) == entry


@pytest.fixture
def named(monkeypatch) -> UserNamedHosts:
    monkeypatch.delenv(ENV, raising=False)
    return UserNamedHosts(ENV)


def test_a_named_host_matches_exactly_on_any_port_and_host_port_on_that_port_only(named, monkeypatch):
    monkeypatch.setenv(ENV, " , Images.Example.ORG., ,api.example.org:8443, [::1]:9000")
    assert named.names() == {"images.example.org", "api.example.org:8443", "[::1]:9000"}  # empty parts skipped
    assert named.covers("https://images.example.org/x") and named.covers("http://IMAGES.example.org.:81/")
    assert named.covers("https://api.example.org:8443/v1") and named.covers("http://[::1]:9000/v1")
    for url in ("https://api.example.org/v1", "https://evil-images.example.org/", "https://images.example.org.evil/",
                "https://sub.images.example.org/", "https://example.org/", "http://[::1]:9001/", "not a url:port"):
        assert not named.covers(url), url


def test_a_host_port_entry_matches_a_url_on_its_schemes_default_port(named):
    named.set(["example.org:443"])
    assert named.covers("https://example.org/v1") and not named.covers("http://example.org/v1")


def test_extra_entries_and_entries_from_python_count_too(named):
    assert not named.covers("https://physionet.org/files/")
    assert named.covers("https://physionet.org/files/", "https://PhysioNet.org/")
    named.add("physionet.org")
    assert named.covers("https://physionet.org/files/")
    assert named.set([]) == ("physionet.org",) and not named.covers("https://physionet.org/files/")


@pytest.mark.parametrize("entries, url, allowed", [
    ("physionet.org", "https://physionet.org/files/", True),
    ("PhysioNet.org.", "https://physionet.org./files/", True),  # case and a trailing dot ignored
    ("https://physionet.org/files", "https://physionet.org:443/x", True),  # a URL names its host (was ignored)
    ("physionet.org:443", "https://physionet.org/x", True),  # host:port on its port (was ignored) ...
    ("physionet.org:8443", "https://physionet.org/x", False),  # ... and on no other
    ("physionet.org", "https://www.physionet.org/x", False),  # never a subdomain ...
    ("physionet.org", "https://physionet.org.evil.example/x", False),  # ... nor a look-alike
    ("2001:db8::1", "https://[2001:db8::1]:8443/x", True),  # a bare IPv6 literal, as before
])
def test_proxy_for_names_hosts_as_the_api_key_hosts_do(monkeypatch, entries, url, allowed):
    from medheval.net import transport

    monkeypatch.setenv(transport.PROXY_OPT_IN_ENV, entries)
    assert transport.proxy_allowed(url, credentialed=True) is allowed
    assert transport.proxy_allowed(url, credentialed=False)  # without credentialed data, any remote host may
    monkeypatch.delenv(transport.PROXY_OPT_IN_ENV)
    assert transport.proxy_allowed(url, credentialed=True, proxy_for=tuple(entries.split(","))) is allowed
    previous = transport.set_proxy_for(tuple(entries.split(",")))
    try:
        assert transport.proxy_allowed(url, credentialed=True) is allowed
    finally:
        transport.set_proxy_for(previous)


def test_a_local_or_unparseable_url_never_uses_a_proxy(monkeypatch):
    from medheval.net import transport

    monkeypatch.setenv(transport.PROXY_OPT_IN_ENV, "127.0.0.1,example.org")
    assert not transport.proxy_allowed("http://127.0.0.1:8000/v1", credentialed=False)
    assert not transport.proxy_allowed("https://example.org:abc/", credentialed=False)


@pytest.mark.parametrize("text, address", [
    ("2001:0db8:0000:0000:0000:0000:0000:0001", Address("", "[2001:db8::1]", None)),  # expanded -> compressed
    ("[2001:DB8:0:0::1]:8443", Address("", "[2001:db8::1]", 8443)),  # upper-case hex, brackets with a port
    ("https://[2001:0DB8::0001]/v1", Address("https", "[2001:db8::1]", None)),
    ("[0:0:0:0:0:0:0:1]", Address("", "[::1]", None)),
    ("::ffff:7f00:1", Address("", "127.0.0.1", None)),  # IPv4-mapped IPv6: the IPv4 address it reaches
    ("http://[::FFFF:127.0.0.1]:8000/v1", Address("http", "127.0.0.1", 8000)),
    ("[::ffff:a00:1]", Address("", "10.0.0.1", None)),
    ("127.1", Address("", "127.1", None)),  # a legacy IPv4 spelling is a name, matched as written
])
def test_parse_address_spells_ip_literals_canonically(text, address):
    assert parse_address(text) == address


@pytest.mark.parametrize("text", ["fe80::1%eth0", "FE80::1%ETH0", "[fe80::1%eth0]:8080", "http://[fe80::1%25eth0]:8000/v1"])
def test_an_ipv6_zone_id_is_refused_naming_the_text(text):
    with pytest.raises(ValueError, match=r"zone id .*give a global or unique-local address") as caught:
        parse_address(text)
    assert repr(text) in str(caught.value)
    assert host_entry(text) == "" and host_and_port(text) == ("", None)  # so it names nothing in a host list


def test_every_spelling_of_one_ip_matches_one_entry(named):
    named.set(["2001:0DB8::0001", "127.0.0.1:8000"])
    assert named.names() == {"[2001:db8::1]", "127.0.0.1:8000"}
    assert named.covers("https://[2001:db8:0:0:0:0:0:1]:8443/x") and named.covers("https://[2001:DB8::1]/")
    assert named.covers("http://[::ffff:7f00:1]:8000/v1")  # the mapped form of 127.0.0.1
    assert not named.covers("http://[::ffff:7f00:1]:8001/v1") and not named.covers("https://[2001:db8::2]/")


def test_an_ipv4_mapped_address_is_judged_as_the_ipv4_address(named):
    from medheval.judges.endpoints import endpoint_allowed
    from medheval.net.hosts import is_local_host, is_local_url, is_loopback_host
    from medheval.net.keys import plain_http_to_network

    named.set(["127.0.0.1", "10.0.0.1:8000"])  # IPv4 entries name the IPv4-mapped spellings of their addresses
    assert named.covers("http://[::ffff:7f00:1]:9/v1") and named.covers("http://[::FFFF:10.0.0.1]:8000/v1")
    assert not named.covers("http://[::ffff:a00:1]:8001/v1")
    assert endpoint_allowed("https://[::ffff:a00:1]:8000/v1", ["10.0.0.1:8000"])

    assert is_loopback_host("::ffff:127.0.0.1") and is_loopback_host("[::ffff:7f00:1]")
    assert is_local_host("[::ffff:10.1.2.3]") and not is_local_host("::ffff:8.8.8.8")
    assert not is_local_host("::ffff:169.254.169.254")  # link-local (cloud metadata) stays non-local
    assert is_local_url("http://[::ffff:192.168.1.5]:8000/v1") and not is_local_url("192.168.1.5:8000")
    assert not plain_http_to_network("http://[::ffff:7f00:1]:8000/v1")  # loopback: a key may go in clear
    assert plain_http_to_network("http://[::ffff:10.0.0.1]:8000/v1")  # the LAN: it may not
    assert not is_loopback_host("127.1")  # a name, never resolved: not loopback


def test_a_zoned_address_is_never_local_and_plain_http_to_it_crosses_the_network():
    from medheval.net.hosts import is_local_url, is_loopback_host
    from medheval.net.keys import plain_http_to_network

    assert not is_loopback_host("::1%lo") and not is_local_url("http://[fe80::1%25eth0]:8000/v1")
    assert plain_http_to_network("http://[fe80::1%25eth0]:8000/v1")  # unreadable: counted as crossing it
    assert not plain_http_to_network("https://[fe80::1%25eth0]:8000/v1")


def test_redirect_origins_and_approvals_compare_canonical_ips():
    from medheval.judges.endpoints import endpoint_allowed
    from medheval.net.transport import origin

    assert origin("https://[2001:DB8:0::1]:443/a") == origin("https://[2001:db8::1]/b") == ("https", "[2001:db8::1]", 443)
    assert endpoint_allowed("https://[2001:0db8::1]/v1", ["2001:db8::1"])
    assert endpoint_allowed("https://[2001:0db8::1]/v1/", ["https://[2001:DB8::1]:443/v1"])
    assert not endpoint_allowed("https://[2001:0db8::1]/v2", ["https://[2001:DB8::1]:443/v1"])


@pytest.mark.parametrize("entry, says", [
    ("example.org/v1", r"'example.org/v1' is neither a host nor a URL: give either the host \(example.org\), which "
                       r"names every path on it, or a base URL with its scheme \(https://example.org/v1\)"),
    ("example.org:8443/v1?x=1", r"'example.org:8443/v1\?x=\*\*\*' is neither a host nor a URL: give either the host "
                                r"\(example.org:8443\)"),
    ("user:pw-secret@example.org", r"'\*\*\*@example.org' is neither a host nor a URL: give either the host "
                                   r"\(example.org\), which names every path on it, or a base URL with its scheme "
                                   r"\(https://\*\*\*@example.org\)$"),  # a password is never echoed
    ("example.org:abc", r"'example.org:abc' is not a host name, host:port or URL"),
    ("fe80::1%eth0", r"'fe80::1%eth0' names an IP address with a zone id \(the part from '%'\)"),
    ("127.0.0.1%x", r"'127.0.0.1%x' names an IP address with a zone id \(the part from '%'\)"),
    (":8080", r"':8080' names no host"),
])
def test_an_entry_that_is_not_a_host_or_url_is_refused_where_it_is_given(named, monkeypatch, entry, says):
    from medheval.net.hosts import check_host_entry

    with pytest.raises(ValueError, match=r"^--flag: " + says):
        check_host_entry(f" {entry} ", "--flag")
    with pytest.raises(ValueError, match=r"^on the command line: " + says):
        named.set(["example.net", entry])
    assert named.entries() == ()  # a refused set() changes nothing
    with pytest.raises(ValueError, match=r"^a host added from Python \(for MEDHEVAL_TEST_NAMED_HOSTS\): " + says):
        named.add(entry)
    monkeypatch.setenv(ENV, f"example.net,{entry}")
    with pytest.raises(ValueError, match=rf"^{ENV}: " + says):
        named.covers("https://example.net/")


@pytest.mark.parametrize("entry", ["example.org", "example.org/", "Example.ORG.:8443", "[2001:db8::1]:443", "::1",
                                   "https://example.org/v1", "http://[::1]:8000/v1?x=1"])
def test_a_host_host_port_or_url_entry_is_accepted_as_given(entry):
    from medheval.net.hosts import check_host_entry

    assert check_host_entry(f"  {entry} ") == entry


def test_the_cli_flags_refuse_a_path_without_a_scheme_naming_the_flag(capsys):
    from medheval.cli.main import build_parser

    for flag in ("--api-key-host", "--proxy-for", "--allow-remote-credentialed"):
        with pytest.raises(SystemExit):
            build_parser().parse_args(["run", flag, "example.org/v1"])
        error = capsys.readouterr().err
        assert f"argument {flag}: 'example.org/v1' is neither a host nor a URL" in error, error
        assert "https://example.org/v1" in error
    args = build_parser().parse_args(["run", "--api-key-host", "example.org", "--proxy-for", "https://a.example/",
                                      "--allow-remote-credentialed", "https://example.org/v1"])
    assert (args.api_key_host, args.proxy_for, args.allow_remote_credentialed) == (
        ["example.org"], ["https://a.example/"], ["https://example.org/v1"])


@pytest.fixture
def reached_run(monkeypatch) -> list:
    """Replaces ``medheval run``'s handler: each call records the key hosts main() set, and returns 0."""
    import sys

    import medheval.cli  # noqa: F401 - loads medheval.cli.main (medheval.cli.main the attribute is the function)
    from medheval.net import keys

    reached: list = []
    monkeypatch.setattr(sys.modules["medheval.cli.main"], "cmd_run", lambda args: reached.append(keys.named_key_hosts()) or 0)
    return reached


@pytest.mark.parametrize("option, hosts", [
    ("x.cache=file:///tmp/cache", set()),  # a URL naming no host names none
    ("x.y={base_url: http://127.0.0.1:8000}", {"127.0.0.1:8000"}),  # the flow map's '}' is not its port's
    ("x.y={base_url: http://h.example:abc/v1}", set()),  # a URL naming no readable host names none
    ("x.y={base_url: https://[2001:db8::1]}", {"[2001:db8::1]"}),  # an IPv6 literal keeps its ']'
    ("x.y=[http://[::1]]", {"[::1]"}),  # the flow list's ']' is not the literal's
    ("x.y=[https://Judge.example, http://[::1]:8000]", {"judge.example", "[::1]:8000"}),
    ("sh_judge.judge=openai:m@https://User:pw@Judge.example/v1", {"judge.example"}),
])
def test_a_url_inside_a_metric_option_names_its_host_or_nothing_and_never_stops_the_command(
        reached_run, capsys, option, hosts):
    from medheval.cli import main
    from medheval.net import keys

    before = keys.named_key_hosts()
    assert main(["run", "--benchmark", "knowledge:open", "--metric-option", option]) == 0, capsys.readouterr().err
    assert reached_run == [before | hosts]
    assert keys.named_key_hosts() == before  # the earlier lists are restored


def test_the_api_key_host_flag_still_refuses_a_path_without_a_scheme(reached_run, capsys):
    from medheval.cli import main

    with pytest.raises(SystemExit):
        main(["run", "--api-key-host", "example.org/v1"])
    assert "argument --api-key-host: 'example.org/v1' is neither a host nor a URL" in capsys.readouterr().err
    assert reached_run == []


def test_a_judge_url_that_names_no_readable_host_is_refused_where_the_judge_is_built():
    from medheval.judges import JudgeError, make_judge

    with pytest.raises(JudgeError, match=r"^the openai endpoint's base_url: 'http://h.example:abc/v1' is not a host "
                                         r"name, host:port or URL \(Port could not be cast"):
        make_judge("openai:m@http://h.example:abc/v1", cache_dir=False)
    with pytest.raises(JudgeError, match=r"^the openai endpoint's base_url: 'https://\*\*\*@h.example:99999/v1' is "
                                         r"not a host name"):
        make_judge("openai:m@https://u:pw-secret@h.example:99999/v1", cache_dir=False)
    from medheval.backends.api import APIBackend
    from medheval.backends.base import BackendError

    with pytest.raises(BackendError, match=r"^--model 'openai:m@http://h.example:abc/v1': the openai endpoint's "
                                           r"base_url"):  # an API model under test is no judge
        APIBackend("openai:m@http://h.example:abc/v1", cache_dir=False)


@pytest.mark.parametrize("variable", ["MEDHEVAL_PROXY_FOR", "MEDHEVAL_API_KEY_HOSTS",
                                      "MEDHEVAL_ALLOW_REMOTE_CREDENTIALED", "MEDHEVAL_IMAGE_HOST"])
def test_main_refuses_a_bad_entry_of_any_host_list_variable_before_anything_runs(
        reached_run, capsys, monkeypatch, variable):
    from medheval.cli import main

    monkeypatch.setenv(variable, "example.net,example.org/v1")
    assert main(["run", "--benchmark", "knowledge:open"]) == 2
    assert capsys.readouterr().err == (
        f"error: {variable}: 'example.org/v1' is neither a host nor a URL: give either the host (example.org), "
        "which names every path on it, or a base URL with its scheme (https://example.org/v1)\n")
    assert reached_run == []


def test_a_bad_proxy_for_variable_stops_a_judge_run_once_with_its_message(monkeypatch, caplog):
    """From Python (no main() to check it first), MEDHEVAL_PROXY_FOR is read when a judge thread opens its
    session: the run stops once, naming the variable, not every record failing with an internal error."""
    from medheval.judges import JudgeError, JudgeRequest, make_judge

    monkeypatch.setenv("MEDHEVAL_PROXY_FOR", "judge.example/v1")
    judge = make_judge("openai:m@https://judge.example/v1", cache_dir=False, progress=False,
                       allow_remote_credentialed="judge.example", max_retries=0)
    requests = [JudgeRequest(f"r{i}", user="x", credentialed=True) for i in range(3)]
    with pytest.raises(JudgeError, match=r"^MEDHEVAL_PROXY_FOR: 'judge.example/v1' is neither a host nor a URL"):
        judge.run(requests)
    assert "internal error" not in caplog.text


def test_an_extra_proxy_for_entry_from_python_is_checked_as_every_entry_is(monkeypatch):
    from medheval.data.images import URLTemplateSource
    from medheval.net import transport

    monkeypatch.delenv(transport.PROXY_OPT_IN_ENV, raising=False)
    says = r"^proxy_for: 'example.org/v1' is neither a host nor a URL"
    for credentialed in (True, False):
        with pytest.raises(ValueError, match=says):
            transport.proxy_allowed("https://example.org/files/x", credentialed=credentialed,
                                    proxy_for=("example.org/v1",))
    with pytest.raises(ValueError, match=says):
        URLTemplateSource("https://example.org/files/{path}", proxy_for=("example.org/v1",))
    assert transport.proxy_allowed("https://example.org/files/x", credentialed=True, proxy_for=("example.org",))


@pytest.mark.parametrize("host, local", [
    ("10.0.0.1", True), ("[::1]", True), ("::1", True), ("[::ffff:a00:1]", True), ("localhost", True),
    ("10.0.0.1/x", False), ("localhost:8000", False), ("10.0.0.1:8000", False), ("evil.com\\@10.0.0.1", False),
    ("http://10.0.0.1/", False), ("[10.0.0.1]", False), ("[localhost]", False), ("user@10.0.0.1", False),
    ("127.0.0.1%x", False), ("[::1]:8000", False),
])
def test_is_local_host_judges_a_bare_host_only(monkeypatch, host, local):
    import socket

    from medheval.net.hosts import is_local_host, is_local_url, is_loopback_host

    monkeypatch.setattr(socket, "getaddrinfo", lambda name, *a, **k: [(socket.AF_INET, 1, 6, "", ("127.0.0.1", 0))])
    assert is_local_host(host) is local and is_loopback_host(host) is (local and host != "10.0.0.1"
                                                                        and host != "[::ffff:a00:1]")
    assert is_local_url("http://10.0.0.1:8000/x") and is_local_url("http://localhost:8000/v1")


def test_an_ipvfuture_literal_keeps_its_brackets():
    assert parse_address("[v1.abc]") == Address("", "[v1.abc]", None)
    assert parse_address("HTTP://[v1.abc]:80/x") == Address("http", "[v1.abc]", 80)
    assert host_entry("[v1.abc]") != host_entry("v1.abc")  # a literal is never the DNS name v1.abc


# -- a user-info never reaches a message, whatever it holds ----------------------------------------------------
# each piece of these user-infos holds "qz": no message may hold it, in any letter case (a host is lower-cased)
HOSTILE_USERINFOS = ["uQz1:pQz2://Qz3", "Qz1://Qz2:Qz3", "uQz1://Qz2", "uQz1:pQz2@Qz3", "uQz1:Qz2@Qz3://Qz4",
                     "uQz1:pQz2%40Qz3", "uQz1:Qz2:Qz3", "uQz1:pQz2/Qz3", "uQz1:80/Qz2", "uQz1:80://Qz2",
                     "uQz1:pQz2?Qz3", "uQz1:pQz2#Qz3", "uQz1:[Qz2]", "[Qz1", "uQz1:pQz2 @Qz3"]
HOSTILE_FORMS = ["https://{}@example.org/v1", "http://{}@10.0.0.1:8000/v1", "https://{}@example.org:abc/v1",
                 "http://{}@[fe80::1%25eth0]:8000/v1", "HTTPS://{}@[::1", "{}@example.org", "{}@example.org/v1",
                 "{}@:8080", "https://{}@"]


def _messages(text: str) -> list[str]:
    """What each host rule of medheval.net says about ``text``: its error, or the host it read."""
    from medheval.net.hosts import check_host_entry, mask_userinfo
    from medheval.net.keys import check_plain_http
    from medheval.net.transport import _host

    said = [host_entry(text), _host(text), mask_userinfo(text)]
    for rule in (parse_address, lambda t: check_host_entry(t, "--flag"), lambda t: check_plain_http(t, "a key")):
        try:
            rule(text)
        except ValueError as error:
            said.append(str(error))
    return said


@pytest.mark.parametrize("form", HOSTILE_FORMS)
@pytest.mark.parametrize("userinfo", HOSTILE_USERINFOS)
def test_no_part_of_a_user_info_reaches_a_message(form, userinfo):
    text = form.format(userinfo)
    said = _messages(text)
    assert not [message for message in said if "qz" in message.lower()], said


@pytest.mark.parametrize("text, shown", [
    ("https://us://er:pw@example.org/v1", "https://***@example.org/v1"),
    ("us://er:pw@example.org", "***@example.org"),  # not http(s): which part is a scheme is anyone's guess
    ("https://a@b:c@d.example/x", "https://***@d.example/x"),
    ("https://example.org/@user/x", "https://***@user/x"),  # an "@" in a path: less shown, never a password
    ("https://example.org/v1", "https://example.org/v1"),
    ("example.org", "example.org"),
])
def test_mask_userinfo_masks_up_to_the_last_at(text, shown):
    from medheval.net.hosts import mask_userinfo

    assert mask_userinfo(text) == shown


@pytest.mark.parametrize("text", ["http://alice:80/pw@10.0.0.1/v1", "https://alice:80?x@example.org/",
                                  "https://alice:443#pw@example.org/", "https://alice:/pw@example.org/",
                                  "https://example.org:8443/v1?mail=a@b.org"])
def test_an_at_after_a_host_and_port_is_refused_not_read_as_a_path(text):
    """A password of digits holding an unencoded '/', '?' or '#' ends the host early: every URL parser then reads
    the user name as the host and the password as the port. Refused, as no reading is safe; encoded, it is read."""
    with pytest.raises(ValueError, match=r"^'[^']*\*\*\*@[^']*' holds an '@' after its host and port, so it reads "):
        parse_address(text)
    assert host_entry(text) == ""
    assert parse_address("http://alice:80%2Fpw@10.0.0.1/v1") == Address("http", "10.0.0.1", None)


# every URL parser in use agrees on these hosts: the refusal is of what the writer may have meant, not of a disagreement
AT_AFTER_PORT = [("https://cdn.example.org:8443/repo@main/x", "cdn.example.org", 8443),
                 ("http://alice:80/pw@10.0.0.1", "alice", 80),  # alice:80/pw as user:password for 10.0.0.1
                 ("http://user:pw@host:80/x@evil", "host", 80),  # pw@host:80/x as the password for evil
                 ("https://alice:443?pw@evil.example/", "alice", 443), ("http://[::1]:80/x@evil", "[::1]", 80)]


@pytest.mark.parametrize("text, host, port", AT_AFTER_PORT)
def test_an_at_after_a_port_is_read_alike_by_every_parser_and_still_refused(text, host, port):
    """urlsplit and requests (urllib3) both read the host before the ':'; so would a browser. So "refuse only where
    the parsers disagree" would accept every one of these, the credential-bearing ones included, whose writer may
    have meant a password holding '/', '?' or '#' (sent in the path to the user name as a host). Refused, saying
    how to write each reading; nothing before the last '@' is shown."""
    from urllib.parse import urlsplit

    import requests
    import urllib3

    from medheval.net.hosts import AT_AFTER_PORT as ADVICE, AtAfterPort, mask_userinfo

    prepared = requests.PreparedRequest()
    prepared.prepare_url(text, None)
    parsed = urllib3.util.parse_url(prepared.url)
    assert (parsed.host, parsed.port) == (host, port)
    assert (urlsplit(text).hostname, urlsplit(text).port) == (host.strip("[]"), port)
    with pytest.raises(AtAfterPort) as info:
        parse_address(text)
    message = str(info.value)
    assert message == f"{mask_userinfo(text)!r} {ADVICE}"
    assert "%40 (https://host:8443/repo%40main/...)" in message and "%2F, %3F, %23 (https://user:pa%2Fss@" in message
    shown = message[: -len(ADVICE)]
    hidden = text.split("://", 1)[1].rpartition("@")[0]  # the user-info of the other reading
    assert [piece for piece in re.split(r"[:/?@\[\]]", hidden) if piece and piece in shown] == []


@pytest.mark.parametrize("text, host, port", [("https://cdn.example.org:8443/repo%40main/x", "cdn.example.org", 8443),
                                              ("http://alice:80%2Fpw@10.0.0.1/x", "10.0.0.1", None),
                                              ("http://user:pw%40host:80%2Fx@evil/", "evil", None),
                                              ("http://user:pw@host:80/x%40evil", "host", 80)])
def test_an_at_after_a_port_written_as_the_message_says_is_read_one_way(text, host, port):
    """Each reading, written as the refusal says (%40 in a path, %2F / %40 in a password), is read by every parser
    as the one host it names."""
    import requests
    import urllib3

    assert (parse_address(text).host, parse_address(text).port) == (host, port)
    prepared = requests.PreparedRequest()
    prepared.prepare_url(text, None)
    assert urllib3.util.parse_url(prepared.url).host == host


@pytest.mark.parametrize("text, host", [("https://cdn.jsdelivr.net/gh/org/repo@main/x", "cdn.jsdelivr.net"),
                                        ("https://registry.npmjs.org/@scope/pkg", "registry.npmjs.org"),
                                        ("https://example.org/v1?mail=a@b.org", "example.org"),
                                        ("https://[::1]/a@b", "[::1]")])
def test_an_at_in_the_path_or_query_of_a_host_without_port_is_the_paths(text, host):
    """Without a ':' in the authority no password can have been cut short there (a cut user name alone would
    be read as the host, and no credential goes to it): the '@' is the path's or query's, as every URL parser
    reads it."""
    assert parse_address(text).name == host
    assert host_entry(text) == host


@pytest.mark.parametrize("text", ["https://evil.example\\.physionet.org/files/", "https://evil.example\\@good.example/",
                                  "evil.example\\.physionet.org", "http://127.0.0.1:8000\\@10.0.0.1/v1"])
def test_a_backslash_before_the_path_is_refused(text):
    """urllib3, under requests, ends the authority at a backslash; urlsplit does not. Read by urlsplit,
    ``https://evil.example\\.physionet.org/`` was a physionet.org subdomain (its PHYSIONET_* credentials) that
    requests sent to evil.example. Refused wherever a host is read; encoded (%5C) in a user-info, it is read."""
    from urllib.parse import urlsplit

    import requests
    from urllib3.util import parse_url

    from medheval.net.hosts import host_named

    if "://" in text:  # the two readings, as they were
        assert parse_url(requests.Request("GET", text).prepare().url).host != urlsplit(text).hostname
    with pytest.raises(ValueError, match=r"holds a backslash before its path.*%5C"):
        parse_address(text)
    assert host_entry(text) == "" and not host_named(text, {"physionet.org", "good.example", "10.0.0.1"})
    assert parse_address("https://CORP%5Cbob:pw@good.example/a\\b") == Address("https", "good.example", None)


@pytest.mark.parametrize("text", ["https://gw.example.org:8443/v1?user=a@b.org&api-key=kq-canary-1",
                                  "https://gw.example.org:abc/v1?api-key=kq-canary-1",
                                  "https://u:p?a=kq-canary-1@gw.example.org:8443/v1?x@y",
                                  "gw.example.org:8443/v1?sig=kq-canary-1&x=@"])
def test_a_host_error_shows_no_query_value(text):
    """A host error quotes the text it refuses: its user-info masked first (up to the last '@', which may stand
    in a query), then every query value, so a key or signature in the query never shows."""
    with pytest.raises(ValueError) as info:
        parse_address(text)
    assert "kq-canary" not in str(info.value) and "***" in str(info.value)
