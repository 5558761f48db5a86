"""The surrogate's ensemble and its upper-confidence pick, on a synthetic structured space (no recording, no GPU)."""
import itertools
import math
import random

import numpy as np
import pytest

from kernel_factory.evo.history import Record
from kernel_factory.evo.surrogate import Surrogate, screen, upper_confidence
from kernel_factory.evo.types import Candidate, Gene, GeneSpace, Genome, Status

SPACE = GeneSpace((Gene("threads", (64, 128, 256, 512), 128), Gene("vec", (4, 8, 16), 8),
                   Gene("load", ("plain", "nc", "async"), "plain"), Gene("unroll", (1, 2, 4), 1)))


def fitness(genes: dict) -> float:
    """Structured like a kernel's speedup: each gene helps or hurts, and one pair interacts (wide vectors pay off
    only with the async load); one value always fails to compile."""
    if genes["threads"] == 64 and genes["unroll"] == 4:
        return 0.0
    log = {64: -0.3, 128: 0.0, 256: 0.2, 512: 0.1}[genes["threads"]] + 0.1 * math.log2(genes["unroll"])
    log += {"plain": 0.0, "nc": 0.1, "async": 0.05}[genes["load"]]
    log += 0.3 if (genes["vec"], genes["load"]) == (16, "async") else 0.0
    return math.exp(log)


def every_genome() -> list[dict]:
    return [dict(zip([g.name for g in SPACE.genes], values)) for values in
            itertools.product(*(g.choices for g in SPACE.genes))]


def record(genes: dict) -> Record:
    f = fitness(genes)
    return Record(Genome.of(genes).id, genes, False, (), "random", 0, Status.OK if f > 0 else Status.COMPILE_ERROR,
                  f, 0.1, "r")


def ranks(a) -> np.ndarray:
    return np.argsort(np.argsort(a))


@pytest.fixture(scope="module")
def split():
    genomes = every_genome()
    random.Random(3).shuffle(genomes)
    return [record(g) for g in genomes[:40]], genomes[40:]


@pytest.mark.parametrize("members", [1, 8])
def test_the_model_ranks_unseen_genomes_of_a_structured_space_better_than_chance(split, members):
    train, unseen = split
    model = Surrogate(SPACE, members)
    assert model.fit(train, min_ok=8)
    pred = model.predict(unseen)
    true = np.array([fitness(g) for g in unseen])
    # chance: rank correlation 0, with a standard deviation of about 0.12 over these 68 genomes
    assert np.corrcoef(ranks(pred), ranks(true))[0, 1] > 0.4
    assert true[np.argsort(-pred)[:10]].mean() > true.mean() + 0.1, "the predicted top ten must be better than most"


def test_bootstrap_members_disagree_and_a_single_model_does_not(split):
    train, unseen = split
    one, many = Surrogate(SPACE, 1), Surrogate(SPACE, 8)
    one.fit(train, min_ok=8)
    many.fit(train, min_ok=8)
    assert np.all(one.predict_spread(unseen)[1] == 0.0)
    spread = many.predict_spread(unseen)[1]
    assert np.all(spread > 0.0)
    again = Surrogate(SPACE, 8)
    again.fit(train, min_ok=8)
    assert np.array_equal(again.predict_spread(unseen)[1], spread), "a refit on the same history is the same model"


def test_too_little_history_trains_nothing(split):
    train, _ = split
    model = Surrogate(SPACE, 8)
    assert not model.fit(train[:3], min_ok=8) and model.weights is None


def test_upper_confidence_adds_kappa_spreads_to_the_mean(split):
    train, unseen = split
    model = Surrogate(SPACE, 8)
    model.fit(train, min_ok=8)
    mean, spread = model.predict_spread(unseen)
    assert np.allclose(upper_confidence(model, 2.0)(unseen), mean + 2.0 * spread)
    assert np.allclose(upper_confidence(model, 0.0)(unseen), model.predict(unseen))


def test_the_pick_takes_the_best_scored_proposals_in_score_order():
    cands = [Candidate(Genome.of(g)) for g in every_genome()[:30]]
    score = {c.id: s for c, s in zip(cands, random.Random(1).sample(range(100), 30))}
    by_score = lambda genes_list: np.array([score[Genome.of(g).id] for g in genes_list], dtype=float)
    chosen = screen(cands, 5, by_score, explore=0.0, rng=random.Random(0))
    assert [score[c.id] for c in chosen] == sorted(score.values(), reverse=True)[:5]
    mixed = screen(cands, 5, by_score, explore=0.4, rng=random.Random(0))
    assert [score[c.id] for c in mixed[:3]] == sorted(score.values(), reverse=True)[:3]
    assert len({c.id for c in mixed}) == 5


def test_a_surrogate_without_members_is_refused_by_name():
    from kernel_factory.evo.config import ConfigError
    with pytest.raises(ConfigError, match="search.surrogate.members"):
        Surrogate(SPACE, 0)
