"""The package's layout: core <- families <- tools, no import cycle (function-level imports
counted), a family added by one registry entry, and kernel names unchanged by the move."""

from __future__ import annotations

import ast
import gzip
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

import nvrtc_engine as ne
from nvrtc_engine.core import registry
from nvrtc_engine.core.key import LAYOUTS, SCALINGS

ROOT = Path(ne.__file__).resolve().parent
DATA = Path(__file__).resolve().parent / "data"


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _statements(tree: ast.AST):
    """Every import statement that can run: module level and in functions, not in an
    ``if TYPE_CHECKING:`` block (annotations only; never executed)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING":
            node.body = []
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))]


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports, from every ``import``/``from`` statement
    that can run (module level and function level, see :func:`_statements`)."""
    modules = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in _statements(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                           for a in node.names]  # fmt: skip
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "api"


def test_the_import_graph_has_no_cycle():
    graph = import_graph()
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                cycle = [*path[path.index(dep) :], dep]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    assert len(graph) > 40  # (the walk found the package)


def test_dependencies_point_one_way():
    """core imports no family, no tool, not the API or the torch layer; families import no
    tool, no API, no torch layer."""
    below = {"core": {"core"}, "families": {"core", "families"}}
    wrong = [f"{m} -> {d}" for m, deps in import_graph().items() if layer(m) in below
             for d in deps if layer(d) not in below[layer(m)]]  # fmt: skip
    assert not wrong


def test_importing_the_package_imports_no_family_and_no_heavy_dependency():
    code = ("import sys, nvrtc_engine; print(sorted(m for m in sys.modules if "
            "m.startswith(('nvrtc_engine.families.', 'jinja2', 'numpy', 'cuda.bindings', "
            "'nvrtc_engine.tools.bundle', 'nvrtc_engine.tools.variants'))))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_making_a_key_imports_only_its_family():
    code = ("import sys, nvrtc_engine as ne; ne.make_key('gelu', dtype='bf16', arch='sm_90'); "
            "print(sorted(m for m in sys.modules if m.startswith('nvrtc_engine.families.') "
            "and m.count('.') == 2))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert (
        out.stdout.strip() == "['nvrtc_engine.families.activation', 'nvrtc_engine.families.shared']"
    )


def test_the_api_import_loads_every_family_spec_and_no_kernel_class():
    code = ("import sys; from nvrtc_engine import get_kernel; print(sorted(m.split('.')[-1] "
            "for m in sys.modules if m.startswith('nvrtc_engine.families.') and "
            "m.count('.') == 3))")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = out.stdout.strip()
    assert "'spec'" in loaded and "'config'" in loaded and "'kernels'" not in loaded, loaded


def test_every_family_entry_lists_the_ops_its_module_defines():
    for module, ops in registry.FAMILIES.items():
        specs = __import__(module, fromlist=["SPECS"]).SPECS
        assert sorted(s.name for s in specs) == sorted(ops.split()), module


def test_canonical_names_are_those_recorded_before_the_layout_change():
    """Every valid key of a broad product (every op x every dtype pair x scaling x layout x
    hidden size x three archs x flag sets) is named as it was at f5dfc43, and no key became
    valid or invalid; tests/data/canonical_names.txt.gz holds those 7,443 names."""
    want = gzip.decompress((DATA / "canonical_names.txt.gz").read_bytes()).decode().split()
    got = []
    for op in ne.registered_ops():
        flags = sorted(registry.get_spec(op).flags)
        flag_sets = [
            tuple((n, True) for n in c)
            for r in range(len(flags) + 1)
            for c in itertools.combinations(flags, r)
        ]
        for i, o, s, lay, h, a, f in itertools.product(
            sorted(ne.DTYPES), sorted(ne.DTYPES), SCALINGS, LAYOUTS, (None, 4096),
            ("sm_80", "sm_90a", "sm_100a"), flag_sets,
        ):  # fmt: skip
            try:
                key = ne.KernelKey(op=op, in_dtype=i, out_dtype=o, scaling=s, layout=lay,
                                   hidden_size=h, arch=a, flags=f)  # fmt: skip
            except ne.VariantError:
                continue
            got.append(str(key))
    assert got == want
    assert all(str(ne.KernelKey.parse(name)) == name for name in want[::97])


@pytest.fixture
def toy_family(monkeypatch):
    """The toy family of tests/data/toy_family, registered by one entry; the registry's
    tables are restored afterwards."""
    monkeypatch.syspath_prepend(str(DATA))
    for table in ("FAMILIES", "_family_of", "_specs"):
        monkeypatch.setattr(registry, table, dict(getattr(registry, table)))
    registry.register_family("toy_family", "scale_by")  # the one line
    yield
    sys.modules.pop("toy_family", None)


def test_a_family_outside_the_package_renders_and_compiles(toy_family):
    from nvrtc_engine.core.render import render

    key = ne.make_key("scale_by", dtype="bf16", arch="sm_90", factor=4)
    assert str(key) == "scale_by_bf16_bf16_none_rowwise_hany_sm90_f4"
    assert ne.KernelKey.parse(str(key)) == key and key.flag("factor") == 4
    assert str(ne.make_key("scale_by", dtype="fp32", arch="sm_90", factor=1)).endswith("sm90")
    with pytest.raises(ne.VariantError, match="factor"):
        ne.make_key("scale_by", dtype="bf16", arch="sm_90", factor=3)
    with pytest.raises(ne.VariantTypeError, match="not an int"):
        ne.make_key("scale_by", dtype="bf16", arch="sm_90", factor=True)
    assert "* 4.0f" in render(key).source
    kernel = ne.get_kernel(key)
    assert kernel.artifact.kind == "cubin" and kernel.artifact.symbols == (str(key),)
    assert "scale_by" in ne.registered_ops()


def test_a_family_outside_the_package_is_part_of_its_digest(toy_family, tmp_path):
    from nvrtc_engine.core import cache, render

    key = ne.make_key("scale_by", dtype="bf16", arch="sm_90", factor=2)
    digest = cache.digest(key)
    assert render.templates_digest(key.spec.templates) != render.code_fingerprint()
    render.templates_digest.cache_clear()
    try:
        copy = tmp_path / "toy"
        copy.mkdir()
        for f in (DATA / "toy_family").glob("*.*"):
            (copy / f.name).write_bytes(f.read_bytes() + b"\n")
        type(key.spec).templates = str(copy)
        assert cache.digest(key) != digest
    finally:
        type(key.spec).templates = str(DATA / "toy_family")
        render.templates_digest.cache_clear()
    assert cache.digest(key) == digest
