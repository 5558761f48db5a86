"""Chat completions over any OpenAI-compatible endpoint through the official `openai` client: retries with backoff on
timeouts, 429 and 5xx (honouring Retry-After), `max_completion_tokens`, sampling parameters only where the config
sets them, a prompt budget in tokens, at most `max_concurrent` requests in flight, token usage and cost per call,
and an API key that is read from the environment and never logged."""
from __future__ import annotations

import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import openai

MAX_ATTEMPTS = 4            # one call plus three retries on a timeout, 429 or 5xx
BACKOFF_S = 1.0             # first wait; doubles after each retry unless the server says Retry-After
MAX_WAIT_S = 30.0           # a Retry-After longer than this is cut to it, so one call cannot stall a run
MAX_REPLY_CHARS = 60_000    # a longer reply is refused: a truncated edit would not apply anyway
CHARS_PER_TOKEN = 3.0       # the prompt budget's token estimate: ceil(characters / 3) (code tokenizes densely)
SAMPLING = ("temperature", "top_p", "seed", "reasoning_effort")   # sent only when the agent's config sets them
RENAMED = {"max_tokens": "max_completion_tokens"}


def estimate_tokens(text: str) -> int:
    """The prompt budget's measure: ceil(len(text) / CHARS_PER_TOKEN), the same for every model and endpoint."""
    return math.ceil(len(text) / CHARS_PER_TOKEN)


@dataclass(frozen=True)
class Agent:
    """One model behind one endpoint. api_key_env names the environment variable holding the key; the key itself
    is never part of the config, and is read only when a request is sent."""

    name: str
    base_url: str
    model: str
    api_key_env: str | None = None
    no_key: bool = False              # a local server that needs no key
    max_completion_tokens: int = 4096  # reasoning models count their hidden reasoning in it too
    max_prompt_tokens: int = 16000    # the prompt budget (estimate_tokens); prompts are trimmed to fit it
    max_concurrent: int = 4           # requests in flight to this agent at once
    timeout_s: float = 120.0
    # Sampling parameters: None means "not sent" (current reasoning models reject temperature and top_p).
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    reasoning_effort: str | None = None
    weight: float = 1.0               # starting share among agents
    price_in_per_mtok: float = 0.0    # dollars per million prompt tokens
    price_out_per_mtok: float = 0.0   # dollars per million completion tokens

    @staticmethod
    def of(data: Mapping[str, Any], where: str) -> "Agent":
        """From config; an unknown or missing key is a ValueError naming it (build turns it into a ConfigError)."""
        known = set(Agent.__dataclass_fields__)
        for old, new in RENAMED.items():
            if old in data:
                raise ValueError(f"{where}: agent key {old!r} is now {new!r} (what current models accept)")
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"{where}: unknown agent keys {unknown}; valid: {sorted(known)}")
        missing = [k for k in ("name", "base_url", "model") if k not in data]
        if missing:
            raise ValueError(f"{where}: agent needs {missing}")
        agent = Agent(**data)
        positive = ("weight", "timeout_s", "max_completion_tokens", "max_prompt_tokens", "max_concurrent")
        if any(getattr(agent, k) <= 0 for k in positive):
            raise ValueError(f"{where}: agent {agent.name!r} needs {', '.join(positive)} > 0")
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

    def sampling(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in SAMPLING if getattr(self, k) is not None}


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


class _Retry(Exception):
    """A timeout, 429 or 5xx: worth another attempt, after wait_s if the server said (Retry-After)."""

    def __init__(self, message: str, wait_s: float | None):
        super().__init__(message)
        self.wait_s = wait_s


class _Failure(Exception):
    """Not worth retrying: another 4xx (an unsupported parameter, a bad key), a malformed reply."""


@dataclass
class ChatClient:
    """Sends chat completions; the openai client's own retries are off so that ours (with an injected sleep and
    clock, so tests of retries take no time) are the only ones, and each attempt is counted."""

    max_attempts: int = MAX_ATTEMPTS
    backoff_s: float = BACKOFF_S
    max_reply_chars: int = MAX_REPLY_CHARS
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    calls: int = field(default=0, init=False)
    _gates: dict[str, threading.BoundedSemaphore] = field(default_factory=dict, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def chat(self, agent: Agent, messages: Sequence[Mapping[str, str]]) -> Reply:
        tokens = estimate_tokens("".join(m["content"] for m in messages))
        if tokens > agent.max_prompt_tokens:
            return Reply(agent.name, agent.model, error=f"prompt of ~{tokens} tokens exceeds the agent's "
                                                        f"max_prompt_tokens {agent.max_prompt_tokens}; not sent")
        start, wait = self.clock(), self.backoff_s
        with self._gate(agent):
            for attempt in range(1, self.max_attempts + 1):
                with self._lock:
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

    def chat_many(self, requests: Sequence[tuple[Agent, Sequence[Mapping[str, str]]]]) -> list[Reply]:
        """Several calls at once, each agent's at most max_concurrent in flight; replies in request order."""
        if len(requests) <= 1:
            return [self.chat(a, m) for a, m in requests]
        with ThreadPoolExecutor(max_workers=len(requests), thread_name_prefix="kf-llm") as pool:
            return list(pool.map(lambda req: self.chat(*req), requests))

    def _gate(self, agent: Agent) -> threading.BoundedSemaphore:
        with self._lock:
            return self._gates.setdefault(agent.name, threading.BoundedSemaphore(agent.max_concurrent))

    def _post(self, agent: Agent, messages: Sequence[Mapping[str, str]]) -> Any:
        key = "" if agent.no_key else os.environ.get(agent.api_key_env or "", "")
        client = openai.OpenAI(base_url=agent.base_url, api_key=key or "no-key", timeout=agent.timeout_s,
                               max_retries=0)
        url = agent.base_url.rstrip("/") + "/chat/completions"
        try:
            with client:
                return client.chat.completions.create(model=agent.model, messages=list(messages),
                                                      max_completion_tokens=agent.max_completion_tokens,
                                                      **agent.sampling())
        except openai.APITimeoutError:
            raise _Retry(f"request to {url} timed out after {agent.timeout_s:g} s", None) from None
        except openai.APIStatusError as exc:
            message = f"HTTP {exc.status_code} from {url}: {_scrub(_detail(exc), key)}"
            if exc.status_code == 429 or exc.status_code >= 500:
                raise _Retry(message, _retry_after(exc.response.headers.get("retry-after"))) from None
            raise _Failure(message) from None
        except openai.APIConnectionError as exc:
            raise _Retry(f"request to {url} failed: {_scrub(str(exc.__cause__ or exc), key)}", None) from None
        except (openai.APIResponseValidationError, ValueError) as exc:
            raise _Failure(f"{url} answered with a malformed reply: {_scrub(str(exc), key)[:200]}") from None

    def _finish(self, agent: Agent, data: Any, start: float, attempt: int) -> Reply:
        usage = getattr(data, "usage", None)
        p_tok = int(getattr(usage, "prompt_tokens", 0) or 0)
        c_tok = int(getattr(usage, "completion_tokens", 0) or 0)
        common = dict(prompt_tokens=p_tok, completion_tokens=c_tok, cost_usd=agent.cost(p_tok, c_tok),
                      latency_s=self.clock() - start, attempts=attempt)
        try:
            choice = data.choices[0]
            text = choice.message.content
        except (AttributeError, IndexError, TypeError):
            text, choice = None, None
        if not isinstance(text, str):   # e.g. a reasoning model that spent max_completion_tokens on reasoning
            why = getattr(choice, "finish_reason", None)
            return Reply(agent.name, agent.model, error="malformed reply: no text in choices[0].message.content"
                         + (f" (finish_reason {why})" if why else ""), **common)
        if len(text) > self.max_reply_chars:
            return Reply(agent.name, agent.model, error=f"reply of {len(text)} chars exceeds the limit of "
                                                        f"{self.max_reply_chars}; refused", **common)
        return Reply(agent.name, agent.model, text=text, **common)


def _detail(exc: openai.APIStatusError) -> str:
    body = exc.body if isinstance(exc.body, Mapping) else {}
    error = body.get("error", body) if isinstance(body, Mapping) else {}
    text = error.get("message") if isinstance(error, Mapping) else None
    return " ".join(str(text or exc.message).split())[:300]


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:
        return None   # an HTTP date: fall back to our own backoff


def _scrub(text: str, key: str) -> str:
    """A server may echo the request (headers included) in an error page; the key must not reach our logs."""
    return text.replace(key, "***") if key else text
