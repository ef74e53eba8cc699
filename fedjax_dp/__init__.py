"""fedjax_dp: differentially private federated learning in JAX, agents as an array axis."""
__version__ = "0.1.0"
