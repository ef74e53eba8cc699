"""Datasets, file loaders and partitioners.

* :class:`Dataset` - fixed train / public (server, unlabelled) / test splits.
* Offline sources (no network): :func:`digits`, :func:`wbcd`, :func:`mnist5k`,
  :func:`mnist5k_oddeven` (PCA features, parity labels, 25 digit-pair domains), :func:`synthetic`,
  by name through :func:`load_dataset` / :data:`DATASETS`; :func:`resize_images`.
* Streamed training features (:class:`StreamedDataset`, :data:`STREAMED`): generated in blocks,
  never held whole (:func:`synthetic_stream`).
* User files: :func:`load_npz`, :func:`load_idx`, :func:`load_libsvm`, :func:`load_csv`, then
  :func:`dataset_from_arrays`; TFDS (optional): :func:`load_tfds`.
* Published federated datasets (one agent per client): TFF's HDF5 files and LEAF's JSON,
  written once as a memory-mapped stacked population by :func:`fedjax_dp.data.convert.convert`;
  LEAF's Shakespeare rebuilt from Project Gutenberg's text of the plays
  (:mod:`fedjax_dp.data.gutenberg`, format ``gutenberg_shakespeare``).
* Partitioners (index lists, one per agent): :func:`iid`, :func:`dirichlet`,
  :func:`label_shards`, :func:`one_class`, :func:`by_domain`, :func:`natural`, by name through
  :func:`partition`; as one ``[N, n_max]`` array of record indices through :func:`partition_rows`.
* FedProx's Synthetic(alpha, beta) with natural clients: :func:`fedprox_synthetic`.
"""
from fedjax_dp.data.dataset import Dataset
from fedjax_dp.data.files import (dataset_from_arrays, load_csv, load_idx, load_libsvm, load_npz,
                                  read_idx, remap_labels)
from fedjax_dp.data.fedprox_synthetic import fedprox_synthetic
from fedjax_dp.data.partition import (PARTITIONS, by_domain, class_counts, dirichlet, iid,
                                      iid_rows, label_shards, natural, one_class, partition,
                                      partition_rows)
from fedjax_dp.data.sources import (DATASETS, STACKED_PREFIX, STREAMED, digits, load_dataset,
                                    mnist5k, mnist5k_oddeven, oddeven_pair_id, resize_images,
                                    synthetic, synthetic_stream, wbcd)
from fedjax_dp.data.splits import split_indices
from fedjax_dp.data.streamed import StreamedDataset, train_blocks
from fedjax_dp.data.tfds_adapter import load_tfds

__all__ = [
    "Dataset", "DATASETS", "load_dataset", "digits", "wbcd", "mnist5k", "mnist5k_oddeven",
    "oddeven_pair_id", "synthetic", "synthetic_stream", "STREAMED", "STACKED_PREFIX",
    "StreamedDataset", "train_blocks",
    "resize_images", "load_npz", "load_idx", "read_idx", "load_libsvm", "load_csv",
    "remap_labels", "dataset_from_arrays", "split_indices", "load_tfds", "PARTITIONS",
    "partition", "iid", "dirichlet", "label_shards", "one_class", "by_domain", "class_counts",
    "natural", "fedprox_synthetic", "iid_rows", "partition_rows",
]
