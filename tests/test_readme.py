"""CI runs exactly the README's test command."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    blocks = text.split("```bash\n")[1:]
    return [b.split("```")[0].strip() for b in blocks]


def test_ci_runs_the_readme_test_command():
    test_command = next(c for c in readme_commands() if "pytest" in c)
    ci_lines = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    assert test_command in ci_lines


def test_readme_setup_installs_all_four_families():
    setup = readme_commands()[0]
    for family in ("norm", "conv", "pool", "topk"):
        assert f"plugins/{family}" in setup
    assert "npuops run" in setup
