"""Device ordinals and DeviceBuffer's arguments: checked before the driver is asked, so a bad
one is the same typed error with or without a GPU (these tests need none)."""

from __future__ import annotations

import numpy as np
import pytest

import nvrtc_engine as ne
from nvrtc_engine import ArgumentError, ArgumentTypeError, VariantError, VariantTypeError
from nvrtc_engine.core import driver

NOT_ORDINALS = [(-1, ArgumentError), (2**31, ArgumentError), (10**30, ArgumentError),
                (True, ArgumentTypeError), (1.0, ArgumentTypeError), ("0", ArgumentTypeError),
                (None, ArgumentTypeError)]  # fmt: skip


def test_checked_ordinal():
    assert driver.checked_ordinal(0) == 0 and driver.checked_ordinal(2**31 - 1) == 2**31 - 1
    got = driver.checked_ordinal(np.int64(3))
    assert got == 3 and type(got) is int
    for value, error in NOT_ORDINALS:
        with pytest.raises(
            error, match="^device: a CUDA device ordinal is an int from 0 to 2147483647"
        ):
            driver.checked_ordinal(value)


@pytest.mark.parametrize(("value", "error"), NOT_ORDINALS)
def test_get_device_checks_the_ordinal_before_the_driver(value, error, monkeypatch):
    def no_driver():
        raise AssertionError("the driver was asked about a value that is no ordinal")

    monkeypatch.setattr(driver, "_init", no_driver)
    with pytest.raises(error, match="^device: "):
        driver.get_device(value)


def test_get_kernel_refuses_a_device_beyond_any_ordinal_even_with_an_arch():
    for value, _ in NOT_ORDINALS[:3]:
        with pytest.raises(VariantError) as info:
            ne.get_kernel("gelu", dtype="bf16", arch="sm_90", device=value)
        assert info.value.field == "device" and not isinstance(info.value, TypeError)
    with pytest.raises(VariantTypeError):
        ne.get_kernel("gelu", dtype="bf16", arch="sm_90", device=1.0)


def test_loading_on_a_device_that_is_no_ordinal_is_an_argument_error():
    """Kernel.loaded and the norm kernels' host queries that load (launch_grid,
    workspace_elements, residency) name the device argument, not a missing GPU."""
    gelu = ne.get_kernel("gelu", dtype="bf16", arch="sm_90")
    fwd = ne.get_kernel("layernorm_fwd", dtype="bf16", hidden_size=1024, arch="sm_90")
    bwd = ne.get_kernel("layernorm_bwd", dtype="bf16", hidden_size=1024, arch="sm_90")
    calls = [lambda d: gelu.loaded(d), lambda d: fwd.launch_grid(8, device=d),
             lambda d: bwd.workspace_elements(8, device=d), lambda d: fwd.residency(d)]  # fmt: skip
    for call in calls:
        with pytest.raises(ArgumentError, match="^device: a CUDA device ordinal"):
            call(-1)
        with pytest.raises(ArgumentTypeError, match="^device: .* not float"):
            call(0.0)


def test_device_buffer_checks_dtype_and_shape_before_the_device():
    with pytest.raises(ArgumentError, match="^dtype: 'bogus' is not allowed; allowed: bf16"):
        ne.DeviceBuffer(0, (4, 8), "bogus")
    for shape in ([4, 8], (4, 8.0), (True,), ("4",)):
        with pytest.raises(ArgumentTypeError, match="^shape: a tuple of ints >= 0"):
            ne.DeviceBuffer(0, shape, "bf16")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="^device: "):
        ne.DeviceBuffer(-1, (4, 8), "bf16")


@pytest.mark.parametrize(
    ("dtype", "name"),
    [("fp8", "fp8_e4m3"), ("fp4", "fp4_e2m1"), ("BF16", "bf16"), (np.float32, "fp32"),
     (np.dtype("float16"), "fp16")],
)  # fmt: skip
def test_device_buffer_takes_every_dtype_spelling(dtype, name, monkeypatch):
    """Aliases and numpy dtypes, as everywhere else: resolved before the device is asked."""
    seen = []

    def stop(ordinal):
        seen.append(ordinal)
        raise ne.NoDeviceError("no GPU in this test")

    monkeypatch.setattr(driver, "get_device", stop)
    with pytest.raises(ne.NoDeviceError):
        ne.DeviceBuffer(0, (4, 8), dtype)
    assert seen == [0]
    from nvrtc_engine.core.dtypes import dtype_name

    assert dtype_name(dtype) == name


@pytest.mark.parametrize(
    ("dtype", "error", "says"),
    [([], ArgumentTypeError, r"^dtype: \[\] is not allowed \(list is not a dtype"),
     ({}, ArgumentTypeError, r"^dtype: \{\} is not allowed \(dict is not a dtype"),
     (16, ArgumentTypeError, r"^dtype: 16 is not allowed \(a number is not a dtype"),
     (np.float64, ArgumentError, r"^dtype: <class 'numpy.float64'> is not allowed"),
     ("bf61", ArgumentError, r"^dtype: 'bf61' is not allowed \(did you mean bf16\?\)")],
)  # fmt: skip
def test_device_buffer_refuses_a_dtype_by_name(dtype, error, says):
    with pytest.raises(error, match=says) as info:
        ne.DeviceBuffer(0, (4, 8), dtype)
    assert info.value.argument == "dtype" and not isinstance(info.value, VariantError)
    assert isinstance(info.value, TypeError) is (error is ArgumentTypeError)


def test_a_negative_device_buffer_size_is_a_value_error():
    """A negative size is an int out of range: ArgumentError (a ValueError), not a type
    error; a size that is no int stays an ArgumentTypeError."""
    for shape in ((4, -1), (-8,)):
        with pytest.raises(ArgumentError, match=r"^shape: a tuple of ints >= 0, got .*-") as e:
            ne.DeviceBuffer(0, shape, "bf16")
        assert not isinstance(e.value, TypeError)
