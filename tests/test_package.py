"""Package boundaries: only eagle3_backend/serving and eagle3_backend/cpu touch SGLang."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "eagle3_backend"
SGLANG_OWNERS = ("serving", "cpu")


def test_import_eagle3_backend_does_not_import_sglang():
    code = (
        "import sys\n"
        "import eagle3_backend, eagle3_backend.cli, eagle3_backend.checkpoint, eagle3_backend.ops\n"
        "import eagle3_backend.model, eagle3_backend.verify, eagle3_backend.target\n"
        "eagle3_backend.cli.build_parser()\n"
        "print(sorted(m for m in sys.modules if m == 'sglang' or m.startswith(('sglang.', 'sgl_kernel'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                         cwd=PKG.parent, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_sglang_imports_live_only_in_serving_and_cpu():
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(PKG)
        if rel.parts[0] in SGLANG_OWNERS:
            continue
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            offenders += [f"{rel}:{node.lineno} imports {n}" for n in names
                          if n == "sglang" or n.startswith("sglang.") or n.startswith("sgl_kernel")]
    assert offenders == []


def test_the_sglang_script_beside_this_python_sees_the_plugin():
    """`sglang serve` (SGLang's recommended entry point) from the environment the tests run in
    starts an interpreter that finds this package's plugin and platform entry points (make's
    .venv writes its own script: the base environment's runs an interpreter without them)."""
    script = Path(sys.executable).parent / "sglang"
    assert script.is_file(), f"{script} is missing: `sglang serve` would not come from this environment"
    interpreter = script.read_text().splitlines()[0].removeprefix("#!").strip()
    code = ("from importlib.metadata import entry_points\n"
            "print(sorted(f'{g}:{e.name}' for g in ('sglang.srt.plugins', 'sglang.srt.platforms')\n"
            "             for e in entry_points(group=g) if e.value.startswith('eagle3_backend')))\n")
    out = subprocess.run([interpreter, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "['sglang.srt.platforms:eagle3_cpu', 'sglang.srt.plugins:eagle3']", out
