"""PTX-choice mutation: changes only instruction-level genes (load/store flavour, reduction, rsqrt, ...), keeping
the tiling, so the effect of one instruction choice is measured on an otherwise unchanged kernel."""
from __future__ import annotations

import random
from typing import Sequence

from kernel_factory.evo.types import GeneSpace, Genome
from kernel_factory.operators.gene_mutation import mutate_genes


class PtxMutation:
    name = "ptx_mutation"
    arity = 1

    def __init__(self, per_gene_p: float = 0.3):
        if not 0.0 < per_gene_p <= 1.0:
            raise ValueError(f"per_gene_p must be in (0, 1], got {per_gene_p}")
        self.per_gene_p = per_gene_p

    def vary(self, parents: Sequence[Genome], space: GeneSpace, rng: random.Random) -> Genome:
        ptx = [g.name for g in space.genes if g.kind == "ptx"]
        return mutate_genes(parents[0], ptx, self.per_gene_p, space, rng)
