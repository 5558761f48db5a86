"""The LLM operators against a real HTTP server with scripted replies: each reply ends as the right child (applied,
invalid_patch, llm_error, or handed to the evaluator's static check), retries, budget, agent shares, repair."""
import functools
import json
import random

import pytest

from llm_server import ScriptedServer

from kernel_factory.evo.regions import regions as regions_of
from kernel_factory.evo.config import SearchConfig
from kernel_factory.evo.evaluate import render
from kernel_factory.evo.evaluate.compile import CompileJob, Compiler
from kernel_factory.evo.history import History, Record
from kernel_factory.evo.protocols import OperatorContext
from kernel_factory.evo.types import Candidate, EvalResult, Genome, Status
from kernel_factory.evo.variation import Proposer, WeightedOperator
from kernel_factory.operators import llm_edits
from kernel_factory.operators.gene_mutation import GeneMutation
from kernel_factory.operators.llm_agents import AgentOutcome, AgentPool
from kernel_factory.operators.llm_client import Agent, ChatClient
from kernel_factory.operators.llm_repair import LlmRepair
from kernel_factory.operators.llm_rewrite import LlmRewrite

GOOD = """Reverse the butterfly order.
REGION: reduce
<<<<<<< SEARCH
  for (int m = 16; m > 0; m >>= 1) v += shfl_bfly(v, m);
=======
  for (int m = 1; m < 32; m <<= 1) v += shfl_bfly(v, m);
>>>>>>> REPLACE
"""
MISMATCH = GOOD.replace("m >>= 1) v", "m >>= 1)  v")
GARBAGE = "Sure! Here is a faster kernel: just use more threads."
HOST = """REGION: reduce
<<<<<<< SEARCH
__device__ __forceinline__ float shfl_bfly(float v, int lane_mask) {
=======
#include <cstdio>
int main() { system("rm -rf /"); return 0; }
__device__ __forceinline__ float shfl_bfly(float v, int lane_mask) {
>>>>>>> REPLACE
"""
# Outside the #if on the REDUCE gene, so that it breaks every genome.
BROKEN = """Return through a cast.
REGION: reduce
<<<<<<< SEARCH
  return __uint_as_float(r);
=======
  return __int_as_float((int)r)
>>>>>>> REPLACE
"""
FIXED = """The statement lacks its semicolon.
REGION: reduce
<<<<<<< SEARCH
  return __int_as_float((int)r)
=======
  return __int_as_float((int)r);
>>>>>>> REPLACE
"""


@pytest.fixture
def serve():
    servers = []

    def start(steps, default=None):
        servers.append(ScriptedServer({"steps": steps, "default": default}).start())
        return servers[-1]
    yield start
    for s in servers:
        s.close()


def agent(server, name="local", **extra):
    return {"name": name, "base_url": server.base_url, "model": "scripted", "no_key": True, "timeout_s": 5, **extra}


def context(problem, results=(), generation=1):
    return OperatorContext(problem, {c.id: (c, r) for c, r in results}, "# Lessons\n- forbid load=plain\n",
                           {"gpu": "TEST GPU", "copy_gbps": "4200", "baseline": "torch_eager"}, generation,
                           functools.partial(render.render, problem), {})


def parent_of(problem):
    parent = Candidate(Genome.of(problem.space.defaults()), operator="defaults")
    times = {"bfloat16:32768x4096": 100.0}
    result = EvalResult(parent.id, Status.OK, 1.05, times, {}, {"bfloat16:32768x4096": 105.0},
                        {"bfloat16:32768x4096": 2684.0}, message="")
    return parent, result


def rewrite(problem, server, **options):
    op = LlmRewrite(agents=[agent(server)], **options)
    parent, result = parent_of(problem)
    op.attach(context(problem, [(parent, result)]))
    return op, parent


@pytest.mark.parametrize("reply, status, why", [
    (MISMATCH, Status.INVALID_PATCH, "does not occur"),
    (GARBAGE, Status.INVALID_PATCH, "no 'REGION"),
    (GOOD.replace("REGION: reduce", "REGION: epilogue"), Status.INVALID_PATCH, "unknown region"),
])
def test_replies_that_do_not_apply_are_recorded_as_invalid_patch(rmsnorm, serve, reply, status, why):
    server = serve([{"reply": reply}])
    op, parent = rewrite(rmsnorm, server)
    child = op.make([parent], rmsnorm.space, random.Random(0))
    assert child.failure[0] == status.value and why in child.failure[1]
    assert child.genome.gene_dict == parent.genome.gene_dict and "!unapplied" in child.genome.patch_dict
    assert child.notes["llm/reply.md"] == reply and "llm/diff.patch" not in child.notes
    with pytest.raises(render.PatchError):   # it can never be compiled
        render.apply_patch(rmsnorm.template(), child.genome.patch_dict)


def test_good_edit_gives_a_hybrid_child_with_notes_and_a_full_prompt(rmsnorm, serve):
    server = serve([{"reply": GOOD, "usage": {"prompt_tokens": 1000, "completion_tokens": 200}}])
    op, parent = rewrite(rmsnorm, server)
    op.pool.usable[0] = Agent.of({**agent(server), "price_in_per_mtok": 3.0, "price_out_per_mtok": 15.0}, "t")
    child = op.make([parent], rmsnorm.space, random.Random(0))
    assert child.failure is None and child.genome.gene_dict == parent.genome.gene_dict
    assert "m <<= 1" in child.genome.patch_dict["reduce"]
    usage = json.loads(child.notes["llm/usage.json"])
    assert usage["model"] == "scripted" and usage["prompt_tokens"] == 1000
    assert usage["cost_usd"] == pytest.approx(1000 * 3e-6 + 200 * 15e-6)
    assert "+  for (int m = 1; m < 32; m <<= 1)" in child.notes["llm/diff.patch"]
    prompt = server.requests[0]["body"]["messages"][1]["content"]
    assert prompt == child.notes["llm/prompt.md"]
    for must in ("TASK: rewrite", rmsnorm.description, "KF-EDIT-BEGIN reduce", "#define THREADS 256",
                 "| bfloat16:32768x4096 | 100.00 | 2684 | 64% | 105.00 | 1.050x |", "forbid load=plain",
                 "<<<<<<< SEARCH", "- threads = 256"):
        assert must in prompt, must
    assert "Authorization" not in server.requests[0]["headers"]   # no_key: nothing is sent


def test_host_code_reaches_the_evaluator_whose_static_check_rejects_it(rmsnorm, serve):
    server = serve([{"reply": HOST}])
    op, parent = rewrite(rmsnorm, server)
    child = op.make([parent], rmsnorm.space, random.Random(0))
    assert child.failure is None, "the operator applies the edit; refusing it is the evaluator's job"
    from kernel_factory.evo.evaluate import static_check
    reason = static_check.check(rmsnorm.template(), child.genome.patch_dict)
    assert reason and ("include" in reason or "main" in reason or "system" in reason), reason


def test_429_is_retried_honouring_retry_after_and_5xx_gives_up(rmsnorm, serve):
    server = serve([{"status": 429, "retry_after": 7}, {"status": 503}, {"reply": GOOD}])
    waits = []
    client = ChatClient(sleep=waits.append)
    reply = client.chat(Agent.of(agent(server), "t"), [{"role": "user", "content": "hi"}])
    assert reply.error is None and reply.text == GOOD and reply.attempts == 3 and waits == [7.0, 2.0]
    server = serve([], default={"status": 500})
    reply = ChatClient(sleep=waits.append).chat(Agent.of(agent(server), "t"), [{"role": "user", "content": "x"}])
    assert "HTTP 500" in reply.error and reply.attempts == 4 and len(server.requests) == 4
    server = serve([{"status": 401, "reply": "bad key"}])
    reply = ChatClient(sleep=waits.append).chat(Agent.of(agent(server), "t"), [{"role": "user", "content": "x"}])
    assert "HTTP 401" in reply.error and reply.attempts == 1


def test_timeout_and_oversized_prompt_are_llm_errors(rmsnorm, serve):
    server = serve([], default={"reply": GOOD, "delay_s": 3})
    op = LlmRewrite(agents=[agent(server, timeout_s=0.5)])
    op.client = ChatClient(max_attempts=2, sleep=lambda s: None)
    parent, result = parent_of(rmsnorm)
    op.attach(context(rmsnorm, [(parent, result)]))
    child = op.make([parent], rmsnorm.space, random.Random(0))
    assert child.failure[0] == Status.LLM_ERROR.value and "timed out" in child.failure[1]
    assert "gave up after 2 attempts" in child.failure[1] and len(server.requests) == 2
    op = LlmRewrite(agents=[agent(server, max_prompt_tokens=100)])
    op.attach(context(rmsnorm, [(parent, result)]))
    child = op.make([parent], rmsnorm.space, random.Random(0))
    assert child.failure[0] == Status.LLM_ERROR.value and "exceeds the agent's max_prompt_tokens" in child.failure[1]
    assert len(server.requests) == 2


def test_budget_stops_calls_once_spent(rmsnorm, serve):
    server = serve([], default={"reply": GARBAGE, "usage": {"prompt_tokens": 1000, "completion_tokens": 0}})
    op = LlmRewrite(agents=[agent(server, price_in_per_mtok=1000.0)], budget_usd=2.5)   # $1 per call
    parent, result = parent_of(rmsnorm)
    op.attach(context(rmsnorm, [(parent, result)]))
    rng = random.Random(0)
    children = [op.make([parent], rmsnorm.space, rng) for _ in range(5)]
    assert len(server.requests) == 3
    assert [c.failure[0] for c in children] == ["invalid_patch"] * 3 + ["llm_error"] * 2
    assert "LLM budget of $2.5 spent" in children[-1].failure[1]
    op.attach(context(rmsnorm, [(parent, result)]))
    assert op.unavailable and "budget" in op.unavailable   # the proposer gives its share to the others


def test_agent_shares_follow_success_per_dollar(rmsnorm, serve):
    good, bad = Agent.of(agent(serve([]), "good"), "t"), Agent.of(agent(serve([]), "bad"), "t")
    pool = AgentPool([good, bad], gpu_usd_per_hour=3.0)
    assert pool.shares == {"good": 0.5, "bad": 0.5}
    pool.learn([AgentOutcome("good", True, 0.01, 1.0)] * 5 + [AgentOutcome("bad", False, 0.01, 1.0)] * 5)
    assert pool.shares["good"] > 0.8 and pool.shares["bad"] >= 0.05
    # The same through the operator: outcomes are read from the run's results and the children's usage notes.
    op = LlmRewrite(agents=[agent(serve([]), "good"), agent(serve([]), "bad")])
    parent, presult = parent_of(rmsnorm)
    results = [(parent, presult)]
    for i, (name, fitness) in enumerate([("good", 1.2), ("bad", 0.0)] * 4):
        usage = json.dumps({"agent": name, "model": "m", "cost_usd": 0.01})
        child = Candidate(Genome.of(parent.genome.gene_dict, {"reduce": f"// {i}\n"}), (parent.id,), "llm_rewrite",
                          1, {"llm/usage.json": usage})
        results.append((child, EvalResult(child.id, Status.OK if fitness else Status.INCORRECT, fitness)))
    op.attach(context(rmsnorm, results))
    assert op.pool.shares["good"] > 0.8
    picks = [op.pool.pick(random.Random(s)).name for s in range(200)]
    assert picks.count("good") > 150


def compile_error_of(problem, genome, tmp_path):
    compiler = Compiler(tmp_path / "cache", workers=1)
    try:
        job = CompileJob(compiler.key(render.body(problem, genome, "bfloat16")),
                         render.render(problem, Candidate(genome), "bfloat16"), "x.cu")
        (out,) = compiler.compile_many([job])
    finally:
        compiler.close()
    return out.error


def test_proposer_repairs_a_failed_patched_child_within_bounds(rmsnorm, serve, tmp_path):
    server = serve([{"match": ["TASK: repair", "expected a \";\""], "reply": FIXED}], default={"reply": GARBAGE})
    repair = LlmRepair(agents=[agent(server)], max_attempts=1)
    proposer = Proposer(rmsnorm.space, [WeightedOperator(repair, 1.0), WeightedOperator(GeneMutation(), 1.0)],
                        SearchConfig(policy="static", lessons=False), rmsnorm, {"gpu": "TEST"})
    parent, presult = parent_of(rmsnorm)
    edit = llm_edits.parse(BROKEN)
    body = llm_edits.apply(edit, regions_of(rmsnorm.template()))
    broken = Candidate(Genome.of(parent.genome.gene_dict, {"reduce": body}), (parent.id,), "llm_rewrite", 1)
    error = compile_error_of(rmsnorm, broken.genome, tmp_path)
    assert error and 'expected a ";"' in error
    bresult = EvalResult(broken.id, Status.COMPILE_ERROR, message=f"bfloat16: {error}")
    history = History()
    history.add([Record.of(parent, presult, "r"), Record.of(broken, bresult, "r")])
    proposer.update(history, [(parent, presult), (broken, bresult)])
    children = proposer.propose([parent], 4, {parent.id, broken.id}, 2, random.Random(0))
    (fix,) = [c for c in children if c.operator == "llm_repair"]
    assert fix.parents == (broken.id,) and fix.failure is None and len(children) == 4
    assert "(int)r);" in fix.genome.patch_dict["reduce"] and compile_error_of(rmsnorm, fix.genome, tmp_path) is None
    prompt = server.requests[0]["body"]["messages"][1]["content"]
    assert "TASK: repair" in prompt and "compile_error" in prompt and "attempt 1 of at most 1" in prompt
    # The repair failed too: with max_attempts 1 this lineage gets no second repair.
    fresult = EvalResult(fix.id, Status.INCORRECT, message="bfloat16:199x1024 max abs error 3.2 at (0, 5)")
    history.add([Record.of(fix, fresult, "r")])
    proposer.update(history, [(fix, fresult)])
    again = proposer.propose([parent], 4, {parent.id, broken.id, fix.id}, 3, random.Random(1))
    assert not [c for c in again if c.operator == "llm_repair"] and len(server.requests) == 1


def test_edit_format_is_strict():
    regions = {"reduce": "a\nb\nb\n"}
    ok = llm_edits.parse("REGION: reduce\n<<<<<<< SEARCH\na\n=======\nc\n>>>>>>> REPLACE\n")
    assert llm_edits.apply(ok, regions) == "c\nb\nb\n"
    twice = llm_edits.parse("REGION: reduce\n<<<<<<< SEARCH\nb\n=======\nc\n>>>>>>> REPLACE\n")
    with pytest.raises(llm_edits.EditError, match="occurs 2 times"):
        llm_edits.apply(twice, regions)
    body = llm_edits.parse("REGION: reduce\n<<<<<<< BODY\nnew\n>>>>>>> BODY\n")
    assert llm_edits.apply(body, regions) == "new\n"
    for bad in ("REGION: reduce\n<<<<<<< SEARCH\na\n=======\nc\n",
                "REGION: reduce\n<<<<<<< BODY\nx\n>>>>>>> BODY\n<<<<<<< SEARCH\na\n=======\nc\n>>>>>>> REPLACE\n",
                "REGION: reduce\nREGION: load_store\n<<<<<<< BODY\nx\n>>>>>>> BODY\n",
                "REGION: reduce\n=======\n"):
        with pytest.raises(llm_edits.EditError):
            llm_edits.apply(llm_edits.parse(bad), regions)
    with pytest.raises(llm_edits.EditError, match="unchanged"):
        llm_edits.apply(llm_edits.parse("REGION: reduce\n<<<<<<< BODY\na\nb\nb\n>>>>>>> BODY\n"), regions)
