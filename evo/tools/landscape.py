"""The recorded space as the search-efficiency benchmark sees it: the one record that both halves of the benchmark
(efficiency.py, which builds it, and efficiency_kt.py, which hands it to Kernel Tuner) read."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from ..types import GeneSpace, Genome


@dataclass(frozen=True)
class Landscape:
    """Every feasible genome of the recording and the fitness the replay gives it, with the target a hit reaches."""

    space: GeneSpace
    genomes: Mapping[str, Genome]     # id -> genome, in the recording's order
    fitness: Mapping[str, float]      # id -> geomean speedup over the baseline
    label: str                        # the recording, as the replay evaluator names it
    device: str
    kernel_name: str
    optimum: float                    # the best fitness in the space
    target: float                     # a hit: fitness >= this
