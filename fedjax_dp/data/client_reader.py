"""The interface every published federated dataset's reader implements
(:mod:`fedjax_dp.data.tff_hdf5`, :mod:`fedjax_dp.data.leaf_json`), read by
:mod:`fedjax_dp.data.convert`."""
from __future__ import annotations

import numpy as np


class ClientReader:
    """The interface of a published dataset's reader (one subclass per format family:
    :class:`fedjax_dp.data.tff_hdf5.TFFClients`, :class:`fedjax_dp.data.leaf_json.LeafClients`).

    ``sizes(split)`` yields ``(client_id, number of records)`` and ``clients(split)`` yields
    ``(client_id, x [n, *feature_shape], y [n, *label_shape])``, client after client in the same
    order (``split``: ``"train"`` or ``"test"``); ``paths[split]`` names the files read. The class
    attributes describe the records; ``prepare`` does the work needed before them (a vocabulary)."""

    name = ""
    paths: dict = {}
    feature_shape: tuple[int, ...] = ()
    label_shape: tuple[int, ...] = ()        # () a label per record; (T,) a target per position
    x_dtype = np.float32
    num_classes = 0
    task: dict | None = None                 # the next-token task (task.json), or None
    vocab = None                             # fedjax_dp.data.vocab.Vocab of text formats

    def prepare(self, progress: bool = False) -> None:
        """Work needed before the records (a vocabulary); nothing by default."""

    def close(self) -> None:
        """Release open files; nothing by default."""

    def sizes(self, split: str):
        raise NotImplementedError

    def clients(self, split: str):
        raise NotImplementedError
