"""The README's install lines and what CI runs stay in step (CI only swaps the CPU torch index
for the wheel on its local disk)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CPU_TORCH = "pip install torch --index-url https://download.pytorch.org/whl/cpu"


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def ci_pip_installs() -> list[str]:
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    return [
        line.strip().removeprefix("python3 -m ").replace(" -q", "")
        for line in lines
        if line.strip().startswith("python3 -m pip install")
    ]


def test_readme_commands_install_cpu_torch_first_then_run_the_job_and_the_tests():
    commands = readme_commands()
    main_job = next(c for c in commands if "nanograph generate" in c)
    tests = next(c for c in commands if c.endswith("pytest -q"))
    for command in (main_job, tests):
        steps = [s.strip() for s in command.split("&&")]
        assert steps[0] == CPU_TORCH, "the portable CPU torch install must come first"
    assert "pip install -e ." in main_job and "pip install -e '.[test]'" in tests


def test_ci_follows_the_readme_except_for_the_local_torch_wheel():
    readme_steps = {s.strip() for c in readme_commands() for s in c.split("&&")}
    installs = ci_pip_installs()
    assert installs[0] == "pip install torch==2.13.0"  # the local-wheel shortcut for CPU_TORCH
    assert CPU_TORCH in readme_steps
    for step in installs[1:]:
        assert step in readme_steps, f".ci/run installs {step!r}, which the README does not say"
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.rstrip().endswith("python3 -m pytest -q")


def test_the_test_extra_pulls_no_triton():
    pyproject = (ROOT / "pyproject.toml").read_text()
    test_extra = re.search(r"^test = \[(.*?)\]", pyproject, re.S | re.M).group(1)
    assert "triton" not in test_extra
    assert re.search(r"^triton = \[", pyproject, re.M)
