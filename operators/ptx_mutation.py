"""PTX-choice mutation: changes only instruction-level genes (load/store flavour, reduction, rsqrt, ...), keeping
the tiling, so the effect of one instruction choice is measured on an otherwise unchanged kernel."""
from __future__ import annotations

from ..evo.types import GeneSpace
from .gene_mutation import GeneMutation


class PtxMutation(GeneMutation):
    name = "ptx_mutation"

    def __init__(self, per_gene_p: float = 0.3):
        super().__init__(per_gene_p)

    def mutable(self, space: GeneSpace) -> list[str]:
        return [g.name for g in space.genes if g.kind == "ptx"]
