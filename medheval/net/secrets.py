"""One registry of the secret *values* this process holds, and :func:`redact`, which removes them.

Every secret the run is given is registered where it enters: API keys, passwords and user-info of base URLs,
every query parameter value of a base URL, every value of a header the user adds (except a few standard
headers that never carry one: :data:`PLAIN_HEADERS`), body fields named like secrets in ``extra_body``
(:func:`register_named`), image-server credentials (PhysioNet), and environment variables named like secrets
(:func:`register_environment`: ``OPENAI_API_KEY``, ``HF_TOKEN``, ``PHYSIONET_PASSWORD`` …). Redaction goes
by value, not by field name: a server echoing an ``X-Password`` header into its reply is redacted as surely
as an ``api_key`` field. :func:`redact` is applied where text leaves the process: the run's files
(``run.json``, ``results.json``, ``predictions.jsonl``, ``scored.jsonl``, ``report.html``), error messages
and tracebacks the CLI prints, log records. Each value is also removed in the forms those outputs spell it
(JSON-escaped, HTML-escaped, percent-encoded), in any letter case (a server echoing ``SK-…`` for ``sk-…``),
and base64-encoded inside a longer base64 text (:func:`_base64_forms`: a token echoed in an encoded header or
body).

Length rule. Only a value known to be a *password* (a basic-auth or URL password, an environment variable named
``*PASSWORD`` / ``*PASSWD`` / ``*PASSPHRASE``) is registered from :data:`SHORT_MIN_LENGTH` (4) characters: one
of 4 to 7 characters is removed only where it stands as a whole word (not inside a longer run of letters and
digits), so a password ``Pw12`` is removed from ``user Pw12 refused`` but not from ``Pw123``. API keys (``api_key``,
``OPENAI_API_KEY`` …) and values only *named* like secrets (other environment variables, ``extra_body`` fields,
headers, query parameters) are registered from :data:`MIN_LENGTH` (8) characters: a short "key" is a placeholder
(``OPENAI_API_KEY=EMPTY`` for a keyless vLLM) or a flag (``…_TOKEN=true``), and removing it would corrupt every
prediction and reference containing that word. Values of 1 to 3 characters are never registered, and neither is
a known placeholder in any letter case (:data:`PLACEHOLDERS`: ``EMPTY``, ``none``, ``dummy``,
``sk-no-key-required`` …) whatever its length: such a value is a common word, not a secret, so redacting it would
blank that word in model outputs. A real key must not be an English word.

Word-like rule. A registered value that reads like ordinary text (:func:`looks_like_word`: letters then at most
four digits, ``testtest``, ``password1``, ``Radiology2024``, or digits only, ``20240101``) is redacted all the
same, since it may be the real key and must not leak; but every occurrence of that word in predictions,
references and results then reads ``***``, so a warning says so once, naming where the value came from (the
variable, or the kind of value) and never the value: use a random key.
"""

from __future__ import annotations

import base64
import html
import json
import logging
import os
import re
import threading
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import parse_qsl, quote, quote_plus, urlsplit

from medheval.net.untrusted import printable

logger = logging.getLogger(__name__)

MIN_LENGTH = 8  # values merely named like secrets
SHORT_MIN_LENGTH = 4  # known passwords and keys (whole-word matches below MIN_LENGTH)
# environment variables whose value is a password whatever its length
PASSWORD_NAME = re.compile(r"(PASSWORD|PASSWD|PASSPHRASE)$", re.IGNORECASE)
MASK = "***"
# values that stand in for a key a server does not check: common words, never registered or redacted
PLACEHOLDERS = frozenset({"empty", "none", "null", "nil", "dummy", "placeholder", "unused", "test", "token", "secret",
                          "password", "changeme", "key", "apikey", "api-key", "api_key", "nokey", "no-key",
                          "not-needed", "not_needed", "notneeded", "sk-no-key-required", "no-key-required",
                          "ollama", "vllm", "lm-studio", "lmstudio", "local", "x", "xxx", "xxxx"})
# names that mark a value as a secret (field names in extra_body, environment variables, headers, query parameters);
# ``sig`` (a SAS or CDN URL's signature) only as a word of its own, so ``design`` or ``signal`` is no secret
SECRET_NAME = re.compile(r"key|token(?!s)|secret|pass(word|wd|phrase)?|pwd|auth|cookie|credential|signature|session"
                         r"|(?<![a-z])sig(?![a-z])", re.IGNORECASE)
# a URL query parameter's name marks its value as a secret more often: a signed URL's ``urlsig``, ``hmacsig`` or
# ``tokens`` (the ``sig``/``token`` inside a name, which SECRET_NAME leaves to field and variable names)
_SECRET_QUERY_EXTRA = re.compile(r"sig|token", re.IGNORECASE)


def is_secret_query_name(name: str) -> bool:
    """Whether a URL query parameter named ``name`` holds a secret: :data:`SECRET_NAME`, or ``sig``/``token`` anywhere
    in the name (``urlsig``, ``X-Amz-Signature``, ``tokens``)."""
    return bool(SECRET_NAME.search(name) or _SECRET_QUERY_EXTRA.search(name))


# environment variables named like secrets that hold none: the shell's working folders (``PWD`` would blank out
# every path under the current folder), agent sockets and desktop-session plumbing
NOT_SECRET_ENVIRONMENT = frozenset({"PWD", "OLDPWD", "SSH_AUTH_SOCK", "GPG_AGENT_INFO", "XAUTHORITY",
                                    "DBUS_SESSION_BUS_ADDRESS", "SESSION_MANAGER", "XDG_SESSION_ID",
                                    "XDG_SESSION_TYPE", "XDG_SESSION_CLASS", "XDG_SESSION_DESKTOP", "XDG_SESSION_PATH"})
# headers that never carry a secret (their values are not registered)
PLAIN_HEADERS = frozenset({"accept", "accept-encoding", "accept-language", "content-type", "user-agent",
                           "anthropic-version", "anthropic-beta", "openai-beta", "api-version", "connection"})

_lock = threading.Lock()
_secrets: set[str] = set()
_forms: list[tuple[str, str]] = []  # every registered value in every spelling, longest first, with its casefold
_short: list[re.Pattern[str]] = []  # the spellings of 4-7 character values, as one whole-word pattern
_WORD = "A-Za-z0-9"
_WORD_LIKE = re.compile(r"[A-Za-z]+[0-9]{0,4}|[0-9]+")
_warned: set[str] = set()  # word-like values already pointed out (never printed)


def _base64_forms(secret: str) -> set[str]:
    """The base64 characters that spell ``secret`` wherever it sits in a longer encoded text: with k = 0, 1, 2
    bytes before it (its offset mod 3), encode k zero bytes + its UTF-8 bytes b and keep the characters that
    depend on b alone, from ⌈8k/6⌉ to ⌊8(k + |b|)/6⌋ (each character carries 6 bits)."""
    data = secret.encode("utf-8")
    forms = set()
    for k in range(3):
        encoded = base64.b64encode(bytes(k) + data).decode("ascii")
        forms.add(encoded[-(-8 * k // 6): 8 * (k + len(data)) // 6])
    return {form for form in forms if len(form) >= MIN_LENGTH}


def _spellings(secret: str) -> set[str]:
    return {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1], html.escape(secret),
            html.escape(secret, quote=False), quote(secret, safe=""), quote_plus(secret), *_base64_forms(secret)}


def is_placeholder(value: str) -> bool:
    """Whether ``value`` is a known stand-in for a key (:data:`PLACEHOLDERS`, any letter case), not a secret."""
    return value.strip().casefold() in PLACEHOLDERS


def looks_like_word(value: str) -> bool:
    """Whether ``value`` reads like ordinary text rather than a random key: letters then at most four digits
    (``testtest``, ``password1``, ``Radiology2024``), or digits only (``20240101``)."""
    return bool(_WORD_LIKE.fullmatch(value))


def register_secrets(*secrets: Any, min_length: int = MIN_LENGTH,
                     source: str = "a secret value this run was given (an API key, password, header or URL value)"
                     ) -> None:
    """Remember secret values, so that :func:`redact` removes them from everything written or printed. Values
    shorter than ``min_length`` (never below :data:`SHORT_MIN_LENGTH`) and placeholders (:func:`is_placeholder`) are
    skipped; pass ``min_length=SHORT_MIN_LENGTH`` only for a value known to be a password, never for an API key
    (see the module's length rule). A word-like value (:func:`looks_like_word`) is registered too, with a warning
    naming ``source`` (never the value), the first time that value is registered."""
    floor = max(int(min_length), SHORT_MIN_LENGTH)
    new = {str(s) for s in secrets if s is not None and len(str(s)) >= floor and not is_placeholder(str(s))}
    with _lock:
        if new <= _secrets:
            return
        word_like = {value for value in new - _warned if looks_like_word(value)}
        _warned.update(word_like)
        _secrets.update(new)
        forms = set().union(*(_spellings(s) for s in _secrets))
        _forms[:] = [(f, f.casefold()) for f in sorted((f for f in forms if len(f) >= MIN_LENGTH), key=len, reverse=True)]
        short = sorted((f for f in forms if SHORT_MIN_LENGTH <= len(f) < MIN_LENGTH), key=len, reverse=True)
        _short[:] = [re.compile(f"(?<![{_WORD}])(?:{'|'.join(map(re.escape, short))})(?![{_WORD}])",
                                re.IGNORECASE)] if short else []
    if word_like:
        logger.warning(
            "%s looks like an ordinary word or number, not a random key: it is redacted all the same, so every "
            "occurrence of that word in predictions, references, results and logs will read %s. Use a random key "
            "(e.g. `openssl rand -hex 24`)", source, MASK)


# field names SECRET_NAME matches whose values are not secrets: a host list (``allow_remote_credentialed``), the name of
# a variable (``api_key_env``), a tokenizer or a path; registered, a host would read *** in every message and file
NOT_SECRET_FIELD = re.compile(r"^allow_remote_credentialed$|tokenizer|_env$|_path$|_dir$", re.IGNORECASE)


def is_secret_field(name: str) -> bool:
    """Whether a field named ``name`` holds a secret: :data:`SECRET_NAME` and not :data:`NOT_SECRET_FIELD`."""
    return bool(SECRET_NAME.search(name)) and not NOT_SECRET_FIELD.search(name)


def register_named(value: Any, secret: bool = False) -> None:
    """Register every string under a key named like a secret (:func:`is_secret_field`), at any depth of a JSON-like
    value (``extra_body={"api_key": "…", "auth": {"token": "…"}}``)."""
    if isinstance(value, Mapping):
        for key, item in value.items():
            register_named(item, secret or is_secret_field(str(key)))
    elif isinstance(value, (list, tuple)):
        for item in value:
            register_named(item, secret)
    elif secret and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        register_secrets(str(value))


def register_headers(headers: Mapping[str, Any] | None) -> None:
    """Register the value of every header except the standard ones in :data:`PLAIN_HEADERS`."""
    for name, value in (headers or {}).items():
        if str(name).strip().lower() not in PLAIN_HEADERS and isinstance(value, str):
            register_secrets(value)


def register_basic_auth(user: str | None, password: str | None) -> None:
    """Register a basic-auth password and the header value it travels in (``base64(user:password)``), which
    a server may echo back."""
    import base64

    if password:
        token = base64.b64encode(f"{user or ''}:{password}".encode("utf-8")).decode("ascii")
        register_secrets(password, token, min_length=SHORT_MIN_LENGTH)


# query parameters whose value is never a secret: Azure's ``?api-version=2024-10-21`` (a date, recorded as the run's
# api_version, would otherwise read *** there and in every text holding that date)
NOT_SECRET_QUERY = frozenset({"api-version"})


def register_url(url: str | None) -> None:
    """Register a URL's password and every query parameter value (``?key=…``, ``?sig=…``) but those of
    :data:`NOT_SECRET_QUERY`."""
    if not url:
        return
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:
        return
    register_secrets(password, min_length=SHORT_MIN_LENGTH)
    register_secrets(*(value for name, value in parse_qsl(parts.query, keep_blank_values=False)
                       if name.strip().lower() not in NOT_SECRET_QUERY))


URL_PATTERN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"<>]+")


def register_urls_in(value: Any) -> None:
    """:func:`register_url` for every URL inside the strings of a JSON-like value (a ``--model`` or ``--judge``
    spec, ``openai:gpt-4o@https://host/v1?api-key=…``), and :func:`register_named` for its secret-named fields;
    called where a spec enters, before anything can print it."""
    if isinstance(value, str):
        for url in URL_PATTERN.findall(value):
            register_url(url)
    elif isinstance(value, Mapping):
        register_named(value)
        for item in value.values():
            register_urls_in(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            register_urls_in(item)


def register_environment(environ: Mapping[str, str] | None = None) -> None:
    """Register the values of environment variables named like secrets (``*_API_KEY``, ``HF_TOKEN``,
    ``PHYSIONET_PASSWORD`` …)."""
    environ = os.environ if environ is None else environ
    for name, value in environ.items():
        if SECRET_NAME.search(name) and name.upper() not in NOT_SECRET_ENVIRONMENT:
            register_secrets(value, min_length=SHORT_MIN_LENGTH if PASSWORD_NAME.search(name) else MIN_LENGTH,
                             source=f"the value of {name}")


def redact(text: str | None, secrets: Iterable[str] = ()) -> str | None:
    """``text`` with every registered secret, and ``secrets`` (from :data:`MIN_LENGTH` characters, placeholders
    excepted), replaced by ``***`` in
    each spelling and any letter case (longest first, so a secret containing another is removed whole); a
    registered value under :data:`MIN_LENGTH` characters only where it stands as a whole word."""
    if not text:
        return text
    with _lock:
        forms = list(_forms)
        short = list(_short)
    extra = sorted(set().union(*(_spellings(s) for s in secrets if s and len(s) >= MIN_LENGTH and not is_placeholder(s))),
                   key=len, reverse=True)
    pairs = [(form, form.casefold()) for form in extra] + forms
    folded = text.casefold() if pairs else ""
    for form, folded_form in pairs:
        if form in text:
            text = text.replace(form, MASK)
        if folded_form in folded:  # also when the exact spelling was there: other letter cases may be too
            text = re.sub(re.escape(form), MASK, text, flags=re.IGNORECASE)
    for pattern in short:
        text = pattern.sub(MASK, text)
    return text


def redact_data(value: Any) -> Any:
    """A JSON-like value with :func:`redact` applied to every string in it (keys included)."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {redact(k) if isinstance(k, str) else k: redact_data(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact_data(v) for v in value]
    return value


_hooks_installed = False


def install_redacting_hooks() -> None:
    """Redact what the process prints on its own: uncaught tracebacks (``sys.excepthook``, also in threads) and
    every log record (its message and traceback), whatever logger or handler prints it, with control characters
    escaped (:func:`medheval.net.untrusted.printable`). Idempotent."""
    global _hooks_installed
    if _hooks_installed:
        return
    _hooks_installed = True
    import logging
    import sys
    import threading
    import traceback

    def excepthook(kind, value, tb) -> None:
        sys.stderr.write(printable(redact("".join(traceback.format_exception(kind, value, tb)))) or "")

    def thread_excepthook(args) -> None:
        if args.exc_type is SystemExit:
            return
        name = getattr(args.thread, "name", "?")
        text = "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
        sys.stderr.write(printable(redact(f"Exception in thread {name}:\n{text}")) or "")

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
    make_record = logging.getLogRecordFactory()

    def redacting_record(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = make_record(*args, **kwargs)
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed log call is the logging module's to report
            return record
        record.msg, record.args = printable(redact(message)), ()
        if record.exc_info and not record.exc_text:
            record.exc_text = printable(redact("".join(traceback.format_exception(*record.exc_info)).rstrip("\n")))
        return record

    logging.setLogRecordFactory(redacting_record)


__all__ = ["install_redacting_hooks", "register_basic_auth", "MIN_LENGTH", "PASSWORD_NAME", "SHORT_MIN_LENGTH",
           "URL_PATTERN", "NOT_SECRET_ENVIRONMENT", "PLACEHOLDERS", "is_placeholder", "looks_like_word", "PLAIN_HEADERS", "SECRET_NAME",
           "is_secret_query_name", "redact", "redact_data", "register_environment",
           "register_headers", "register_named", "register_secrets", "register_url", "register_urls_in"]
