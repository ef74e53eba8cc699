"""Configs, the experiment runner and the ``fedjax-dp`` command line (the top layer)."""
