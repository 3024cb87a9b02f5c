"""SASS of an nvrtc_engine kernel, compiled here (no GPU needed), with an opcode histogram.

    python bench/tuning/sass.py OP [field=value ...] [norm_tag=TAG] [edits=NAME[+NAME...] [--diff]]
                         [--all]

e.g. ``python bench/tuning/sass.py gelu dtype=fp8 scaling=mxfp8 layout=rowwise hidden_size=8192``
prints the kernel's registers, shared memory and stack (``cuobjdump -res-usage``) and the
count of each opcode per function of the cubin (arch sm_90 unless ``arch=`` says otherwise);
``--all`` adds the whole disassembly. Fields are get_kernel's. Needs ``cuobjdump``: the one
named by $CUOBJDUMP, else on PATH (a CUDA toolkit), else the one Triton's wheel carries
(``triton/backends/nvidia/bin``). Used to count the instructions per element of a kernel
before spending GPU time (docs/activations.md, "Kernels"). ``norm_tag=`` compiles a norm
kernel with that launch configuration (a ``LaunchConfig`` tag, e.g. ``w4r1v8j8c8hogqiyzt3``)
whatever its key's default, on a memory-only engine (the key does not see the tag).
``edits=`` compiles the kernel from its rendered source with bench/source_ab.py's edits
(``+``-joined; with ``norm_tag=`` the layout as given, as source_ab's ``@TAG``), and
``--diff`` then prints the instructions that differ from the same kernel without them (the
addresses and encodings left out): e.g. ``python bench/tuning/sass.py layernorm_fwd in_dtype=bf16
out_dtype=fp8 hidden_size=4096 norm_tag=w4r1v8j4c1hogqit3 edits=red4 --diff`` (round 25: only
the stages' base offset differs). The edits are listed and explained in bench/source_ab.py.
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


def tagged_norm(op: str, fields: dict[str, object], tag: str) -> object:
    """``op``'s norm kernel for ``fields`` compiled with the layout ``tag``, in memory only.

    The tag goes where a TUNED entry would (unlike common.norm_layout, which forces a layout
    as given), so the module's switches apply to it as they would to a TUNED winner; a tag
    they change is refused, naming the letters dropped."""
    import nvrtc_engine as ne
    import nvrtc_engine.ops.norm as norm
    import nvrtc_engine.ops.norm_layout as norm_layout
    from nvrtc_engine.engine import Engine

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # bench/
    import common

    common.memory_only()  # the key does not see the tag
    try:
        cfg = norm.parse_tag(tag)
    except ValueError as e:
        sys.exit(str(e))
    saved = norm_layout._tuned
    norm_layout._tuned = lambda key: cfg
    norm.launch_config.cache_clear()
    try:
        kernel = Engine().get(ne.make_key(op, **fields))  # type: ignore[arg-type]
    finally:
        norm_layout._tuned = saved
        norm.launch_config.cache_clear()
    if kernel.config != cfg:
        dropped = sorted(set(tag) - set(kernel.config.tag))
        sys.exit(f"{tag} does not apply to this key: it compiles as {kernel.config.tag} (without "
                 f"{', '.join(dropped) or 'some of its letters'}: see LaunchConfig.tag for where "
                 "each switch applies)")  # fmt: skip
    return kernel


def edited_norm(op: str, fields: dict[str, object], tag: object, edits: list[str]) -> object:
    """``op``'s kernel for ``fields`` compiled from its rendered source with source_ab.py's
    ``edits`` (none: the same build without them), with the layout ``tag`` as given where one
    is named; exits with the message where an edit does not apply."""
    import nvrtc_engine as ne

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import source_ab

    try:
        source_ab.check_edits(edits)
        return source_ab.build(ne.make_key(op, **fields), ([f"@{tag}"] if tag else []) + edits)
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
    tag = fields.pop("norm_tag", None)
    edits = [e for e in str(fields.pop("edits", "") or "").split("+") if e]
    if "--diff" in sys.argv and not edits:
        sys.exit("--diff compares against the kernel without its edits: name them with edits=")
    if edits:
        kernel = edited_norm(args[0], fields, tag, edits)
    elif tag is None:
        kernel = ne.get_kernel(args[0], **fields)
    else:
        kernel = tagged_norm(args[0], fields, str(tag))
    sass, res = disassemble(tool, kernel.artifact.image)
    print(kernel.name + (f" with {'+'.join(edits)} (source_ab.py's edits of its source)"
                         if edits else ""))  # fmt: skip
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
        plain = disassemble(tool, edited_norm(args[0], fields, tag, []).artifact.image)[0]
        diff = list(difflib.unified_diff(instructions(plain), instructions(sass), "without edits",
                                         "+".join(edits), n=0, lineterm=""))  # fmt: skip
        gone = sum(1 for line in diff if line.startswith("-") and not line.startswith("---"))
        new = sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))
        print(
            f"== diff against the kernel without {'+'.join(edits)}: "
            + (f"{gone} instructions out, {new} in" if diff else "the same instructions")
        )
        print("\n".join(diff))
    return 0


if __name__ == "__main__":
    sys.exit(main())
