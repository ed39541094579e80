"""A stand-in for llama.cpp's llama-server (CI has no llama.cpp): /health and a streaming /v1/completions
that answers max_tokens tokens of "a"; `--help` lists two n-gram speculation types. With $FAKE_LLAMA_LOG
set, each request appends a line to that file: its port, prompt length and max_tokens."""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

if "--help" in sys.argv:
    print("--spec-type none,draft-simple,ngram-simple,ngram-mod   comma-separated list of types")
    sys.exit(0)
port = int(sys.argv[sys.argv.index("--port") + 1])


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b'{"status": "ok"}')

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        n = body["max_tokens"]
        if os.environ.get("FAKE_LLAMA_LOG"):
            with open(os.environ["FAKE_LLAMA_LOG"], "a") as log:
                log.write(f"{port} {len(body['prompt'])} {n}\n")
        for _ in range(n):
            self.wfile.write(b'data: {"choices": [{"text": "a"}]}\n\n')
        usage = {"choices": [], "usage": {"completion_tokens": n}}
        self.wfile.write(f"data: {json.dumps(usage)}\n\ndata: [DONE]\n\n".encode())


ThreadingHTTPServer(("127.0.0.1", port), Handler).serve_forever()
