"""A standard-library-only E2B client, as a Python harness without the
e2b package would write one, driving paddock's E2B facade over plain HTTP:
create, a streamed process start (Connect envelopes), files up and down,
errors, kill, and /health after the kill.

Usage: python3 client.py API_URL API_KEY. Prints "ok python" on success and
"info KEY VALUE" lines; any failed check raises (exit code 1).
"""

import base64
import gzip
import http.client
import json
import os
import struct
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

API, KEY = sys.argv[1], sys.argv[2]
HOST = urllib.parse.urlparse(API).netloc


def call(method, path, body=None, headers=None):
    """One request; returns (status, headers, body bytes) for any status."""
    req = urllib.request.Request(API + path, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.headers, e.read()


def control(method, path, obj=None):
    body = None if obj is None else json.dumps(obj).encode()
    return call(method, path, body, {"X-API-KEY": KEY, "Content-Type": "application/json"})


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def envelope(obj, flags=0):
    b = json.dumps(obj).encode()
    return struct.pack(">BI", flags, len(b)) + b


def read_envelopes(resp):
    """Yields (flags, message) from a Connect streaming response."""
    while True:
        hdr = resp.read(5)
        if not hdr:
            return
        check(len(hdr) == 5, "truncated envelope header")
        flags, n = struct.unpack(">BI", hdr)
        msg = json.loads(resp.read(n))
        yield flags, msg


def start_process(sbx, cmd, args, user=None):
    """process.Process/Start, streamed; returns (pid, stdout, stderr, end)."""
    headers = {
        "Content-Type": "application/connect+json",
        "Connect-Protocol-Version": "1",
        "E2b-Sandbox-Id": sbx["sandboxID"],
        "X-Access-Token": sbx["envdAccessToken"],
    }
    if user:
        headers["Authorization"] = "Basic " + base64.b64encode((user + ":").encode()).decode()
    conn = http.client.HTTPConnection(HOST, timeout=60)
    conn.request("POST", "/process.Process/Start", envelope({"process": {"cmd": cmd, "args": args}, "stdin": False}), headers)
    resp = conn.getresponse()
    check(resp.status == 200, "start status %d" % resp.status)
    check(resp.getheader("Content-Type") == "application/connect+json", "stream content type")
    pid, out, err, end, last = None, b"", b"", None, None
    for flags, msg in read_envelopes(resp):
        if flags & 2:
            last = msg
            break
        ev = msg["event"]
        if "start" in ev:
            check(pid is None, "one start event, first")
            pid = ev["start"]["pid"]
        elif "data" in ev:
            out += base64.b64decode(ev["data"].get("stdout", ""))
            err += base64.b64decode(ev["data"].get("stderr", ""))
        elif "end" in ev:
            end = ev["end"]
    conn.close()
    check(last == {}, "stream ends cleanly: %r" % last)
    check(pid and end is not None, "start and end events")
    return pid, out, err, end


def unary(sbx, method, obj, token=None):
    headers = {
        "Content-Type": "application/json",
        "E2b-Sandbox-Id": sbx["sandboxID"],
        "X-Access-Token": token or sbx["envdAccessToken"],
    }
    return call("POST", "/" + method, json.dumps(obj).encode(), headers)


def main():
    # Errors first: no key, a wrong key, a bad body, an unknown sandbox.
    st, _, body = call("GET", "/v2/sandboxes")
    check(st == 401 and json.loads(body)["code"] == 401, "no API key: %d %s" % (st, body))
    st, _, body = call("GET", "/v2/sandboxes", headers={"X-API-KEY": "e2b_" + "0" * 40})
    check(st == 401, "wrong API key")
    st, _, body = call("POST", "/sandboxes", b"{not json", {"X-API-KEY": KEY})
    check(st == 400 and json.loads(body)["code"] == 400, "bad JSON: %d %s" % (st, body))
    st, _, body = control("POST", "/sandboxes", {"templateID": "no-such-template"})
    check(400 <= st < 500, "unknown template: %d" % st)
    st, _, body = control("GET", "/sandboxes/nosuchsandbox1")
    check(st == 404 and json.loads(body) == {"code": 404, "message": json.loads(body)["message"]}, "unknown sandbox: %d %s" % (st, body))

    st, _, body = control("POST", "/sandboxes", {"templateID": "base", "timeout": 120, "metadata": {"client": "python"}, "envVars": {"GREETING": "hello"}})
    check(st == 201, "create: %d %s" % (st, body))
    sbx = json.loads(body)
    print("info sandbox", sbx["sandboxID"])
    check(sbx["envdVersion"] and sbx["envdAccessToken"], "create answers envd version and token")
    try:
        pid, out, err, end = start_process(sbx, "/bin/bash", ["-l", "-c", "echo $GREETING; whoami; echo e >&2; exit 7"])
        check(out == b"hello\nuser\n" and err == b"e\n", "output %r %r" % (out, err))
        check(end.get("exitCode") == 7 and end.get("exited") is True, "end %r" % end)
        _, out, _, _ = start_process(sbx, "id", ["-u"], user="root")
        check(out == b"0\n", "root through Basic auth: %r" % out)

        # Unary calls; a wrong access token is refused.
        st, _, body = unary(sbx, "process.Process/List", {}, token="wrong")
        check(st == 401 and json.loads(body)["code"] == "unauthenticated", "wrong token: %d %s" % (st, body))
        st, _, body = unary(sbx, "filesystem.Filesystem/Stat", {"path": "/nope"})
        check(st == 404 and json.loads(body)["code"] == "not_found", "stat missing: %d %s" % (st, body))

        # Files: octet-stream, multipart, gzip, download.
        h = {"E2b-Sandbox-Id": sbx["sandboxID"], "X-Access-Token": sbx["envdAccessToken"]}
        data = os.urandom(3 << 20)
        st, _, body = call("POST", "/files?path=data.bin", data, dict(h, **{"Content-Type": "application/octet-stream"}))
        check(st == 200 and json.loads(body)[0]["path"] == "/home/user/data.bin", "octet upload: %d %s" % (st, body))
        st, hd, body = call("GET", "/files?path=data.bin", headers=h)
        check(st == 200 and body == data, "download")
        bnd = "paddockboundary"
        mp = ("--%s\r\nContent-Disposition: form-data; name=\"file\"; filename=\"sub/dir/m.txt\"\r\n\r\nmultipart!\r\n--%s--\r\n" % (bnd, bnd)).encode()
        st, _, body = call("POST", "/files", mp, dict(h, **{"Content-Type": "multipart/form-data; boundary=" + bnd}))
        check(st == 200 and json.loads(body)[0]["path"] == "/home/user/sub/dir/m.txt", "multipart: %d %s" % (st, body))
        st, _, body = call("POST", "/files?path=z.txt", gzip.compress(b"z" * 100000), dict(h, **{"Content-Type": "application/octet-stream", "Content-Encoding": "gzip"}))
        check(st == 200, "gzip upload %d" % st)
        st, hd, body = call("GET", "/files?path=z.txt", headers=dict(h, **{"Accept-Encoding": "gzip"}))
        check(st == 200 and hd["Content-Encoding"] == "gzip" and gzip.decompress(body) == b"z" * 100000, "gzip download")
        st, _, body = call("GET", "/files?path=missing.txt", headers=h)
        check(st == 404 and json.loads(body)["code"] == 404, "missing file: %d %s" % (st, body))
        _, out, _, _ = start_process(sbx, "cat", ["/home/user/sub/dir/m.txt"])
        check(out == b"multipart!", "multipart content in the sandbox")

        st, _, body = control("GET", "/v2/sandboxes?metadata=" + urllib.parse.quote("client=python"))
        check(st == 200 and [s["sandboxID"] for s in json.loads(body)] == [sbx["sandboxID"]], "list by metadata: %s" % body)
        # The first sample comes within the telemetry's interval (1 s):
        # before it the answer is [], as E2B's own right after a create.
        for _ in range(50):
            st, _, body = control("GET", "/sandboxes/%s/metrics" % sbx["sandboxID"])
            if st != 200 or json.loads(body):
                break
            time.sleep(0.1)
        check(st == 200 and json.loads(body)[0]["memTotal"] > 0, "metrics %s" % body)
    finally:
        st, _, _ = control("DELETE", "/sandboxes/" + sbx["sandboxID"])
    check(st == 204, "kill: %d" % st)
    st, _, _ = control("DELETE", "/sandboxes/" + sbx["sandboxID"])
    check(st == 404, "second kill: %d" % st)
    st, _, body = call("GET", "/health", headers={"E2b-Sandbox-Id": sbx["sandboxID"]})
    check(st == 502, "health after kill: %d" % st)
    print("ok python")


if __name__ == "__main__":
    main()
