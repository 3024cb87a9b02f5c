"""``nvrtc-engine demo``: compile, cache and (where a GPU is present) run and check kernels.

The variant list is the GELU kernels at the hidden sizes of one real model config
(Llama-3-8B: hidden 4096, MLP intermediate 14336), bf16 input, bf16 and tensor-scaled
fp8_e4m3 output. Without a GPU the demo compiles and caches for ``--arch`` (default sm_90).
"""

from __future__ import annotations

import statistics
import time
from typing import Any, NamedTuple, TextIO

from ..api import cache_info, get_kernel, make_key
from ..core import driver
from ..core.kernel import runs_on
from ..core.key import DeviceArch, KernelKey
from ..reference import activation, check_close, sample_input

__all__ = ["DemoRow", "demo_keys", "run_demo"]

LLAMA3_8B_HIDDEN_SIZES = (4096, 14336)


class DemoRow(NamedTuple):
    """One line of the demo's table: ``image_bytes`` is the size of the kernel's image, a
    cubin or (for an arch newer than NVRTC knows) PTX, as ``kind`` says."""

    key: KernelKey
    source: str
    ms: float
    image_bytes: int
    check: str = "-"
    gbps: float | None = None
    ok: bool = True
    kind: str = "cubin"


def demo_keys(arch: str) -> list[KernelKey]:
    """The demo's variants: GELU bf16->bf16 and bf16->fp8_e4m3 at Llama-3-8B's sizes."""
    keys = []
    for hidden in LLAMA3_8B_HIDDEN_SIZES:
        for out in ("bf16", "fp8_e4m3"):
            keys.append(make_key("gelu", dtype=out, hidden_size=hidden, arch=arch))
    return keys


def _run_one(row: DemoRow, tokens: int, ordinal: int, seed: int) -> DemoRow:
    """``row`` with its check and bandwidth, from a run of its kernel on the GPU."""
    import numpy as np

    key = row.key
    rng = np.random.default_rng(seed)
    shape = (tokens, key.hidden_size or 4096)
    x_host = sample_input(shape, key.in_dtype, rng)
    x = driver.DeviceBuffer(ordinal, shape, key.in_dtype)
    y = driver.DeviceBuffer(ordinal, shape, key.out_dtype)
    x.copy_from_host(x_host)
    y.fill_bytes(0xFF)  # poison: NaN in every output format
    kernel = get_kernel(key)
    kwargs: dict[str, Any] = {}
    scale_value = 2.0
    buffers = []
    if key.scaling == "tensor":
        scale = driver.DeviceBuffer(ordinal, (1,), "fp32")
        scale.copy_from_host(np.array([scale_value], dtype=np.float32))
        amax = driver.DeviceBuffer(ordinal, (1,), "fp32")
        amax.fill_bytes(0)
        scale_inv = driver.DeviceBuffer(ordinal, (1,), "fp32")
        scale_inv.fill_bytes(0xFF)
        kwargs = {"scale": scale, "amax": amax, "scale_inv": scale_inv}
        buffers = [scale, amax, scale_inv]
    kernel(x, y, **kwargs)
    ref = activation(key.op, x_host, key.out_dtype,
                     scale_value if key.scaling == "tensor" else None)  # fmt: skip
    scaled = ref.y * (scale_value if key.scaling == "tensor" else 1.0)
    problems = []
    try:
        factor = scale_value if key.scaling == "tensor" else 1.0
        _, at_ties = check_close(y.to_host(), scaled, key.out_dtype, ref.tolerance * factor)
    except AssertionError as exc:
        problems.append(str(exc).split(";")[0])
        at_ties = 0
    if key.scaling == "tensor":
        got_amax = float(buffers[1].to_host()[0])
        got_inv = buffers[2].to_host()[0]
        if got_amax != np.float32(ref.amax):
            problems.append(f"amax {got_amax} != {ref.amax}")
        if got_inv != ref.scale_inv:
            problems.append(f"scale_inv {got_inv} != {ref.scale_inv}")
    ok = not problems
    check = "ok" + (f" ({at_ties} at ties)" if at_ties else "") if ok else "; ".join(problems)
    dev = driver.get_device(ordinal)
    times = driver.time_launches(dev, lambda: kernel(x, y, **kwargs), repeat=20)
    nbytes = x.nbytes + y.nbytes
    gbps = nbytes / (statistics.median(times) * 1e-3) / 1e9
    for b in (x, y, *buffers):
        b.free()
    return row._replace(ok=ok, check=check, gbps=gbps)


def run_demo(arch: str | None, tokens: int, run: bool, out: TextIO, seed: int = 0) -> int:
    """Compile (or load) the demo variants, run and check them on a GPU if present.

    Returns the process exit code: 0 when every check passed, 1 otherwise.
    """
    gpu = driver.device_count() > 0
    ordinal = driver.current_device() if gpu else -1
    if arch is None:
        arch = DeviceArch(driver.get_device(ordinal).arch) if gpu else "sm_90"
    keys = demo_keys(arch)  # a bad arch is an error before anything is printed
    print(f"nvrtc_engine demo: GELU variants for Llama-3-8B sizes, arch {keys[0].arch}", file=out)
    if not gpu:
        print("no GPU found: compiling and caching only", file=out)
    rows = []
    for key in keys:
        before = cache_info()
        start = time.perf_counter()
        kernel = get_kernel(key)
        ms = (time.perf_counter() - start) * 1e3
        after = cache_info()
        if after.compiles > before.compiles:
            source = "compiled"
        elif after.disk_hits > before.disk_hits:
            source = "disk hit"
        else:
            source = "memory hit"
        artifact = kernel.artifact
        rows.append(DemoRow(key, source, ms, len(artifact.image), kind=artifact.kind))
    can_run = gpu and run
    if can_run and not runs_on(arch, driver.get_device(ordinal).arch):
        print(f"arch {arch} does not run on this GPU: not running", file=out)
        can_run = False
    if can_run:  # the float64 reference takes seconds per variant: say what is happening
        print(f"running each variant on {tokens} tokens and checking it against the float64 "
              "reference (fewer --tokens: a quicker check)", file=out)  # fmt: skip
        for i, row in enumerate(rows):
            print(f"  {row.key} ...", file=out, flush=True)
            rows[i] = _run_one(row, tokens, ordinal, seed + i)
    from .table import format_table

    header = ["variant", "source", "ms", "kind", "image bytes"]
    if can_run:
        header += ["GB/s", f"check (tokens={tokens})"]
    cells = []
    for r in rows:
        cell = [str(r.key), r.source, f"{r.ms:.1f}", r.kind, str(r.image_bytes)]
        if can_run:
            cell += [f"{r.gbps or 0:.0f}", r.check]
        cells.append(cell)
    for line in format_table(header, cells, right=("ms", "image bytes", "GB/s")):
        print(line, file=out)
    print("ms: get_kernel's wall time (a compile, or a read of the disk cache; the first call "
          "of a process also loads NVRTC and opens the cache)", file=out)  # fmt: skip
    info = cache_info()
    if info.directory:
        print(f"cache: {info.directory} ({info.entries} entries, {info.bytes} bytes on disk with "
              "its SQLite database)", file=out)  # fmt: skip
    else:
        print(f"cache: memory only ({info.memory_entries} kernels held in this process)", file=out)
    return 0 if all(r.ok for r in rows) else 1
