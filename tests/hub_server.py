"""A small Hugging Face Hub look-alike for tests: enough protocol for `huggingface_hub` 2.x to push and download.

Run it as a subprocess and stop it by its pid:

    python tests/hub_server.py --root DIR --token TOKEN

It binds 127.0.0.1 on a free port and prints `PORT <n>` on stdout once it listens. Repos live in memory, file
contents under `DIR/<namespace>/<name>/`; every request is appended to `DIR/requests.jsonl` (method, path,
status; never headers, so never the token) so that tests can check the protocol flow.

Endpoints, as `huggingface_hub` calls them (hf_api.py, _commit_api.py, file_download.py, utils/_http.py):
- `POST /api/repos/create`; 409 when the repo exists (`create_repo(exist_ok=True)` accepts that).
- `POST /api/validate-yaml`: parses the card's YAML front matter and checks `model-index` entries like the Hub
  (task type, dataset type and name, metric type and numeric value); 400 with `errors` otherwise.
- `POST /api/models/{ns}/{name}/preupload/{rev}`: every file is "regular", so neither Xet nor LFS is needed.
- `POST /api/models/{ns}/{name}/commit/{rev}`: NDJSON `header`, `file` (base64), `deletedFile`, `deletedFolder`.
- `GET /api/models/{ns}/{name}[/revision/{rev}]` (sha, siblings) and `.../tree/{rev}[/{path}]`.
- `HEAD`/`GET /{ns}/{name}/resolve/{rev}/{path}` with `X-Repo-Commit`, `ETag` and `Content-Length`; errors carry
  the `X-Error-Code` (`RepoNotFound`, `RevisionNotFound`, `EntryNotFound`) that the client maps to exceptions.
- Dataset repos (`create_repo(repo_type="dataset")`) through the same endpoints under `/api/datasets/...` and
  `/datasets/{ns}/{name}/resolve/...`, which is what `datasets.load_dataset` reads; their files under
  `DIR/datasets/<namespace>/<name>/`.
Writes need `Authorization: Bearer <token>`; reads of private repos too. A wrong token is a 401 everywhere.
Only the `main` branch exists; every commit of it stays readable by its sha (`revision=<sha>` downloads), as on the
Hub, its files kept by content under `DIR/.objects/`.
"""

import argparse
import base64
import hashlib
import json
import re
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import yaml

BRANCH = "main"
REPO = r"(?P<repo>[\w.-]+/[\w.-]+)"
KIND = r"(?P<kind>models|datasets)"
ROUTES = [
    ("POST", re.compile(r"^/api/repos/create$"), "create_repo"),
    ("POST", re.compile(r"^/api/validate-yaml$"), "validate_yaml"),
    ("POST", re.compile(rf"^/api/{KIND}/{REPO}/preupload/(?P<rev>[^/]+)$"), "preupload"),
    ("POST", re.compile(rf"^/api/{KIND}/{REPO}/commit/(?P<rev>[^/]+)$"), "commit"),
    ("GET", re.compile(rf"^/api/{KIND}/{REPO}(?:/revision/(?P<rev>[^/]+))?$"), "repo_info"),
    ("GET", re.compile(rf"^/api/{KIND}/{REPO}/tree/(?P<rev>[^/]+)(?:/(?P<path>.+))?$"), "tree"),
    ("HEAD", re.compile(rf"^/{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"), "resolve"),
    ("GET", re.compile(rf"^/{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"), "resolve"),
    ("HEAD", re.compile(rf"^/(?P<kind>datasets)/{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"), "resolve"),
    ("GET", re.compile(rf"^/(?P<kind>datasets)/{REPO}/resolve/(?P<rev>[^/]+)/(?P<path>.+)$"), "resolve"),
]


def git_blob_oid(data: bytes) -> str:
    """The git object id of a file, which the Hub uses as ETag and oid of regular files."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def hub_time() -> str:
    """Now as the Hub writes times (`2026-12-03T17:45:11.419Z`): huggingface_hub parses nothing else."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


@dataclass
class Repo:
    private: bool
    sha: str
    files: dict[str, str] = field(default_factory=dict)  # path -> oid
    last_modified: str = field(default_factory=hub_time)
    history: dict[str, dict[str, str]] = field(default_factory=dict)  # commit sha -> its files (path -> oid)

    def __post_init__(self) -> None:
        self.history.setdefault(self.sha, dict(self.files))


class HubError(Exception):
    def __init__(
        self, status: int, message: str, code: str | None = None, headers: dict | None = None, body: dict | None = None
    ):
        super().__init__(message)
        self.status, self.code, self.headers, self.body = status, code, headers or {}, body or {}


def card_metadata_errors(content: str) -> list[str]:
    """What the Hub would reject in a card's metadata (the subset that matters for model-index)."""
    match = re.match(r"^\s*---[\r\n]+(.*?)[\r\n]+---(?:\r?\n|$)", content, re.DOTALL)
    if not match:
        return []
    try:
        metadata = yaml.safe_load(match.group(1))
    except yaml.YAMLError as error:
        return [f"Invalid YAML: {error}"]
    if metadata is None:
        return []
    if not isinstance(metadata, dict):
        return ["Metadata must be a YAML mapping."]
    errors = []
    for model in metadata.get("model-index") or []:
        if not model.get("name"):
            errors.append('"model-index[].name" is required')
        for result in model.get("results", []):
            for path in (("task", "type"), ("dataset", "type"), ("dataset", "name")):
                if not (result.get(path[0]) or {}).get(path[1]):
                    errors.append(f'"model-index[].results[].{".".join(path)}" is required')
            for metric in result.get("metrics", []):
                if not metric.get("type") or not isinstance(metric.get("value"), int | float):
                    errors.append('"model-index[].results[].metrics[]" needs a "type" and a numeric "value"')
    return errors


class HubState:
    def __init__(self, root: Path, token: str):
        self.root, self.token = root, token
        self.repos: dict[str, Repo] = {}
        self.lock = threading.Lock()

    def repo(self, repo_id: str, authorized: bool) -> Repo:
        repo = self.repos.get(repo_id)
        if repo is None or (repo.private and not authorized):
            raise HubError(404 if authorized else 401, "Repository not found", "RepoNotFound")
        return repo

    def revision(self, repo_id: str, rev: str, authorized: bool) -> Repo:
        """The repo as `rev` (the branch, or any of its commits) has it."""
        repo = self.repo(repo_id, authorized)
        sha = repo.sha if unquote(rev) == BRANCH else unquote(rev)
        if sha not in repo.history:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return Repo(repo.private, sha, repo.history[sha], repo.last_modified, repo.history)

    def blob(self, oid: str) -> Path:
        return self.root / ".objects" / oid

    def file_path(self, repo_id: str, path: str) -> Path:
        target = (self.root / repo_id / path).resolve()
        if not target.is_relative_to((self.root / repo_id).resolve()):
            raise HubError(400, f"Invalid path {path!r}")
        return target

    def commit(self, repo_id: str, summary: str, added: dict[str, bytes], deleted: list[str]) -> str:
        repo = self.repos[repo_id]
        for path in deleted:
            prefix = path.rstrip("/") + "/"
            gone = [p for p in repo.files if p == path or p.startswith(prefix)]
            if not gone:
                raise HubError(404, f"A file with this name doesn't exist: {path}", "EntryNotFound")
            for p in gone:
                del repo.files[p]
                self.file_path(repo_id, p).unlink()
        for path, data in added.items():
            target = self.file_path(repo_id, path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
            repo.files[path] = git_blob_oid(data)
            self.blob(repo.files[path]).parent.mkdir(exist_ok=True)
            self.blob(repo.files[path]).write_bytes(data)
        tree = json.dumps(sorted(repo.files.items()))
        repo.sha = hashlib.sha1(f"{repo.sha}\n{summary}\n{tree}".encode()).hexdigest()
        repo.history[repo.sha] = dict(repo.files)
        repo.last_modified = hub_time()
        return repo.sha


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx expects; every answer sets Content-Length
    state: HubState

    # -- plumbing ----------------------------------------------------------------------------------------------

    def do_GET(self):
        self._dispatch("GET")

    def do_HEAD(self):
        self._dispatch("HEAD")

    def do_POST(self):
        self._dispatch("POST")

    def log_message(self, format, *args):  # quiet: the request log is requests.jsonl
        pass

    def _dispatch(self, method: str) -> None:
        # Read the whole body first, even for a request about to be refused: leaving it unread would corrupt
        # the next request on this keep-alive connection.
        self.body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = unquote(urlsplit(self.path).path)
        status = 500
        try:
            self.authorized = self._check_token()
            for route_method, pattern, name in ROUTES:
                match = pattern.match(path)
                if route_method == method and match:
                    arguments = {k: v for k, v in match.groupdict().items() if v is not None}
                    if arguments.pop("kind", "models") == "datasets":  # stored apart: a dataset may share a model's id
                        arguments["repo"] = f"datasets/{arguments['repo']}"
                    status = getattr(self, name)(**arguments)
                    break
            else:
                raise HubError(404, f"No route for {method} {path}")
        except HubError as error:
            status = error.status
            headers = {"X-Error-Message": str(error), **error.headers}
            if error.code:
                headers["X-Error-Code"] = error.code
            self._send_json(status, {"error": str(error), **error.body}, headers)
        except Exception as error:  # a bug here: answer, so that the client fails fast instead of hanging
            traceback.print_exc()
            self._send_json(status, {"error": f"Test server error: {error!r}"})
        with self.state.lock, open(self.state.root / "requests.jsonl", "a") as log:
            log.write(json.dumps({"method": method, "path": path, "status": status}) + "\n")

    def _check_token(self) -> bool:
        header = self.headers.get("Authorization")
        if header is None:
            return False
        if header != f"Bearer {self.state.token}":
            raise HubError(401, "Invalid credentials in Authorization header")
        return True

    def _require_token(self) -> None:
        if not self.authorized:
            raise HubError(401, "You must be authenticated to do this: no token was sent")

    def _send(self, status: int, body: bytes, headers: dict, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _send_json(self, status: int, payload, headers: dict | None = None) -> int:
        self._send(status, json.dumps(payload).encode(), headers or {}, "application/json")
        return status

    def _json_body(self):
        try:
            return json.loads(self.body or b"{}")
        except json.JSONDecodeError as error:
            raise HubError(400, f"Invalid JSON body: {error}") from error

    def _url(self, *parts: str) -> str:
        return "/".join([f"http://{self.headers['Host']}", *parts])

    # -- endpoints ---------------------------------------------------------------------------------------------

    def create_repo(self) -> int:
        self._require_token()
        payload = self._json_body()
        kind = payload.get("type", "model")
        if kind not in ("model", "dataset"):
            raise HubError(400, "This test server only hosts model and dataset repos")
        repo_id = f"{payload.get('organization') or 'tester'}/{payload['name']}"
        key = repo_id if kind == "model" else f"datasets/{repo_id}"
        with self.state.lock:
            if key in self.state.repos:
                # The Hub answers a conflict with the repo's url, which create_repo(exist_ok=True) returns.
                url = self._url(key)
                raise HubError(
                    409, f"You already created this {kind} repo", headers={"X-Repo-Url": url}, body={"url": url}
                )
            private = payload.get("visibility") == "private" or bool(payload.get("private"))
            self.state.repos[key] = Repo(private=private, sha=hashlib.sha1(key.encode()).hexdigest())
            (self.state.root / key).mkdir(parents=True, exist_ok=True)
        return self._send_json(200, {"url": self._url(key), "name": repo_id, "id": repo_id})

    def validate_yaml(self) -> int:
        errors = card_metadata_errors(self._json_body().get("content", ""))
        return self._send_json(400 if errors else 200, {"errors": [{"message": e} for e in errors], "warnings": []})

    def preupload(self, repo: str, rev: str) -> int:
        self._require_token()
        files = self.state.revision(repo, rev, True).files
        answer = [
            {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False, "oid": files.get(f["path"])}
            for f in self._json_body().get("files", [])
        ]
        return self._send_json(200, {"files": answer, "commitOid": self.state.repos[repo].sha})

    def commit(self, repo: str, rev: str) -> int:
        self._require_token()
        self.state.revision(repo, rev, True)
        summary, added, deleted = "", {}, []
        for line in self.body.splitlines():
            if not line.strip():
                continue
            item = json.loads(line)
            key, value = item["key"], item["value"]
            if key == "header":
                summary = value.get("summary", "")
            elif key == "file":
                added[value["path"]] = base64.b64decode(value["content"])
            elif key in ("deletedFile", "deletedFolder"):
                deleted.append(value["path"])
            else:
                raise HubError(400, f"Unsupported commit operation {key!r} (this server takes regular files only)")
        with self.state.lock:
            sha = self.state.commit(repo, summary, added, deleted)
        return self._send_json(200, {"commitUrl": self._url(repo, "commit", sha), "commitOid": sha})

    def repo_info(self, repo: str, rev: str = BRANCH) -> int:
        info = self.state.revision(repo, rev, self.authorized)
        siblings = [
            {"rfilename": path, "size": self.state.blob(oid).stat().st_size, "blobId": oid}
            for path, oid in sorted(info.files.items())
        ]
        repo_id = repo.removeprefix("datasets/")
        payload = {
            "id": repo_id,
            "modelId": repo_id,
            "author": repo_id.split("/")[0],
            "sha": info.sha,
            "private": info.private,
            "lastModified": info.last_modified,
            "tags": [],
            "siblings": siblings,
        }
        return self._send_json(200, payload)

    def tree(self, repo: str, rev: str, path: str = "") -> int:
        info = self.state.revision(repo, rev, self.authorized)
        prefix = f"{path.strip('/')}/" if path else ""
        recursive = "recursive=true" in (urlsplit(self.path).query or "").lower()
        entries, folders = [], set()
        for file_path, oid in sorted(info.files.items()):
            if not file_path.startswith(prefix):
                continue
            rest = file_path[len(prefix) :]
            if "/" in rest and not recursive:
                folders.add(prefix + rest.split("/")[0])
                continue
            size = self.state.blob(oid).stat().st_size
            entries.append({"type": "file", "path": file_path, "size": size, "oid": oid})
        entries += [{"type": "directory", "path": folder, "oid": "0" * 40} for folder in sorted(folders)]
        if path and not entries:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": info.sha})
        return self._send_json(200, entries)

    def resolve(self, repo: str, rev: str, path: str) -> int:
        info = self.state.revision(repo, rev, self.authorized)
        headers = {"X-Repo-Commit": info.sha}
        oid = info.files.get(path)
        if oid is None:
            raise HubError(404, "Entry not found", "EntryNotFound", headers)
        body = self.state.blob(oid).read_bytes()
        self._send(200, body, {**headers, "ETag": f'"{oid}"'}, "application/octet-stream")
        return 200


@contextmanager
def running_hub_server(root: Path, token: str) -> Iterator[str]:
    """Run this server in a subprocess on a free port over `root`; yield its endpoint; stop it by its pid."""
    server = subprocess.Popen(
        [sys.executable, __file__, "--root", str(root), "--token", token], stdout=subprocess.PIPE, text=True
    )
    try:
        line = server.stdout.readline()
        assert line.startswith("PORT "), f"hub server did not start: {line!r}"
        yield f"http://127.0.0.1:{line.split()[1]}"
    finally:
        server.terminate()
        server.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", required=True, type=Path, help="directory for repo files and the request log")
    parser.add_argument("--token", required=True, help="the one token accepted for writes")
    args = parser.parse_args()
    args.root.mkdir(parents=True, exist_ok=True)
    Handler.state = HubState(args.root, args.token)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"PORT {server.server_address[1]}", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()
