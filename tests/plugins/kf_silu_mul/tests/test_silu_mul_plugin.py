"""silu_mul against every rule of the factory's plugin contract, on the CPU (what `kernel-factory check silu_mul`
runs): inputs, every dtype's reference, launch plans, baselines and compiles of a few genomes."""
from kernel_factory.evo.tools.check import check


def test_the_plugin_passes_the_factory_check():
    lines = check("silu_mul", sample=2, shapes=2)
    assert lines[0].startswith("contract: silu_mul") and any(line.startswith("compiled 2/2") for line in lines)
