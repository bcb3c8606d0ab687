"""Copy the Prometheus rules and Grafana dashboards of ``deploy/`` into the Helm chart.

    .venv/bin/python scripts/sync_chart_files.py           # copy, and remove stale copies
    .venv/bin/python scripts/sync_chart_files.py --check   # exit 1 when the copies drifted

``deploy/`` holds the one source. Helm reads files only from inside the chart, so the chart
carries byte-for-byte copies under ``files/``; docker-compose mounts the sources directly.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
CHART_DIR = Path("helm") / "retrieval-monitor"
RULES_DIR = Path("deploy") / "prometheus"
DASHBOARDS_DIR = Path("deploy") / "grafana" / "dashboards"
CHART_RULES_DIR = CHART_DIR / "files" / "rules"
CHART_DASHBOARDS_DIR = CHART_DIR / "files" / "dashboards"


def rule_files(repo: Path = REPO_ROOT) -> list[Path]:
    """Prometheus rule files in ``deploy/prometheus`` (repo-relative), sorted.

    A rule file is told apart from a promtool test file by its content (a top-level ``groups``),
    not its name, so both may sit in the folder.
    """
    folder = repo / RULES_DIR
    found = []
    for path in sorted(folder.glob("*.y*ml")) if folder.is_dir() else []:
        document = yaml.safe_load(path.read_text())
        if isinstance(document, dict) and "groups" in document:
            found.append(path.relative_to(repo))
    return found


def dashboard_files(repo: Path = REPO_ROOT) -> list[Path]:
    """Grafana dashboard JSON files in ``deploy/grafana/dashboards`` (repo-relative), sorted."""
    folder = repo / DASHBOARDS_DIR
    if not folder.is_dir():
        return []
    return [path.relative_to(repo) for path in sorted(folder.glob("*.json"))]


def expected_copies(repo: Path = REPO_ROOT) -> dict[Path, Path]:
    """Each copy the chart must hold (repo-relative) and the source it copies."""
    copies = {CHART_RULES_DIR / source.name: source for source in rule_files(repo)}
    copies.update({CHART_DASHBOARDS_DIR / source.name: source for source in dashboard_files(repo)})
    return copies


def _present_copies(repo: Path) -> set[Path]:
    present: set[Path] = set()
    for folder in (CHART_RULES_DIR, CHART_DASHBOARDS_DIR):
        if (repo / folder).is_dir():
            present.update(p.relative_to(repo) for p in (repo / folder).iterdir() if p.is_file())
    return present


def drift(repo: Path = REPO_ROOT) -> list[str]:
    """One line per copy that is missing, differs from its source, or has no source any more."""
    problems = []
    expected = expected_copies(repo)
    for copy, source in sorted(expected.items()):
        if not (repo / copy).is_file():
            problems.append(f"missing: {copy} (copy of {source})")
        elif (repo / copy).read_bytes() != (repo / source).read_bytes():
            problems.append(f"differs: {copy} from {source}")
    for extra in sorted(_present_copies(repo) - set(expected)):
        problems.append(f"no source: {extra}")
    return problems


def sync(repo: Path = REPO_ROOT) -> list[Path]:
    """Make the copies equal their sources; return the copies written or removed."""
    changed = []
    expected = expected_copies(repo)
    for copy, source in sorted(expected.items()):
        content = (repo / source).read_bytes()
        target = repo / copy
        if not target.is_file() or target.read_bytes() != content:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            changed.append(copy)
    for extra in sorted(_present_copies(repo) - set(expected)):
        (repo / extra).unlink()
        changed.append(extra)
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Copy deploy/ rules and dashboards into the chart."
    )
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on drift")
    parser.add_argument("--repo", type=Path, default=REPO_ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.check:
        problems = drift(args.repo)
        for line in problems:
            print(line, file=sys.stderr)
        if problems:
            print("run: python scripts/sync_chart_files.py", file=sys.stderr)
        return 1 if problems else 0
    for path in sync(args.repo):
        print(f"updated {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
