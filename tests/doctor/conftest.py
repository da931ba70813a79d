"""Fixtures of the doctor tests.

* one torch thread per test: on a loaded 2-core machine two threads spin against each other;
* ``smollm2``: the bundled SmolLM2-135M-Instruct loaded once per module, fp32 on the CPU;
* the trained drafts (``doctor_draft``, ``wide_draft``): tests/conftest.py, see doctor_draft.py.
"""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread):
    yield


@pytest.fixture(scope="module")
def smollm2():
    from eagle3_backend.verify.targets import load_target

    return load_target("bundled", "float32", "cpu")
