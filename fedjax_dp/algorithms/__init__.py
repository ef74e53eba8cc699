"""Federated algorithms as pure functions over stacked agents."""
