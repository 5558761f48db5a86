"""Genomes and the RMSNorm gene space: content ids, feasibility rules, enumeration."""
from kernel_factory.evo.types import Candidate, Case, Gene, GeneSpace, Genome, geomean_speedup

import pytest


def test_genome_id_is_a_content_hash():
    a = Genome.of({"x": 1, "y": "nc"})
    assert a.id == Genome.of({"y": "nc", "x": 1}).id            # order-free
    assert a.id != Genome.of({"x": 2, "y": "nc"}).id
    assert a.id != Genome.of({"x": 1, "y": "nc"}, {"reduce": "code"}).id
    assert Candidate(a, ("p",), "gene_mutation", 3).id == a.id    # lineage is not identity
    assert Genome.from_json(a.to_json()) == a


def test_gene_rejects_a_default_outside_its_choices():
    with pytest.raises(ValueError, match="default"):
        Gene("t", (1, 2), 3)


def test_rmsnorm_rules(rmsnorm):
    space, d = rmsnorm.space, rmsnorm.space.defaults()
    assert space.why_infeasible(d) is None
    big_ring = {**d, "threads": 1024, "load": "cp_async", "unroll": 4, "vec_bytes": 16}
    assert "shared memory" in space.why_infeasible(big_ring)
    too_many_regs = {**d, "threads": 1024, "keep_x": True, "unroll": 4, "vec_bytes": 16, "load": "nc"}
    assert "registers" in space.why_infeasible(too_many_regs)
    assert "is not one of" in space.why_infeasible({**d, "threads": 96})
    assert "do not match" in space.why_infeasible({"threads": 256})


def test_enumerate_yields_exactly_the_feasible_genomes():
    space = GeneSpace((Gene("a", (1, 2, 3), 1), Gene("b", (1, 2), 1)),
                      rule=lambda g: "odd sum" if (g["a"] + g["b"]) % 2 else None)
    got = list(space.enumerate())
    assert got == [{"a": 1, "b": 1}, {"a": 2, "b": 2}, {"a": 3, "b": 1}]
    assert space.size() == 6


def test_rmsnorm_space_counts(rmsnorm):
    feasible = list(rmsnorm.space.enumerate())
    assert 1000 < len(feasible) < rmsnorm.space.size()
    assert len({Genome.of(g).id for g in feasible}) == len(feasible)


def test_geomean_speedup():
    assert geomean_speedup({"a": 1.0, "b": 4.0}, {"a": 2.0, "b": 2.0}) == pytest.approx(1.0)
    assert geomean_speedup({"a": 1.0}, {"a": 2.0}) == pytest.approx(2.0)
    assert geomean_speedup({"a": float("nan")}, {"a": 2.0}) == 0.0
    assert geomean_speedup({"a": 1.0}, {"b": 2.0}) == 0.0
    assert geomean_speedup({}, {}) == 0.0


def test_case_keys_round_trip():
    c = Case((32768, 256), "bfloat16")
    assert c.key == "bfloat16:32768x256" and Case.parse(c.key) == c
