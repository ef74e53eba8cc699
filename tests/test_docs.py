"""The documentation site builds with ``mkdocs build --strict`` (links, anchors, API docstrings)."""
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PAGES = ["index.html", "getting_started/index.html", "privacy_units/index.html",
         "voting_dpfl/index.html", "fedkt/index.html", "isrl/index.html",
         "shuffle_dp/index.html", "fnas/index.html", "protocol/index.html", "sweeps/index.html",
         "performance/index.html", "scale/index.html", "runs/index.html", "audit/index.html",
         "secagg/index.html", "own_model_and_data/index.html", "api/index.html"]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          cwd=config.parent, capture_output=True, text=True, timeout=300)


def test_site_builds_strict_with_every_page_and_the_api(tmp_path):
    proc = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    site = tmp_path / "site"
    for page in PAGES:
        assert (site / page).is_file(), page
    api = (site / "api" / "privacy" / "index.html").read_text()
    assert 'id="fedjax_dp.privacy.ledger.PrivacyLedger"' in api       # rendered from docstrings
    assert 'id="fedjax_dp.algorithms.api"' in (site / "api" / "algorithms" / "index.html").read_text()
    # the wide theme: the content column's stylesheet is linked, code blocks get a copy button
    # (tools/docs_screenshots.py measures in a browser that nothing is cut)
    home = (site / "index.html").read_text()
    assert "stylesheets/wide.css" in home and "content.code.copy" in home
    assert (site / "stylesheets" / "wide.css").is_file()
    units = (site / "privacy_units" / "index.html").read_text()
    for unit in ("agent", "instance", "party", "example", "silo_record", "shuffle"):
        assert f"<code>{unit}</code>" in units, unit


def test_broken_links_and_anchors_fail_the_build(tmp_path):
    """The config's own checks: a link to a missing page, a missing anchor or a file outside
    docs/ is an error, not a note (mkdocs' defaults only log missing anchors)."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs", docs)
    for page in (docs / "api").glob("*.md"):                            # no API rendering: faster
        page.write_text("".join(line for line in page.read_text().splitlines(True)
                                if not line.startswith((":::", "    "))))
    config = (ROOT / "mkdocs.yml").read_text()
    assert "paths: [.]" in config
    (tmp_path / "mkdocs.yml").write_text(config.replace("paths: [.]", f"paths: [{ROOT}]"))
    assert _build(tmp_path / "mkdocs.yml", tmp_path / "ok").returncode == 0

    bads = ("[a](fnas.md#no-such-section)", "[b](no_such_page.md)",
            "[c](../results/isrl/table.md)", "[d](#nowhere)")
    (docs / "sweeps.md").write_text("# Sweeps\n\n" + "".join(f"See {b}.\n\n" for b in bads))
    proc = _build(tmp_path / "mkdocs.yml", tmp_path / "bad")    # strict: every warning named
    assert proc.returncode != 0
    for bad in bads:
        assert bad[bad.index("(") + 1:-1] in proc.stdout + proc.stderr, bad
