"""Images fetched by ID from where the user may legally get them.

Records carry image *references* (``images: list[str]``), relative to a per-source root,
never bytes: SLAKE ``xmlab<N>/source.jpg``, VQA-RAD ``synpic<N>.jpg``, IU-Xray
``CXR<id>_IM-<nnnn>/0.png``, MIMIC-CXR-JPG ``p<XX>/p<subject>/s<study>/<dicom_id>.jpg``
(relative to the MIMIC-CXR-JPG ``files/`` folder). An :class:`ImageResolver` maps each
source to an :class:`ImageSource`:

* :class:`LocalFolderSource` -- a folder on disk (``/data/slake/imgs``, ``file:///...``);
* :class:`URLTemplateSource` -- an HTTP(S) URL template with optional basic auth, e.g.
  ``https://physionet.org/files/mimic-cxr-jpg/2.1.0/files/{path}`` with PhysioNet
  credentials from ``PHYSIONET_USERNAME``/``PHYSIONET_PASSWORD`` or ``~/.netrc``;
* :class:`HFDatasetSource` -- a ``datasets.Dataset`` with an id column and an image column
  (``hf://user/dataset:split#id_column=id,image_column=image``).

>>> resolver = ImageResolver(parse_image_root_args(["mimic_cxr=/data/mimic-cxr-jpg/2.1.0/files"]))
>>> kept, skipped = resolver.partition(records, on_missing="skip")  # doctest: +SKIP
>>> images = resolver.load_record_images(kept[0])                   # doctest: +SKIP

References are checked before use: absolute paths, ``..`` components (also percent-encoded),
backslashes, control characters and symlinks leaving the root are refused
(:class:`UnsafeImagePath`). Credentials never appear in ``describe()``, ``repr`` or
exception messages. Nothing is decoded until :meth:`ImageResolver.open` is called.
"""

from __future__ import annotations

import hashlib
from http import HTTPStatus
import io
import ipaddress
import logging
import netrc
import os
import re
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import requests
from PIL import Image

from medheval.data.schema import is_credentialed
from medheval.net import transport
from medheval.net.hosts import AtAfterPort, is_host_form, mask_userinfo, parse_address
from medheval.net.keys import IMAGE_HOST_ENV, check_plain_http, image_hosts
from medheval.net.secrets import is_secret_query_name, redact, register_basic_auth, register_url

__all__ = [
    "REFERENCE_PATTERNS",
    "check_reference",
    "looks_credentialed",
    "reference_problem",
    "ImageError",
    "UnsafeImagePath",
    "ImageNotFound",
    "NoImageRoot",
    "MissingImagesError",
    "MimicDicomSource",
    "ImageFetchError",
    "ImageDecodeError",
    "check_pixels",
    "max_pixels",
    "ImageSource",
    "LocalFolderSource",
    "URLTemplateSource",
    "HFDatasetSource",
    "parse_image_root",
    "parse_image_root_args",
    "ImageResolver",
]

# --------------------------------------------------------------------------- references

# a MIMIC-CXR DICOM id (the stem of a MIMIC-CXR-JPG file name), as a pattern text: every MIMIC-shaped check builds
# on it (here, Arrow's in medheval.data.benchmarks, the publish guard's, Med-HallMark's)
DICOM_ID_PATTERN = r"[0-9a-f]{8}(?:-[0-9a-f]{8}){4}"

REFERENCE_PATTERNS: dict[str, re.Pattern[str]] = {
    # SLAKE imgs/ folder
    "slake": re.compile(r"xmlab\d+/source\.jpg"),
    # VQA-RAD "VQA_RAD Image Folder"
    "vqa_rad": re.compile(r"synpic\d+\.jpg"),
    # IU-Xray in the R2Gen/R2GenGPT iu_xray/images/ layout
    "iu_xray": re.compile(r"CXR\d+_IM-\d{4}(?:-\d+)*/\d+\.png"),
    # MIMIC-CXR-JPG files/ folder: p<first two digits of subject>/p<subject>/s<study>/<dicom_id>.jpg,
    # or a bare <dicom_id>.jpg (Med-HallMark; see MimicDicomSource)
    "mimic_cxr": re.compile(rf"(?:p(\d{{2}})/p\1\d{{6}}/s\d{{8}}/)?{DICOM_ID_PATTERN}\.jpg"),
}

# Where each known source's references are relative to (used in error hints).
_LAYOUT_HINTS: dict[str, str] = {
    "slake": "the SLAKE 'imgs/' folder (holding xmlab<N>/source.jpg)",
    "vqa_rad": "the VQA-RAD image folder (holding synpic<N>.jpg)",
    "iu_xray": "the IU-Xray 'iu_xray/images/' folder in the R2Gen layout (holding CXR<id>_IM-<nnnn>/0.png)",
    "mimic_cxr": (
        "the MIMIC-CXR-JPG 'files/' folder (holding p<XX>/p<subject>/s<study>/<dicom_id>.jpg), or the URL "
        "template https://physionet.org/files/mimic-cxr-jpg/2.1.0/files/{path} with PhysioNet credentials"
    ),
}

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:")
_URL_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)://")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MAX_COMPONENT_BYTES = 255  # the longest file or folder name any common file system allows (NAME_MAX)


def _unsafe_reason(ref: object) -> str | None:
    """Why ``ref`` is not a safe relative path, or None when it is."""
    if not isinstance(ref, str):
        return f"a reference must be a string, not {type(ref).__name__}"
    if not ref:
        return "empty reference"
    # Check the reference as written and every percent-decoding of it (``%2e%2e/``,
    # ``%252e%252e/``), so no server or filesystem layer can turn it into a traversal.
    seen = ref
    for _ in range(4):
        reason = _unsafe_reason_once(seen)
        if reason is not None:
            return reason if seen == ref else f"{reason} once percent-decoded ({seen!r})"
        decoded = unquote(seen)
        if decoded == seen:
            return None
        seen = decoded
    return "too many levels of percent-encoding"


def _unsafe_reason_once(ref: str) -> str | None:
    if "\x00" in ref:
        return "contains a NUL byte"
    if _CONTROL.search(ref):
        return "contains a control character"
    if "\\" in ref:
        return "contains a backslash (use '/' as the separator)"
    if ref.startswith("/"):
        return "is an absolute path"
    if _SCHEME.match(ref):
        return "has a scheme or drive prefix (references are relative to the image root)"
    for part in ref.split("/"):
        if part == "..":
            return "has a '..' component"
        if part in ("", "."):
            return "has an empty or '.' path component"
        if len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
            return f"has a path component longer than {MAX_COMPONENT_BYTES} bytes (no file system holds such a name)"
    return None


def check_reference(source: str, ref: str) -> bool:
    """True when ``ref`` is a well-formed image reference for ``source``.

    Known sources (:data:`REFERENCE_PATTERNS`) must match their layout; any other source
    accepts any safe relative path (no ``..``, not absolute, no backslash or control chars).
    """
    if _unsafe_reason(ref) is not None:
        return False
    pattern = REFERENCE_PATTERNS.get(source)
    return pattern is None or pattern.fullmatch(ref) is not None


def looks_credentialed(ref: str) -> bool:
    """Whether ``ref`` names a MIMIC-CXR-JPG file: its last component is ``<dicom_id>.jpg``, as in
    ``p10/p10000032/s50414267/<dicom_id>.jpg`` (or bare, Med-HallMark). A record that is not credentialed must
    not name one: it would be sent or embedded as if it were not MIMIC."""
    return isinstance(ref, str) and REFERENCE_PATTERNS["mimic_cxr"].fullmatch(ref.rsplit("/", 1)[-1]) is not None


def reference_problem(source: str, ref: str, credentialed: bool) -> str | None:
    """Why a record of ``source`` may not name image ``ref`` (None when it may): a known source's reference
    must match its layout (:func:`check_reference`), and a record that is not credentialed must not name a
    MIMIC-shaped file (:func:`looks_credentialed`), whatever its source."""
    if not check_reference(source, ref):
        reason = _unsafe_reason(ref)
        return reason or f"does not match the {source} layout ({_LAYOUT_HINTS.get(source, 'its image folder')})"
    if not credentialed and looks_credentialed(ref):
        return ("is shaped like a MIMIC-CXR image but the record is not credentialed (source "
                f"{source!r}): mark it meta.credentialed=true or fix its source or reference")
    return None


def _safe_parts(ref: str, root: str) -> list[str]:
    """The ``/``-separated components of a safe reference; :class:`UnsafeImagePath` otherwise."""
    reason = _unsafe_reason(ref)
    if reason is not None:
        raise UnsafeImagePath(ref, root, reason)
    return ref.split("/")


# --------------------------------------------------------------------------- errors


class ImageError(Exception):
    """Base class of every error raised by :mod:`medheval.data.images`."""


class UnsafeImagePath(ImageError, ValueError):
    """A reference that would leave its image root (absolute, ``..``, symlink out, ...)."""

    def __init__(self, ref: str, root: str, reason: str = "leaves the image root", hint: str | None = None) -> None:
        self.ref = ref
        self.root = root
        self.reason = reason
        hint = hint or ("References must be relative paths inside the image root; check the annotation file this "
                        "record came from.")
        super().__init__(f"unsafe image reference {ref!r} for root {root}: {reason}. {hint}")


def _root_hint(source: str | None) -> str:
    layout = _LAYOUT_HINTS.get(source or "")
    name = source or "SOURCE"
    if layout:
        return f"check that --image-root {name}=PATH points at {layout}"
    return f"check that --image-root {name}=PATH points at the folder (or URL template) the references are relative to"


class ImageNotFound(ImageError):
    """One image is not where its source says it should be."""

    def __init__(self, source: str | None, ref: str, where: str, hint: str | None = None) -> None:
        self.source = source
        self.ref = ref
        self.where = where
        self.explicit_hint = hint
        self.hint = hint or _root_hint(source)
        label = f" (source {source!r})" if source else ""
        super().__init__(f"image {ref!r}{label} not found: looked at {where}. To fix: {self.hint}.")


class NoImageRoot(ImageNotFound):
    """An image of a source for which no image root was configured."""

    def __init__(self, source: str, ref: str) -> None:
        layout = _LAYOUT_HINTS.get(source)
        hint = f"pass --image-root {source}=PATH_OR_URL (image_roots={{{source!r}: ...}})"
        if layout:
            hint += f", pointing at {layout}"
        super().__init__(source, ref, f"no image root configured for source {source!r}", hint)


class MissingImagesError(ImageError):
    """Some records reference images that are not available; ``.missing`` lists (record id, ref),
    ``.undecodable`` (record id, ref, reason) for local files whose header no image decoder reads."""

    def __init__(
        self,
        missing: Sequence[tuple[str, str]],
        roots: Mapping[str, str] | None = None,
        unconfigured: Sequence[str] = (),
        show: int = 20,
        undecodable: Sequence[tuple[str, str, str]] = (),
    ) -> None:
        self.missing = list(missing)
        self.undecodable = list(undecodable)
        self.roots = dict(roots or {})
        self.unconfigured = list(unconfigured)
        lines: list[str] = []
        if self.missing:
            ids = list(dict.fromkeys(rid for rid, _ in self.missing))
            lines.append(f"{len(self.missing)} image(s) missing for {len(ids)} record(s):")
            lines += [f"  - {rid}: {ref}" for rid, ref in self.missing[:show]]
            if len(self.missing) > show:
                lines.append(f"  ... and {len(self.missing) - show} more")
        if self.undecodable:
            ids = list(dict.fromkeys(rid for rid, _, _ in self.undecodable))
            lines.append(f"{len(self.undecodable)} image(s) undecodable (corrupt or not an image) for {len(ids)} "
                         f"record(s):")
            lines += [f"  - {rid}: {ref} ({why})" for rid, ref, why in self.undecodable[:show]]
            if len(self.undecodable) > show:
                lines.append(f"  ... and {len(self.undecodable) - show} more")
        if self.unconfigured:
            flags = " ".join(f"--image-root {s}=PATH_OR_URL" for s in self.unconfigured)
            lines.append(f"No image root is configured for source(s) {', '.join(self.unconfigured)}: pass {flags}.")
        if self.roots:
            lines.append("Image roots in use: " + "; ".join(f"{k} -> {v}" for k, v in self.roots.items()) + ".")
        lines.append(
            "To fix: check --image-root SOURCE=PATH points at the folder or URL the references are relative to"
            + (" and replace the undecodable files" if self.undecodable else "")
            + ", or pass --on-missing skip (Python: on_missing=\"skip\") to skip these records and count them."
        )
        super().__init__("\n".join(lines))


class ImageFetchError(ImageError):
    """An HTTP fetch failed for a reason other than 404 (auth, server error, timeout)."""

    def __init__(self, url: str, status: int | None = None, reason: str = "", hint: str = "") -> None:
        self.url = _redact_url(url)
        self.status = status
        self.reason = reason
        self.hint = hint
        what = f"HTTP {status}" if status is not None else "request failed"
        text = f"fetching {self.url}: {what}"
        if reason:
            text += f" ({reason})"
        if hint:
            text += f". {hint}"
        super().__init__(text)


class ImageDecodeError(ImageError):
    """The bytes of an image could not be decoded by PIL. When raised by :meth:`ImageResolver.open`, ``ref``,
    ``source`` and ``location`` (a local file's path, else the reference in its root's description) name it."""

    def __init__(self, message: str, ref: str | None = None, source: str | None = None,
                 location: str | None = None) -> None:
        super().__init__(message)
        self.ref = ref
        self.source = source
        self.location = location


class ImageRootUnavailable(ImageError):
    """An image root (an ``hf://`` dataset) cannot be opened at all: offline, unknown id, no access."""


# --------------------------------------------------------------------------- sources


@runtime_checkable
class ImageSource(Protocol):
    """Where the images of one source live; references are relative to it."""

    def describe(self) -> str:
        """A one-line description, safe to log (never contains credentials)."""
        ...

    def exists(self, ref: str) -> bool:
        """True when the image ``ref`` is available."""
        ...

    def open_bytes(self, ref: str) -> bytes:
        """The raw (encoded) bytes of image ``ref``; :class:`ImageNotFound` when absent."""
        ...


class LocalFolderSource:
    """Images in a local folder: ``ref`` resolves to ``root/ref``.

    References are refused when absolute, containing ``..``/backslashes/NUL bytes, or when
    they resolve (through a symlink) outside the root. Point the root at the real image
    folder, not at a folder of symlinks into another tree.
    """

    is_remote = False

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).expanduser()
        self._resolved_root = self.root.resolve()

    def describe(self) -> str:
        return f"local folder {self.root}"

    def __repr__(self) -> str:
        return f"LocalFolderSource({str(self.root)!r})"

    def path_for(self, ref: str) -> Path:
        """The resolved on-disk path of ``ref`` (checked to stay inside the root)."""
        parts = _safe_parts(ref, str(self.root))
        resolved = self._resolved_root.joinpath(*parts).resolve()
        if not resolved.is_relative_to(self._resolved_root):
            raise UnsafeImagePath(ref, str(self.root), "resolves outside the root (through a symlink)")
        return resolved

    def exists(self, ref: str) -> bool:
        """Whether ``ref`` is a file under the root; a path the OS cannot look up (too long, a loop) is absent."""
        path = self.path_for(ref)
        try:
            return path.is_file()
        except OSError:
            return False

    def open_bytes(self, ref: str) -> bytes:
        path = self.path_for(ref)
        try:
            return path.read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            hint = None
            if not self._resolved_root.is_dir():
                hint = f"the image root {self.root} itself does not exist or is not a folder; " + _root_hint(None)
            raise ImageNotFound(None, ref, str(path), hint) from None
        except PermissionError:
            raise ImageError(f"image {ref!r}: permission denied reading {path}") from None
        except OSError as error:  # a name too long, a symlink loop, an I/O error: this image cannot be read
            raise ImageNotFound(None, ref, str(path), f"the file cannot be read here ({error.strerror or error})") from None


DEADLINE_ENV = "MEDHEVAL_IMAGE_DEADLINE"
MAX_MB_ENV = "MEDHEVAL_IMAGE_MAX_MB"
DEFAULT_DEADLINE = 60.0  # seconds for one image, retries and redirects included
DEFAULT_MAX_BYTES = 64 * 2**20  # one image (a MIMIC-CXR JPEG is 0.5-3 MB, an IU-Xray PNG far less)
SOURCE_MODE = "medheval_source_mode"  # image.info key: the PIL mode the file was stored in, before the RGB decode
MAX_PIXELS_ENV = "MEDHEVAL_IMAGE_MAX_PIXELS"
DEFAULT_MAX_PIXELS = 50_000_000  # one decoded image, ~150 MB as RGB (a MIMIC-CXR JPEG is about 3000x2500 = 7.5 M)


def _env_number(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name}={raw[:40]!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise ValueError(f"{name}={raw[:40]!r} must be a positive number")
    return value


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


def max_pixels() -> int:
    """The cap on one decoded image: ``MEDHEVAL_IMAGE_MAX_PIXELS``, default :data:`DEFAULT_MAX_PIXELS`."""
    return int(_env_number(MAX_PIXELS_ENV, DEFAULT_MAX_PIXELS))


def check_pixels(image: Image.Image, what: str, limit: int | None = None) -> None:
    """Refuse an opened (not yet decoded) image whose canvas is over ``limit`` (default :func:`max_pixels`).
    A small file can declare a huge canvas (a decompression bomb: 160 KB of PNG decoding to 13000x13000); the
    size cap on downloads does not see it, and PIL only warns below ~179 M pixels."""
    limit = max_pixels() if limit is None else limit
    width, height = image.size
    if width * height > limit:
        raise ImageDecodeError(
            f"{what} declares {width}x{height} = {width * height:,} pixels, over the cap of {limit:,}; it was not "
            f"decoded. If the image is genuine, raise the cap with {MAX_PIXELS_ENV}=N."
        )


# The raster formats medical benchmarks store images in; PIL's other plugins (EPS, which runs Ghostscript, and
# dozens of rarely used parsers) are never reached from an image a dataset or a server chose.
IMAGE_FORMATS: tuple[str, ...] = ("JPEG", "PNG", "GIF", "BMP", "TIFF", "WEBP")  # a multi-picture JPEG opens as JPEG


def open_image(source: Any, what: str) -> Image.Image:
    """``PIL.Image.open(source)`` (a path or a binary file object) restricted to :data:`IMAGE_FORMATS`;
    :class:`ImageDecodeError` naming ``what`` and the allowed formats for any other file."""
    try:
        return Image.open(source, formats=IMAGE_FORMATS)
    except Image.UnidentifiedImageError:
        raise ImageDecodeError(
            f"{what} is not an image in an allowed format ({', '.join(IMAGE_FORMATS)}); other formats (EPS, "
            f"PSD, PDF, ...) are refused. Convert it to PNG or JPEG.") from None


def _redact_url(url: str) -> str:
    """``url`` with secret-looking query values replaced by ``***``, then its user-info as ``***``
    (:func:`~medheval.net.hosts.mask_userinfo`, whatever it holds). In this order: masking first would turn an
    ``@`` in the path or query into the end of a user-info, and the ``?sig=`` after it into part of the host."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "<unparseable URL>"
    query = parts.query
    if query:
        items = []
        for item in query.split("&"):
            name, sep, _ = item.partition("=")
            items.append(f"{name}{sep}***" if sep and is_secret_query_name(name) else item)
        query = "&".join(items)
    return mask_userinfo(urlunsplit((parts.scheme, parts.netloc, parts.path, query, parts.fragment)))


# hosts whose credentials have a documented name; the prefix covers the host and its subdomains only
KNOWN_CREDENTIAL_HOSTS = {"physionet.org": "PHYSIONET"}
# the generic image-server credentials, and the one host they belong to
GENERIC_CREDENTIALS = "MEDHEVAL_IMAGE"
# the image servers they go to: IMAGE_HOST_ENV names them (net.keys.image_hosts, matched as the API-key hosts)
_LABEL = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
logger = logging.getLogger(__name__)
_renamed_warned: set[str] = set()  # hosts whose renamed credential variables were already pointed out


def _host_env_prefix(host: str) -> str | None:
    """The prefix of a host's ``<PREFIX>_USERNAME``/``<PREFIX>_PASSWORD``: ``physionet.org`` (and its subdomains)
    -> ``PHYSIONET``; any other host -> its whole name, upper case, each ``.`` as ``_`` and each ``-`` as ``__``
    (``images.example.com`` -> ``IMAGES_EXAMPLE_COM``, ``images-example.com`` -> ``IMAGES__EXAMPLE_COM``), a
    leading ``www.`` dropped (the same site). Two hosts never share a prefix, so a look-alike (``physionet.io``,
    ``physionet.org.example.com``, ``images-example.com``) never gets another host's credentials. None for IP
    addresses and names that are not plain DNS names (``_``, non-ASCII: give ``env_prefix`` or use ~/.netrc)."""
    host = host.strip("[]").lower().rstrip(".")
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    for domain, prefix in KNOWN_CREDENTIAL_HOSTS.items():
        if host == domain or host.endswith("." + domain):
            return prefix
    labels = host.removeprefix("www.").split(".")
    if not all(_LABEL.match(label) for label in labels):
        return None
    return "_".join(label.replace("-", "__") for label in labels).upper()


def _netrc_host(machine: str) -> str | None:
    """A netrc ``machine`` name as :func:`~medheval.net.hosts.parse_address` names its host (``Address.name``),
    or None for one that is not a bare host (a port, path, scheme or user-info: never matched)."""
    if not is_host_form(machine):
        return None
    try:
        address = parse_address(machine)
    except ValueError:
        return None
    return address.name if address.port is None else None


def _legacy_env_prefix(host: str) -> str | None:
    """The prefix a hyphenated host had before ``-`` mapped to ``__`` (each ``-`` as ``_``, so
    ``images-example.com`` -> ``IMAGES_EXAMPLE_COM``, which is now ``images.example.com``'s); None when the host
    has no ``-`` (its prefix is unchanged) or no prefix."""
    prefix = _host_env_prefix(host)
    if prefix is None or "__" not in prefix or prefix in KNOWN_CREDENTIAL_HOSTS.values():
        return None
    return prefix.replace("__", "_")


def _renamed_credentials_notice(host: str, prefix: str) -> str | None:
    """What to say when ``host``'s credentials are absent under ``prefix`` but set under its old-style prefix
    (:func:`_legacy_env_prefix`): those are no longer sent to it (they name another host's variables now)."""
    if os.environ.get(f"{prefix}_USERNAME") or os.environ.get(f"{prefix}_PASSWORD") is not None:
        return None
    legacy = _legacy_env_prefix(host)
    if legacy is None or legacy == prefix:
        return None
    found = [name for name in (f"{legacy}_USERNAME", f"{legacy}_PASSWORD") if os.environ.get(name) is not None]
    if not found:
        return None
    return (f"{'/'.join(found)} {'is' if len(found) == 1 else 'are'} set but no longer sent to {host}: a '-' in a "
            f"host name now maps to '__' in its credential variables, so {host} reads {prefix}_USERNAME/"
            f"{prefix}_PASSWORD (and {legacy}_* belong to the host {legacy.lower().replace('_', '.')} only). "
            f"Rename the variables to {prefix}_USERNAME/{prefix}_PASSWORD")


class URLTemplateSource:
    """Images over HTTP(S): ``{path}`` in the template is replaced by the reference.

    >>> src = URLTemplateSource("https://physionet.org/files/mimic-cxr-jpg/2.1.0/files/{path}")  # doctest: +SKIP

    Basic-auth credentials, first found wins: ``auth=(user, password)``; user-info in the
    template URL; env ``<PREFIX>_USERNAME``/``<PREFIX>_PASSWORD`` (prefix from the whole host name,
    ``images.example.com`` -> ``IMAGES_EXAMPLE_COM``, ``images-example.com`` -> ``IMAGES__EXAMPLE_COM``,
    ``physionet.org`` -> ``PHYSIONET``, or ``env_prefix``); env ``MEDHEVAL_IMAGE_USERNAME``/``MEDHEVAL_IMAGE_PASSWORD``
    only for the host ``MEDHEVAL_IMAGE_HOST`` names (set without it they are refused); the ``machine`` entry of
    exactly this host in ``netrc_file`` (default ``$NETRC`` or ``~/.netrc``; its ``default`` entry is never used).
    The host is :func:`~medheval.net.hosts.parse_address`'s (:attr:`host`: lower case, no trailing dot, an IP
    literal canonical), so one host written two ways (``[::ffff:127.0.0.1]``, ``127.0.0.1``) is one host; the
    credentials go to it only (a redirect to another origin is refused by :mod:`medheval.net.transport`).
    Credentials are refused over plain ``http://`` to a host other than loopback. They never appear in
    ``describe()``, ``repr`` or errors. 5xx/429 answers, connection errors and timeouts are retried ``retries`` times
    with exponential backoff; 404 raises :class:`ImageNotFound`, anything else
    :class:`ImageFetchError`.

    ``cache_dir`` (off by default) keeps fetched bytes on disk under
    ``cache_dir/<hash of the template>/<ref>``. **Warning:** images behind a data use
    agreement (MIMIC-CXR) that are cached this way stay under that agreement: keep the cache
    on the user's own machine, never in a shared, synced or published folder.
    """

    is_remote = True

    def __init__(
        self,
        template: str,
        auth: tuple[str, str] | None = None,
        timeout: float = 30,
        retries: int = 2,
        netrc_file: str | os.PathLike[str] | None = None,
        env_prefix: str | None = None,
        cache_dir: str | os.PathLike[str] | None = None,
        backoff: float = 0.5,
        deadline: float | None = None,
        max_bytes: int | None = None,
        credentialed: bool = True,
        proxy_for: Sequence[str] = (),
    ) -> None:
        if "{path}" not in template:
            raise ValueError(f"URL template {_redact_url(template)!r} has no '{{path}}' placeholder")
        try:  # the host as medheval.net spells it: one host however it is written
            address = parse_address(template)
        except AtAfterPort as error:  # its text is masked there: user-info, every query and fragment value
            raise ValueError(f"URL template {error}") from None
        except ValueError as error:  # parse_address's reason (a port, a zone id, a backslash), the text masked
            raise ValueError(
                f"URL template {error}. A port is a number from 0 to 65535, an IPv6 address has no zone id, a host "
                "holds no backslash, and a '/', '?', '#', '@' or backslash in a user name or password is "
                "percent-encoded (%2F, %3F, %23, %40, %5C)") from None
        parts = urlsplit(template)
        if address.scheme not in ("http", "https") or not address.name:
            raise ValueError(f"URL template {_redact_url(template)!r} must be an http(s) URL with a host")
        url_auth: tuple[str, str] | None = None
        if "@" in parts.netloc:
            userinfo, _, hostport = parts.netloc.rpartition("@")
            user, _, password = userinfo.partition(":")
            url_auth = (unquote(user), unquote(password))
            template = urlunsplit((parts.scheme, hostport, parts.path, parts.query, parts.fragment))
        self.template = template
        # what the credentials are looked up by (prefix, netrc): lower case, no trailing dot, an IP literal canonical
        self.host: str = address.name
        self.timeout = float(timeout)
        self.deadline = float(deadline if deadline is not None else _env_number(DEADLINE_ENV, DEFAULT_DEADLINE))
        self.max_bytes = int(max_bytes if max_bytes is not None
                             else _env_number(MAX_MB_ENV, DEFAULT_MAX_BYTES / 2**20) * 2**20)
        if not self.deadline > 0 or self.max_bytes <= 0:
            raise ValueError(f"image deadline and size cap must be positive, got deadline={self.deadline:g} s, "
                             f"max_bytes={self.max_bytes}")
        self.retries = max(0, int(retries))
        self.backoff = float(backoff)
        self.env_prefix = env_prefix or _host_env_prefix(self.host)
        self._netrc_file = netrc_file
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else None
        self._auth, self.auth_origin = self._find_auth(auth, url_auth)
        # old-style variables of a hyphenated host are never sent, but their owner is told what to set instead
        self.renamed_credentials = (None if env_prefix or not self.env_prefix or self._auth is not None
                                    else _renamed_credentials_notice(self.host, self.env_prefix))
        if self.renamed_credentials and self.host not in _renamed_warned:
            _renamed_warned.add(self.host)
            logger.warning(self.renamed_credentials)
        if self._auth is not None:  # never written out, whatever a server echoes
            register_basic_auth(*self._auth)
        register_url(template)  # a ?token= in the template, too
        if self._auth is not None:  # a password never crosses the network in clear text
            check_plain_http(template, f"the image-server credentials ({self.auth_origin})")
        # the one outbound policy (medheval.net.transport): same-origin redirects only, a total deadline, a
        # size cap, and no environment proxy for credentialed images unless the host is named (--proxy-for)
        self.credentialed = bool(credentialed or self._auth is not None)
        self._session = transport.session_for(self.template, credentialed=self.credentialed,
                                              proxy_for=tuple(proxy_for))
        self._session.headers["User-Agent"] = "medheval-images"
        if self._auth is not None:
            self._session.auth = self._auth

    # -- credentials -------------------------------------------------------------------

    def _find_auth(
        self, auth: tuple[str, str] | None, url_auth: tuple[str, str] | None
    ) -> tuple[tuple[str, str] | None, str]:
        if auth is not None:
            return (str(auth[0]), str(auth[1])), "explicit auth"
        if url_auth is not None:
            return url_auth, "user-info in the URL"
        if self.env_prefix:
            user = os.environ.get(f"{self.env_prefix}_USERNAME")
            password = os.environ.get(f"{self.env_prefix}_PASSWORD")
            if user and password is not None:
                return (user, password), f"env {self.env_prefix}_USERNAME/{self.env_prefix}_PASSWORD"
        user = os.environ.get(f"{GENERIC_CREDENTIALS}_USERNAME")
        password = os.environ.get(f"{GENERIC_CREDENTIALS}_PASSWORD")
        if user and password is not None:
            if not image_hosts.entries():
                raise ValueError(
                    f"{GENERIC_CREDENTIALS}_USERNAME/{GENERIC_CREDENTIALS}_PASSWORD are set but {IMAGE_HOST_ENV} "
                    f"is not: they are sent only to the image server it names. Set {IMAGE_HOST_ENV}={self.host} "
                    f"if they are this server's, or unset them")
            if image_hosts.covers(self.template):
                return (user, password), f"env {GENERIC_CREDENTIALS}_USERNAME/{GENERIC_CREDENTIALS}_PASSWORD"
        return self._netrc_auth()

    def _netrc_auth(self) -> tuple[tuple[str, str] | None, str]:
        explicit = self._netrc_file or os.environ.get("NETRC")
        if explicit:
            path = Path(explicit).expanduser()
            if not path.is_file():
                if self._netrc_file:
                    raise ValueError(f"netrc file {path} does not exist")
                return None, "no credentials"
            file: str | None = str(path)
        else:
            path = Path("~/.netrc").expanduser()
            if not path.is_file():
                return None, "no credentials"
            file = None  # the default file: netrc checks its permissions
        try:  # this host's own machine entry only: the file's ``default`` entry would go to any host
            machines = netrc.netrc(file).hosts
        except netrc.NetrcParseError as exc:  # its message may quote a token: don't repeat it
            raise ValueError(
                f"could not read netrc file {path} (line {exc.lineno}): fix its syntax and make it "
                "readable only by you (chmod 600)"
            ) from None
        entry = next((value for name, value in machines.items() if _netrc_host(name) == self.host), None)
        if entry is None or not entry[0]:
            return None, "no credentials"
        return (entry[0], entry[2] or ""), f"netrc {path}"

    def _auth_hint(self) -> str:
        names = f"{self.env_prefix}_USERNAME/{self.env_prefix}_PASSWORD" if self.env_prefix else "<PREFIX>_USERNAME/<PREFIX>_PASSWORD"
        if self.renamed_credentials:
            return f"{self.renamed_credentials}."
        if self._auth is None:
            return (
                f"The server needs credentials and none were found: set {names} "
                f"(or MEDHEVAL_IMAGE_USERNAME/MEDHEVAL_IMAGE_PASSWORD with {IMAGE_HOST_ENV}={self.host}) in the "
                f"environment, or add 'machine {self.host} login USER password PASSWORD' to ~/.netrc"
            )
        hint = f"The credentials from {self.auth_origin} were refused: check them"
        if self.host.endswith("physionet.org"):
            hint += ", and that your PhysioNet account is credentialed and has signed this dataset's data use agreement"
        return hint + (f" (credentials are read from {names}, MEDHEVAL_IMAGE_USERNAME/PASSWORD with "
                       f"{IMAGE_HOST_ENV}, or ~/.netrc)")

    # -- URLs and HTTP ----------------------------------------------------------------

    def describe(self) -> str:
        return f"URL template {_redact_url(self.template)} ({self.auth_origin})"

    def __repr__(self) -> str:
        return f"URLTemplateSource({self.describe()!r})"

    def url_for(self, ref: str) -> str:
        """The URL of ``ref``: each path segment percent-quoted, ``/`` kept."""
        parts = _safe_parts(ref, _redact_url(self.template))
        return self.template.replace("{path}", "/".join(quote(part, safe="") for part in parts))

    def _cache_path(self, ref: str) -> Path | None:
        if self.cache_dir is None:
            return None
        key = hashlib.sha256(_redact_url(self.template).encode()).hexdigest()[:16]
        path = self.cache_dir.joinpath(key, *_safe_parts(ref, str(self.cache_dir)))
        # a symbolic link planted in the cache (a shared or synced folder) must not make a run read another file
        # as this image, nor write a downloaded (credentialed) image into another folder
        if not path.resolve().is_relative_to(self.cache_dir.resolve() / key):
            raise UnsafeImagePath(ref, str(self.cache_dir), "resolves outside the image cache (through a symbolic "
                                  "link)", hint="remove the link from the cache folder, or choose another cache_dir")
        return path

    def _request(self, method: str, url: str) -> transport.Reply:
        """One request through :mod:`medheval.net.transport`, with retries on connection errors, read
        timeouts, 429 and 5xx; ``deadline`` bounds all attempts together."""
        attempts = self.retries + 1
        stop_at = time.monotonic() + self.deadline
        for attempt in range(attempts):
            remaining = stop_at - time.monotonic()
            last = attempt == attempts - 1
            try:
                if remaining <= 0:
                    raise transport.DeadlineExceeded("deadline spent")
                response = transport.request(self._session, method, url, timeout=self.timeout, deadline=remaining,
                                             max_bytes=self.max_bytes)
            except transport.DeadlineExceeded:
                raise ImageFetchError(
                    url, reason=f"no complete image within the deadline of {self.deadline:g} s",
                    hint=f"the server is slow or stalls; retry later, or raise the deadline ({DEADLINE_ENV}=SECONDS "
                         "or URLTemplateSource(deadline=...))") from None
            except transport.ReplyTooLarge:
                raise ImageFetchError(
                    url, reason=f"the image is larger than the cap of {self.max_bytes} bytes",
                    hint=f"if this image is genuine, raise the cap ({MAX_MB_ENV}=MEGABYTES or "
                         "URLTemplateSource(max_bytes=...))") from None
            except transport.RedirectRefused as exc:
                raise ImageFetchError(url, reason=redact(str(exc)) or "",
                                      hint="an image from another host is never used") from None
            except requests.Timeout:
                if last:
                    raise ImageFetchError(
                        url,
                        reason=f"timed out after {self.timeout:g} s ({attempts} attempt(s))",
                        hint="the server is slow or unreachable: retry later or pass a larger timeout",
                    ) from None
            except requests.RequestException as exc:
                if last:
                    raise ImageFetchError(
                        url,
                        reason=f"{type(exc).__name__} after {attempts} attempt(s)",
                        hint="check the URL, your network connection and proxy settings",
                    ) from None
            else:
                if not (response.status_code == 429 or response.status_code >= 500) or last:
                    return response
                wait = response.headers.get("Retry-After", "")
                if wait.isdigit():
                    time.sleep(max(0.0, min(float(wait), 10.0, stop_at - time.monotonic())))
                    continue
            time.sleep(max(0.0, min(self.backoff * (2**attempt), 10.0, stop_at - time.monotonic())))
        raise AssertionError("unreachable")  # pragma: no cover

    def _raise_for(self, ref: str, url: str, response: transport.Reply) -> None:
        status = response.status_code
        if status in (404, 410):
            raise ImageNotFound(None, ref, _redact_url(url))
        if status in (401, 403):
            raise ImageFetchError(url, status, _reason(status), self._auth_hint())
        raise ImageFetchError(url, status, _reason(status), "the server refused or failed the request")

    def exists(self, ref: str) -> bool:
        cached = self._cache_path(ref)
        if cached is not None and cached.is_file():
            return True
        url = self.url_for(ref)
        response = self._request("HEAD", url)
        if response.status_code in (405, 501):  # HEAD not allowed: ask for the body (within the size cap)
            response = self._request("GET", url)
        if 200 <= response.status_code < 300:
            return True
        if response.status_code in (404, 410):
            return False
        self._raise_for(ref, url, response)
        return False  # pragma: no cover

    def open_bytes(self, ref: str) -> bytes:
        cached = self._cache_path(ref)
        if cached is not None and cached.is_file():
            return cached.read_bytes()
        url = self.url_for(ref)
        response = self._request("GET", url)
        if not 200 <= response.status_code < 300:
            self._raise_for(ref, url, response)
        if response.headers.get("Content-Type", "").lower().startswith("text/html"):
            raise ImageFetchError(
                url,
                response.status_code,
                "the server answered with an HTML page, not an image",
                "this is usually a login page: " + self._auth_hint(),
            )
        data = response.content
        if cached is not None:
            cached.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=cached.parent, prefix=".part-")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(data)
                os.replace(tmp, cached)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        return data

    def close(self) -> None:
        """Close the pooled HTTP connections."""
        self._session.close()


class HFDatasetSource:
    """Images in a ``datasets.Dataset``, keyed by an id column.

    ``dataset`` is a ``Dataset`` (or ``DatasetDict``, then ``split`` picks one), a Hub id or a
    local path. Paths and ids are loaded lazily on first use (``datasets.load_from_disk`` for
    a ``save_to_disk`` folder, ``datasets.load_dataset(dataset, split=split)`` otherwise). The
    reference is looked up in ``id_column``; the bytes come from the undecoded ``Image``
    storage (embedded bytes, or a path read from disk), or from a binary/path column.

    A path stored in a dataset named by a spec (a Hub id or a folder) is read only inside the dataset's own files:
    the folder, or for a Hub id its own repo folder in the Hub cache (``datasets--owner--name``), its Arrow cache
    folders, and the folders its own archives were extracted to. The dataset's author must not choose which local
    file is read (``/home/me/.netrc``, a local MIMIC image under a non-credentialed source, another cached repo's
    file such as a private model's or a gated dataset's). A ``Dataset`` object passed in Python is the caller's
    own, and its paths are read wherever they point.
    """

    is_remote = False

    def __init__(
        self,
        dataset: Any,
        id_column: str = "id",
        image_column: str = "image",
        split: str | None = None,
    ) -> None:
        self._spec = dataset if isinstance(dataset, (str, os.PathLike)) else None
        self._dataset: Any = None if self._spec is not None else dataset
        self.id_column = id_column
        self.image_column = image_column
        self.split = split
        self._index: dict[str, int] | None = None
        self._images: Any = None
        self._lock = threading.Lock()
        self._path_roots: list[Path] | None = None  # None: any path (the user's own dataset)
        self._archive_folder: Path | None = None  # where the dataset's own archives lie (see _extracted_roots)
        self._extracted: list[Path] | None = None

    def describe(self) -> str:
        if self._spec is not None:
            name = str(self._spec)
        else:
            info = getattr(self._dataset, "info", None)
            name = getattr(info, "dataset_name", None) or "in-memory Dataset"
        split = f" split={self.split}" if self.split else ""
        return f"HF dataset {name}{split} (id_column={self.id_column}, image_column={self.image_column})"

    def __repr__(self) -> str:
        return f"HFDatasetSource({self.describe()!r})"

    def _load(self) -> Any:
        import datasets

        from huggingface_hub import constants

        spec = self._spec
        path = Path(spec).expanduser() if spec is not None else None
        # a stored path may point inside the dataset's own files only (its folder, or its repo in the Hub cache)
        own = path if path is not None and path.exists() else _hub_repo_folder(constants.HF_HUB_CACHE, str(spec))
        self._path_roots = [own.resolve()]
        self._archive_folder = own
        if path is not None and path.is_dir() and (
            (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()
        ):
            return datasets.load_from_disk(str(path))
        try:
            return datasets.load_dataset(str(spec), split=self.split or "train")
        except (OSError, ValueError) as error:  # offline, unknown id, gated, network down (ConnectionError ⊂ OSError)
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
            root = f"hf://{spec}" + (f":{self.split}" if self.split else "")
            raise ImageRootUnavailable(
                f"image root {root}: cannot open the dataset ({type(error).__name__}: {reason}). Check the "
                f"dataset id or local path, the network (HF_HUB_OFFLINE / HF_ENDPOINT), and access to gated "
                f"datasets (`hf auth login` or HF_TOKEN); or point --image-root at a local folder"
            ) from None

    def _ensure(self) -> None:
        if self._index is not None:
            return
        with self._lock:
            if self._index is not None:
                return
            import datasets

            ds = self._dataset if self._dataset is not None else self._load()
            if isinstance(ds, datasets.DatasetDict):
                split = self.split or ("train" if "train" in ds else next(iter(ds)))
                if split not in ds:
                    raise ValueError(f"{self.describe()}: no split {split!r} (splits: {list(ds)})")
                ds = ds[split]
            if self._path_roots is not None:  # its Arrow cache folders are its own files too
                self._path_roots += [Path(entry["filename"]).parent.resolve()
                                     for entry in getattr(ds, "cache_files", None) or [] if entry.get("filename")]
            for column in (self.id_column, self.image_column):
                if column not in ds.column_names:
                    raise ValueError(
                        f"{self.describe()}: no column {column!r} (columns: {ds.column_names}); "
                        "set id_column=/image_column= (hf://...#id_column=...,image_column=...)"
                    )
            index: dict[str, int] = {}
            duplicates: list[str] = []
            for row, key in enumerate(ds[self.id_column]):
                key = str(key)
                if key in index:
                    duplicates.append(key)
                else:
                    index[key] = row
            if duplicates:
                raise ValueError(
                    f"{self.describe()}: {len(duplicates)} duplicate id(s) in column {self.id_column!r}, "
                    f"e.g. {duplicates[:5]}; image ids must be unique"
                )
            images = ds.select_columns([self.image_column])
            if isinstance(images.features[self.image_column], datasets.Image):
                images = images.cast_column(self.image_column, datasets.Image(decode=False))
            self._dataset = ds
            self._images = images
            self._index = index

    def exists(self, ref: str) -> bool:
        self._ensure()
        assert self._index is not None
        return str(ref) in self._index

    def open_bytes(self, ref: str) -> bytes:
        self._ensure()
        assert self._index is not None
        row = self._index.get(str(ref))
        if row is None:
            raise ImageNotFound(None, ref, f"column {self.id_column!r} of {self.describe()}",
                                f"check that the dataset has a row with {self.id_column} == {ref!r}")
        value = self._images[row][self.image_column]
        if isinstance(value, dict):
            if value.get("bytes"):
                return bytes(value["bytes"])
            value = value.get("path")
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value)
        if isinstance(value, str) and value:
            stored = Path(value).resolve()
            if not self._own_file(stored):
                raise UnsafeImagePath(
                    ref, self.describe(), f"row {row} stores the file path {value!r}, outside the dataset's own files "
                    "(its folder, its repo in the Hub cache, its Arrow cache, its extracted archives)",
                    "A dataset may only point at its own files: use one that embeds the "
                    "image bytes (cast the column to datasets.Image() before save_to_disk), or pass the image "
                    "folder itself as --image-root SOURCE=FOLDER.")
            try:
                return stored.read_bytes()
            except OSError:
                raise ImageNotFound(None, ref, value, "the dataset row stores a file path that is not readable here") from None
        if isinstance(value, Image.Image):
            buffer = io.BytesIO()
            value.save(buffer, format="PNG")
            return buffer.getvalue()
        raise ImageNotFound(None, ref, f"row {row} of {self.describe()}", "the image cell is empty")


    def _own_file(self, stored: Path) -> bool:
        """Whether the resolved path ``stored`` may be read: anywhere for a caller's ``Dataset``, else only
        inside the dataset's own files."""
        if self._path_roots is None:
            return True
        if _inside(stored, self._path_roots):
            return True
        with self._lock:
            if self._extracted is None:
                self._extracted = _extracted_roots(self._archive_folder)
        return _inside(stored, self._extracted)


def _inside(path: Path, roots: Sequence[Path]) -> bool:
    """Whether ``path`` is one of ``roots`` or lies under one."""
    return any(root == path or root in path.parents for root in roots)


def _hub_repo_folder(hub_cache: str | os.PathLike[str], repo_id: str) -> Path:
    """The Hub cache folder of dataset repo ``repo_id`` (``datasets--owner--name``: snapshots and blobs)."""
    return Path(hub_cache) / ("datasets--" + repo_id.strip("/").replace("/", "--"))


_ARCHIVE_SUFFIXES = (".zip", ".tar", ".tgz", ".gz", ".bz2", ".xz", ".zst", ".7z", ".lz4")


def _extracted_roots(folder: Path | None) -> list[Path]:
    """The folders ``datasets`` extracted the archives under ``folder`` to (it names each by a hash of the
    archive's path), those that exist: a dataset's rows may point into its own archives, no one else's."""
    if folder is None or not folder.is_dir():
        return []
    try:
        import datasets
        from datasets.utils.extract import ExtractManager
    except ImportError:
        return []
    downloads = {Path(datasets.config.HF_DATASETS_CACHE) / datasets.config.DOWNLOADED_DATASETS_DIR,
                 Path(datasets.config.DOWNLOADED_DATASETS_PATH)}
    managers = [ExtractManager(cache_dir=str(d)) for d in downloads] + [ExtractManager()]
    roots: list[Path] = []
    for archive in folder.rglob("*"):
        if archive.name.lower().endswith(_ARCHIVE_SUFFIXES):
            for manager in managers:
                output = Path(manager._get_output_path(str(archive)))
                if output.exists() and output.resolve() not in roots:
                    roots.append(output.resolve())
    return roots


_BARE_DICOM = re.compile(rf"{DICOM_ID_PATTERN}\.jpg")


class MimicDicomSource:
    """MIMIC-CXR-JPG images referenced by a bare ``<dicom_id>.jpg`` (Med-HallMark's ``Irg.json``).

    The dataset's metadata CSV (``mimic-cxr-2.0.0-metadata.csv[.gz]``, columns ``dicom_id``,
    ``subject_id``, ``study_id``) maps each dicom id to ``p<XX>/p<subject>/s<study>/<dicom_id>.jpg``
    under ``base`` (the ``files/`` folder, or the PhysioNet URL template). A full relative path
    passes through unchanged. Without a CSV, use a plain folder holding the ``<dicom_id>.jpg``
    files directly instead (a flat folder). CLI: ``--image-root mimic_cxr=ROOT#metadata=CSV``.
    """

    def __init__(self, base: ImageSource | str, metadata_csv: str | os.PathLike[str]) -> None:
        self.base = parse_image_root(base) if isinstance(base, str) else base
        self.metadata_csv = Path(metadata_csv).expanduser()
        self.is_remote = bool(getattr(self.base, "is_remote", False))
        self._paths: dict[str, str] | None = None
        self._lock = threading.Lock()

    def describe(self) -> str:
        return f"{self.base.describe()} (dicom ids mapped by {self.metadata_csv.name})"

    def __repr__(self) -> str:
        return f"MimicDicomSource({self.base!r}, {str(self.metadata_csv)!r})"

    def _table(self) -> dict[str, str]:
        with self._lock:
            if self._paths is None:
                self._paths = self._read_table()
            return self._paths

    def _read_table(self) -> dict[str, str]:
        import csv
        import gzip

        if not self.metadata_csv.is_file():
            raise ImageError(f"MIMIC-CXR metadata CSV {self.metadata_csv} not found: point #metadata= at "
                             "mimic-cxr-2.0.0-metadata.csv(.gz) from MIMIC-CXR-JPG")
        opener = gzip.open if self.metadata_csv.suffix == ".gz" else open
        paths: dict[str, str] = {}
        with opener(self.metadata_csv, "rt", encoding="utf-8", newline="") as handle:
            reader = csv.DictReader(handle)
            needed = {"dicom_id", "subject_id", "study_id"}
            if not needed <= set(reader.fieldnames or ()):
                raise ImageError(f"{self.metadata_csv}: expected columns {sorted(needed)}, "
                                 f"found {reader.fieldnames}")
            for row in reader:
                subject = row["subject_id"].strip()
                paths[row["dicom_id"].strip()] = f"p{subject[:2]}/p{subject}/s{row['study_id'].strip()}"
        return paths

    def path_of(self, ref: str) -> str:
        """The reference under ``base``: ``p<XX>/p<subject>/s<study>/<dicom_id>.jpg`` for a bare id."""
        if not _BARE_DICOM.fullmatch(ref):
            return ref
        folder = self._table().get(ref[: -len(".jpg")])
        if folder is None:
            raise ImageNotFound("mimic_cxr", ref, f"{self.metadata_csv} (no row for this dicom_id)",
                                "check that the metadata CSV is MIMIC-CXR-JPG's mimic-cxr-2.0.0-metadata.csv")
        return f"{folder}/{ref}"

    def exists(self, ref: str) -> bool:
        try:
            mapped = self.path_of(ref)
        except ImageNotFound:
            return False
        return self.base.exists(mapped)

    def open_bytes(self, ref: str) -> bytes:
        return self.base.open_bytes(self.path_of(ref))


# --------------------------------------------------------------------------- specs


def parse_image_root(spec: str, credentialed: bool = True) -> ImageSource:
    """An :class:`ImageSource` from a CLI/config string. ``credentialed=False`` (a source known to hold no
    credentialed data) lets an http(s) root without credentials use an environment proxy
    (:mod:`medheval.net.transport`).

    * ``/local/dir``, ``~/dir``, ``rel/dir`` or ``file:///local/dir`` -> :class:`LocalFolderSource`
    * ``http(s)://host/...{path}...`` -> :class:`URLTemplateSource` (``/{path}`` appended when absent)
    * ``hf://<hub-id-or-path>[:split][#id_column=...,image_column=...]`` -> :class:`HFDatasetSource`
    * ``<local or URL root>#metadata=<MIMIC-CXR metadata CSV>`` -> :class:`MimicDicomSource`
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"empty image root {spec!r}: pass a folder, a file:// or http(s):// URL, or hf://dataset")
    spec = spec.strip()
    lowered = spec.lower()
    if lowered.startswith("hf://"):
        return _parse_hf_spec(spec)
    base, marker, metadata = spec.rpartition("#metadata=")
    if marker:
        if not base.strip() or not metadata.strip():
            raise ValueError(f"image root {spec!r}: expected ROOT#metadata=/path/to/mimic-cxr-2.0.0-metadata.csv")
        return MimicDicomSource(parse_image_root(base, credentialed), metadata.strip())
    if lowered.startswith(("http://", "https://")):
        template = spec if "{path}" in spec else spec.rstrip("/") + "/{path}"
        return URLTemplateSource(template, credentialed=credentialed)
    if lowered.startswith("file://"):
        parts = urlsplit(spec)
        if parts.netloc not in ("", "localhost"):
            raise ValueError(f"file:// image root {spec!r} names a remote host; use file:///absolute/path")
        return LocalFolderSource(unquote(parts.path))
    match = _URL_SCHEME.match(spec)
    if match:
        scheme = match.group(1)
        raise ValueError(
            f"unsupported image root {_redact_url(spec)!r} (scheme {scheme!r}): use a local folder, "
            "file:///path, an http(s):// URL template with {path}, or hf://dataset[:split]"
        )
    return LocalFolderSource(spec)


def _parse_hf_spec(spec: str) -> HFDatasetSource:
    body, _, options = spec[len("hf://"):].partition("#")
    split: str | None = None
    head, sep, tail = body.rpartition(":")
    if sep and head and tail and "/" not in tail:
        body, split = head, tail
    if not body:
        raise ValueError(f"image root {spec!r}: hf:// needs a dataset id or path, e.g. hf://user/images:train")
    kwargs: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in options.split(","))):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in ("id_column", "image_column", "split") or not value.strip():
            raise ValueError(
                f"image root {spec!r}: bad option {item!r}; allowed: id_column=..., image_column=..., split=..."
            )
        kwargs[key] = value.strip()
    if "split" in kwargs:
        split = kwargs.pop("split")
    return HFDatasetSource(body, split=split, **kwargs)


_ROOT_KEY = re.compile(r"\*|[A-Za-z_][A-Za-z0-9_\-.]*")


def parse_image_root_args(items: Iterable[str]) -> dict[str, str]:
    """``["mimic_cxr=/data/mimic", "/data/all"]`` -> ``{"mimic_cxr": "/data/mimic", "*": "/data/all"}``.

    Split on the first ``=`` when what precedes it is a source name; otherwise (a URL or path
    containing ``=``) the whole item is the default root ``"*"``.
    """
    roots: dict[str, str] = {}
    for raw in items:
        item = raw.strip()
        key, eq, value = item.partition("=")
        if eq and _ROOT_KEY.fullmatch(key.strip()):
            key, value = key.strip(), value.strip()
        else:
            key, value = "*", item
        if not value:
            raise ValueError(f"--image-root {raw!r}: empty root; use SOURCE=PATH_OR_URL or a bare PATH_OR_URL")
        if key in roots:
            raise ValueError(f"--image-root given twice for {'the default root' if key == '*' else key!r}")
        roots[key] = value
    return roots


# --------------------------------------------------------------------------- resolver


def _for_records(error: E, ids: list[str]) -> E:
    """``error`` with the record(s) whose image it is named first in its message."""
    shown = ", ".join(repr(i) for i in ids[:3]) + (f" and {len(ids) - 3} more" if len(ids) > 3 else "")
    error.record_ids = ids
    error.args = (f"record {shown}: {error.args[0] if error.args else error}",)
    return error


E = TypeVar("E", bound=ImageError)
T = TypeVar("T")
R = TypeVar("R")

# local images checked inline below this many (a thread pool costs more than it saves on a few files);
# from it, on ImageResolver.workers threads: see benchmarks/bench_image_check.py
POOL_MIN_LOCAL = 64


class ImageCheck(NamedTuple):
    """What :meth:`ImageResolver.check_records` found: records kept, and (id, ref) / (id, ref, reason) skipped."""

    kept: list[dict[str, Any]]
    missing: list[tuple[str, str]]
    undecodable: list[tuple[str, str, str]]


def _header_problem(root: ImageSource, ref: str) -> str | None:
    """Why a local image file cannot be decoded, read from its header only (format, declared size against
    :func:`max_pixels`); ``None`` when it opens, or when the root is not a plain local folder (remote images
    are checked when fetched). A file cut short after its header is still caught only when decoded."""
    if type(root) is not LocalFolderSource:
        return None
    try:
        with open_image(root.path_for(ref), f"image {ref!r}") as image:
            check_pixels(image, f"image {ref!r}")
    except ImageDecodeError as exc:
        return str(exc)
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


class ImageResolver:
    """Maps ``(source, ref)`` to images through per-source :class:`ImageSource` roots.

    ``roots`` is keyed by source name (``"mimic_cxr"``), with ``"*"`` as the default; values
    are sources or spec strings for :func:`parse_image_root`. Nothing is fetched or decoded
    until :meth:`open`, :meth:`load_record_images`, :meth:`find_missing` or :meth:`partition`.
    """

    def __init__(self, roots: Mapping[str, ImageSource | str] | None = None, workers: int = 8) -> None:
        self.roots: dict[str, ImageSource] = {}
        for name, value in (roots or {}).items():
            source: Any
            if isinstance(value, Path):
                source = LocalFolderSource(value)
            elif isinstance(value, str):  # the default root "*" may serve MIMIC records: credentialed
                source = parse_image_root(value, credentialed=name == "*" or is_credentialed(str(name)))
            else:
                source = value
            if not isinstance(source, ImageSource):
                raise TypeError(
                    f"image root for {name!r} must be an ImageSource or a spec string, not {type(value).__name__}"
                )
            self.roots[str(name)] = source
        self.workers = max(1, int(workers))

    def __repr__(self) -> str:
        return f"ImageResolver({self.describe()!r})"

    def describe(self) -> dict[str, str]:
        """``{source: description}`` of every configured root (safe to log)."""
        return {name: source.describe() for name, source in self.roots.items()}

    def has_root(self, source: str) -> bool:
        """True when ``source`` (or the ``"*"`` default) has a root."""
        return source in self.roots or "*" in self.roots

    def source_for(self, source: str, ref: str = "") -> ImageSource:
        """The root serving ``source``; :class:`NoImageRoot` when there is none."""
        found = self.roots.get(source) or self.roots.get("*")
        if found is None:
            raise NoImageRoot(source, ref)
        return found

    def open_bytes(self, source: str, ref: str) -> bytes:
        """The encoded bytes of ``ref``; errors name the source and the root to set."""
        root = self.source_for(source, ref)
        try:
            return root.open_bytes(ref)
        except ImageNotFound as exc:
            if exc.source is None:
                where = f"{exc.where} ({root.describe()})"
                raise ImageNotFound(source, ref, where, exc.explicit_hint) from None
            raise

    def location(self, source: str, ref: str) -> str:
        """Where image ``ref`` of ``source`` is read from, safe to show: a local file's path, else the reference
        and its root's description (no credentials)."""
        root = self.source_for(source, ref)
        try:
            if isinstance(root, MimicDicomSource) and isinstance(root.base, LocalFolderSource):
                return str(root.base.path_for(root.path_of(ref)))
            if isinstance(root, LocalFolderSource):
                return str(root.path_for(ref))
        except ImageError:
            pass
        return f"{ref!r} in {root.describe()}"

    def open(self, source: str, ref: str) -> Image.Image:
        """Image ``ref`` of ``source`` decoded as RGB; its stored mode (``L`` for a grayscale file) is kept in
        ``image.info[SOURCE_MODE]`` (:mod:`medheval.backends.grey_padding` reads it). A file that does not decode
        in full (corrupt, cut short after a valid header) raises :class:`ImageDecodeError`: PIL's
        ``LOAD_TRUNCATED_IMAGES`` is never set, so a truncated file is never half-read."""
        data = self.open_bytes(source, ref)
        limit = max_pixels()
        try:
            what = f"image {ref!r} (source {source!r}, {len(data)} bytes)"
            with open_image(io.BytesIO(data), what) as image:
                check_pixels(image, what, limit)
                image.load()
                decoded = image.convert("RGB")
                decoded.info[SOURCE_MODE] = image.mode
                return decoded
        except ImageDecodeError as exc:
            where = self.location(source, ref)
            raise ImageDecodeError(f"{exc} File: {where}.", ref, source, where) from None
        except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
            where = self.location(source, ref)
            raise ImageDecodeError(
                f"image {ref!r} (source {source!r}, {len(data)} bytes, file {where}) could not be decoded: "
                f"{type(exc).__name__}: {exc}. The file is corrupt, truncated or not an image.",
                ref, source, where,
            ) from None

    def load_record_images(self, record: Mapping[str, Any]) -> list[Image.Image]:
        """Every image of a canonical record, decoded as RGB, in order."""
        source = record.get("source") or "*"
        try:
            return [self.open(source, ref) for ref in record.get("images") or []]
        except (ImageFetchError, ImageDecodeError, ImageNotFound, UnsafeImagePath) as exc:
            raise _for_records(exc, [str(record.get("id"))]) from None

    def find_missing(self, records: Iterable[Mapping[str, Any]], progress: bool = True) -> list[tuple[str, str]]:
        """``(record id, ref)`` for every referenced image that is not available, in record order.

        A source without a root counts as missing. Local roots are checked with ``stat``, remote ones with
        HEAD requests, on :attr:`workers` threads (:meth:`_fan_out`). Auth and server errors raise.
        """
        return self._check(records, progress)[0]

    def _check(
        self, records: Iterable[Mapping[str, Any]], progress: bool, headers: bool = False
    ) -> tuple[list[tuple[str, str]], list[str], list[tuple[str, str, str]]]:
        """(missing (id, ref), sources without a root, undecodable (id, ref, reason): with ``headers``, local
        files whose header does not open). Each distinct image is checked once, through :meth:`_fan_out`."""
        pairs: dict[tuple[str, str, str], None] = {}
        for record in records:
            source = record.get("source") or "*"
            rid = str(record.get("id"))
            for ref in record.get("images") or []:
                pairs[(rid, source, ref)] = None
        owners: dict[tuple[str, str], list[str]] = {}
        for rid, source, ref in pairs:
            owners.setdefault((source, ref), []).append(rid)
        absent: set[tuple[str, str]] = set()
        unconfigured: set[str] = set()
        checks: list[tuple[tuple[str, str], ImageSource]] = []
        for key in owners:
            if self.has_root(key[0]):
                checks.append((key, self.source_for(*key)))
            else:
                absent.add(key)
                unconfigured.add(key[0])

        def probe(check: tuple[tuple[str, str], ImageSource]) -> tuple[bool, str | None]:
            (_, ref), root = check
            try:
                found = root.exists(ref)
            except (UnsafeImagePath, ImageFetchError) as exc:
                raise _for_records(exc, owners[check[0]]) from None
            return found, _header_problem(root, ref) if found and headers else None

        remote = any(getattr(root, "is_remote", False) for _, root in checks)
        broken: dict[tuple[str, str], str] = {}
        for (key, _), (found, problem) in zip(checks, self._fan_out(probe, checks, progress, remote)):
            if not found:
                absent.add(key)
            elif problem is not None:
                broken[key] = problem
        missing = [(rid, ref) for rid, source, ref in pairs if (source, ref) in absent]
        undecodable = [(rid, ref, broken[(source, ref)]) for rid, source, ref in pairs if (source, ref) in broken]
        return missing, sorted(unconfigured), undecodable

    def _fan_out(self, check: Callable[[T], R], items: Sequence[T], progress: bool, remote: bool) -> list[R]:
        """``check(item)`` for every item, results in item order, with a progress bar from 200 items.

        Runs on up to :attr:`workers` threads when there is a remote item or at least :data:`POOL_MIN_LOCAL`
        items, else inline (threads cost more than they save on a few local files). The first item is always
        checked inline: a lazy root (an ``hf://`` dataset) loads there, once, and one that cannot open raises at
        once instead of on every thread. The first item, in order, whose check raises raises: checks not yet
        begun are cancelled, running ones finish first."""
        from tqdm.auto import tqdm

        results: list[R] = []
        with tqdm(total=len(items), desc="checking images", unit="img",
                  disable=not progress or len(items) < 200) as bar:
            pooled = self.workers > 1 and (remote or len(items) >= POOL_MIN_LOCAL)
            for item in items[:1] if pooled else items:
                results.append(check(item))
                bar.update()
            if not pooled:
                return results
            with ThreadPoolExecutor(max_workers=self.workers) as pool:
                futures = [pool.submit(check, item) for item in items[1:]]
                try:
                    for future in futures:
                        results.append(future.result())
                        bar.update()
                except BaseException:
                    pool.shutdown(cancel_futures=True)
                    raise
        return results

    def partition(
        self,
        records: Iterable[Mapping[str, Any]],
        on_missing: str = "error",
        progress: bool = True,
    ) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
        """``(kept records, skipped (id, ref))``.

        ``on_missing="error"`` raises :class:`MissingImagesError` listing the ids;
        ``"skip"`` drops the records with a missing or undecodable image and returns the skipped pairs
        (:meth:`check_records` keeps the two apart).
        """
        check = self.check_records(records, on_missing, progress)
        return check.kept, check.missing + [(rid, ref) for rid, ref, _ in check.undecodable]

    def check_records(self, records: Iterable[Mapping[str, Any]], on_missing: str = "error",
                      progress: bool = True) -> ImageCheck:
        """:meth:`partition` with the reason kept apart: images missing, and local files whose header no
        decoder reads (undecodable), both refused (``"error"``: one :class:`MissingImagesError` naming every
        record) or skipped (``"skip"``)."""
        if on_missing not in ("error", "skip"):
            raise ValueError(f"on_missing must be 'error' or 'skip', not {on_missing!r}")
        records = list(records)
        missing, unconfigured, undecodable = self._check(records, progress, headers=True)
        if (missing or undecodable) and on_missing == "error":
            raise MissingImagesError(missing, roots=self.describe(), unconfigured=unconfigured,
                                     undecodable=undecodable)
        bad = {rid for rid, _ in missing} | {rid for rid, _, _ in undecodable}
        kept = [dict(record) for record in records if str(record.get("id")) not in bad]
        return ImageCheck(kept, missing, undecodable)
