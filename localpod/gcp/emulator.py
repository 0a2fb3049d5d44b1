"""gcp-storage-emulator, in memory, with what tensorstore's GCS driver (so OCDBT) needs.

The server, its HTTP API and its object storage are the stock ones; this module patches in:
- Generation preconditions, as GCS has them: `ifGenerationMatch` (0 = create only) and
  `ifGenerationNotMatch` on uploads, object GETs and deletes: 412 on a failed precondition, and
  304 on a GET whose `ifGenerationNotMatch` names the live generation. OCDBT commits its manifest
  with these; the stock emulator ignores them.
- `x-goog-generation` / `x-goog-metageneration` on media downloads: tensorstore reads an object's
  generation from them (without them every read fails with "Malformed StorageGeneration").
- 416 for a range that starts past the object's end (the stock one answers a bogus 206).
- A media upload stores its body as is, JSON included (the stock one parses it as metadata).
- A threaded HTTP/1.1 server with keep-alive and TCP_NODELAY: the stock one serves one
  connection at a time over HTTP/1.0 (a new TCP connection per request). Keep-alive needs
  NODELAY: a response is several writes, and with Nagle on each one waited for the client's
  delayed ACK (a small GET: 44 ms median, 0.4 ms with NODELAY). One lock serialises the
  handlers, so a precondition check and its write are atomic; the reply is sent after the lock
  is released, as GCS serves reads concurrently (under the lock, a worker's 185 MB environment
  download held its peer's manifest GET 2.2 s in every recreate).
- No index dump per write: the stock emulator rewrites its whole object index as one JSON file
  after every write (24.5 ms against 0.6 ms per write at 1,300 objects); in memory it has no reader.
- Soft delete off in the default bucket: pruned checkpoint steps would otherwise stay in memory
  for GCS's default 7 days.
- Injected faults (429, 503, dropped connections, stalls) on a chosen fraction of requests:
  localpod.gcp.storage_faults, off unless `TPUPOD_STORAGE_FAULTS` or `/_tpupod/faults` asks.
- IAM, in a pod (`TPUPOD_STORAGE_POD_DIR`): every request authorised by the pod's gate
  (localpod.gcp.storage_iam), on one listener per machine (`TPUPOD_STORAGE_LISTENERS`: address ->
  the member a request without a token of the pod's is attributed to: each VM's address, and
  127.0.0.1 the operator's). The stock `/wipe` is not served there: GCS has none.

`python -m localpod.gcp.emulator start --host 127.0.0.1 --port P --default-bucket B`
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from functools import partial
from http import HTTPStatus
from http.server import ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from gcp_storage_emulator import server, storage
from gcp_storage_emulator.__main__ import main
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import buckets, objects

from localpod.gcp import storage_faults, storage_iam
from localpod.gcp.authz import Gate
from localpod.gcp.loopback import send_json

POD_DIR_ENV = "TPUPOD_STORAGE_POD_DIR"
LISTENERS_ENV = "TPUPOD_STORAGE_LISTENERS"
_LOCK = threading.Lock()
_FAULTS = storage_faults.FaultGate(storage_faults.FaultPlan())
_GATE: Gate | None = None
_LISTENERS: dict[str, str] = {}  # address -> member (a VM's storage URL)
_stock_read_raw = server._read_raw_data
_stock_send = server.Response.close
_stock_bucket_resource = buckets._make_bucket_resource


def _skip_index_dump(self) -> None:
    """In memory the index file has no reader; the live index stays in the process."""


def _live_generation(request, store) -> int | None:
    """The live generation of the request's object, None when there is none."""
    bucket = request.params["bucket_name"]
    name = request.params.get("object_id") or (request.query.get("name") or [None])[0]
    if name is None and isinstance(request.data, dict):  # multipart/resumable metadata
        name = request.data.get("name") or (request.data.get("meta") or {}).get("name")
    try:
        return int(store.get_file_obj(bucket, name)["generation"])
    except (NotFound, KeyError, TypeError):
        return None


def _failed_precondition(request, store, *, read: bool) -> HTTPStatus | None:
    """GCS's answer to the request's generation preconditions, None when they hold."""
    match = request.query.get("ifGenerationMatch")
    not_match = request.query.get("ifGenerationNotMatch")
    if not match and not not_match:
        return None
    live = _live_generation(request, store)
    if match is not None:
        want = int(match[0])
        if (want == 0 and live is not None) or (want != 0 and want != live):
            return HTTPStatus.PRECONDITION_FAILED
    if not_match is not None and live is not None and int(not_match[0]) == live:
        return HTTPStatus.NOT_MODIFIED if read else HTTPStatus.PRECONDITION_FAILED
    return None


def _with_preconditions(handler, *, read: bool):
    def checked(request, response, store, *args, **kwargs):
        if request.query.get("upload_id"):  # a resumable chunk: checked when it was created
            return handler(request, response, store, *args, **kwargs)
        failed = _failed_precondition(request, store, read=read)
        if failed is not None:
            response.status = failed
            if failed == HTTPStatus.PRECONDITION_FAILED:
                response.json({"error": {"code": 412, "message": "Precondition Failed"}})
            return None
        return handler(request, response, store, *args, **kwargs)

    return checked


def _range_past_end(request, store) -> bool:
    """A `Range: bytes=START-` with START at or past the object's end: GCS answers 416."""
    m = re.fullmatch(r"\s*bytes=(\d+)-\d*", request.get_header("range", "") or "")
    if not m:
        return False
    try:
        obj = store.get_file_obj(request.params["bucket_name"], request.params["object_id"])
    except NotFound:
        return False
    return int(m.group(1)) >= int(obj.get("size") or 0) > 0


def _with_generation_headers(handler):
    def download(request, response, store, *args, **kwargs):
        if _range_past_end(request, store):
            response.status = HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE
            response.json({"error": {"code": 416, "message": "Requested range not satisfiable"}})
            return
        handler(request, response, store, *args, **kwargs)
        if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
            obj = store.get_file_obj(request.params["bucket_name"], request.params["object_id"])
            response["x-goog-generation"] = str(obj["generation"])
            response["x-goog-metageneration"] = str(obj.get("metageneration", "1"))
            response["x-goog-stored-content-length"] = str(obj.get("size", ""))

    return download


def _media_as_bytes(handler, query, _stock=server._read_data):
    """A media upload's body is the object, whatever its Content-Type: the stock server parses
    an `application/json` object (a manifest) as if it were the upload's metadata."""
    if (query.get("uploadType") or [""])[0] == "media":
        return server._decode_raw_data(handler.tpupod_body, handler) or None
    return _stock(handler, query)


def _no_soft_delete(*args, **kwargs) -> dict:
    bucket = _stock_bucket_resource(*args, **kwargs)
    bucket["softDeletePolicy"] = {"retentionDurationSeconds": "0"}
    return bucket


def _handle_serialised(self, method, _stock=server.Router.handle) -> None:
    """Reads the whole body first (an unread body would corrupt the next request on a kept-alive
    connection), draws an injected fault, then routes under the lock (a stall waits outside it)."""
    handler = self._request_handler
    handler.tpupod_body = _stock_read_raw(handler)
    if handler.path.split("?", 1)[0] == storage_faults.CONTROL_PATH:
        storage_faults.control(_FAULTS, handler, str(method).upper(), handler.tpupod_body)
        return
    if storage_faults.inject(_FAULTS, handler):
        return
    if _GATE is not None and not _authorized(handler, str(method).upper()):
        return
    handler.tpupod_reply = None
    with _LOCK:
        _stock(self, method)
    if handler.tpupod_reply is not None:
        _stock_send(handler.tpupod_reply)


def _reply_later(self) -> None:
    """Response.close, deferred: _handle_serialised sends the reply once the lock is free (its
    body is bytes already read, so a write after the lock cannot change what it sends)."""
    self._handler.tpupod_reply = self


def _caller(handler):
    member = _LISTENERS.get(handler.server.server_address[0])
    return _GATE.caller(handler.headers.get("Authorization"), member)


def _exists(store, bucket: str, name: str) -> bool:
    try:
        store.get_file_obj(bucket, name)
        return True
    except NotFound:
        return False


def _authorized(handler, method: str) -> bool:
    """True when the request may be served; else GCS's refusal has been sent."""
    url = urlsplit(handler.path)
    query = parse_qs(url.query)
    if query.get("upload_id") or url.path == "/batch/storage/v1":
        return True  # a resumable session's chunk (its URL authorises it); a batch's parts
    verb = handler.headers.get("x-http-method-override") or method
    found = storage_iam.route(verb, url.path)
    if found is None or found[0] == "health":
        if url.path == "/wipe":
            send_json(handler, 404, {"error": {"code": 404, "message": "Not Found"}})
            return False
        return True  # the stock server answers what GCS does not serve (501)
    name, params = found
    store = handler.storage
    call = storage_iam.call(_GATE, name, params, query, partial(_exists, store),
                            lambda: server._read_data(handler, query))  # fmt: skip
    refused = storage_iam.check(_GATE, _caller(handler), call)
    if refused is None:
        return True
    send_json(handler, *refused)
    return False


def _batch_guard(stock, verb: str):
    """A batch part checked as the request it stands for (a denied part answers 403 alone)."""

    def guarded(request, item, store, bucket_name, object_id, meta, response):
        if _GATE is None:
            return stock(request, item, store, bucket_name, object_id, meta, response)
        params = {
            "bucket": bucket_name,
            "object": object_id,
            "dbucket": item.get("dest_bucket_name"),
            "dobject": item.get("dest_object_id"),
        }
        call = storage_iam.call(_GATE, storage_iam.BATCH_METHODS[verb], params, {},
                                partial(_exists, store), lambda: meta)  # fmt: skip
        refused = storage_iam.check(_GATE, _caller(request._request_handler), call)
        if refused is None:
            return stock(request, item, store, bucket_name, object_id, meta, response)
        objects._batch_write_json(response, f"HTTP/1.1 {refused[0]} Forbidden", refused[1])
        return True

    return guarded


class _ThreadingServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128


def _serve_threaded(self) -> None:
    """APIThread.run with a thread per connection, and one more listener per VM address. A port
    it cannot bind ends the process with the bind's errno (EADDRINUSE: its starter picks another
    port): the stock server's main thread would wait forever for a listener that died."""
    handler = partial(server.RequestHandler, self._storage)
    try:
        self._httpd = _ThreadingServer((self._host, self._port), handler)
        extras = [_ThreadingServer((address, self._port), handler)
                  for address in _LISTENERS if address != self._host]  # fmt: skip
    except OSError as err:
        print(f"emulator: cannot listen on port {self._port}: {err}", file=sys.stderr, flush=True)
        os._exit(err.errno or 1)
    for extra in extras:  # the main listener's attribution is in _LISTENERS too
        threading.Thread(target=extra.serve_forever, daemon=True).start()
    self.is_running.set()
    self._httpd.serve_forever()


def _replace_handlers(stock, patched) -> None:
    for _, by_method in server.HANDLERS:
        for method, handler in list(by_method.items()):
            if handler is stock:
                by_method[method] = patched


def install() -> None:
    storage.Storage._write_config_to_file = _skip_index_dump
    buckets._make_bucket_resource = _no_soft_delete
    server._read_raw_data = lambda handler: handler.tpupod_body
    server._read_data = _media_as_bytes
    server.Router.handle = _handle_serialised
    server.Response.close = _reply_later
    server.RequestHandler.protocol_version = "HTTP/1.1"
    # Headers and body go out as separate writes: with Nagle on, a kept-alive connection waits
    # for the client's delayed ACK (40 ms) on every response.
    server.RequestHandler.disable_nagle_algorithm = True
    server.APIThread.run = _serve_threaded
    download = _with_preconditions(_with_generation_headers(objects.download), read=True)
    patched = {
        objects.insert: _with_preconditions(objects.insert, read=False),
        objects.xml_upload: _with_preconditions(objects.xml_upload, read=False),
        objects.delete: _with_preconditions(objects.delete, read=False),
        objects.get: _with_preconditions(
            lambda req, res, st, *a, **k: (
                download(req, res, st)
                if (req.query.get("alt") or [""])[0] == "media"
                else objects.get(req, res, st, *a, **k)
            ),
            read=True,
        ),
        objects.download: download,
    }
    objects.insert = patched[objects.insert]  # the router's fallback for uploads without /upload
    for verb, stock in list(objects._BATCH_METHOD_HANDLERS.items()):
        objects._BATCH_METHOD_HANDLERS[verb] = _batch_guard(stock, verb)
    for stock, new in patched.items():
        _replace_handlers(stock, new)


def run(argv: list[str]) -> int:
    global _GATE
    _FAULTS.set(storage_faults.plan_from_env())
    if pod_dir := os.environ.get(POD_DIR_ENV):
        _GATE = Gate.for_pod(Path(pod_dir))
        _LISTENERS.update(json.loads(os.environ.get(LISTENERS_ENV) or "{}"))
    install()
    if "--in-memory" not in argv:
        argv = [*argv, "--in-memory"]
    return main(argv) or 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
