"""An OTLP/HTTP collector that keeps nothing: the receiving end for tracing's on-cost.

    python bench/otlp_sink.py [--port 4318]

Answers every ``POST /v1/traces`` 200 with an empty ``ExportTraceServiceResponse`` (an
empty protobuf message is valid), after reading the body, and counts requests and
bytes (printed on SIGINT/SIGTERM). With ``OTEL_TRACES_EXPORTER=otlp`` and
``OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318`` a service then pays the whole
price of tracing on (spans, the batch processor, protobuf encoding, the HTTP post)
and none of a real collector's: what bench/RESULTS.md calls the no-op exporter.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

counts = {"requests": 0, "bytes": 0}
lock = threading.Lock()


class Sink(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(size)
        with lock:
            counts["requests"] += 1
            counts["bytes"] += size
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=4318)
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Sink)

    def stop(*_: object) -> None:
        threading.Thread(target=server.shutdown).start()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    print(f"otlp sink on 127.0.0.1:{args.port}", flush=True)
    server.serve_forever()
    print(f"otlp sink: {counts['requests']} requests, {counts['bytes']} bytes", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
