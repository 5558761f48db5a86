"""Chat completions over any OpenAI-compatible HTTP endpoint with the standard library only: one request with
bounded retries, token usage and cost per call, size limits, and an API key that only ever reaches the
Authorization header."""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

MAX_ATTEMPTS = 4            # one call plus three retries on 429 / 5xx
BACKOFF_S = 1.0             # first wait; doubles after each retry unless the server says Retry-After
MAX_WAIT_S = 30.0           # a Retry-After longer than this is cut to it, so one call cannot stall a run
MAX_PROMPT_CHARS = 120_000  # prompts are built to stay well under this; a longer one is refused, not sent
MAX_REPLY_CHARS = 60_000    # a longer reply is refused: a truncated edit would not apply anyway


@dataclass(frozen=True)
class Agent:
    """One model behind one endpoint. api_key_env names the environment variable holding the key; the key itself
    is never part of the config, and is read only when a request is sent."""

    name: str
    base_url: str
    model: str
    api_key_env: str | None = None
    no_key: bool = False              # a local server that needs no key
    temperature: float = 0.2
    max_tokens: int = 4096
    timeout_s: float = 120.0
    weight: float = 1.0               # starting share among agents
    price_in_per_mtok: float = 0.0    # dollars per million prompt tokens
    price_out_per_mtok: float = 0.0   # dollars per million completion tokens

    @staticmethod
    def of(data: Mapping[str, Any], where: str) -> "Agent":
        """From config; an unknown or missing key is a ValueError naming it (build turns it into a ConfigError)."""
        known = set(Agent.__dataclass_fields__)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown agent keys {unknown}; valid: {sorted(known)}")
        missing = [k for k in ("name", "base_url", "model") if k not in data]
        if missing:
            raise ValueError(f"{where}: agent needs {missing}")
        agent = Agent(**data)
        if agent.weight <= 0 or agent.timeout_s <= 0 or agent.max_tokens <= 0:
            raise ValueError(f"{where}: agent {agent.name!r} needs weight, timeout_s and max_tokens > 0")
        return agent

    def why_unusable(self) -> str | None:
        if self.no_key:
            return None
        if not self.api_key_env:
            return f"agent {self.name!r} names no api_key_env (set no_key: true for a local server)"
        if not os.environ.get(self.api_key_env):
            return f"agent {self.name!r}: environment variable {self.api_key_env} is unset"
        return None

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        return (prompt_tokens * self.price_in_per_mtok + completion_tokens * self.price_out_per_mtok) / 1e6


@dataclass(frozen=True)
class Reply:
    """The outcome of one chat call: text on success, error (one line) on failure; usage either way."""

    agent: str
    model: str
    text: str = ""
    error: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    latency_s: float = 0.0
    attempts: int = 0

    def usage(self) -> dict[str, Any]:
        return {"agent": self.agent, "model": self.model, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "cost_usd": self.cost_usd,
                "latency_s": round(self.latency_s, 3), "attempts": self.attempts, "error": self.error}


class _Failure(Exception):
    """A failure not worth retrying: another 4xx, no connection, a timeout, a malformed answer."""


class _Retry(Exception):
    """A 429 or 5xx: worth another attempt, after wait_s if the server said (Retry-After)."""

    def __init__(self, message: str, wait_s: float | None):
        super().__init__(message)
        self.wait_s = wait_s


@dataclass
class ChatClient:
    """Sends chat completions. Retries only 429 and 5xx answers: a timeout is not retried, because a model that
    is too slow once would cost the wait again. sleep and clock are injected so tests of retries take no time."""

    max_attempts: int = MAX_ATTEMPTS
    backoff_s: float = BACKOFF_S
    max_prompt_chars: int = MAX_PROMPT_CHARS
    max_reply_chars: int = MAX_REPLY_CHARS
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    calls: int = field(default=0, init=False)

    def chat(self, agent: Agent, messages: Sequence[Mapping[str, str]]) -> Reply:
        size = sum(len(m["content"]) for m in messages)
        if size > self.max_prompt_chars:
            return Reply(agent.name, agent.model, error=f"prompt of {size} chars exceeds the limit of "
                                                        f"{self.max_prompt_chars}; not sent")
        start, wait = self.clock(), self.backoff_s
        for attempt in range(1, self.max_attempts + 1):
            self.calls += 1
            try:
                return self._finish(agent, self._post(agent, messages), start, attempt)
            except _Retry as exc:
                if attempt == self.max_attempts:
                    return Reply(agent.name, agent.model, error=f"{exc} (gave up after {attempt} attempts)",
                                 latency_s=self.clock() - start, attempts=attempt)
                self.sleep(min(exc.wait_s if exc.wait_s is not None else wait, MAX_WAIT_S))
                wait *= 2
            except _Failure as exc:
                return Reply(agent.name, agent.model, error=str(exc), latency_s=self.clock() - start,
                             attempts=attempt)
        raise AssertionError("unreachable: the last attempt returns")

    def _post(self, agent: Agent, messages: Sequence[Mapping[str, str]]) -> dict[str, Any]:
        body = json.dumps({"model": agent.model, "messages": list(messages), "temperature": agent.temperature,
                           "max_tokens": agent.max_tokens}).encode()
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(agent.api_key_env or "", "") if not agent.no_key else ""
        if key:
            headers["Authorization"] = f"Bearer {key}"
        url = agent.base_url.rstrip("/") + "/chat/completions"
        request = urllib.request.Request(url, body, headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=agent.timeout_s) as response:
                raw = response.read(self.max_reply_chars * 4 + 65536)
        except urllib.error.HTTPError as exc:
            detail = _scrub(exc.read(500).decode("utf-8", "replace"), key)
            message = f"HTTP {exc.code} from {url}: {' '.join(detail.split())[:300]}"
            if exc.code == 429 or exc.code >= 500:
                raise _Retry(message, _retry_after(exc.headers.get("Retry-After"))) from None
            raise _Failure(message) from None
        except (urllib.error.URLError, TimeoutError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise _Failure(f"request to {url} failed: {_scrub(str(reason), key)} "
                           f"(timeout {agent.timeout_s:g} s)") from None
        try:
            return json.loads(raw)
        except ValueError:
            raise _Failure(f"{url} answered with something that is not JSON ({len(raw)} bytes)") from None

    def _finish(self, agent: Agent, data: dict[str, Any], start: float, attempt: int) -> Reply:
        usage = data.get("usage") or {}
        p_tok, c_tok = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
        common = dict(prompt_tokens=p_tok, completion_tokens=c_tok, cost_usd=agent.cost(p_tok, c_tok),
                      latency_s=self.clock() - start, attempts=attempt)
        try:
            text = data["choices"][0]["message"]["content"] or ""
        except (KeyError, IndexError, TypeError):
            return Reply(agent.name, agent.model, error="the reply has no choices[0].message.content", **common)
        if len(text) > self.max_reply_chars:
            return Reply(agent.name, agent.model, error=f"reply of {len(text)} chars exceeds the limit of "
                                                        f"{self.max_reply_chars}; refused", **common)
        return Reply(agent.name, agent.model, text=text, **common)


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None   # an HTTP date: fall back to our own backoff


def _scrub(text: str, key: str) -> str:
    """A server may echo the request (headers included) in an error page; the key must not reach our logs."""
    return text.replace(key, "***") if key else text
