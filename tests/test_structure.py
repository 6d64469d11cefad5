"""The package's shape: imports run one way between its subpackages and never in a cycle, functions stay short,
hf_io is about file formats only, and each model family lives in one file. Read from the source (ast), nothing is
run but the model registry test_each_family_lives_in_one_file reads."""
import ast
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "flaxlm"
# Each layer may import the layers before it and its own subpackage, never a later layer nor a sibling of its own
# layer: scripts -> distillation (GKD's sampling: rl's) -> rl (rewards: tasks' metrics) -> objectives/tasks/planning ->
# training -> models/data/tokenization/
# reporting -> small helpers.
LAYERS = [("__init__", "platform", "secrets"), ("errors",), ("files", "config"),
          ("models", "data", "tokenization", "reporting"), ("training", "adaptation"),
          ("objectives", "tasks", "planning"), ("rl",), ("distillation",)]
MAX_FUNCTION_LINES = 80
MAX_HF_IO_LINES = 300


def module_name(path):
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(name):
    """The flaxlm modules `name` imports anywhere in its file (inside functions too: a cycle hidden in a function is
    still a cycle)."""
    out = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("flaxlm"):
            for alias in node.names:  # `from flaxlm.models import hf_io` imports the submodule hf_io
                sub = f"{node.module}.{alias.name}"
                out.add(sub if sub in MODULES else node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("flaxlm"))
    return out - {name}


GRAPH = {name: imports_of(name) for name in MODULES}


def subpackage(name):
    """'models' for flaxlm.models.bert, 'errors' for flaxlm.errors, '__init__' for flaxlm itself."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer(name):
    return next(i for i, names in enumerate(LAYERS) if subpackage(name) in names)


def test_every_module_has_a_layer():
    assert {subpackage(name) for name in MODULES} <= {p for names in LAYERS for p in names}


def test_imports_run_one_way():
    wrong = [f"{a} imports {b}" for a, targets in GRAPH.items() for b in targets
             if subpackage(b) != subpackage(a) and layer(b) >= layer(a)]
    assert not wrong, "imports against the layers " + str(LAYERS) + ":\n" + "\n".join(sorted(wrong))


def test_no_import_cycle():
    cycles, state = [], {}

    def visit(node, path):
        state[node] = "open"
        for nxt in sorted(GRAPH[node]):
            if nxt not in GRAPH:
                continue
            if state.get(nxt) == "open":
                cycles.append(" -> ".join(path[path.index(nxt):] + [nxt]))
            elif nxt not in state:
                visit(nxt, path + [nxt])
        state[node] = "done"

    for name in GRAPH:
        if name not in state:
            visit(name, [name])
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_functions_are_short():
    long = []
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append(f"{name}.{node.name}: {lines} lines")
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines:\n" + "\n".join(long)


def test_hf_io_is_about_files_only():
    """hf_io reads and writes checkpoint files, config.json and the hub; it imports no model family."""
    assert len(MODULES["flaxlm.models.hf_io"].read_text(encoding="utf-8").splitlines()) < MAX_HF_IO_LINES
    assert all(subpackage(m) in ("errors", "files") or m in ("flaxlm.models.hf_io",)
               for m in GRAPH["flaxlm.models.hf_io"]), GRAPH["flaxlm.models.hf_io"]


def test_each_family_lives_in_one_file():
    """A family's Family and presets are defined in one module, its file; its model, name map and normalize
    function in one module too: that file, or the file of the architecture it reuses (xlm_roberta.py's families
    are bert.py's RoBERTa under other model types)."""
    from flaxlm.models.registry import FAMILIES
    models = [m for name, m in sys.modules.items() if name.startswith("flaxlm.models.")]
    for family in FAMILIES.values():
        code = sys.modules[family.model.__module__]
        assert family.tensor_names.__module__ == family.normalize.__module__ == code.__name__, family.model_type
        home = [m for m in models if any(value is family for value in vars(m).values())]
        assert len(home) == 1 and any(value is family.presets for value in vars(home[0]).values()), family.model_type


@pytest.mark.parametrize("script", sorted(p.name for p in ROOT.glob("*.py")))
def test_scripts_import_only_the_package(script):
    """A top-level script imports flaxlm and libraries, never another script's internals (train.py runs the
    scripts' main() by name, which is their public entry point)."""
    tree = ast.parse((ROOT / script).read_text(encoding="utf-8"))
    private = [f"{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
               for a in n.names if a.name.startswith("_") and (n.module or "").startswith("flaxlm")]
    assert not private, f"{script} imports private names: {private}"
