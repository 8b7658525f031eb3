"""The one parser of what names a host (medheval.net.hosts.parse_address) and the one host-list rule
(medheval.net.named.UserNamedHosts.covers), by known answers."""

from __future__ import annotations

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
    monkeypatch.setenv(ENV, " , Images.Example.ORG., ,api.example.org:8443,not a:port, [::1]:9000")
    assert named.names() == {"images.example.org", "api.example.org:8443", "[::1]:9000"}  # empty/garbage dropped
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
    (" , physionet.org:abc, ", "https://physionet.org/x", False),  # empty and unparseable entries name nothing
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
