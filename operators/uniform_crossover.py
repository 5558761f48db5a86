"""Uniform crossover: each gene comes from either parent with probability 1/2; the patch from the first parent."""
from __future__ import annotations

import random
from typing import Sequence

from ..evo.types import GeneSpace, Genome


class UniformCrossover:
    name = "uniform_crossover"
    arity = 2

    def __init__(self, swap_p: float = 0.5):
        if not 0.0 <= swap_p <= 1.0:
            raise ValueError(f"swap_p must be in [0, 1], got {swap_p}")
        self.swap_p = swap_p

    def vary(self, parents: Sequence[Genome], space: GeneSpace, rng: random.Random) -> Genome:
        a, b = parents[0].gene_dict, parents[1].gene_dict
        child = {name: (b[name] if rng.random() < self.swap_p else a[name]) for name in space.names}
        return Genome.of(child, parents[0].patch_dict)
