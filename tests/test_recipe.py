"""The general launch recipe (kernels/recipe.py): 1-, 2- and 3-D grids and blocks, dynamic shared memory, several
outputs, sizes and strides of the tensors, 64-bit arguments exact past 2^31 (and an i32 that does not fit refused),
the argument slots the op packs, what check() finds wrong in a recipe's form, and Launch steps from a recipe."""
from __future__ import annotations

import random
import struct

import numpy as np
import pytest
import torch

from kernel_factory.evo.protocols import launch_from_recipe
from kernel_factory.evo.types import Case
from kernel_factory.kernels import recipe


def three_d() -> dict:
    return {"let": [["tiles", ["cdiv", "N", 64]]],
            "buffers": {"partial": {"dtype": "float32", "shape": [["size", "x", 0], "tiles"]}},
            "steps": [{"kernel": "main", "grid": {"x": "tiles", "y": ["size", "x", -2], "z": ["size", "x", 0]},
                       "block": {"x": 64, "y": 4}, "cluster": {"x": 2}, "smem": ["mul", 64, 4, 4],
                       "args": [["ptr", "x"], ["ptr", "y"], ["ptr", "partial"], ["i64", ["numel", "x"]],
                                ["i64", ["stride", "x", 0]], ["u32", "N"], ["f64", "eps"]]},
                      {"kernel": "finish", "grid": ["size", "x", 0], "block": 32, "when": ["gt", "tiles", 1],
                       "args": [["ptr", "partial"], ["ptr", "z"], ["i32", "tiles"]]}],
            "op": {"inputs": ["x"], "outputs": {"y": {"like": "x"}, "z": {"dtype": "float32", "shape": ["M"]}},
                   "returns": ["y", "z"],
                   "scalars": {"eps": 1e-5}}}


def test_a_3d_plan_with_buffers_and_several_outputs():
    b, h, n = random.randint(2, 5), random.randint(2, 9), random.randint(65, 4000)
    layout = {"x": ((b, h, n), (h * n, n, 1))}
    plan = recipe.evaluate(three_d(), b * h, n, None, {"x": 256}, layout)
    main, finish = plan.steps
    tiles = -(-n // 64)
    assert (main.grid3, main.block3, main.cluster3, main.smem) == ((tiles, h, b), (64, 4, 1), (2, 1, 1), 1024)
    assert main.args == (("ptr", "x"), ("ptr", "y"), ("ptr", "partial"), ("i64", b * h * n), ("i64", h * n),
                         ("u32", n), ("f64", 1e-5))
    assert finish.grid3 == (b, 1, 1) and finish.args[-1] == ("i32", tiles)
    assert plan.buffers == {"partial": ("float32", (b, tiles))}
    assert recipe.check(three_d()) == []
    assert recipe.queried(three_d()) == {"align": set(), "layout": {"x"}}
    one = recipe.evaluate(three_d(), b, 64, 0.5, None, {"x": ((b, 1, 64), (64, 64, 1))})   # a single tile
    assert [s.kernel for s in one.steps] == ["main"] and one.buffers == {"partial": ("float32", (b, 1))}
    assert one.steps[0].args[-1] == ("f64", 0.5)


def test_sizes_past_2_31_are_exact_and_an_i32_that_does_not_fit_is_refused():
    m, n = 3 * 2**30 + 7, 4096 + 3
    spec = {"steps": [{"kernel": "k", "grid": {"x": ["min", ["cdiv", "N", 256], 2**31 - 1], "y": ["min", "M", 65535]},
                       "block": 256, "args": [["i64", ["mul", "M", "N"]], ["u64", ["mul", "M", "N", 2]]]}]}
    (step,) = recipe.evaluate(spec, m, n).steps
    assert step.args == (("i64", m * n), ("u64", 2 * m * n)) and m * n > 2**40
    assert recipe.pack("i64", m * n) == m * n and recipe.pack("i32", -1) == 0xFFFFFFFF
    narrow = {"steps": [{**spec["steps"][0], "args": [["i32", ["mul", "M", "N"]]]}]}
    with pytest.raises(recipe.RecipeError, match=r"does not fit an i32 argument \(pass sizes past 2\^31 as i64\)"):
        recipe.evaluate(narrow, m, n)


def test_scalar_slots_hold_each_kinds_bits():
    v = random.uniform(-1e3, 1e3)
    assert recipe.pack("f32", v) == struct.unpack("<I", struct.pack("<f", v))[0]
    assert recipe.pack("f64", v) == struct.unpack("<Q", struct.pack("<d", v))[0]
    assert recipe.pack("u32", 2**32 - 1) == 2**32 - 1 and recipe.pack("i64", -2) == 2**64 - 2


@pytest.mark.parametrize("spec, says", [
    ({"steps": []}, "a non-empty list of steps"),
    ({"steps": [{"grid": 1, "block": 1, "args": [["i16", 3]]}]}, "is not [KIND, value] with KIND one of ptr, i32"),
    ({"steps": [{"grid": {"w": 1}, "block": 1, "args": []}]}, "step 0 grid: unknown dimension 'w'"),
    ({"steps": [{"grid": ["pow", 2, 3], "block": 1, "args": []}]}, "step 0 grid: unknown recipe operation 'pow'"),
    ({"steps": [{"block": 1, "args": []}]}, "step 0: needs a grid and a block"),
    ({"steps": [{"grid": 1, "block": 1, "args": [], "shared": 4}]}, "step 0: unknown key 'shared'"),
    ({"steps": [{"grid": 1, "block": 1, "args": [["ptr", "x"]]}], "op": {"inputs": ["y"], "outputs": {"z": {}}}},
     "op: output 'z' needs {'like': INPUT} or a dtype and a shape"),
])
def test_check_names_what_is_wrong_with_a_recipe(spec, says):
    assert says in recipe.check(spec)[0]


def test_launch_steps_of_a_2d_recipe_carry_every_dimension_and_typed_scalars():
    m, n = random.randint(70000, 90000), random.randint(3, 50)
    spec = {"steps": [{"kernel": "k", "grid": {"x": ["cdiv", "N", 32], "y": ["min", "M", 65535]},
                       "block": {"x": 32, "y": 4}, "args": [["ptr", "a"], ["ptr", "out"], ["i64", "M"], ["f32", "eps"],
                                                           ["u32", ["stride", "a", 0]]]}]}
    a, out = torch.randn(m, n), torch.empty(m, n)
    (step,) = launch_from_recipe(spec, Case((m, n), "float32"), {"a": a, "out": out}, eps=0.25)
    assert step.grid == (-(-n // 32), 65535, 1) and step.block == (32, 4, 1) and step.cluster is None
    assert step.args[0] is a and step.args[1] is out
    assert [type(x) for x in step.args[2:]] == [np.int64, np.float32, np.uint32]
    assert step.args[2:] == (m, 0.25, n)
