"""Module sizes (issue 41's done-when): no module in ``assets/`` over 300 lines, no file in ``ops/``
over 600. A module past its limit is split by concern (docs/architecture.md)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIMITS = {"assets": 300, "ops": 600}


def test_no_module_over_its_package_limit():
    over = []
    for package, limit in LIMITS.items():
        files = sorted((ROOT / package).rglob("*.py"))
        assert len(files) > 10, package                        # the walk found the package
        for p in files:
            n = len(p.read_text(encoding="utf-8").splitlines())
            if n > limit:
                over.append(f"{p.relative_to(ROOT)}: {n} lines > {limit}")
    assert not over, "; ".join(over)
