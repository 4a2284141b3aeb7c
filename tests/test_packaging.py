"""Each installation gets what it uses: the extras in pyproject.toml against what each part imports.

The import graph is read from the source (every import, those inside functions too), so a dependency a
part uses but its extra does not declare fails here, not on a host. The proxy is also started for real
with the client's and the simulator's dependencies made unimportable, and answers a request.
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

import dcu_serving
from support import FAST_SIM, REPO, SERVED_MODEL, make_proxy, wait_until

SRC = Path(dcu_serving.__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
BASE = [Requirement(r) for r in PROJECT["dependencies"]]
EXTRAS = {name: [Requirement(r) for r in reqs] for name, reqs in PROJECT["optional-dependencies"].items()}
# What the proxy must run without: the client's and the simulator's own dependencies.
NOT_FOR_THE_PROXY = ("PIL", "pydantic", "requests")


def module_file(name: str) -> Path | None:
    path = SRC.joinpath(*name.split("."))
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def imports_of(name: str) -> set[str]:
    """Absolute names of everything module `name` imports, anywhere in it."""
    file = module_file(name)
    package = name if file.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module != "__future__":
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names if module_file(f"{base}.{alias.name}"))
    return found


def reached_from(package: str) -> tuple[set[str], set[str]]:
    """(dcu_serving modules, top-level third-party modules) that importing every module of `package` loads."""
    todo = [p.relative_to(SRC).with_suffix("").as_posix().replace("/", ".").removesuffix(".__init__")
            for p in (SRC / package.replace(".", "/")).rglob("*.py")]
    own, third_party = set(), set()
    while todo:
        name = todo.pop()
        if name in own:
            continue
        own.add(name)
        parents = [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]
        todo += parents  # importing a.b.c runs a and a.b first
        for imported in imports_of(name):
            top = imported.split(".")[0]
            if top == "dcu_serving":
                while module_file(imported) is None:  # `from dcu_serving.x import NAME`: the module is x
                    imported = imported.rpartition(".")[0]
                todo.append(imported)
            elif top not in sys.stdlib_module_names:
                third_party.add(top)
    return own, third_party


def distributions(modules: set[str]) -> set[str]:
    installed = packages_distributions()
    return {canonicalize_name(dist) for module in modules for dist in installed.get(module) or [module]}


def declared(*extras: str) -> set[str]:
    return {canonicalize_name(r.name) for r in BASE + [r for extra in extras for r in EXTRAS[extra]]}


@pytest.mark.parametrize(("package", "extra", "others"), [
    ("dcu_serving.proxy", "proxy", ("client", "sim")),
    ("dcu_serving.exporter", "proxy", ("client", "sim")),
    ("dcu_serving.client", "client", ("proxy", "sim")),
    ("dcu_serving.sim", "sim", ("proxy", "client")),
    ("dcu_serving.bundle", None, ("proxy", "client", "sim")),
    ("dcu_serving.capacity", "benchmark", ("proxy", "client", "sim")),
])
def test_each_part_imports_only_what_its_extra_declares(package, extra, others):
    own, third_party = reached_from(package)
    assert not {m for m in own for other in others if m.startswith(f"dcu_serving.{other}")}
    needed = distributions(third_party)
    missing = needed - (declared(extra) if extra else declared())
    assert not missing, f"{package} imports {sorted(missing)}, which [{extra or 'base'}] does not declare"


def test_the_proxy_needs_none_of_the_client_or_simulator_dependencies():
    _, third_party = reached_from("dcu_serving.proxy")
    assert not third_party & set(NOT_FOR_THE_PROXY)
    assert not declared("proxy") & distributions(set(NOT_FOR_THE_PROXY))


def test_all_is_every_extra_but_the_load_generator():
    # `benchmark` (aiperf, ~1.2 GB) lives in its own venv (make loadgen), not in the dev venv that `all` builds
    [everything] = EXTRAS["all"]
    assert canonicalize_name(everything.name) == canonicalize_name(PROJECT["name"])
    assert everything.extras == set(EXTRAS) - {"all", "benchmark"}


# The proxy as a host runs it, where the client's and the simulator's dependencies are not installed.
WITHOUT_THEM = f"""
import importlib.abc, runpy, sys

class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {NOT_FOR_THE_PROXY!r} or name.startswith(("dcu_serving.client", "dcu_serving.sim")):
            raise ModuleNotFoundError(f"No module named {{name!r}} (not installed on a proxy host)")

sys.meta_path.insert(0, NotInstalled())
runpy.run_module("dcu_serving.proxy", run_name="__main__")
"""


def test_the_proxy_serves_without_the_client_and_simulator_dependencies(tmp_path, start_sim):
    sim = start_sim(*FAST_SIM)  # the backend, in its own process, has them
    proxy = make_proxy(tmp_path, [sim.url])
    proxy.args = [sys.executable, "-c", WITHOUT_THEM, *proxy.args[3:]]  # instead of -m dcu_serving.proxy
    proxy.env = {"PYTHONPATH": str(SRC)}
    try:
        proxy.start(ready_path="/__lb_status")
        wait_until(lambda: proxy.lb_status()["healthy"] == 1, 15, what="the backend healthy")
        answer = proxy.chat({"model": SERVED_MODEL, "user": "no-client-deps", "max_tokens": 4,
                             "messages": [{"role": "user", "content": "hello"}]})
        assert answer.status_code == 200, answer.text
        assert answer.json()["choices"][0]["message"]["content"]
        assert answer.headers["X-Backend"] == sim.url.removeprefix("http://")
    finally:
        proxy.stop()
    assert "not installed on a proxy host" not in proxy.tail()
