"""The LLM client (the official openai package) against a real HTTP server on 127.0.0.1 that behaves as real
endpoints do: 429 with Retry-After, a timeout, 5xx, a 400 for a parameter that reasoning models reject, a malformed
reply; plus the prompt budget's trimming rule, the concurrency limit, and an API key that never reaches a message."""
import functools
import random

import pytest

from llm_server import ScriptedServer

from kernel_factory.evo.evaluate import render
from kernel_factory.evo.protocols import OperatorContext
from kernel_factory.evo.types import Candidate, Genome
from kernel_factory.operators import llm_prompts
from kernel_factory.operators.llm_client import Agent, ChatClient, estimate_tokens
from kernel_factory.operators.llm_rewrite import LlmRewrite

HI = [{"role": "user", "content": "hi"}]
REASONING_MODEL = ["temperature", "top_p", "max_tokens"]   # what such endpoints answer 400 for


@pytest.fixture
def serve():
    servers = []

    def start(steps, default=None):
        servers.append(ScriptedServer({"steps": steps, "default": default}).start())
        return servers[-1]
    yield start
    for s in servers:
        s.close()


def agent(server, **extra) -> Agent:
    return Agent.of({"name": "local", "base_url": server.base_url, "model": "m", "no_key": True, "timeout_s": 5,
                     **extra}, "t")


def test_a_reasoning_model_gets_max_completion_tokens_and_no_unset_sampling(serve):
    server = serve([{"reply": "fine", "reject": REASONING_MODEL}])
    reply = ChatClient().chat(agent(server, max_completion_tokens=1234), HI)
    assert reply.error is None and reply.text == "fine"
    body = server.requests[0]["body"]
    assert body["max_completion_tokens"] == 1234 and not set(REASONING_MODEL) & set(body)


def test_sampling_is_sent_only_where_configured_and_a_400_is_not_retried(serve):
    server = serve([], default={"reply": "ok", "reject": ["temperature"]})
    reply = ChatClient(sleep=lambda s: None).chat(agent(server, temperature=0.7), HI)
    assert reply.attempts == 1 and len(server.requests) == 1
    assert reply.error.startswith("HTTP 400") and "Unsupported parameter: 'temperature'" in reply.error
    reply = ChatClient().chat(agent(server, top_p=0.9, seed=3), HI)
    assert reply.error is None and server.requests[-1]["body"]["top_p"] == 0.9
    assert server.requests[-1]["body"]["seed"] == 3 and "temperature" not in server.requests[-1]["body"]


def test_429_timeout_and_5xx_are_retried_with_backoff_honouring_retry_after(serve):
    server = serve([{"status": 429, "retry_after": 7}, {"reply": "late", "delay_s": 2}, {"status": 503},
                    {"reply": "done"}])
    waits = []
    reply = ChatClient(sleep=waits.append).chat(agent(server, timeout_s=0.4), HI)
    assert reply.error is None and reply.text == "done" and reply.attempts == 4
    assert waits == [7.0, 2.0, 4.0], "Retry-After first, then our doubling backoff"
    server = serve([], default={"status": 429, "retry_after": 1000})
    waits = []
    reply = ChatClient(sleep=waits.append).chat(agent(server), HI)
    assert "HTTP 429" in reply.error and "gave up after 4 attempts" in reply.error and waits == [30.0] * 3


@pytest.mark.parametrize("raw", ["this is not JSON {", '{"choices": []}', '{"choices": [{"message": {}}]}'])
def test_a_malformed_reply_is_one_line_and_not_retried(serve, raw):
    server = serve([{"raw": raw}, {"reply": "never reached"}])
    reply = ChatClient(sleep=lambda s: None).chat(agent(server), HI)
    assert reply.error and "malformed reply" in reply.error and "\n" not in reply.error
    assert reply.attempts == 1 and len(server.requests) == 1


def test_requests_in_flight_stay_within_max_concurrent(serve):
    server = serve([], default={"reply": "ok", "delay_s": 1.0})
    client = ChatClient()
    replies = client.chat_many([(agent(server, max_concurrent=2), HI)] * 6)
    assert [r.text for r in replies] == ["ok"] * 6
    assert server.max_in_flight == 2, "six calls, two at a time"


def test_the_api_key_comes_from_the_environment_and_never_reaches_a_message(serve, monkeypatch):
    secret = f"sk-test-{random.getrandbits(64):016x}"
    monkeypatch.setenv("KF_TEST_KEY", secret)
    server = serve([{"status": 400, "reply": f"bad request; you sent Bearer {secret}"}])
    a = Agent.of({"name": "remote", "base_url": server.base_url, "model": "m", "api_key_env": "KF_TEST_KEY"}, "t")
    reply = ChatClient().chat(a, HI)
    headers = {k.lower(): v for k, v in server.requests[0]["headers"].items()}
    assert headers["authorization"] == f"Bearer {secret}"
    assert secret not in reply.error and "***" in reply.error and secret not in repr(a)
    with pytest.raises(ValueError, match="'max_tokens' is now 'max_completion_tokens'"):
        Agent.of({"name": "x", "base_url": "http://h/v1", "model": "m", "max_tokens": 10}, "t")


def test_the_prompt_budget_trims_lessons_then_relatives_and_never_the_source(rmsnorm):
    parent = Candidate(Genome.of(rmsnorm.space.defaults()))
    lessons = "# Lessons\n" + "".join(f"- lesson {i}: {random.random()}\n" for i in range(800))
    ctx = OperatorContext(rmsnorm, {}, lessons, {"gpu": "TEST GPU"}, 1, functools.partial(render.render, rmsnorm), {})
    full = llm_prompts.rewrite(ctx, parent, 3)
    budget = estimate_tokens(full) - 2000
    trimmed = llm_prompts.rewrite(ctx, parent, 3, budget)
    assert estimate_tokens(trimmed) <= budget < estimate_tokens(full)
    assert "more characters cut]" in trimmed and llm_prompts.source(ctx, parent, None) in trimmed
    assert llm_prompts.rewrite(ctx, parent, 3, estimate_tokens(full)) == full


def test_the_operator_sends_a_generations_calls_together(rmsnorm, serve):
    server = serve([], default={"reply": "no edit here", "delay_s": 0.5})
    op = LlmRewrite(agents=[{"name": "local", "base_url": server.base_url, "model": "m", "no_key": True,
                             "max_concurrent": 3}])
    parent = Candidate(Genome.of(rmsnorm.space.defaults()))
    op.attach(OperatorContext(rmsnorm, {}, "", {"gpu": "TEST GPU"}, 1, functools.partial(render.render, rmsnorm), {}))
    children = op.make_many([[parent]] * 5, rmsnorm.space, random.Random(0))
    assert len(children) == 5 and len({c.id for c in children}) == 5 and len(server.requests) == 5
    assert server.max_in_flight == 3 and op.ledger.calls == 5
