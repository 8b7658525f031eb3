"""A loopback fake of the Hugging Face Hub: the subset of its HTTP API that huggingface_hub,
datasets, evaluate and transformers call to create repos, commit files and read them back.

    with HubServer(tokens={"hf_owner": "owner"}) as hub:
        env = {"HF_ENDPOINT": hub.url, "HF_TOKEN": "hf_owner", ...}   # clients read HF_ENDPOINT at import
        ...
        hub.repos[("dataset", "medheval/cxr_vishal")].files   # {path: bytes}

Routes (the Hub's, as the installed clients call them; anything else answers 404 and is recorded in
``hub.unhandled``): ``POST /api/repos/create``, ``PUT /api/{type}s/{repo}/settings``,
``POST /api/validate-yaml``, ``POST /api/{type}s/{repo}/preupload/{rev}`` (Parquet and other binary
suffixes go "lfs", the rest "regular": base64 in the commit), ``POST /[{type}s/]{repo}.git/info/lfs/objects/batch``
+ ``PUT`` to the upload href (basic LFS transfer; clients need ``HF_HUB_DISABLE_XET=1``),
``POST /api/{type}s/{repo}/commit/{rev}`` (NDJSON: ``file``, ``lfsFile``, deletions), ``GET
/api/{type}s/{repo}[/revision/{rev}]``, ``GET /api/{type}s/{repo}/tree/{rev}[/{path}]``, ``POST
/api/{type}s/{repo}/paths-info/{rev}``, ``GET|HEAD /[{type}s/]{repo}/resolve/{rev}/{path}`` (Range too).

Auth like the Hub: writes need a known token (``Authorization: Bearer``); a gated repo's files need a
token with access (401 ``GatedRepo`` anonymously); its metadata stays public.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading

import pytest
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlparse

import yaml

PREFIX = {"model": "", "dataset": "datasets/", "space": "spaces/"}
PLURAL = {"models": "model", "datasets": "dataset", "spaces": "space"}
LFS_SUFFIXES = (".parquet", ".arrow", ".bin", ".safetensors", ".png", ".jpg", ".jpeg")


@dataclass
class Repo:
    repo_id: str
    repo_type: str
    files: dict[str, bytes] = field(default_factory=dict)
    commits: list[str] = field(default_factory=list)
    gated: Any = False
    sdk: str | None = None

    @property
    def sha(self) -> str:
        return self.commits[-1] if self.commits else "0" * 40


def _blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubServer:
    """Start with ``with HubServer(...) as hub`` (or ``start()``/``stop()``); ``hub.url`` is the endpoint."""

    def __init__(self, tokens: dict[str, str] | None = None):
        self.tokens = dict(tokens or {})  # token -> user name; every known token may read gated repos
        self.repos: dict[tuple[str, str], Repo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, user)
        self.unhandled: list[tuple[str, str]] = []
        self.lfs_objects: dict[str, bytes] = {}  # sha256 -> content
        self.lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> "HubServer":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def do_GET(self) -> None:
                hub._dispatch(self, "GET")

            def do_HEAD(self) -> None:
                hub._dispatch(self, "HEAD")

            def do_POST(self) -> None:
                hub._dispatch(self, "POST")

            def do_PUT(self) -> None:
                hub._dispatch(self, "PUT")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def __enter__(self) -> "HubServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- helpers -----------------------------------------------------------------------------
    def _user(self, handler: BaseHTTPRequestHandler) -> str | None:
        auth = handler.headers.get("Authorization", "")
        token = auth[7:] if auth.startswith("Bearer ") else None
        return self.tokens.get(token) if token else None

    @staticmethod
    def _send(handler: BaseHTTPRequestHandler, status: int, body: Any = b"", headers: dict[str, str] | None = None,
              head: bool = False) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        handler.send_response(status)
        if not isinstance(body, bytes):
            handler.send_header("Content-Type", "application/json")
        for key, value in (headers or {}).items():
            handler.send_header(key, value)
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        if not head:
            handler.wfile.write(data)

    def _error(self, handler: BaseHTTPRequestHandler, status: int, code: str, message: str, head: bool = False) -> None:
        self._send(handler, status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message}, head=head)

    def _repo(self, repo_type: str, repo_id: str) -> Repo | None:
        return self.repos.get((repo_type, repo_id))

    def _rev_ok(self, repo: Repo, rev: str) -> bool:
        return rev in ("main", "refs/heads/main") or (len(rev) >= 7 and any(c.startswith(rev) for c in repo.commits))

    def _info(self, repo: Repo) -> dict[str, Any]:
        info = {"id": repo.repo_id, "_id": repo.repo_id, "sha": repo.sha, "private": False, "gated": repo.gated,
                "disabled": False, "author": repo.repo_id.split("/")[0], "lastModified": "2026-01-01T00:00:00.000Z",
                "createdAt": "2026-01-01T00:00:00.000Z", "downloads": 0, "likes": 0, "tags": [],
                "siblings": [{"rfilename": path} for path in sorted(repo.files)]}
        if repo.repo_type == "space":
            info["sdk"] = repo.sdk
        return info

    def _entries(self, repo: Repo, base: str, recursive: bool) -> list[dict[str, Any]] | None:
        base = base.strip("/")
        prefix = base + "/" if base else ""
        if base and base in repo.files:
            return None
        files = {p: d for p, d in repo.files.items() if p.startswith(prefix)}
        if base and not files:
            return None
        dirs: set[str] = set()
        out = []
        for path in sorted(files):
            rest = path[len(prefix):].split("/")
            for depth in range(1, len(rest)):
                dirs.add(prefix + "/".join(rest[:depth]))
            if recursive or len(rest) == 1:
                out.append(self._file_entry(path, files[path]))
        for directory in sorted(dirs):
            if recursive or "/" not in directory[len(prefix):]:
                out.append({"type": "directory", "oid": hashlib.sha1(directory.encode()).hexdigest(), "size": 0,
                            "path": directory})
        return out

    @staticmethod
    def _file_entry(path: str, data: bytes) -> dict[str, Any]:
        return {"type": "file", "oid": _blob_oid(data), "size": len(data), "path": path}

    # -- dispatch ----------------------------------------------------------------------------
    def _dispatch(self, handler: BaseHTTPRequestHandler, method: str) -> None:
        parsed = urlparse(handler.path)
        path, query = parsed.path, parse_qs(parsed.query)
        length = int(handler.headers.get("Content-Length") or 0)
        body = handler.rfile.read(length) if length else b""
        user = self._user(handler)
        head = method == "HEAD"
        with self.lock:
            self.requests.append((method, path, user))
        try:
            if self._route(handler, method, path, query, body, user, head):
                return
        except Exception as error:  # a fake must say what broke, not hang the client
            self._error(handler, 500, "ServerError", f"{type(error).__name__}: {error}", head=head)
            return
        with self.lock:
            self.unhandled.append((method, handler.path))
        self._error(handler, 404, "NotFound", f"fake hub: no route for {method} {path}", head=head)

    def _route(self, handler: BaseHTTPRequestHandler, method: str, path: str, query: dict[str, list[str]],
               body: bytes, user: str | None, head: bool) -> bool:
        if method == "POST" and path == "/api/validate-yaml":
            content = json.loads(body or b"{}").get("content", "")
            match = re.match(r"^---\s*\n(.*?)\n---", content, flags=re.DOTALL)
            try:
                yaml.safe_load(match.group(1) if match else "")
            except yaml.YAMLError as error:
                self._send(handler, 200, {"errors": [{"message": str(error)}], "warnings": []})
                return True
            self._send(handler, 200, {"errors": [], "warnings": []})
            return True
        if method == "POST" and path == "/api/repos/create":
            return self._create(handler, json.loads(body or b"{}"), user)
        match = re.match(r"^/(?:(datasets|spaces)/)?([^/]+/[^/]+)\.git/info/lfs/objects/batch$", path)
        if match and method == "POST":
            return self._lfs_batch(handler, json.loads(body or b"{}"), user)
        match = re.match(r"^/lfs-upload/([0-9a-f]{64})$", path)
        if match and method == "PUT":
            if hashlib.sha256(body).hexdigest() != match.group(1):
                self._send(handler, 400, {"error": "fake hub: LFS upload does not match its sha256"})
                return True
            with self.lock:
                self.lfs_objects[match.group(1)] = body
            self._send(handler, 200, {})
            return True
        match = re.match(r"^/api/(models|datasets|spaces)/([^/]+/[^/]+)(?:/(.*))?$", path)
        if match:
            return self._api(handler, method, PLURAL[match.group(1)], match.group(2), unquote(match.group(3) or ""),
                             query, body, user, head)
        match = re.match(r"^/(?:(datasets|spaces)/)?([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
        if match and method in ("GET", "HEAD"):
            repo_type = PLURAL[match.group(1)] if match.group(1) else "model"
            return self._resolve(handler, repo_type, match.group(2), unquote(match.group(3)), unquote(match.group(4)),
                                 user, head)
        return False

    def _create(self, handler: BaseHTTPRequestHandler, payload: dict[str, Any], user: str | None) -> bool:
        if user is None:
            self._error(handler, 401, "Unauthorized", "creating a repo needs a token")
            return True
        repo_type = payload.get("type") or "model"
        repo_id = f"{payload.get('organization') or user}/{payload['name']}"
        url = f"{self.url}/{PREFIX[repo_type]}{repo_id}"
        with self.lock:
            if (repo_type, repo_id) in self.repos:
                self._send(handler, 409, {"error": "You already created this repo", "url": url})
                return True
            if repo_type == "space" and not payload.get("sdk"):
                self._send(handler, 400, {"error": "a Space needs an sdk"})
                return True
            # like the Hub: a new repo starts with one commit holding .gitattributes
            repo = Repo(repo_id, repo_type, sdk=payload.get("sdk"),
                        files={".gitattributes": b"*.parquet filter=lfs diff=lfs merge=lfs -text\n"})
            repo.commits.append(hashlib.sha1(f"init {repo_type} {repo_id}".encode()).hexdigest())
            self.repos[(repo_type, repo_id)] = repo
        self._send(handler, 200, {"url": url, "name": repo_id})
        return True

    def _api(self, handler: BaseHTTPRequestHandler, method: str, repo_type: str, repo_id: str, rest: str,
             query: dict[str, list[str]], body: bytes, user: str | None, head: bool) -> bool:
        repo = self._repo(repo_type, repo_id)
        if repo is None:
            self._error(handler, 404, "RepoNotFound", f"Repository Not Found for url: {repo_type} {repo_id}", head=head)
            return True
        if method == "GET" and (rest == "" or rest.startswith("revision/")):
            rev = rest[len("revision/"):] if rest else "main"
            if not self._rev_ok(repo, rev):
                self._error(handler, 404, "RevisionNotFound", f"Invalid rev id: {rev}", head=head)
                return True
            self._send(handler, 200, self._info(repo), head=head)
            return True
        if method == "PUT" and rest == "settings":
            if user is None:
                self._error(handler, 401, "Unauthorized", "settings need a token")
                return True
            payload = json.loads(body or b"{}")
            if "gated" in payload:
                repo.gated = payload["gated"]
            self._send(handler, 200, {})
            return True
        match = re.match(r"^(preupload|commit|paths-info|tree)/([^/]+)(?:/(.*))?$", rest)
        if not match:
            return False
        action, rev, sub = match.group(1), unquote(match.group(2)), match.group(3) or ""
        if not self._rev_ok(repo, rev):
            self._error(handler, 404, "RevisionNotFound", f"Invalid rev id: {rev}", head=head)
            return True
        if action in ("preupload", "commit") and method == "POST":
            if user is None:
                self._error(handler, 401, "Unauthorized", "writing needs a token")
                return True
            if action == "preupload":
                files = json.loads(body or b"{}").get("files", [])
                self._send(handler, 200, {"files": [
                    {"path": f["path"], "shouldIgnore": False,
                     "uploadMode": "lfs" if f["path"].lower().endswith(LFS_SUFFIXES) else "regular"} for f in files]})
                return True
            return self._commit(handler, repo, body)
        if action == "paths-info" and method == "POST":
            form = parse_qs(body.decode()) if body and not body.startswith(b"{") else {}
            paths = form.get("paths") or json.loads(body or b"{}").get("paths", [])
            out = []
            for wanted in paths:
                wanted = wanted.strip("/")
                if wanted in repo.files:
                    out.append(self._file_entry(wanted, repo.files[wanted]))
                elif any(p.startswith(wanted + "/") for p in repo.files):
                    out.append({"type": "directory", "oid": hashlib.sha1(wanted.encode()).hexdigest(), "size": 0,
                                "path": wanted})
            self._send(handler, 200, out)
            return True
        if action == "tree" and method == "GET":
            recursive = (query.get("recursive") or ["false"])[0].lower() in ("1", "true")
            entries = self._entries(repo, unquote(sub), recursive)
            if entries is None:
                self._error(handler, 404, "EntryNotFound", f"{sub} does not exist on main", head=head)
                return True
            self._send(handler, 200, entries, head=head)
            return True
        return False

    def _lfs_batch(self, handler: BaseHTTPRequestHandler, payload: dict[str, Any], user: str | None) -> bool:
        if user is None:
            self._error(handler, 401, "Unauthorized", "LFS uploads need a token")
            return True
        objects = []
        for obj in payload.get("objects", []):
            entry = {"oid": obj["oid"], "size": obj["size"]}
            if obj["oid"] not in self.lfs_objects:  # no "actions" means "already there"
                entry["actions"] = {"upload": {"href": f"{self.url}/lfs-upload/{obj['oid']}"}}
            objects.append(entry)
        self._send(handler, 200, {"transfer": "basic", "objects": objects})
        return True

    def _commit(self, handler: BaseHTTPRequestHandler, repo: Repo, body: bytes) -> bool:
        lines = [json.loads(line) for line in body.decode().splitlines() if line.strip()]
        with self.lock:
            for line in lines:
                key, value = line["key"], line["value"]
                if key == "file":
                    repo.files[value["path"]] = base64.b64decode(value["content"])
                elif key == "lfsFile":
                    if value["oid"] not in self.lfs_objects:
                        self._send(handler, 400, {"error": f"fake hub: LFS object {value['oid']} was never uploaded"})
                        return True
                    repo.files[value["path"]] = self.lfs_objects[value["oid"]]
                elif key == "deletedFile":
                    repo.files.pop(value["path"], None)
                elif key == "deletedFolder":
                    for path in [p for p in repo.files if p.startswith(value["path"].rstrip("/") + "/")]:
                        del repo.files[path]
                elif key != "header":
                    self._send(handler, 400, {"error": f"fake hub: unsupported commit entry {key!r}"})
                    return True
            sha = hashlib.sha1(f"{repo.repo_id}{len(repo.commits)}{sorted(repo.files)}".encode()).hexdigest()
            repo.commits.append(sha)
        self._send(handler, 200, {"commitUrl": f"{self.url}/{PREFIX[repo.repo_type]}{repo.repo_id}/commit/{sha}",
                                  "commitOid": sha, "success": True})
        return True

    def _resolve(self, handler: BaseHTTPRequestHandler, repo_type: str, repo_id: str, rev: str, path: str,
                 user: str | None, head: bool) -> bool:
        repo = self._repo(repo_type, repo_id)
        if repo is None:
            self._error(handler, 404, "RepoNotFound", f"Repository Not Found: {repo_type} {repo_id}", head=head)
            return True
        if repo.gated and user is None:
            self._error(handler, 401, "GatedRepo",
                        f"Access to {repo_type} {repo_id} is restricted. You must have access to it and be "
                        "authenticated to access it. Please log in.", head=head)
            return True
        if not self._rev_ok(repo, rev):
            self._error(handler, 404, "RevisionNotFound", f"Invalid rev id: {rev}", head=head)
            return True
        if path not in repo.files:
            self._error(handler, 404, "EntryNotFound", f"{path} does not exist on {rev}", head=head)
            return True
        data = repo.files[path]
        headers = {"ETag": f'"{_blob_oid(data)}"', "X-Repo-Commit": repo.sha, "Accept-Ranges": "bytes"}
        range_header = handler.headers.get("Range")
        match = re.match(r"bytes=(\d*)-(\d*)", range_header or "")
        if match and not head:
            start = int(match.group(1) or 0)
            end = int(match.group(2)) if match.group(2) else len(data) - 1
            end = min(end, len(data) - 1)
            headers["Content-Range"] = f"bytes {start}-{end}/{len(data)}"
            self._send(handler, 206, data[start:end + 1], headers)
            return True
        self._send(handler, 200, data, headers, head=head)
        return True


OWNER_TOKEN = "hf_owner_token"


@pytest.fixture
def loopback_hub(monkeypatch):
    """A fake Hub on 127.0.0.1 that this process's huggingface_hub talks to (``OWNER_TOKEN`` owns it)."""
    from huggingface_hub import constants

    with HubServer(tokens={OWNER_TOKEN: "owner"}) as fake:
        monkeypatch.setattr(constants, "ENDPOINT", fake.url)
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
        yield fake
