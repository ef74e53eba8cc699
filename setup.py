"""What pyproject.toml cannot say: the shipped configs are package data.

``configs/`` at the top of the checkout stays the one source (every path in the docs, the tests
and the README, such as ``configs/dp_fedavg/mnist5k.toml``, is a real file there); the wheel
carries it as ``fedjax_dp/configs/`` (fedjax_dp.experiments.shipped finds either), so an install
outside the source tree runs ``fedjax-dp run dp_fedavg/mnist5k``. Everything else is in
pyproject.toml.
"""
from setuptools import find_namespace_packages, setup

CONFIG_PACKAGES = ["fedjax_dp.configs"] + [
    f"fedjax_dp.configs.{p}" for p in find_namespace_packages(where="configs")]

setup(packages=find_namespace_packages(include=["fedjax_dp", "fedjax_dp.*"]) + CONFIG_PACKAGES,
      package_dir={"fedjax_dp.configs": "configs"},
      package_data={p: ["*.toml"] for p in CONFIG_PACKAGES})
