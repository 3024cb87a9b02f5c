"""Kernel arguments are checked before anything is launched (no GPU needed)."""

from __future__ import annotations

import pytest
from fakes import FakeCaiArray, FakeCupyArray

import nvrtc_engine as ne
from nvrtc_engine import ArgumentError, ArgumentTypeError


@pytest.fixture(scope="module")
def fp8_kernel():
    return ne.get_kernel("gelu", dtype="fp8", hidden_size=64, arch="sm_90")


@pytest.fixture(scope="module")
def bf16_kernel():
    return ne.get_kernel("gelu", dtype="bf16", arch="sm_90")


def scalars():
    return {
        name: FakeCupyArray((1,), "<f4", ptr=0x2000 + 16 * i)
        for i, name in enumerate(("scale", "amax", "scale_inv"))
    }


def test_wrong_input_dtype(fp8_kernel):
    with pytest.raises(ArgumentError, match="x: has dtype <f2.*takes bf16"):
        fp8_kernel(FakeCupyArray((4, 64), "<f2"), FakeCupyArray((4, 64), "|u1"), **scalars())


def test_non_contiguous_input(bf16_kernel):
    with pytest.raises(ArgumentError, match="x: must be C-contiguous"):
        bf16_kernel(FakeCupyArray((4, 64), "<u2", strides=(2, 8)))


def test_hidden_size_must_match(fp8_kernel):
    with pytest.raises(ArgumentError, match="last dimension is 65.*hidden_size=64"):
        fp8_kernel(FakeCupyArray((4, 65), "<u2"), FakeCupyArray((4, 65), "|u1"), **scalars())


def test_zero_dim_input(bf16_kernel):
    with pytest.raises(ArgumentError, match="at least one dimension"):
        bf16_kernel(FakeCupyArray((), "<u2"), FakeCupyArray((), "<u2"))


def test_out_shape_dtype_device(fp8_kernel):
    x = FakeCupyArray((4, 64), "<u2")
    with pytest.raises(ArgumentError, match=r"out: has shape \(4, 32\)"):
        fp8_kernel(x, FakeCupyArray((4, 32), "|u1"), **scalars())
    with pytest.raises(ArgumentError, match="out: has dtype <f2"):
        fp8_kernel(x, FakeCupyArray((4, 64), "<f2"), **scalars())
    with pytest.raises(ArgumentError, match="out: is on device 1"):
        fp8_kernel(x, FakeCupyArray((4, 64), "|u1", device=1), **scalars())


def test_tensor_scaling_needs_scale_and_amax(fp8_kernel):
    x, y = FakeCupyArray((4, 64), "<u2"), FakeCupyArray((4, 64), "|u1")
    s = scalars()
    with pytest.raises(ArgumentError, match="scale: is required"):
        fp8_kernel(x, y, amax=s["amax"])
    with pytest.raises(ArgumentError, match="amax: is required"):
        fp8_kernel(x, y, scale=s["scale"])
    with pytest.raises(ArgumentError, match="scale: must be a float32"):
        fp8_kernel(x, y, scale=FakeCupyArray((1,), "<f2"), amax=s["amax"])
    with pytest.raises(ArgumentError, match="amax: must have at least one element"):
        fp8_kernel(x, y, scale=s["scale"], amax=FakeCupyArray((0,), "<f4"))
    with pytest.raises(ArgumentError, match="scale_inv: is on device 3"):
        fp8_kernel(
            x, y, scale=s["scale"], amax=s["amax"], scale_inv=FakeCupyArray((1,), "<f4", device=3)
        )


def test_unscaled_kernel_rejects_scale(bf16_kernel):
    x = FakeCupyArray((4, 64), "<u2")
    with pytest.raises(ArgumentError, match="no scaling"):
        bf16_kernel(x, FakeCupyArray((4, 64), "<u2"), scale=scalars()["scale"])


def test_out_required_when_input_library_cannot_allocate(bf16_kernel, monkeypatch):
    from nvrtc_engine.core import driver

    monkeypatch.setattr(driver, "pointer_device", lambda ptr: 0)
    with pytest.raises(ArgumentTypeError, match="out: is required"):
        bf16_kernel(FakeCaiArray((4, 64), "<u2"))


def test_not_an_array(bf16_kernel):
    with pytest.raises(ArgumentTypeError, match="x: expected a CUDA array"):
        bf16_kernel("not an array")


def test_a_call_without_a_device_says_running_needs_one(monkeypatch):
    """On a machine without a GPU a kernel call fails at its first driver question (which
    device holds the array) with a NoDeviceError that says a call needs a device and that
    compiling does not."""
    from nvrtc_engine.core import driver
    from nvrtc_engine.core.kernel import _device_of

    def no_driver(ptr):
        raise ne.NoDeviceError("no usable CUDA driver or device")

    monkeypatch.setattr(driver, "pointer_device", no_driver)
    array = type("A", (), {"ptr": 0x7F0000000000})()
    with pytest.raises(ne.NoDeviceError, match="running a kernel needs a CUDA device, and x "):
        _device_of(array, "x")


def test_loading_without_a_device_names_the_kernel(monkeypatch, bf16_kernel):
    """Loading a kernel (a launch, Kernel.loaded, a norm kernel's residency or launch_grid)
    without a driver or device: a NoDeviceError that names the kernel and the device and
    says that compiling needs neither, with the driver's words."""
    from nvrtc_engine.core import driver

    def no_driver(ordinal):
        raise ne.NoDeviceError("no usable CUDA driver or device: libcuda not found.")

    monkeypatch.setattr(driver, "get_device", no_driver)
    symbol = bf16_kernel.artifact.symbols[0]
    with pytest.raises(ne.NoDeviceError) as default:
        bf16_kernel.loaded()  # device 0 by default, as residency's
    with pytest.raises(ne.NoDeviceError) as info:
        bf16_kernel.loaded(0)
    assert (
        str(default.value)
        == str(info.value)
        == (
            f"{symbol} cannot be loaded on device 0: no usable CUDA driver or device: libcuda not "
            "found (loading a kernel, to run it or to ask for its occupancy, needs a CUDA device; "
            "compiling and caching it do not)"
        )
    )


@pytest.mark.parametrize("ordinal", ["x", 1.0, True, None])
def test_a_device_ordinal_that_is_not_an_int(bf16_kernel, ordinal):
    """``Kernel.loaded`` and ``driver.get_device`` name the argument before touching the
    driver (so also without one)."""
    with pytest.raises(ne.ArgumentTypeError, match="a CUDA device ordinal is an int"):
        bf16_kernel.loaded(ordinal)
    with pytest.raises(ne.ArgumentTypeError, match="a CUDA device ordinal is an int"):
        ne.core.driver.get_device(ordinal)


def test_an_address_no_kernel_may_read_is_refused(fp8_kernel, bf16_kernel):
    """An element address not a multiple of the element size (a view into bytes) would stop
    the CUDA context with a misaligned-address error; a null one with elements would fault.
    Both are refused before a launch, for inputs, outputs and the fp32 scaling buffers; an
    FP8 output (1 byte) may start anywhere."""
    base = 0x7F0000000000
    with pytest.raises(ArgumentError, match=r"^x: address 0x7f0000000001 is not a multiple of "
                                            r"its element size \(2 bytes\)"):  # fmt: skip
        bf16_kernel(FakeCupyArray((4, 64), "<u2", ptr=base + 1))
    with pytest.raises(ArgumentError, match="^out: address .* element size"):
        bf16_kernel(FakeCupyArray((4, 64), "<u2"), FakeCupyArray((4, 64), "<u2", ptr=base + 3))
    with pytest.raises(ArgumentError, match="^x: is a null pointer with 256 elements"):
        bf16_kernel(FakeCupyArray((4, 64), "<u2", ptr=0))
    bad_scale = {**scalars(), "amax": FakeCupyArray((1,), "<f4", ptr=0x2002)}
    with pytest.raises(ArgumentError, match=r"^amax: address 0x2002 .*\(4 bytes\)"):
        fp8_kernel(FakeCupyArray((4, 64), "<u2"), FakeCupyArray((4, 64), "|u1"), **bad_scale)
    from nvrtc_engine.core.interop import as_array
    from nvrtc_engine.core.kernel import _check_address

    _check_address(as_array(FakeCupyArray((4, 64), "|u1", ptr=base + 1), "out"), "out", 1)
    _check_address(as_array(FakeCupyArray((0, 64), "<u2", ptr=0), "x"), "x", 2)  # no elements
