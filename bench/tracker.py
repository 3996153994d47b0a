#!/usr/bin/env python3
"""A minimal BitTorrent HTTP tracker for the dissemination benchmark: every
announce is answered with every other peer of the same torrent (compact
form), re-announced each second. Enough for a lab swarm; not for the
internet (no expiry, no limits).

    python3 bench/tracker.py ADDR PORT
"""

from __future__ import annotations

import socket
import struct
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

PEERS: dict[bytes, dict[bytes, tuple[str, int]]] = {}


def bencode(v) -> bytes:
    if isinstance(v, int):
        return b"i%de" % v
    if isinstance(v, bytes):
        return b"%d:%s" % (len(v), v)
    if isinstance(v, str):
        return bencode(v.encode())
    if isinstance(v, dict):
        return b"d" + b"".join(bencode(k) + bencode(v[k]) for k in sorted(v)) + b"e"
    raise TypeError(type(v))


class Announce(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the stdlib's name)
        path, _, query = self.path.partition("?")
        q = parse_qs(query, encoding="latin-1")
        if path != "/announce" or "info_hash" not in q or "peer_id" not in q or "port" not in q:
            body = bencode({"failure reason": "bad announce"})
        else:
            ih = q["info_hash"][0].encode("latin-1")
            pid = q["peer_id"][0].encode("latin-1")
            swarm = PEERS.setdefault(ih, {})
            if q.get("event", [""])[0] == "stopped":
                swarm.pop(pid, None)
            else:
                swarm[pid] = (self.client_address[0], int(q["port"][0]))
            others = b"".join(socket.inet_aton(a) + struct.pack(">H", p) for k, (a, p) in swarm.items() if k != pid)
            body = bencode({"interval": 1, "min interval": 1, "peers": others})
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


if __name__ == "__main__":
    ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Announce).serve_forever()
