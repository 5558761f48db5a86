"""Gene mutation: each gene is redrawn with probability `per_gene_p` (at least one gene always changes)."""
from __future__ import annotations

import random
from typing import Sequence

from ..evo.types import GeneSpace, Genome


class GeneMutation:
    name = "gene_mutation"
    arity = 1

    def __init__(self, per_gene_p: float = 0.2):
        if not 0.0 < per_gene_p <= 1.0:
            raise ValueError(f"per_gene_p must be in (0, 1], got {per_gene_p}")
        self.per_gene_p = per_gene_p

    def mutable(self, space: GeneSpace) -> list[str]:
        """The genes this operator may change."""
        return [g.name for g in space.genes]

    def vary(self, parents: Sequence[Genome], space: GeneSpace, rng: random.Random) -> Genome:
        """A copy of the parent with some genes set to another choice; the patch is kept (hybrid genome)."""
        parent = parents[0]
        genes = parent.gene_dict
        names = [n for n in self.mutable(space) if len(space[n].choices) > 1]
        if not names:
            return parent
        picked = [n for n in names if rng.random() < self.per_gene_p] or [rng.choice(names)]
        for name in picked:
            genes[name] = rng.choice([v for v in space[name].choices if v != genes[name]])
        return Genome.of(genes, parent.patch_dict)
