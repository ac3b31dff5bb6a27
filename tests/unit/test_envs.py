"""The cluster's conda envs (envs/*.yaml) against the tested venv (requirements.txt) and the rules.

- every rule's `conda:` names an existing env file;
- every pip pin in an env is `name==version` and equals requirements.txt's pin for that package
  (torch: the Makefile recipe line installing `torch==...`, which installs it before requirements.txt),
  so a cluster env cannot drift from what the tests ran;
- every third-party package a rule's CLI command imports (static import closure of its `ragrl`
  subcommand, lazy imports included) that requirements.txt pins is pinned in that rule's env;
- (needs PyPI) each env's pip part resolves: `pip install --dry-run --ignore-installed --report`,
  nothing installed, and the resolved set holds every package the env's rules import, transitive
  ones (e.g. `datasets`, `safetensors`) included.

envs/verl.yaml is exempt from the equality check: verl pins its own stack (transformers < 5.11,
DESIGN §5) and is tested with verl. One documented difference is allowed (GPU_BUILDS): the cluster
envs install FAISS's GPU build, faiss-gpu, where requirements.txt has faiss-cpu of the same version.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
import urllib.request
from functools import lru_cache
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src"
OWN_PINS = {"envs/verl.yaml"}  # pins its own stack; see the module docstring
# Cluster build -> the tested venv's build of the same package and version: clusters have GPUs
# (retrieval.gpu), this machine has none. Both provide the module `faiss`.
GPU_BUILDS = {"faiss-gpu": "faiss-cpu"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _requirements() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep, f"requirements.txt: {line!r} is not an exact pin"
            pins[_norm(name)] = version.strip()
    # torch is installed first and alone by the Makefile (so nothing pulls a CUDA build on CPU).
    # A recipe line (tab-indented), however pip is spelled there (`pip install`, `$(PIP_INSTALL)`).
    torch = re.search(r"^\t[^\n]*\btorch==([0-9][^\s]*)", (REPO / "Makefile").read_text(), re.M)
    assert torch, "Makefile: no torch==<version> install found"
    pins["torch"] = torch.group(1)
    return pins


def _as_tested(name: str) -> str:
    """The requirements.txt name of an env's package (faiss-gpu -> faiss-cpu)."""
    return GPU_BUILDS.get(_norm(name), _norm(name))


def _env_pip(path: Path) -> list[str]:
    env = yaml.safe_load(path.read_text())
    for dep in env.get("dependencies", []):
        if isinstance(dep, dict) and "pip" in dep:
            return list(dep["pip"])
    return []


def _rules() -> dict[str, dict]:
    """rule name → {env: path relative to the repo, argv: the `python -m ragrl` subcommand words}."""
    rules = {}
    for smk in sorted((REPO / "rules").glob("*.smk")):
        text = smk.read_text()
        for block in re.split(r"(?m)^(?=rule \w+:)", text):
            m = re.match(r"rule (\w+):", block)
            if not m:
                continue
            env = re.search(r'conda:\s*\n\s*"([^"]+)"', block)
            cmd = re.search(r'shell:\s*\n\s*"python -m ragrl ((?:[a-z][a-z0-9-]* ?)+)', block)
            rules[m.group(1)] = {
                "env": str((smk.parent / env.group(1)).resolve().relative_to(REPO)) if env else None,
                "argv": cmd.group(1).split() if cmd else None,
                "file": smk.name,
            }
    return rules


RULES = _rules()


def test_rules_found():
    assert {"corpus", "embed_shard", "index", "sft", "rl", "eval", "results_db"} <= set(RULES)


@pytest.mark.parametrize("rule", sorted(RULES))
def test_rule_env_exists(rule):
    info = RULES[rule]
    assert info["env"], f"rule {rule} ({info['file']}) has no conda: directive"
    assert (REPO / info["env"]).is_file(), f"rule {rule}: conda env {info['env']} does not exist"


ENVS = sorted({info["env"] for info in RULES.values() if info["env"]} | {
    str(p.relative_to(REPO)) for p in (REPO / "envs").glob("*.yaml")})


@pytest.mark.parametrize("env", [e for e in ENVS if e not in OWN_PINS])
def test_env_pins_equal_requirements(env):
    reqs = _requirements()
    problems = []
    for spec in _env_pip(REPO / env):
        name, sep, version = spec.partition("==")
        if not sep:
            problems.append(f"{spec!r} is not an exact pin")
        elif _norm(name) in GPU_BUILDS.values():
            problems.append(f"{name} is the CPU build; cluster envs pin the GPU build "
                            f"({[g for g, c in GPU_BUILDS.items() if c == _norm(name)][0]})")
        elif _as_tested(name) not in reqs:
            problems.append(f"{name} is pinned here but not in requirements.txt")
        elif reqs[_as_tested(name)] != version.strip():
            problems.append(f"{name}=={version} but requirements.txt has {_as_tested(name)}=={reqs[_as_tested(name)]}")
    assert not problems, f"{env}: " + "; ".join(problems)


# ------------------------------------------------------------------ what each rule's command imports


def _module_file(name: str) -> Path | None:
    base = SRC.joinpath(*name.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


def _imports(tree: ast.AST, package: str) -> list[str]:
    """Absolute names imported anywhere in `tree` (function bodies too), except under TYPE_CHECKING."""
    names = []

    def visit(node):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Try) and any(
                h.type is not None and re.search(r"\b(ImportError|ModuleNotFoundError)\b", ast.unparse(h.type))
                for h in node.handlers):
            # an optional dependency (e.g. PyStemmer): the command works without it
            for child in [*node.handlers, *node.orelse, *node.finalbody]:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                mod = f"{base}.{node.module}" if node.module else base
            else:
                mod = node.module
            names.append(mod)
            names.extend(f"{mod}.{alias.name}" for alias in node.names)  # submodules, when they are
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


@lru_cache(maxsize=None)
def _closure_of_module(name: str) -> frozenset[str]:
    return frozenset(_closure([name]))


@lru_cache(maxsize=None)
def _lazy_exports(package: str) -> dict[str, str]:
    """A package's `_EXPORTS = {name: submodule}` (served lazily by its __getattr__), if it has one."""
    path = _module_file(package)
    if path is None or path.name != "__init__.py":
        return {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            return ast.literal_eval(node.value)
    return {}


def _closure(start: list[str]) -> set[str]:
    """Third-party top-level modules reachable from `start` through ragrl's own modules."""
    seen, third, todo = set(), set(), list(start)
    while todo:
        name = todo.pop()
        top = name.split(".")[0]
        if top != "ragrl":
            if top not in sys.stdlib_module_names and top != "__future__":
                third.add(top)
            continue
        parts = name.split(".")
        lazy = _lazy_exports(".".join(parts[:-1])) if len(parts) > 1 and _module_file(name) is None else {}
        if parts[-1] in lazy:  # `from ragrl.pkg import X`, X served by the package's lazy __getattr__
            todo.append(f"{'.'.join(parts[:-1])}.{lazy[parts[-1]]}")
        for i in range(1, len(parts) + 1):  # importing a.b.c runs a/__init__ and a/b/__init__
            mod = ".".join(parts[:i])
            path = _module_file(mod)
            if path is None or mod in seen:
                continue
            seen.add(mod)
            package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
            todo.extend(_imports(ast.parse(path.read_text()), package))
    return third


def _command_function(argv: list[str]):
    sys.path.insert(0, str(SRC))
    from ragrl.cli import build_parser

    parser = build_parser()
    for word in argv:
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parser = sub.choices[word]
    return parser._defaults["func"]


def _command_imports(argv: list[str]) -> set[str]:
    func = _command_function(argv)
    # The CLI package's modules: building the parser imports every one of them (one per group).
    modules = {path.stem: ast.parse(path.read_text()) for path in sorted((SRC / "ragrl/cli").glob("*.py"))
               if path.stem != "__main__"}
    # Helper names are unique across the package (ragrl.cli.common's are imported by name).
    helpers = {n.name: n for tree in modules.values() for n in tree.body if isinstance(n, ast.FunctionDef)}
    # the command's function and the CLI helpers it calls (e.g. load_recipe), transitively
    body, todo, seen = [], [func.__name__], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in helpers:
            continue
        seen.add(name)
        body.append(helpers[name])
        todo.extend(n.id for n in ast.walk(helpers[name]) if isinstance(n, ast.Name))
    tree = ast.Module(body=body, type_ignores=[])
    # ragrl.cli's module-level imports run for every command; of its lazy imports only the
    # command's own function's count (the module is not followed as a whole).
    module_level = ast.Module(body=[n for tree in modules.values() for n in tree.body
                                    if isinstance(n, (ast.Import, ast.ImportFrom))], type_ignores=[])
    # The package's own modules are not followed as a whole either: the helpers above stand for them.
    outside = [m for m in _imports(module_level, "ragrl.cli") if m != "ragrl.cli" and not m.startswith("ragrl.cli.")]
    return _closure(["ragrl", *outside, *_imports(tree, "ragrl.cli")])


@lru_cache(maxsize=None)
def _dist_of() -> dict[str, list[str]]:
    return packages_distributions()


def _distributions(modules: set[str]) -> set[str]:
    dists = set()
    for mod in modules:
        found = _dist_of().get(mod)
        assert found, f"module {mod!r} is imported but no installed distribution provides it"
        dists.update(_norm(d) for d in found)
    return dists


COMMAND_RULES = sorted(r for r, info in RULES.items() if info["argv"])


@pytest.mark.parametrize("rule", COMMAND_RULES)
def test_env_pins_what_the_rule_imports(rule):
    info = RULES[rule]
    imported = _distributions(_command_imports(info["argv"]))
    reqs = _requirements()
    pinned = {_as_tested(s.partition("==")[0]) for s in _env_pip(REPO / info["env"])}
    missing = sorted(d for d in imported if d in reqs and d not in pinned)
    assert not missing, (
        f"rule {rule} (`ragrl {' '.join(info['argv'])}`) imports {missing}, pinned in requirements.txt "
        f"but not in {info['env']}")


def test_import_closure_sees_lazy_imports():
    # The closure must follow imports inside functions: `ragrl sft` imports trl only lazily.
    assert {"trl", "transformers"} <= _command_imports(["sft"])
    assert "faiss" in _command_imports(["index", "build"])


# ------------------------------------------------------------------ resolution against PyPI


@lru_cache(maxsize=None)
def _pypi_reachable() -> bool:
    try:
        with urllib.request.urlopen("https://pypi.org/simple/pip/", timeout=10) as resp:
            return resp.status == 200
    except OSError:
        return False


@lru_cache(maxsize=None)
def _resolve(env: str) -> dict[str, str]:
    pins = _env_pip(REPO / env)
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--quiet", "--ignore-installed",
         "--disable-pip-version-check", "--report", "-", *pins],
        capture_output=True, text=True, timeout=900,
    )
    assert proc.returncode == 0, f"{env}: pip could not resolve its pins:\n{proc.stderr[-3000:]}"
    report = json.loads(proc.stdout)
    return {_norm(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}


@pytest.mark.slow
@pytest.mark.parametrize("env", [e for e in ENVS if e not in OWN_PINS])
def test_env_resolves_on_pypi(env):
    if not _pypi_reachable():
        pytest.skip("PyPI (https://pypi.org) is not reachable from here")
    resolved = _resolve(env)
    for spec in _env_pip(REPO / env):
        name, _, version = spec.partition("==")
        assert resolved.get(_norm(name), "").split("+")[0] == version.split("+")[0], (
            f"{env}: {name} resolved to {resolved.get(_norm(name))}, pinned {version}")
    users = [r for r in COMMAND_RULES if RULES[r]["env"] == env]
    installed = {_as_tested(name) for name in resolved}
    missing = {r: sorted(_distributions(_command_imports(RULES[r]["argv"])) - installed) for r in users}
    missing = {r: m for r, m in missing.items() if m}
    assert not missing, f"{env}: rules import packages the env does not install: {missing}"
