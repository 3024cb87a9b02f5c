"""Device ordinals and DeviceBuffer's arguments: checked before the driver is asked, so a bad
one is the same typed error with or without a GPU (these tests need none)."""

from __future__ import annotations

import numpy as np
import pytest

import nvrtc_engine as ne
from nvrtc_engine import ArgumentError, ArgumentTypeError, VariantError, VariantTypeError, driver

NOT_ORDINALS = [(-1, ArgumentError), (2**31, ArgumentError), (10**30, ArgumentError),
                (True, ArgumentTypeError), (1.0, ArgumentTypeError), ("0", ArgumentTypeError),
                (None, ArgumentTypeError)]  # fmt: skip


def test_checked_ordinal():
    assert driver.checked_ordinal(0) == 0 and driver.checked_ordinal(2**31 - 1) == 2**31 - 1
    got = driver.checked_ordinal(np.int64(3))
    assert got == 3 and type(got) is int
    for value, error in NOT_ORDINALS:
        with pytest.raises(error, match="^device: a CUDA device ordinal is an int >= 0"):
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
    with pytest.raises(ArgumentError, match="^dtype: 'bogus' is no dtype name; one of"):
        ne.DeviceBuffer(0, (4, 8), "bogus")
    for shape in ((4, -1), [4, 8], (4, 8.0), (True,)):
        with pytest.raises(ArgumentTypeError, match="^shape: a tuple of ints >= 0"):
            ne.DeviceBuffer(0, shape, "bf16")  # type: ignore[arg-type]
    with pytest.raises(ArgumentError, match="^device: "):
        ne.DeviceBuffer(-1, (4, 8), "bf16")
