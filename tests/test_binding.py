"""InputBinder: a call sees exactly the arrays (or lists) bound for it, whether their buffers are reused, replaced or
bound in place, and the caller may change its arrays once they are bound."""

from __future__ import annotations

import numpy as np
import openvino as ov
import openvino.opset16 as ops
import pytest

from ovbuild.ir import core
from ovbuild.runtime.model.binding import REUSE_BYTES, InputBinder


def doubling_model() -> ov.CompiledModel:
    """y = 2 * float(x) for an i32 vector x of any length, and s = scale (an f32 scalar input) + 0."""
    x = ops.parameter([-1], ov.Type.i32, name="x")
    scale = ops.parameter([], ov.Type.f32, name="scale")
    y = ops.multiply(ops.convert(x, ov.Type.f32), ops.constant(np.float32(2)))
    s = ops.add(scale, ops.constant(np.float32(0)))
    return core().compile_model(ov.Model([ops.result(y), ops.result(s)], [x, scale], "doubling"), "CPU")


def call(binder: InputBinder, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    binder.bind(feeds)
    binder.request.start_async()
    binder.request.wait()
    return [binder.request.get_output_tensor(i).data.copy() for i in range(2)]


def test_every_call_sees_its_own_values_through_reused_and_replaced_buffers():
    compiled = doubling_model()
    binder = InputBinder(compiled.create_infer_request(), compiled.inputs)
    rng = np.random.default_rng(0)
    shapes = [(3,), (3,), (5,), (5,), (1,), (3,), (0,)]  # same shape twice: the buffer is reused
    for shape in shapes:
        x = rng.integers(-1000, 1000, shape)  # i64: converted to the input's i32
        scale = np.float32(rng.standard_normal())
        y, s = call(binder, {"x": x, "scale": np.array(scale)})
        np.testing.assert_array_equal(y, 2 * x.astype(np.float32))
        assert s == scale


def test_arrays_may_change_after_binding_small_ones_are_copied():
    compiled = doubling_model()
    binder = InputBinder(compiled.create_infer_request(), compiled.inputs)
    x = np.arange(4, dtype=np.int32)
    binder.bind({"x": x, "scale": np.array(1, np.float32)})
    x[:] = 100  # the caller reuses its array before the call runs
    binder.request.infer()
    np.testing.assert_array_equal(binder.request.get_output_tensor(0).data, [0, 2, 4, 6])


def test_a_large_array_is_bound_over_its_own_memory():
    compiled = doubling_model()
    binder = InputBinder(compiled.create_infer_request(), compiled.inputs)
    x = np.arange(REUSE_BYTES // 4 + 1, dtype=np.int32)  # one element over the reuse size
    y, _ = call(binder, {"x": x, "scale": np.array(1, np.float32)})
    np.testing.assert_array_equal(y, 2 * x)
    tensor = binder.request.get_input_tensor(0)
    assert np.shares_memory(tensor.data, x)  # no copy was made
    small = np.arange(3, dtype=np.int32)  # back to a small array of a new shape: a buffer of the binder's own
    y, _ = call(binder, {"x": small, "scale": np.array(1, np.float32)})
    np.testing.assert_array_equal(y, [0, 2, 4])
    assert not np.shares_memory(binder.request.get_input_tensor(0).data, small)


def test_an_unknown_input_name_is_named_in_the_error():
    compiled = doubling_model()
    binder = InputBinder(compiled.create_infer_request(), compiled.inputs)
    with pytest.raises(RuntimeError, match="no_such_input"):
        binder.bind({"no_such_input": np.zeros(2, np.int32)})


def test_lists_and_numbers_equal_changed_or_reshaped_and_arrays_in_between():
    """Plain lists and numbers are written into the held buffers, and skipped when equal to the previous call's: every
    call still sees its own values, also when an array of the same values' shape was bound in between."""
    compiled = doubling_model()
    binder = InputBinder(compiled.create_infer_request(), compiled.inputs)
    feeds = [
        ([1, 2, 3], 1.5),
        ([1, 2, 3], 1.5),  # equal: nothing is written
        ([4, 5, 6], 2),  # same shape, new values
        (np.array([7, 8, 9]), np.array(0.5, np.float32)),  # arrays of the same shape overwrite the held buffers
        ([4, 5, 6], 2),  # equal to the last plain values, but the buffers hold the arrays' values now
        ([1], 3.0),  # a new shape
        ([], 3.0),
        ([1, 2], 2),
    ]
    for x, scale in feeds:
        y, s = call(binder, {"x": x, "scale": scale})
        np.testing.assert_array_equal(y, 2 * np.asarray(x, np.float32))
        assert s == np.float32(scale)


def test_a_list_may_change_after_binding():
    compiled = doubling_model()
    binder = InputBinder(compiled.create_infer_request(), compiled.inputs)
    x = [1, 2, 3]
    call(binder, {"x": x, "scale": 1.0})
    x[0] = 100  # the caller reuses its list: the next bind of it must not look unchanged
    y, _ = call(binder, {"x": x, "scale": 1.0})
    np.testing.assert_array_equal(y, [200, 4, 6])


def test_a_large_list_outlives_bind():
    """A list longer than the reuse size (a call's block table past 16,384 indices) becomes an array bound in place:
    the binder keeps it until the input is bound again, or the call reads freed memory (it crashed the process)."""
    compiled = doubling_model()
    binder = InputBinder(compiled.create_infer_request(), compiled.inputs)
    values = list(range(REUSE_BYTES // 4 + 1000))
    binder.bind({"x": values, "scale": 1.0})
    np.zeros(len(values) * 4, np.int64).fill(-1)  # memory a freed array would have given back is written over
    binder.request.infer()
    np.testing.assert_array_equal(binder.request.get_output_tensor(0).data, 2 * np.array(values, np.float32))
