"""Fixtures of the serving tests: entry-point discovery (``tiny_target_dir`` is tests/conftest.py's).

``plugin_site``: a directory that makes SGLang's entry-point discovery see this
package. When eagle3-backend is pip-installed (``make`` does ``pip install -e .``)
that is the real distribution and the directory is empty; otherwise it holds a
``eagle3_backend-*.dist-info`` whose ``entry_points.txt`` is generated from
``pyproject.toml`` (every ``[project.entry-points.*]`` table), so the tests
exercise exactly the entry points the package declares.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from serving_launch import make_plugin_site


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sys.path entry under which importlib.metadata finds the package's entry points."""
    return make_plugin_site(tmp_path_factory.mktemp("plugin_site"))
