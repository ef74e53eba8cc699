"""Stacked-agent containers, the lift-over-agents primitive, PRNG helpers and argument checks."""
from fedjax_dp.core.lift import (AGENTS, agent_mesh, agent_sum, auto_chunk_size, for_each_agent,
                                for_each_agent_sum, shard_agents)
from fedjax_dp.core.rng import as_key, numpy_rng, split_per_agent, stream
from fedjax_dp.core.stacked import (StackedData, auto_placement, from_arrays, from_partition,
                                   from_ragged, is_on_host, load_stacked, place, record_rows,
                                   save_stacked, stack_records)

__all__ = ["AGENTS", "agent_mesh", "agent_sum", "auto_chunk_size", "for_each_agent",
           "for_each_agent_sum", "shard_agents", "as_key",
           "numpy_rng", "split_per_agent", "stream", "StackedData", "from_partition",
           "from_ragged", "from_arrays", "is_on_host", "load_stacked", "save_stacked",
           "stack_records", "record_rows", "auto_placement", "place"]
