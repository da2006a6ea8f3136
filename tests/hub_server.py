"""A small in-memory Hugging Face Hub on 127.0.0.1, for testing upload and download offline.

It implements the endpoints that ``huggingface_hub`` calls for ``create_repo``, ``create_branch``,
``upload_folder`` (preupload, then a commit with every file inline) and ``snapshot_download``
(repo info, tree listing, file resolution). Point ``HF_ENDPOINT`` at :attr:`HubServer.url`.

A test may script faults: ``hub.script(method, path)`` returns ``None`` (answer normally) or
``(status, headers, chunks)``, and the chunks (bytes, or a number of seconds to sleep) are sent as
they come, for a Hub that stalls, trickles or answers what a Hub never should.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


class Repo:
    def __init__(self, private: bool) -> None:
        self.private = private
        self.commits: dict[str, dict[str, bytes]] = {}
        self.branches: dict[str, str] = {}
        self._commit({}, "main")

    def _commit(self, files: dict[str, bytes], branch: str) -> str:
        sha = hashlib.sha1(json.dumps(sorted((k, hashlib.sha1(v).hexdigest()) for k, v in files.items())).encode()
                           + str(len(self.commits)).encode()).hexdigest()
        self.commits[sha] = files
        self.branches[branch] = sha
        return sha

    def resolve(self, revision: str) -> str | None:
        if revision in self.branches:
            return self.branches[revision]
        return revision if revision in self.commits else None


class HubServer:
    """``with HubServer() as hub: ...``; ``hub.repos`` holds what was pushed, ``hub.requests`` what was asked."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.requests: list[str] = []
        self.auth: list[str | None] = []  # the Authorization header of each request
        self.script = None
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> HubServer:
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # quiet
                pass

            def _send(self, status: int, body: bytes | dict | list = b"", headers: dict | None = None,
                      head: bool = False) -> None:
                data = json.dumps(body).encode() if isinstance(body, (dict, list)) else body
                self.send_response(status)
                self.send_header("Content-Type", "application/json" if isinstance(body, (dict, list)) else
                                 "application/octet-stream")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if not head:
                    self.wfile.write(data)

            def _body(self) -> bytes:
                return self.rfile.read(int(self.headers.get("Content-Length", 0)))

            def _error(self, status: int, message: str, head: bool = False) -> None:
                code = {404: "RepoNotFound", 409: "Conflict"}.get(status, "Error")
                self._send(status, {"error": message}, {"X-Error-Code": code, "X-Error-Message": message}, head=head)

            def do_POST(self) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append(f"POST {path}")
                hub.auth.append(self.headers.get("Authorization"))
                body = self._body()
                if self._answer_scripted("POST", path):
                    return None
                if path == "/api/repos/create":
                    req = json.loads(body)
                    repo_id = f"{req['organization']}/{req['name']}" if req.get("organization") else req["name"]
                    if repo_id in hub.repos:  # the Hub answers 409 with the repository's URL
                        return self._send(409, {"error": "You already created this model repo",
                                                "url": f"{hub.url}/{repo_id}"}, {"X-Error-Code": "Conflict"})
                    hub.repos[repo_id] = Repo(req.get("visibility") == "private" or bool(req.get("private")))
                    return self._send(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id})
                if path == "/api/validate-yaml":  # model card metadata check before a commit
                    return self._send(200, {"errors": [], "warnings": []})
                m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/(preupload|commit|branch)/(.+)", path)
                if not m or m.group(1) not in hub.repos:
                    return self._error(404, f"no route or repository for POST {path}")
                repo, action, rev = hub.repos[m.group(1)], m.group(2), m.group(3)
                if action == "branch":
                    if rev in repo.branches:
                        return self._error(409, "Reference already exists")
                    repo.branches[rev] = repo.branches["main"]
                    return self._send(200, {})
                if action == "preupload":
                    files = json.loads(body)["files"]
                    return self._send(200, {"files": [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False}
                                                      for f in files], "commitOid": repo.resolve(rev)})
                if repo.resolve(rev) is None:
                    return self._error(404, f"revision {rev} not found")
                files = dict(repo.commits[repo.resolve(rev)])
                for line in body.decode().splitlines():
                    item = json.loads(line)
                    if item["key"] == "file":
                        files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                    elif item["key"] == "deletedFile":
                        files.pop(item["value"]["path"], None)
                    elif item["key"] != "header":
                        return self._error(400, f"unsupported commit operation {item['key']}")
                sha = repo._commit(files, rev if rev in repo.branches else "main")
                return self._send(200, {"commitUrl": f"{hub.url}/{m.group(1)}/commit/{sha}", "commitOid": sha,
                                        "success": True})

            def do_HEAD(self) -> None:
                self.do_GET(head=True)

            def _answer_scripted(self, method: str, path: str, head: bool = False) -> bool:
                """Send the test's scripted answer to this request, if it scripted one."""
                scripted = hub.script(method, path) if hub.script else None
                if scripted is not None:
                    status, headers, chunks = scripted
                    self.send_response(status)
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    try:
                        for chunk in ([] if head else chunks):
                            if isinstance(chunk, (int, float)):
                                time.sleep(chunk)
                            else:
                                self.wfile.write(chunk)
                                self.wfile.flush()
                    except OSError:  # the client gave up: what the test wants
                        pass
                    self.close_connection = True
                    return True
                return False

            def do_GET(self, head: bool = False) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append(f"{'HEAD' if head else 'GET'} {path}")
                hub.auth.append(self.headers.get("Authorization"))
                if self._answer_scripted("HEAD" if head else "GET", path, head):
                    return None
                m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/(.+))?", path)
                if m:
                    repo = hub.repos.get(m.group(1))
                    sha = repo.resolve(m.group(2) or "main") if repo else None
                    if sha is None:
                        return self._error(404, "Repository or revision not found", head)
                    files = repo.commits[sha]
                    return self._send(200, {"id": m.group(1), "modelId": m.group(1), "sha": sha, "private": repo.private,
                                            "siblings": [{"rfilename": p} for p in sorted(files)]}, head=head)
                m = re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path)
                if m:
                    repo = hub.repos.get(m.group(1))
                    sha = repo.resolve(m.group(2)) if repo else None
                    if sha is None:
                        return self._error(404, "Repository or revision not found", head)
                    entries = [{"type": "file", "path": p, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                               for p, b in sorted(repo.commits[sha].items())]
                    return self._send(200, entries, head=head)
                m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
                if m:
                    repo = hub.repos.get(m.group(1))
                    sha = repo.resolve(m.group(2)) if repo else None
                    if sha is None or m.group(3) not in repo.commits[sha]:
                        return self._error(404, "Entry not found", head)
                    data = repo.commits[sha][m.group(3)]
                    etag = f'"{hashlib.sha1(data).hexdigest()}"'
                    headers = {"X-Repo-Commit": sha, "ETag": etag, "X-Linked-Etag": etag}
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    for k, v in headers.items():
                        self.send_header(k, v)
                    self.end_headers()
                    if not head:
                        self.wfile.write(data)
                    return None
                return self._error(404, f"no route for GET {path}", head)

        return Handler
