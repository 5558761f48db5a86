"""Conformance suite: every installed entry point loads and satisfies its plugin contract."""
import copy
import random
from importlib.metadata import entry_points

import numpy as np
import pytest
import torch

from kernel_factory.evo import registry
from kernel_factory.evo.protocols import launch_steps, SHAPE_SETS, Launch, Operator, Problem
from kernel_factory.evo.types import Case, Genome

PROBLEMS = registry.available("problem")
OPERATORS = registry.available("operator")


def test_every_group_has_its_built_ins():
    assert "rmsnorm_fwd" in PROBLEMS
    assert {"gene_mutation", "uniform_crossover", "ptx_mutation"} <= set(OPERATORS)
    assert {"gpu", "replay"} <= set(registry.available("evaluator"))
    assert {"console", "journal", "mlflow"} <= set(registry.available("observer"))
    for group in registry.GROUPS.values():
        for ep in entry_points(group=group):
            assert ep.load() is not None, ep


@pytest.mark.parametrize("name", PROBLEMS)
def test_problem_contract(name):
    prob = registry.load("problem", name)
    assert isinstance(prob, Problem)
    assert set(SHAPE_SETS) <= set(prob.shape_sets) and all(prob.shape_sets[s] for s in SHAPE_SETS)
    assert prob.space.why_infeasible(prob.space.defaults()) is None, "template defaults must be feasible"
    assert prob.kernel_name in prob.template()
    assert prob.baselines and prob.dtypes
    case = Case(prob.shape_sets["correctness"][0], prob.dtypes[0])
    a, b = prob.make_inputs(case, 1, "cpu"), prob.make_inputs(case, 1, "cpu")
    c = prob.make_inputs(case, 2, "cpu")
    for key in a:
        assert torch.equal(a[key], b[key]), "same seed must give the same inputs"
    assert any(not torch.equal(a[k], c[k]) for k in a), "another seed must give other inputs"
    outs, ref = prob.make_outputs(case, "cpu"), prob.reference(a)
    assert set(ref) <= set(outs), "every reference output needs a buffer (extra buffers are scratch)"
    for key in ref:
        assert ref[key].shape == outs[key].shape and torch.isfinite(ref[key]).all()
    steps = launch_steps(prob.launch(prob.space.defaults(), case, a, outs))
    assert steps and all(isinstance(s, Launch) and all(g >= 1 for g in s.grid) for s in steps)
    for arg in (arg for s in steps for arg in s.args):   # tensors become pointers; scalars must be numpy-typed
        assert isinstance(arg, (torch.Tensor, np.generic)), f"untyped kernel argument {arg!r}"
    assert prob.bytes_moved(case) > 0
    for dt in prob.dtypes:
        atol, rtol = prob.tolerance(dt)
        assert 0 < atol < 1 and 0 < rtol < 0.1


@pytest.mark.parametrize("name", PROBLEMS)
def test_every_installed_problem_keeps_the_declared_rules(name):
    """What `kernel-factory check` reads without running anything, for every installed plugin (the built-ins and the
    packages under tests/plugins/ alike): genes header fresh, names C identifiers, hooks well formed."""
    from kernel_factory.evo.evaluate.render import genes_header_fault
    from kernel_factory.evo.tools import check_contract
    prob = registry.load("problem", name)
    assert genes_header_fault(prob) == ""
    (line,) = check_contract.static(prob, name)
    assert line.startswith(f"contract: {name} v{prob.version}, ")


@pytest.mark.parametrize("name", OPERATORS)
def test_operator_contract(name, rmsnorm):
    op = registry.load("operator", name)()
    assert isinstance(op, Operator) and op.name == name and op.arity >= 1
    space = rmsnorm.space
    rng = random.Random(0)
    genomes = [Genome.of(g) for g in random.Random(1).sample(list(space.enumerate()), 8)]
    before = copy.deepcopy(genomes)
    children = [op.vary(genomes[i:i + op.arity], space, rng) for i in range(0, 8 - op.arity)]
    assert genomes == before, "parents must not change"
    for child in children:
        assert set(child.gene_dict) == set(space.names)
        assert all(child.gene_dict[g.name] in g.choices for g in space.genes)
    again = [op.vary(genomes[i:i + op.arity], space, random.Random(0)) for i in range(0, 8 - op.arity)]
    assert children[0] == again[0], "the same rng state must give the same child"
    assert any(c not in genomes for c in children), "an operator must produce new genomes"


def test_ptx_mutation_touches_only_ptx_genes(rmsnorm):
    op = registry.load("operator", "ptx_mutation")()
    parent = Genome.of(rmsnorm.space.defaults())
    ptx = {g.name for g in rmsnorm.space.genes if g.kind == "ptx"}
    rng = random.Random(5)
    for _ in range(50):
        child = op.vary([parent], rmsnorm.space, rng)
        changed = {k for k, v in child.gene_dict.items() if parent.gene_dict[k] != v}
        assert changed and changed <= ptx


def test_gene_mutation_keeps_the_patch(rmsnorm):
    op = registry.load("operator", "gene_mutation")()
    parent = Genome.of(rmsnorm.space.defaults(), {"reduce": "// patched\n"})
    child = op.vary([parent], rmsnorm.space, random.Random(0))
    assert child.patch_dict == parent.patch_dict and child.gene_dict != parent.gene_dict


def test_optional_capabilities_are_protocols_the_plugins_satisfy():
    """The engine asks isinstance(plugin, Capability); a renamed or half-declared member must not silently turn a
    capability off, so the built-ins are held to the ones they offer."""
    from kernel_factory.evo.protocols import (DeclaresDeterminism, ExpectedSass, MaybeUnavailable, PublishedPeers,
                                              RowReference, SpecialInputs)
    fwd, bwd = registry.load("problem", "rmsnorm_fwd"), registry.load("problem", "rmsnorm_bwd")
    for prob in (fwd, bwd):
        assert isinstance(prob, PublishedPeers) and set(prob.peers) <= set(prob.baselines)
        assert isinstance(prob, SpecialInputs) and isinstance(prob, ExpectedSass)
        assert not isinstance(prob, DeclaresDeterminism)     # neither opts out of the repeated-launch check
    assert isinstance(bwd, RowReference) and not isinstance(fwd, RowReference)
    assert set(bwd.row_outputs) < set(bwd.reference(bwd.make_inputs(Case((64, 256), "float32"), 3, "cpu")))
    for name in OPERATORS:   # an LLM operator built with no agents is out of service, and says so
        op = registry.load("operator", name)()
        assert isinstance(op, MaybeUnavailable) == name.startswith("llm_"), name
        assert not isinstance(op, MaybeUnavailable) or op.unavailable
