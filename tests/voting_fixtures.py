"""A voting run (AE-DPFL, kNN-DPFL) through :func:`fedjax_dp.algorithms.api.run`, its final values
as attributes (``labels``, ``clean_vote_sums``, ``params``, ``agent_params``, ...)."""
from types import SimpleNamespace

from fedjax_dp.algorithms import api


def run_voting(module, key, agents, model, config, x_public, *, chunk_size="auto"):
    """``api.run(module, key, FederatedData(agents, x_public), model, config)``: the state's
    values, ``query_indices`` and ``state`` as attributes (None for a value not produced)."""
    data = api.FederatedData(agents=agents, num_classes=model.num_classes, x_public=x_public)
    done = api.run(module, key, data, model, config, runtime=api.Runtime(chunk_size=chunk_size))
    v = done.state.values
    return SimpleNamespace(
        params=v["params"], labels=v["labels"], clean_vote_sums=v.get("clean_vote_sums"),
        agent_params=v.get("agent_params"), agent_ballots=v.get("agent_ballots"),
        agent_losses=v.get("agent_losses"), query_indices=done.state.context.query_indices,
        feature_map=done.state.context.extra, state=done.state)
