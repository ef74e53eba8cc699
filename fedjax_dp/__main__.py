"""``python -m fedjax_dp``: the ``fedjax-dp`` command line (its console entry)."""
import sys

from fedjax_dp.experiments.cli import script

if __name__ == "__main__":
    sys.exit(script())
