"""Gene mutation: each gene is redrawn with probability `per_gene_p` (at least one gene always changes)."""
from __future__ import annotations

import random
from typing import Sequence

from kernel_factory.evo.types import GeneSpace, Genome


def mutate_genes(parent: Genome, names: Sequence[str], per_gene_p: float, space: GeneSpace,
                 rng: random.Random) -> Genome:
    """A copy of `parent` with some of `names` set to a different choice; the patch is kept (hybrid genome)."""
    genes = parent.gene_dict
    mutable = [n for n in names if len(space[n].choices) > 1]
    if not mutable:
        return parent
    picked = [n for n in mutable if rng.random() < per_gene_p] or [rng.choice(mutable)]
    for name in picked:
        genes[name] = rng.choice([v for v in space[name].choices if v != genes[name]])
    return Genome.of(genes, parent.patch_dict)


class GeneMutation:
    name = "gene_mutation"
    arity = 1

    def __init__(self, per_gene_p: float = 0.2):
        if not 0.0 < per_gene_p <= 1.0:
            raise ValueError(f"per_gene_p must be in (0, 1], got {per_gene_p}")
        self.per_gene_p = per_gene_p

    def vary(self, parents: Sequence[Genome], space: GeneSpace, rng: random.Random) -> Genome:
        return mutate_genes(parents[0], space.names, self.per_gene_p, space, rng)
