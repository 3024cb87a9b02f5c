"""SASS of an nvrtc_engine kernel, compiled here (no GPU needed), with an opcode histogram.

    python bench/tuning/sass.py OP [field=value ...] [variant=CHANGE[+CHANGE...] [--diff]]
                         [--all]

e.g. ``python bench/tuning/sass.py gelu dtype=fp8 scaling=mxfp8 layout=rowwise hidden_size=8192``
prints the kernel's registers, shared memory and stack (``cuobjdump -res-usage``) and the
count of each opcode per function of the cubin (arch sm_90 unless ``arch=`` says otherwise);
``--all`` adds the whole disassembly. Fields are get_kernel's. Needs ``cuobjdump``: the one
named by $CUOBJDUMP, else on PATH (a CUDA toolkit), else the one Triton's wheel carries
(``triton/backends/nvidia/bin``). Used to count the instructions per element of a kernel
before spending GPU time (docs/activations.md, "How a launch is chosen"). ``variant=``
compiles a norm forward under bench/tuning/source_ab.py's changes (another configuration
field, the rules' configuration, the trigger added or taken out) on a memory-only engine,
and ``--diff`` then prints the instructions that differ from the kernel as chosen (the
addresses and encodings left out): e.g. ``python bench/tuning/sass.py layernorm_fwd
in_dtype=bf16 out_dtype=fp8 hidden_size=4096 variant=staging.align=16 --diff``.
"""

from __future__ import annotations

import collections
import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path


def cuobjdump() -> str:
    """Path of a cuobjdump, or exit with a message."""
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if not found:
        try:
            import triton

            candidate = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
            found = str(candidate) if candidate.exists() else None
        except ImportError:
            found = None
    if not found:
        sys.exit("no cuobjdump: set CUOBJDUMP, install a CUDA toolkit, or pip install triton")
    return found


def parse_fields(args: list[str]) -> dict[str, object]:
    fields: dict[str, object] = {}
    for a in args:
        name, _, value = a.partition("=")
        fields[name] = int(value) if value.isdigit() else (None if value == "None" else value)
    fields.setdefault("arch", "sm_90")
    return fields


def built(op: str, fields: dict[str, object], variant: str) -> object:
    """``op``'s kernel for ``fields`` under source_ab.py's ``variant`` (``base``: the kernel
    as chosen, built the same way); exits with the message where it does not apply."""
    import nvrtc_engine as ne

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import source_ab

    try:
        return source_ab.build(ne.make_key(op, **fields), source_ab.parse_variant(variant))
    except ValueError as e:
        sys.exit(str(e))


def disassemble(tool: str, image: bytes) -> tuple[str, str]:
    """``(cuobjdump -sass, cuobjdump -res-usage)`` of a cubin."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(image)
        f.flush()
        return tuple(
            subprocess.run([tool, flag, f.name], capture_output=True, text=True, check=True).stdout
            for flag in ("-sass", "-res-usage")
        )  # type: ignore[return-value]


def instructions(sass: str) -> list[str]:
    """The instruction lines of a disassembly without their addresses and encodings."""
    return [re.sub(r"\s*/\*\s*[0-9a-fx]+\s*\*/\s*", " ", line).strip()
            for line in sass.splitlines() if re.match(r"\s+/\*[0-9a-f]{4,}\*/", line)]  # fmt: skip


def main() -> int:
    flags = [a for a in sys.argv[1:] if a.startswith("-")]
    unknown = sorted(set(flags) - {"--all", "--diff"})
    if unknown:
        sys.exit(f"unknown option(s) {unknown}: --all and --diff are the options\n\n{__doc__}")
    args = [a for a in sys.argv[1:] if not a.startswith("-")]
    if not args:
        sys.exit(__doc__)
    import nvrtc_engine as ne

    tool = cuobjdump()
    fields = parse_fields(args[1:])
    variant = str(fields.pop("variant", "") or "")
    if "--diff" in sys.argv and not variant:
        sys.exit("--diff compares against the kernel as chosen: name the changes with variant=")
    kernel = built(args[0], fields, variant) if variant else ne.get_kernel(args[0], **fields)
    sass, res = disassemble(tool, kernel.artifact.image)
    print(kernel.name + (f" with {variant} (source_ab.py's changes)" if variant else ""))
    print(res.strip())
    func = None
    counts: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in sass.splitlines():
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            func = m.group(1)
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m and func:
            counts[func][m.group(2).split(".")[0]] += 1
    for func, c in counts.items():
        print(f"== {func}: {sum(c.values())} instructions")
        print("  " + ", ".join(f"{op} {n}" for op, n in c.most_common()))
    if "--all" in sys.argv:
        print(sass)
    if "--diff" in sys.argv:
        plain = disassemble(tool, built(args[0], fields, "base").artifact.image)[0]
        diff = list(difflib.unified_diff(instructions(plain), instructions(sass), "as chosen",
                                         variant, n=0, lineterm=""))  # fmt: skip
        gone = sum(1 for line in diff if line.startswith("-") and not line.startswith("---"))
        new = sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))
        print(
            "== diff against the kernel as chosen: "
            + (f"{gone} instructions out, {new} in" if diff else "the same instructions")
        )
        print("\n".join(diff))
    return 0


if __name__ == "__main__":
    sys.exit(main())
