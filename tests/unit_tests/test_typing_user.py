"""What a type checker sees of the adapters: every documented option is a typed keyword and a typed attribute.

The llama-server options are declared once, in ``runtime/server_options.OPTIONS``; ``scripts/gen_options.py``
writes them out as the fields of ``gguf_provider/_server_fields.py`` (a type checker does not run
``pydantic.create_model``). Checked here (test_declared_once.py: the written modules are what the script writes now): every adapter's fields
agree with the table and with the option groups, and a user file that sets every documented option of every adapter
(the list is docs/reference.md's, derived from the declarations: a new option is covered by itself) is clean under
pyright (basedpyright, standard mode) and mypy (no configuration: pydantic's ``dataclass_transform``), while a
misspelled keyword is an error in both. Offline: both checkers run on this machine (basedpyright brings its node).
"""

from __future__ import annotations

import ast
import inspect
import json
import re
import subprocess
import sys
import types
import typing
import warnings
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, SecretStr

from gguf_provider import ChatGGUF, GGUFEmbeddings, GGUFRerank, options
from gguf_provider.llama_index import GGUF, GGUFEmbedding, GGUFRerankPostprocessor
from gguf_provider.runtime._serve import server_options
from scripts import gen_reference

ROOT = Path(__file__).resolve().parents[2]
ADAPTERS: list[type[BaseModel]] = [ChatGGUF, GGUF, GGUFEmbeddings, GGUFEmbedding, GGUFRerank, GGUFRerankPostprocessor]
# A value of an option's type that its check (`normalize`) also takes, where the type's first value is not one.
VALUES = {"kv_cache_type": '"q8_0"', "rpc_servers": '["127.0.0.1:50052"]'}
TYPO = "n_ctxx"


def _server_groups(cls: type[BaseModel]) -> set[server_options.Group]:
    """The option groups of the table an adapter has: every adapter the server's, chat and embedding adapters
    their own."""
    groups: set[server_options.Group] = {"server"}
    if issubclass(cls, options.ChatOptions):
        groups.add("chat")
    if issubclass(cls, options.EmbeddingOptions):
        groups.add("embedding")
    return groups


@pytest.mark.parametrize("cls", ADAPTERS, ids=lambda c: c.__name__)
def test_the_adapters_server_fields_are_the_tables(cls: type[BaseModel]) -> None:
    groups = _server_groups(cls)
    for o in server_options.OPTIONS:
        if o.group not in groups:
            assert o.name not in cls.model_fields, f"{cls.__name__}.{o.name}: the table gives it to {o.group}"
            continue
        f = cls.model_fields.get(o.name)
        assert f is not None, f"{cls.__name__} lacks {o.name} (run python scripts/gen_options.py)"
        assert f.annotation == o.type, f"{cls.__name__}.{o.name}: {f.annotation} is not the table's {o.type}"
        if o.factory is not None:
            assert f.default_factory is o.factory, f"{cls.__name__}.{o.name}: not the table's default factory"
        else:
            assert f.default_factory is None and f.default == o.default and type(f.default) is type(o.default), \
                f"{cls.__name__}.{o.name}: default {f.default!r} is not the table's {o.default!r}"
        assert f.description == o.description, f"{cls.__name__}.{o.name}: not the table's description"


def _groups(cls: type[BaseModel]) -> list[type[BaseModel]]:
    return [group for group, _ in gen_reference.GROUPS if issubclass(cls, group)]


@pytest.mark.parametrize("cls", ADAPTERS, ids=lambda c: c.__name__)
def test_the_adapters_fields_are_their_option_groups(cls: type[BaseModel]) -> None:
    """No adapter (nor a framework base) declares one of its option groups' fields again, otherwise."""
    for group in _groups(cls):
        for name, declared in group.model_fields.items():
            f = cls.model_fields[name]
            got = (f.annotation, f.default, f.default_factory, f.description, options.aliases(f), f.metadata)
            want = (declared.annotation, declared.default, declared.default_factory, declared.description,
                    options.aliases(declared), declared.metadata)
            assert got == want, f"{cls.__name__}.{name} is not {group.__name__}'s"


# --- the user's view -----------------------------------------------------------------------------------------------


def documented(cls: type[BaseModel]) -> list[str]:
    """The parameters docs/reference.md lists for ``cls``: its option groups' and its own."""
    names = [n for group in _groups(cls) for n in gen_reference.own_fields(group)]
    return names + [n for n in gen_reference.own_fields(cls) if n not in names]


def _arms(tp: Any) -> tuple[Any, ...]:
    return typing.get_args(tp) if typing.get_origin(tp) in (typing.Union, types.UnionType) else (tp,)


def type_source(tp: Any) -> str:
    """An annotation as the user writes it (for ``assert_type``)."""
    if tp is None or tp is type(None):
        return "None"
    if tp is Any:
        return "Any"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(type_source(a) for a in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(a) for a in args)}]"
    if origin is not None:
        return f"{origin.__name__}[{', '.join(type_source(a) for a in args)}]"
    if tp is SecretStr or (isinstance(tp, type) and tp.__module__ == "builtins"):
        return tp.__name__
    raise AssertionError(f"no source for {tp!r}: teach type_source (and value_source) the new type")


def value_source(name: str, tp: Any) -> str:
    """A valid value of an option, as source: of its type's first arm other than None."""
    if name in VALUES:
        return VALUES[name]
    arm = next((a for a in _arms(tp) if a is not type(None)), None)
    origin = typing.get_origin(arm)
    if arm is None or arm is Any:
        return "None"
    if origin is typing.Literal:
        return repr(typing.get_args(arm)[0])
    if origin is list or arm is list:
        return '["x"]'
    if origin is dict or arm is dict:
        return "{}"
    sources = {bool: "True", int: "1", float: "1.5", str: '"x"', SecretStr: 'SecretStr("x")'}
    if arm in sources:
        return sources[arm]
    raise AssertionError(f"{name}: no value for {tp!r}: teach value_source the new type")


def _header() -> list[str]:
    return ["from typing import Any, Literal", "", "from pydantic import SecretStr", "from typing_extensions import assert_type",
            "", "from gguf_provider import ChatGGUF, GGUFEmbeddings, GGUFRerank",
            "from gguf_provider.llama_index import GGUF, GGUFEmbedding, GGUFRerankPostprocessor", ""]


def user_file() -> str:
    """Every adapter, made with every documented option set; every option read back with its declared type; then
    made again with the options' other names (aliases) alone."""
    lines = _header()
    for cls in ADAPTERS:
        var = cls.__name__.lower()
        names = documented(cls)
        lines.append(f"{var} = {cls.__name__}(")
        lines += [f"    {n}={value_source(n, cls.model_fields[n].annotation)}," for n in names]
        lines.append(")")
        lines += [f"assert_type({var}.{n}, {type_source(cls.model_fields[n].annotation)})" for n in names]
        aliases = {a: n for n in names for a in options.aliases(cls.model_fields[n])}
        if aliases:
            given = ", ".join(f"{a}={value_source(n, cls.model_fields[n].annotation)}" for a, n in aliases.items())
            lines.append(f"{var}_aliases = {cls.__name__}({given})")
        lines.append("")
    return "\n".join(lines)


def typo_file() -> str:
    """Each adapter with one misspelled keyword, one a line (1-based line numbers in ``TYPO_LINES``)."""
    return "\n".join(_header() + [f'{c.__name__.lower()} = {c.__name__}(model="x", {TYPO}=4096)' for c in ADAPTERS])


def _typo_lines() -> set[int]:
    return set(range(len(_header()) + 1, len(_header()) + 1 + len(ADAPTERS)))


def test_the_user_files_run() -> None:
    """The values are valid and every name is known at run time too (no UnknownOptionWarning); the typo is
    forwarded to llama-server with a warning, as before (static checkers flag it, the run does not fail)."""
    good = user_file()
    assert "n_ctx=1" in good and "token=SecretStr" in good and "stop_sequences=" in good and "pooling='mean'" in good
    with warnings.catch_warnings():
        warnings.simplefilter("error", options.UnknownOptionWarning)
        exec(compile(good, "user.py", "exec"), {"__name__": "user"})
    with pytest.warns(options.UnknownOptionWarning, match=f"no option '{TYPO}' \\(did you mean 'n_ctx'") as record:
        exec(compile(typo_file(), "typo.py", "exec"), {"__name__": "typo"})
    assert len([w for w in record if issubclass(w.category, options.UnknownOptionWarning)]) == len(ADAPTERS)


@pytest.fixture(scope="module")
def user_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("typing_user")
    (where / "user.py").write_text(user_file())
    (where / "typo.py").write_text(typo_file())
    return where


def _checker(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        pytest.skip(f"{module} is not installed (pip install -e '.[test]')")


def test_pyright_sees_every_option(user_files: Path) -> None:
    _checker("basedpyright")
    # Standard mode (what pyright and Pylance check by default); gguf_provider as the user's environment has it.
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    (user_files / "pyrightconfig.json").write_text(json.dumps({
        "typeCheckingMode": "standard", "pythonVersion": version, "extraPaths": [str(ROOT)]}))
    proc = subprocess.run([sys.executable, "-m", "basedpyright", "--outputjson", "--pythonpath", sys.executable,
                           "user.py", "typo.py"], cwd=user_files, capture_output=True, text=True, timeout=300)
    report = json.loads(proc.stdout)
    found: dict[str, list[tuple[int, str]]] = {"user.py": [], "typo.py": []}
    for d in report["generalDiagnostics"]:
        if d["severity"] in ("error", "warning"):
            found[Path(d["file"]).name].append((d["range"]["start"]["line"] + 1, d["message"]))
    assert found["user.py"] == [], found["user.py"]
    assert {line for line, _ in found["typo.py"]} == _typo_lines(), found["typo.py"]
    assert all(f'No parameter named "{TYPO}"' in message for _, message in found["typo.py"]), found["typo.py"]


def test_mypy_sees_every_option(user_files: Path) -> None:
    _checker("mypy")
    # No configuration (no pydantic plugin): pydantic's dataclass_transform gives mypy the fields. The package is
    # read as an installed one is (its own errors not reported); the cache outlives the test's temp dir (a cold run
    # reads langchain-core and llama-index-core: tens of seconds).
    (user_files / "mypy.ini").write_text(f"[mypy]\nmypy_path = {ROOT}\n\n[mypy-gguf_provider.*]\n"
                                         "follow_imports = silent\n")
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "mypy.ini", "--cache-dir",
                           str(ROOT / ".mypy_cache" / "test_typing_user"), "--no-error-summary", "user.py", "typo.py"],
                          cwd=user_files, capture_output=True, text=True, timeout=600)
    found: dict[str, list[tuple[int, str]]] = {"user.py": [], "typo.py": []}
    for m in re.finditer(r"^(user\.py|typo\.py):(\d+): error: (.*)$", proc.stdout, re.M):
        found[m[1]].append((int(m[2]), m[3]))
    assert proc.returncode in (0, 1) and not proc.stderr.strip(), proc.stderr[-2000:]
    assert found["user.py"] == [], found["user.py"]
    assert {line for line, _ in found["typo.py"]} == _typo_lines(), proc.stdout[-3000:]
    assert all(f'Unexpected keyword argument "{TYPO}"' in message for _, message in found["typo.py"]), found["typo.py"]


def test_every_option_has_its_description_as_its_docstring() -> None:
    """An editor shows a field's docstring (hover, completion), not pydantic's ``description=``: each option has
    both, the same text (as langchain-ollama's fields have docstrings). The generated fields get theirs from
    gen_options.py; a hand-written field's is written beside its description, and checked here."""
    modules = {k.__module__ for cls in ADAPTERS for k in cls.__mro__ if k.__module__.startswith("gguf_provider")}
    checked: set[str] = set()
    for name in sorted(modules):
        module = sys.modules[name]
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if not isinstance(node, ast.ClassDef):
                continue
            fields = getattr(getattr(module, node.name, None), "model_fields", {})
            for stmt, after in zip(node.body, [*node.body[1:], None], strict=True):
                if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
                        and stmt.target.id in fields and fields[stmt.target.id].description):
                    continue
                field = stmt.target.id
                doc = after.value.value if (isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
                                            and isinstance(after.value.value, str)) else None
                assert doc is not None and doc.split() == fields[field].description.split(), \
                    f"{name}.{node.name}.{field}: its docstring is not its description (the editor's text)"
                checked.add(field)
    for cls in ADAPTERS:
        assert not set(documented(cls)) - checked, f"{cls.__name__}: no docstring found for some options"
