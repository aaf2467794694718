"""core._checks called directly: every kind against every dtype family, and the exact messages.

Written for mutation testing (docs/testing.md): the core functions' tests reach these checks with
one bad input each, which leaves most kind/rank branches and message parts unobserved.
"""
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.core._checks import check_array, check_same_shape

DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16, "i32": jnp.int32, "u8": jnp.uint8,
          "bool": jnp.bool_}
# kind -> the dtype families it accepts (the others must raise).
ACCEPTS = {
    "float": {"f32", "bf16"},
    "bool": {"bool"},
    "int": {"i32", "u8"},
    "bool_or_int": {"i32", "u8", "bool"},
    "number": {"f32", "bf16", "i32", "u8", "bool"},
}


@pytest.mark.parametrize("kind", sorted(ACCEPTS))
@pytest.mark.parametrize("dname", sorted(DTYPES))
def test_kind_table(kind, dname):
  x = jnp.zeros((2,), DTYPES[dname])
  if dname in ACCEPTS[kind]:
    assert check_array(x, "x", kind=kind) is x
  else:
    want = f"^x: expected a {kind.replace('_', ' ')} dtype, got {np.dtype(DTYPES[dname])}$"
    with pytest.raises(ValueError, match=want):
      check_array(x, "x", kind=kind)


def test_strings_are_not_numbers():
  with pytest.raises(ValueError, match="^s: expected a number dtype, got <U1$"):
    check_array(np.array(["a"]), "s", kind="number")


def test_rank_single_and_alternatives():
  x = jnp.zeros((3,))
  assert check_array(x, "x", ndim=1) is x
  assert check_array(x, "x", ndim=(1, 2)) is x
  assert check_array(x, "x") is x
  with pytest.raises(ValueError, match=r"^x: expected rank 2, got shape \(3,\)$"):
    check_array(x, "x", ndim=2)
  with pytest.raises(ValueError, match=r"^y: expected rank 1 or 2, got shape \(1, 1, 1\)$"):
    check_array(jnp.zeros((1, 1, 1)), "y", ndim=(1, 2))


def test_not_an_array():
  with pytest.raises(ValueError, match="^x: expected an array, got list$"):
    check_array([1.0, 2.0], "x")
  with pytest.raises(ValueError, match="^x: expected an array, got float$"):
    check_array(1.0, "x", kind="float")


def test_same_shape_message():
  check_same_shape(jnp.zeros((2, 3)), jnp.ones((2, 3)), "a", "b")
  with pytest.raises(ValueError, match=r"^b: shape \(3, 2\) does not match a \(2, 3\)$"):
    check_same_shape(jnp.zeros((2, 3)), jnp.zeros((3, 2)), "a", "b")
