"""A scripted chat-completions server (OpenAI response shape) on 127.0.0.1, so that the LLM operators are tested
over real HTTP, and the H200 run gets its edits, without a model: replies come from a script, and every request
is recorded for the tests to inspect.

A script is {"steps": [step, ...], "default": step | null}. A step is {"reply": text, "status": 200, "delay_s": 0,
"retry_after": null, "match": text | [text, ...], "usage": {"prompt_tokens": n, "completion_tokens": n},
"reject": [parameter, ...], "raw": text}: `reject` answers HTTP 400 "Unsupported parameter" (as reasoning models do)
when the request carries one of those parameters; `raw` sends that text as a 200 body (a malformed reply). Each
request is served the first unused step whose `match` strings all occur in its messages (a step without `match`
fits any request), else `default` (which is never used up), else HTTP 400 "script exhausted".

Standalone: python tests/llm_server.py --port 8765 --script tests/llm_scripts/h200.json [--log requests.jsonl]
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Mapping


class Script:
    def __init__(self, data: Mapping[str, Any]):
        self.steps = [dict(s) for s in data.get("steps", [])]
        self.default = data.get("default")
        self.used: set[int] = set()
        self.lock = threading.Lock()

    def next(self, prompt: str) -> dict[str, Any] | None:
        with self.lock:
            for i, step in enumerate(self.steps):
                match = step.get("match") or []
                match = [match] if isinstance(match, str) else match
                if i not in self.used and all(m in prompt for m in match):
                    self.used.add(i)
                    return step
        return self.default


class ScriptedServer:
    """Start with start(); base_url is what an agent's config names; requests holds every request received."""

    def __init__(self, script: Mapping[str, Any], port: int = 0, log: Path | None = None):
        self.script = Script(script)
        self.requests: list[dict[str, Any]] = []
        self.log = log
        self.in_flight = self.max_in_flight = 0   # requests being served at once, and the most ever
        self.flight_lock = threading.Lock()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), _handler(self))
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="llm-server", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def start(self) -> "ScriptedServer":
        self.thread.start()
        return self

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def record(self, entry: dict[str, Any]) -> None:
        self.requests.append(entry)
        if self.log is not None:
            redacted = {**entry, "headers": {k: ("<redacted>" if k.lower() == "authorization" else v)
                                             for k, v in entry["headers"].items()}}
            with self.log.open("a") as f:
                f.write(json.dumps(redacted) + "\n")


def _handler(server: ScriptedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:   # keep test output and the run's console clean
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            server.record({"path": self.path, "headers": dict(self.headers), "body": body, "time": time.time()})
            if self.path.rstrip("/") != "/v1/chat/completions":
                return self._send(404, {"error": {"message": f"no route {self.path}"}})
            prompt = "\n".join(m.get("content", "") for m in body.get("messages", []))
            step = server.script.next(prompt)
            if step is None:
                return self._send(400, {"error": {"message": "script exhausted"}})
            rejected = [p for p in step.get("reject", []) if p in body]
            if rejected:
                return self._send(400, {"error": {"message": f"Unsupported parameter: '{rejected[0]}' is not "
                                                             "supported with this model.", "param": rejected[0],
                                                  "type": "invalid_request_error"}})
            with server.flight_lock:
                server.in_flight += 1
                server.max_in_flight = max(server.max_in_flight, server.in_flight)
            try:
                time.sleep(float(step.get("delay_s", 0)))
            finally:
                with server.flight_lock:
                    server.in_flight -= 1
            if "raw" in step:
                return self._send_raw(200, step["raw"].encode())
            status = int(step.get("status", 200))
            if status != 200:
                return self._send(status, {"error": {"message": step.get("reply", "scripted error")}},
                                  step.get("retry_after"))
            reply = step.get("reply", "")
            usage = step.get("usage") or {"prompt_tokens": len(prompt) // 4, "completion_tokens": len(reply) // 4}
            self._send(200, {"id": f"scripted-{len(server.requests)}", "object": "chat.completion",
                             "model": body.get("model", "scripted"),
                             "choices": [{"index": 0, "finish_reason": "stop",
                                          "message": {"role": "assistant", "content": reply}}],
                             "usage": {**usage, "total_tokens": sum(usage.values())}})

        def _send(self, status: int, payload: Mapping[str, Any], retry_after: Any = None) -> None:
            self._send_raw(status, json.dumps(payload).encode(), retry_after)

        def _send_raw(self, status: int, data: bytes, retry_after: Any = None) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                if retry_after is not None:
                    self.send_header("Retry-After", str(retry_after))
                self.end_headers()
                self.wfile.write(data)
            except (BrokenPipeError, ConnectionResetError):
                pass   # the client timed out and hung up: that is what a delay step tests

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--script", type=Path, required=True)
    parser.add_argument("--log", type=Path, help="append every request (Authorization redacted) to this JSONL file")
    args = parser.parse_args()
    server = ScriptedServer(json.loads(args.script.read_text()), args.port, args.log)
    print(f"scripted chat-completions server on {server.base_url} ({len(server.script.steps)} steps)", flush=True)
    try:
        server.httpd.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.httpd.server_close()
        print(f"served {len(server.requests)} requests", flush=True)


if __name__ == "__main__":
    main()
