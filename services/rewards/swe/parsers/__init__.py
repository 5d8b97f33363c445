"""The log-parser registry: a name (from the instance's ``install_config.log_parser``
or its repository) -> a function ``log -> {test_id: status}``.

Names are accepted with or without ``swebench``'s ``parse_log_`` prefix, so
SWE-bench / SWE-rebench rows work unchanged. Add a runner with :func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable

from ..status import StatusMap
from .other_runners import parse_cargo, parse_go_test, parse_jest
from .python_runners import (
    parse_django,
    parse_matplotlib,
    parse_pytest,
    parse_pytest_options,
    parse_pytest_v2,
    parse_seaborn,
    parse_sympy,
    parse_unittest,
)

LogParser = Callable[[str], StatusMap]

_REGISTRY: dict[str, LogParser] = {}


class UnknownParserError(KeyError):
    """No parser is registered under that name."""


def _key(name: str) -> str:
    name = name.strip()
    return name.removeprefix("parse_log_")


def register(name: str, parser: LogParser) -> None:
    """Make ``parser`` available as ``name`` (and ``parse_log_<name>``)."""
    _REGISTRY[_key(name)] = parser


def get_parser(name: str) -> LogParser:
    try:
        return _REGISTRY[_key(name)]
    except KeyError:
        raise UnknownParserError(
            f"unknown log parser {name!r}; known: {', '.join(sorted(_REGISTRY))}"
        ) from None


def parser_names() -> list[str]:
    return sorted(_REGISTRY)


for _name, _parser in {
    "pytest": parse_pytest,
    "pytest_options": parse_pytest_options,
    "pytest_v2": parse_pytest_v2,
    "django": parse_django,
    "unittest": parse_unittest,
    "sympy": parse_sympy,
    "matplotlib": parse_matplotlib,
    "seaborn": parse_seaborn,
    "gotest": parse_go_test,
    "go_test": parse_go_test,
    "cargo": parse_cargo,
    "jest": parse_jest,
    # swebench's per-repository aliases
    "astroid": parse_pytest,
    "flask": parse_pytest,
    "marshmallow": parse_pytest,
    "pvlib": parse_pytest,
    "pyvista": parse_pytest,
    "sqlfluff": parse_pytest,
    "xarray": parse_pytest,
    "pydicom": parse_pytest_options,
    "requests": parse_pytest_options,
    "pylint": parse_pytest_options,
    "astropy": parse_pytest_v2,
    "scikit": parse_pytest_v2,
    "sphinx": parse_pytest_v2,
}.items():
    register(_name, _parser)

REPO_PARSERS: dict[str, str] = {
    "astropy/astropy": "astropy",
    "django/django": "django",
    "marshmallow-code/marshmallow": "marshmallow",
    "matplotlib/matplotlib": "matplotlib",
    "mwaskom/seaborn": "seaborn",
    "pallets/flask": "flask",
    "psf/requests": "requests",
    "pvlib/pvlib-python": "pvlib",
    "pydata/xarray": "xarray",
    "pydicom/pydicom": "pydicom",
    "pylint-dev/astroid": "astroid",
    "pylint-dev/pylint": "pylint",
    "pytest-dev/pytest": "pytest",
    "pyvista/pyvista": "pyvista",
    "scikit-learn/scikit-learn": "scikit",
    "sqlfluff/sqlfluff": "sqlfluff",
    "sphinx-doc/sphinx": "sphinx",
    "sympy/sympy": "sympy",
}
"""The SWE-bench repositories' parsers, for rows that name no ``log_parser``."""


def parser_for(log_parser: str | None, repo: str | None) -> str:
    """The parser name to use: the row's own, else its repository's, else pytest's."""
    if log_parser:
        get_parser(log_parser)  # fail early on a typo
        return _key(log_parser)
    return REPO_PARSERS.get(repo or "", "pytest")
