"""The package's layering: imports go one way, and saving knows no network class."""

from __future__ import annotations

import ast
import functools
import json
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from composable_ebm import AttributeClassifier, ClassifierConfig, GaussianEnergy, MLPConfig, MLPEnergy
from composable_ebm.errors import ModelFileError
from composable_ebm.pretrained import Pretrained
from composable_ebm.models import load_model
from composable_ebm.model_types import register

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "composable_ebm"


SAMPLE_IMPORT = ("composable_ebm.energy", "Energy.sample_result", "composable_ebm.pipeline")
"""``Energy.sample`` reaches the pipeline when it is called (DESIGN.md): the one import that closes a cycle."""
LAZY_IMPORTS = {SAMPLE_IMPORT, *(("composable_ebm.pretrained", f"Pretrained.{method}", "composable_ebm.models")
                                 for method in ("save_pretrained", "push_to_hub", "from_pretrained"))}
"""The imports of a higher layer made inside a function when it is called, each documented where it stands:
``Energy.sample``'s, and the `Pretrained` mixin's methods, which every network inherits, reaching the model sources
(so importing a network imports neither the Hub nor the cards). The layers' test leaves them out; the cycle test
counts every import but ``Energy.sample``'s."""


def _lazy_nodes(tree: ast.Module, module: str, lazy: frozenset = frozenset(LAZY_IMPORTS)) -> set[int]:
    """The import statements of ``tree`` that ``lazy`` (default `LAZY_IMPORTS`) allows, by id."""
    allowed = {(qualname, target) for m, qualname, target in lazy if m == module}
    found = set()
    for cls in [n for n in tree.body if isinstance(n, ast.ClassDef)]:
        for fn in [n for n in cls.body if isinstance(n, ast.FunctionDef)]:
            for node in ast.walk(fn):
                if isinstance(node, ast.ImportFrom) and (f"{cls.name}.{fn.name}", node.module) in allowed:
                    found.add(id(node))
    return found


@functools.cache
def import_graph(type_checking: bool = True, lazy: frozenset = frozenset(LAZY_IMPORTS)) -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere (in functions too, and under ``if TYPE_CHECKING:`` unless
    ``type_checking`` is false), but for the documented imports ``lazy`` names."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        skipped = set() if type_checking else {
            id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body for n in ast.walk(stmt)}
        skipped |= _lazy_nodes(tree, name, lazy)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets = set()
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.Import):
                targets |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                targets |= {f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names}
        graph[name] = {t for t in targets if t in modules and t != name}
    return graph


def test_the_only_import_cycle_is_energy_sample_reaching_the_pipeline():
    """No cycle, counting every import, in functions and under ``if TYPE_CHECKING:`` too, but ``Energy.sample``'s
    documented one (`SAMPLE_IMPORT`)."""
    graph = import_graph(lazy=frozenset({SAMPLE_IMPORT}))
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(module: str, path: list[str]) -> None:
        state[module] = 1
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycle = path[path.index(target):] + [target] if target in path else [module, target]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if target not in state:
                visit(target, path + [target])
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])


@pytest.mark.parametrize("lower, higher", [
    ("composable_ebm.energy", "composable_ebm.sampling"),
    ("composable_ebm.energy", "composable_ebm.pipeline"),
    ("composable_ebm.energy", "composable_ebm.data"),
    ("composable_ebm.nets", "composable_ebm.data"),
    ("composable_ebm.sampling", "composable_ebm.pipeline"),
    ("composable_ebm.training", "composable_ebm.pipeline"),
    ("composable_ebm.energy", "composable_ebm.persistence"),
    ("composable_ebm.energy", "composable_ebm.hub"),
    ("composable_ebm.sampling", "composable_ebm.energy"),
    ("composable_ebm.hub", "composable_ebm.energy"),
    ("composable_ebm.persistence", "composable_ebm.nets"),
    ("composable_ebm.persistence", "composable_ebm.evaluation"),
    ("composable_ebm.persistence", "composable_ebm.hub"),
    ("composable_ebm.persistence", "composable_ebm.model_cards"),
    ("composable_ebm.persistence", "composable_ebm.sampling"),
    ("composable_ebm.persistence", "composable_ebm.pipeline"),
    ("composable_ebm.persistence", "composable_ebm.models"),
    ("composable_ebm.nets", "composable_ebm.hub"),
    ("composable_ebm.nets", "composable_ebm.models"),
    ("composable_ebm.hub", "composable_ebm"),  # the version comes from composable_ebm._version
])
def test_a_lower_layer_never_imports_a_higher_one(lower, higher):
    graph = import_graph(type_checking=False)
    reached, todo = set(), [m for m in graph if m == lower or m.startswith(lower + ".")]
    while todo:
        module = todo.pop()
        if module not in reached:
            reached.add(module)
            todo += graph[module]
    offending = sorted(m for m in reached if m == higher or (higher != "composable_ebm" and m.startswith(higher + ".")))
    assert not offending, f"{lower} reaches {offending}"


def test_the_design_page_lists_every_module_in_its_layer_table():
    """docs/design.md's layer table names every module of the package (a folder's modules by file name)."""
    text = (ROOT / "docs" / "design.md").read_text()
    table = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    rows = {line.split("|")[1]: line for line in table.splitlines() if line.startswith("| `")}
    missing = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        folder = f"`{relative.parent}/`" if relative.parent != Path(".") else None
        if folder is None:
            found = any(f"`{relative.name}`" in cell for cell in rows)
        else:
            found = any(folder in cell and (relative.name == "__init__.py" or f"`{relative.name}`" in line)
                        for cell, line in rows.items())
        if not found:
            missing.append(str(relative))
    assert not missing, f"docs/design.md's layer table leaves out {missing}"


def test_the_only_lazy_import_of_a_higher_layer_is_energy_sample_reaching_the_pipeline():
    """energy.py imports the pipeline in exactly one place, `Energy.sample_result`; no module-level hook."""
    tree = ast.parse((PACKAGE / "energy.py").read_text())
    imports = [n for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and "pipeline" in (n.module or "")]
    assert len(imports) == 1 and len(_lazy_nodes(tree, "composable_ebm.energy")) == 1
    assert not re.search(r"^_?[A-Z_]*(SAMPLE|PIPELINE)\w*\s*[:=]", (PACKAGE / "energy.py").read_text(), re.M)


@pytest.mark.subprocess
def test_a_fresh_energy_subclass_samples_in_a_fresh_interpreter():
    """Subclass `Energy` in a new process that imports nothing else of the package and call ``.sample()``: the
    pipeline is reached by the method itself, not by a hook some other import installs."""
    code = ("import torch, sys\n"
            "from composable_ebm.energy import Energy\n"
            "class Bowl(Energy):\n"
            "    def __init__(self):\n"
            "        super().__init__((2,), (-3.0, 3.0))\n"
            "    def energy(self, x, labels):\n"
            "        return 0.5 * (x ** 2).sum(dim=1)\n"
            "assert 'composable_ebm.pipeline' not in sys.modules\n"
            "print(tuple(Bowl().sample(5, steps=3, step_size=0.1, seed=0).shape))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["(5,", "2)"]


@pytest.mark.subprocess
def test_importing_a_network_imports_no_hub_card_sampler_or_pipeline():
    code = ("import json, sys; import composable_ebm.nets.mlp; "
            "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('composable_ebm', 'huggingface_hub'))))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    for absent in ("huggingface_hub", "composable_ebm.hub", "composable_ebm.model_cards", "composable_ebm.models",
                   "composable_ebm.sampling", "composable_ebm.pipeline"):
        assert absent not in loaded, loaded


@pytest.mark.subprocess
def test_a_model_loads_by_its_type_name_without_its_module_imported_first():
    code = ("import sys; from composable_ebm.models import load_model; "
            "assert 'composable_ebm.nets.resnet' not in sys.modules; "
            "m = load_model('shapes-color'); print(type(m).__module__, type(m).__name__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["composable_ebm.nets.resnet", "ResNetEnergy"]


def test_only_registered_classes_save_and_the_classifier_is_one(tmp_path):
    classifier = AttributeClassifier(ClassifierConfig(attributes={"color": ("red", "blue")}, width=8))
    classifier.save_pretrained(tmp_path / "clf")
    again = AttributeClassifier.from_pretrained(tmp_path / "clf")
    x = torch.rand(2, 3, 32, 32)  # its image_size
    assert torch.equal(classifier(x)["color"], again(x)["color"])
    assert (tmp_path / "clf" / "README.md").is_file()
    with pytest.raises(TypeError, match="holds a AttributeClassifier, not a MLPEnergy"):
        MLPEnergy.from_pretrained(tmp_path / "clf")
    model = MLPEnergy(MLPConfig(hidden=8, depth=1))
    composite = model + 2 * model
    assert not hasattr(composite, "save_pretrained") and not hasattr(GaussianEnergy(torch.zeros(2), torch.eye(2)), "save_pretrained")


def test_register_needs_a_config_class_and_refuses_a_taken_name(tmp_path):
    with pytest.raises(TypeError, match="needs a config_class"):
        register("no_config")(type("NoConfig", (Pretrained, nn.Module), {}))
    with pytest.raises(ValueError, match="model_type 'mlp' is taken by MLPEnergy"):
        register("mlp")(type("Other", (Pretrained, nn.Module), {"config_class": MLPConfig}))

    @dataclass(frozen=True)
    class TinyConfig:
        width: int = 3

    @register("test_tiny")
    class Tiny(Pretrained, nn.Module):
        config_class = TinyConfig

        def __init__(self, config: TinyConfig) -> None:
            super().__init__()
            self.config = config
            self.weight = nn.Parameter(torch.arange(float(config.width)))

    Tiny(TinyConfig(width=4)).save_pretrained(tmp_path / "tiny", card="a card")
    loaded = load_model(tmp_path / "tiny")
    assert type(loaded) is Tiny and torch.equal(loaded.weight, torch.arange(4.0))
    config = (tmp_path / "tiny" / "config.json").read_text().replace("test_tiny", "test_unknown")
    (tmp_path / "tiny" / "config.json").write_text(config)
    with pytest.raises(ModelFileError, match=r"unknown model_type 'test_unknown'; known types: \[.*'mlp'.*\]"):
        load_model(tmp_path / "tiny")


def test_a_network_registers_once_and_folders_saved_under_the_old_names_load(tmp_path):
    """One registry: a recipe's [model] type and config.json's model_type are the same name, the recipes build only
    energies, and a config.json written with the names of the two registries before still loads."""
    from composable_ebm.errors import InvalidInputError
    from composable_ebm.model_types import MODEL_TYPES, OLD_NAMES, network_class, network_names

    assert {"resnet", "mlp", "denoising-unet"} <= set(network_names()) and "attribute-classifier" not in network_names()
    assert network_class("mlp") is MLPEnergy and MLPEnergy.model_type == "mlp" and MODEL_TYPES.get("mlp") is MLPEnergy
    with pytest.raises(InvalidInputError, match=r"unknown network type 'attribute-classifier'; valid choices: \["):
        network_class("attribute-classifier")
    MLPEnergy(MLPConfig(name="old", hidden=8, depth=1)).save_pretrained(tmp_path / "old", card="a card")
    path = tmp_path / "old" / "config.json"
    path.write_text(path.read_text().replace('"model_type": "mlp"', '"model_type": "mlp_energy"'))
    assert type(load_model(tmp_path / "old")) is MLPEnergy and OLD_NAMES["mlp_energy"] == "mlp"


GENERAL_MODULES = ["energy.py", "pipeline.py", "registry.py", "configs.py", "sampling", "training", "nets",
                   "evaluation/metrics.py", "evaluation/realism.py"]
ORDINARY_WORDS = {"shapes", "folder"}
"""Dataset names that are also ordinary words (an energy checks input shapes, a model is saved as a folder): for
these, only the capitalised name of the dataset (Shapes) and the dataset module's own names count."""


def dataset_names() -> tuple[re.Pattern, set[str]]:
    """Every registered dataset's words (its name, Shapes capitalised) and the public names its module defines
    (config classes, functions, transforms, constants)."""
    import importlib

    from composable_ebm import data
    from composable_ebm.data import DATASETS

    words, identifiers = {"Shapes"}, set()
    for name in DATASETS.names():
        if name not in ORDINARY_WORDS:
            words.add(name)
        module = importlib.import_module(DATASETS.get(name).__module__)
        tree = ast.parse(Path(module.__file__).read_text())
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        defined |= {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        identifiers |= {n for n in defined if not n.startswith("_") and n.lower() != name  # its classes, constants
                        and (n[0].isupper() or n in data.__all__)}                      # and exported functions
    return re.compile(r"\b(" + "|".join(sorted(words)) + r")\b"), identifiers


@pytest.mark.parametrize("where", GENERAL_MODULES)
def test_the_general_modules_name_no_dataset(where):
    """What one dataset needs lives in that dataset's file: the energy, sampling, training and network code and the
    configs never import the data layer, use a name a dataset's module defines, or name a registered dataset in
    their text (docstrings and comments included)."""
    words, identifiers = dataset_names()
    paths = [PACKAGE / where] if where.endswith(".py") else sorted((PACKAGE / where).rglob("*.py"))
    found = []
    for path in paths:
        text = path.read_text()
        where_ = path.relative_to(ROOT)
        found += [f"{where_}:{i}: {line.strip()[:80]}" for i, line in enumerate(text.splitlines(), start=1)
                  if words.search(line)]
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                modules = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                found += [f"{where_}:{node.lineno}: imports {m}" for m in modules if m.startswith("composable_ebm.data")]
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name in identifiers:
                found.append(f"{where_}:{node.lineno}: uses {name}")
    assert not found, "\n".join(found)


def test_the_dataset_check_knows_every_registered_dataset():
    """The check above covers each dataset: its name (or, for an ordinary word, its module's names) and faces'
    renderer among them."""
    from composable_ebm.data import DATASETS

    words, identifiers = dataset_names()
    for name in DATASETS.names():
        assert words.search(name) or name in ORDINARY_WORDS
    assert {"FacesData", "render_faces", "ShapesData", "ChannelSort", "FolderData", "DigitsData"} <= identifiers
