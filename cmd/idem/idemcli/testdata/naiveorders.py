"""A deliberately naive orders service: it honours Idempotency-Key by
check-then-write, with a gap between the check and the write, so that
concurrent duplicates all pass the check and each create an order.

    python3 naiveorders.py PORT      (0 picks a free port, printed on stdout)

POST /orders[?delay=SECONDS]  creates an order (201), or returns the one
                              already stored under the key (200)
GET  /orders                  every order, as a JSON array
GET  /received                how many POST /orders arrived
"""
import itertools
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

GAP = 0.05  # seconds between the check and the write: the race window

lock = threading.Lock()  # guards the lists, not the check-then-write
orders = []
by_key = {}
ids = itertools.count(1)
received = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        global received
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        url = urlparse(self.path)
        if url.path != "/orders":
            return self.answer(404, {"error": "not found"})
        with lock:
            received += 1
        key = self.headers.get("Idempotency-Key")
        if key is not None and key in by_key:  # check ...
            return self.answer(200, by_key[key])
        delay = float(parse_qs(url.query).get("delay", ["0"])[0])
        time.sleep(GAP + delay)  # ... the gap ...
        with lock:  # ... then write
            order = {"id": next(ids), "key": key, "request": body.decode("utf-8", "replace")}
            orders.append(order)
            if key is not None:
                by_key[key] = order
        self.answer(201, order, {"Location": "/orders/%d" % order["id"]})

    def do_GET(self):
        path = urlparse(self.path).path
        if path == "/orders":
            with lock:
                return self.answer(200, list(orders))
        if path == "/received":
            return self.answer(200, {"received": received})
        self.answer(404, {"error": "not found"})

    def answer(self, status, doc, headers=None):
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler)
    server.daemon_threads = True
    print("listening %d" % server.server_address[1], flush=True)
    server.serve_forever()
