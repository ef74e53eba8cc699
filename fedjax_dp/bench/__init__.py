"""``fedjax-dp bench``: the library's headline measurements, each a ratio timed in one run.

One module per part (``measure(sizes, repeats) -> record``): :mod:`.local_training`,
:mod:`.peers` (with the re-expressed peers' workload :mod:`.peers_reference`), :mod:`.dp_sgd`,
:mod:`.knn_vote`, :mod:`.isrl`, :mod:`.fnas`, :mod:`.ae_dpfl`; :mod:`.common` times them;
:mod:`.suite` runs them and writes the JSON and the markdown table.
"""
from fedjax_dp.bench.suite import PARTS, SUITES, markdown, run, write

__all__ = ["PARTS", "SUITES", "markdown", "run", "write"]
