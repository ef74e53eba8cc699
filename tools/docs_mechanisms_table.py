"""Regenerate the table of docs/mechanisms.md (every pair of stage options: runs, or the reason)
from the stages' stated requirements (:mod:`fedjax_dp.stages.table`); tests/test_stage_matrix.py
checks the page is current.

    python tools/docs_mechanisms_table.py
"""
from pathlib import Path

from fedjax_dp.core import files
from fedjax_dp.stages import table

BEGIN, END = "<!-- table: begin -->\n", "<!-- table: end -->"


def main() -> None:
    page = Path(__file__).resolve().parents[1] / "docs" / "mechanisms.md"
    text = page.read_text()
    head, rest = text.split(BEGIN, 1)
    tail = rest.split(END, 1)[1]
    files.write_text(page, head + BEGIN + table.markdown() + END + tail)
    print(f"wrote {page}")


if __name__ == "__main__":
    main()
