"""``fedjax-dp data convert FORMAT SRC DST``: a published federated dataset -> a stacked population.

The result is the folder ``data.dataset = "stacked:DST"`` runs (the format of
:func:`fedjax_dp.core.save_stacked` and ``fedjax_dp.data.population.save``)::

    x.npy         [N, n_max, *feature_shape]  float32 (images, Sent140) or int32 (token ids)
    y.npy         [N, n_max] int32  (next-token formats: [N, n_max, T] int32 target ids)
    counts.npy    [N] int32         client i's records are rows 0 .. counts[i] - 1
    server.npz    the published test split: x_test, y_test, test_client [n_test] int32 (the row
                  of test_client_ids its record came from), test_client_ids; x_public / y_public
                  empty; num_classes; name
    clients.json  {"train": [N client ids, agent order], "format", "source", "options", sizes}
    task.json     the next-token task (next-token formats; fedjax_dp.models.tasks.save)
    vocab.txt     the vocabulary (text formats), one token per line, ids 1..V

Each client of the published train split is one agent. The conversion never holds the
population: pass 1 reads every client's size, pass 2 reads one client at a time and writes its
rows straight into the memory-mapped ``x.npy`` / ``y.npy`` (sparse: padding costs no disk
write), so memory stays about one client whatever N. The folder is built as the hidden sibling
``.DST.tmp-<pid>``, its files fsynced, and renamed to DST at the end, so a conversion killed,
failed or out of disk space never leaves a DST (the next conversion removes a dead process's
temporary folder); a full disk ends in one line naming DST.

Options: ``max_clients`` keeps the first K train clients (the test split keeps every test
client), ``max_records`` the first k records of every client, ``max_test_records`` a uniform
random subset (``seed``) of the test records (kept in client order). ``vocab_size`` /
``vocab_file`` / ``seq_len`` set the text formats' tokenisation (:mod:`fedjax_dp.data.vocab`).
``gutenberg_shakespeare`` builds LEAF's clients from the plays' text and makes LEAF's split
itself (``split`` "sample" / "user", ``train_fraction``, ``split_seed``; ``window_stride``:
every S-th window of each split;
:mod:`fedjax_dp.data.gutenberg`); its summary also holds the conversion's ``statistics``.
"""
from __future__ import annotations

import errno
import json
import mmap
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from fedjax_dp.core import files

#: format -> one-line description (``fedjax-dp data convert --help``)
FORMATS = {
    "tff_emnist": "TFF federated EMNIST-62 (fed_emnist_{train,test}.h5)",
    "tff_emnist_digits": "TFF federated EMNIST digits only (fed_emnist_digitsonly_{train,test}.h5)",
    "tff_shakespeare": "TFF Shakespeare, next character (shakespeare_{train,test}.h5)",
    "tff_stackoverflow": "TFF StackOverflow, next word (stackoverflow_{train,test}.h5)",
    "tff_cifar100": "TFF CIFAR-100, Pachinko partition (fed_cifar100_{train,test}.h5)",
    "leaf_femnist": "LEAF FEMNIST (data/{train,test}/*.json)",
    "leaf_shakespeare": "LEAF Shakespeare, next character (data/{train,test}/*.json)",
    "leaf_sent140": "LEAF Sent140, tweet sentiment (data/{train,test}/*.json)",
    "gutenberg_shakespeare": "Shakespeare's plays from Project Gutenberg's text (the complete "
                             "works as one .txt, or a folder of one .txt per play): LEAF's "
                             "clients, windows and split",
}
TEXT_FORMATS = ("tff_shakespeare", "tff_stackoverflow", "leaf_shakespeare", "leaf_sent140",
                "gutenberg_shakespeare")
#: formats that make their own train / test split (fedjax_dp.data.gutenberg)
SPLIT_FORMATS = ("gutenberg_shakespeare",)
VOCAB_FORMATS = ("tff_stackoverflow", "leaf_sent140")
#: bytes written between two hand-backs of the written pages to the OS
FLUSH_BYTES = 64 << 20

def open_source(fmt: str, src, *, vocab_size: int | None = None, vocab_file=None,
                seq_len: int | None = None, split: str | None = None,
                train_fraction: float | None = None, split_seed: int | None = None,
                window_stride: int | None = None):
    """The reader of ``fmt`` on ``src`` (its files opened and their layout checked)."""
    from fedjax_dp.data import gutenberg, leaf_json, tff_hdf5
    if fmt not in FORMATS:
        raise ValueError(f"unknown FORMAT {fmt!r}; valid formats are {sorted(FORMATS)}")
    if (vocab_size is not None or vocab_file is not None) and fmt not in VOCAB_FORMATS:
        raise ValueError(f"--vocab-size / --vocab apply to {list(VOCAB_FORMATS)}, not {fmt!r}")
    if seq_len is not None and fmt not in TEXT_FORMATS:
        raise ValueError(f"--seq-len applies to {list(TEXT_FORMATS)}, not {fmt!r}")
    if vocab_size is not None and (isinstance(vocab_size, bool) or int(vocab_size) != vocab_size
                                   or vocab_size < 1):
        raise ValueError(f"--vocab-size must be an integer >= 1, got {vocab_size!r}")
    if seq_len is not None and (isinstance(seq_len, bool) or int(seq_len) != seq_len
                                or seq_len < 1):
        raise ValueError(f"--seq-len must be an integer >= 1, got {seq_len!r}")
    splitting = {"split": split, "train_fraction": train_fraction, "split_seed": split_seed,
                 "window_stride": window_stride}
    given = [f"--{k.replace('_', '-')}" for k, v in splitting.items() if v is not None]
    if given and fmt not in SPLIT_FORMATS:
        raise ValueError(f"{' / '.join(given)} apply to {list(SPLIT_FORMATS)}, not {fmt!r} "
                         f"(its files hold their published split)")
    t = {} if seq_len is None else {"seq_len": int(seq_len)}
    if fmt == "gutenberg_shakespeare":
        return gutenberg.Shakespeare(src, **t, **{k: v for k, v in splitting.items()
                                                  if v is not None})
    v = {"vocab_size": vocab_size, "vocab_file": vocab_file}
    if fmt in ("tff_emnist", "tff_emnist_digits"):
        return tff_hdf5.EMNIST(src, only_digits=fmt == "tff_emnist_digits")
    if fmt == "tff_cifar100":
        return tff_hdf5.CIFAR100(src)
    if fmt == "tff_shakespeare":
        return tff_hdf5.Shakespeare(src, **t)
    if fmt == "tff_stackoverflow":
        return tff_hdf5.StackOverflow(src, **v, **t)
    if fmt == "leaf_femnist":
        return leaf_json.FEMNIST(src)
    if fmt == "leaf_shakespeare":
        return leaf_json.Shakespeare(src, **t)
    return leaf_json.Sent140(src, **v, **t)


def _check_count(name: str, value) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _bar(total: int, desc: str, progress: bool):
    from tqdm.auto import tqdm
    return tqdm(total=total, desc=desc, unit="client", disable=not progress, leave=False)


def _sizes(reader, split: str, max_clients: int | None, max_records: int | None
           ) -> tuple[list[str], np.ndarray]:
    """Pass 1: ``(client ids, records per client [N] int64)``, capped; empty clients dropped."""
    ids, counts, seen = [], [], set()
    for cid, n in reader.sizes(split):
        if cid in seen:
            raise ValueError(f"{reader.name}: client {cid!r} appears twice in the {split} split "
                             f"({reader.paths[split]})")
        seen.add(cid)
        n = min(n, max_records) if max_records else n
        if n > 0:
            ids.append(cid)
            counts.append(n)
        if max_clients and len(ids) >= max_clients:
            break
    if not ids:
        raise ValueError(f"{reader.name}: the {split} split ({reader.paths[split]}) holds no "
                         f"record")
    return ids, np.asarray(counts, np.int64)


def _memmap(path: Path, dtype, shape) -> np.memmap:
    return np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=tuple(shape))


def _release(*arrays: np.memmap) -> None:
    """Write the memory maps' dirty pages to disk and drop them from this process's memory."""
    for a in arrays:
        a.flush()
        m = getattr(a, "_mmap", None)
        if m is not None and hasattr(m, "madvise") and hasattr(mmap, "MADV_DONTNEED"):
            m.madvise(mmap.MADV_DONTNEED)


def _write(reader, split: str, ids: list[str], counts: np.ndarray, x_out, y_out, *,
           keep: np.ndarray | None, progress: bool, capped: bool = False) -> int:
    """Pass 2: every kept client's records into ``x_out`` / ``y_out``; a client whose features
    and labels disagree in number, or differ from its first-pass size (below a ``capped`` one:
    ``max_records``), is refused naming the file and the client. Stacked (``keep`` None):
    client i -> rows ``[i, :counts[i]]``; flat (test): the records whose index (in client order,
    over the capped counts) is in the sorted array ``keep``, one after another. Returns the
    number of records written."""
    wanted = dict(zip(ids, range(len(ids))))
    offsets = np.concatenate([[0], np.cumsum(counts)])
    written = since_flush = row = 0
    bar = _bar(len(ids), f"{reader.name} {split}", progress)
    try:
        for cid, x, y in reader.clients(split):
            i = wanted.get(cid)
            if i is None:
                continue
            n = int(counts[i])
            where = f"{reader.name}: client {cid!r} in {str(reader.paths[split])!r}"
            if len(x) != len(y):
                raise ValueError(f"{where}: its labels have {len(y)} records but its features "
                                 f"have {len(x)} (every field needs one row per record)")
            if len(x) < n or (not capped and len(x) != n):
                raise ValueError(f"{where}: {len(x)} records but its size read {n} on the "
                                 f"first pass")
            x, y = x[:n], y[:n]
            if (x.shape[1:] != tuple(reader.feature_shape)
                    or y.shape[1:] != tuple(reader.label_shape)):
                raise ValueError(f"{reader.name}: client {cid!r} of the {split} split has "
                                 f"records x {x.shape[1:]}, y {y.shape[1:]}; expected "
                                 f"{tuple(reader.feature_shape)}, {tuple(reader.label_shape)}")
            if keep is None:
                x_out[i, :n] = x
                y_out[i, :n] = y
                row_bytes = x.nbytes + y.nbytes
            else:
                lo, hi = np.searchsorted(keep, [offsets[i], offsets[i] + n])
                sel = keep[lo:hi] - offsets[i]
                x_out[row:row + len(sel)] = x[sel]
                y_out[row:row + len(sel)] = y[sel]
                row += len(sel)
                row_bytes = x[sel].nbytes + y[sel].nbytes
            written += 1
            since_flush += row_bytes
            if since_flush >= FLUSH_BYTES:
                _release(x_out, y_out)
                since_flush = 0
            bar.update(1)
            if written == len(ids):
                break
    finally:
        bar.close()
    if written != len(ids):
        raise ValueError(f"{reader.name}: the {split} split yielded {written} of its "
                         f"{len(ids)} clients on the second pass (files changed?)")
    _release(x_out, y_out)
    return row if keep is not None else int(counts.sum())


def _temporary(dst: Path) -> Path:
    """The folder ``dst`` is built in: ``.DST.tmp-<pid>`` beside it (a concurrent conversion
    to the same DST builds its own)."""
    return dst.with_name(f".{dst.name}.tmp-{os.getpid()}")


def _remove_dead_temporaries(dst: Path) -> None:
    """Remove what a killed conversion to ``dst`` left: ``.DST.tmp-<pid>`` of a process that
    is no longer running."""
    prefix = f".{dst.name}.tmp-"
    if not dst.parent.is_dir():
        return
    for p in dst.parent.iterdir():
        pid = p.name[len(prefix):]
        if not (p.name.startswith(prefix) and pid.isdigit()) or p.is_symlink() or \
                not p.is_dir() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:                 # dead: its folder is a leftover
            shutil.rmtree(p, ignore_errors=True)
        except OSError:                            # alive (another user's): not ours
            pass


def _sync(folder: Path) -> None:
    """fsync every file of ``folder`` and the folder itself (before the rename publishes it)."""
    for p in folder.iterdir():
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    files.fsync_folder(folder)


#: errors of the disk, not of the source: reported as a failed write of DST
_DISK_ERRORS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS)


def convert(fmt: str, src, dst, *, vocab_size: int | None = None, vocab_file=None,
            seq_len: int | None = None, max_clients: int | None = None,
            max_records: int | None = None, max_test_records: int | None = None,
            seed: int = 0, progress: bool = True, split: str | None = None,
            train_fraction: float | None = None, split_seed: int | None = None,
            window_stride: int | None = None) -> dict[str, Any]:
    """Convert the published dataset ``fmt`` at ``src`` into the stacked population ``dst``
    (module docstring). Returns a summary (clients, records, n_max, files). Every argument is
    checked, and the source's layout read, before anything is written."""
    max_clients = _check_count("--max-clients", max_clients)
    max_records = _check_count("--max-records", max_records)
    max_test_records = _check_count("--max-test-records", max_test_records)
    dst = Path(dst).expanduser()
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise ValueError(f"DST {str(dst)!r} already exists and is not an empty folder; choose a "
                         f"new folder")
    reader = open_source(fmt, src, vocab_size=vocab_size, vocab_file=vocab_file,
                         seq_len=seq_len, split=split, train_fraction=train_fraction,
                         split_seed=split_seed, window_stride=window_stride)
    partial = _temporary(dst)
    _remove_dead_temporaries(dst)
    try:
        reader.prepare(progress)
        train_ids, train_counts = _sizes(reader, "train", max_clients, max_records)
        test_ids, test_counts = _sizes(reader, "test", None, max_records)
        n_test_all = int(test_counts.sum())
        if max_test_records and max_test_records < n_test_all:
            rng = np.random.default_rng(seed)
            keep = np.sort(rng.choice(n_test_all, size=max_test_records, replace=False))
        else:
            keep = np.arange(n_test_all)
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir(parents=True)
        num, n_max = len(train_ids), int(train_counts.max())
        fs, ls = tuple(reader.feature_shape), tuple(reader.label_shape)
        x = _memmap(partial / "x.npy", reader.x_dtype, (num, n_max) + fs)
        y = _memmap(partial / "y.npy", np.int32, (num, n_max) + ls)
        n_train = _write(reader, "train", train_ids, train_counts, x, y, keep=None,
                         progress=progress, capped=max_records is not None)
        del x, y
        np.save(partial / "counts.npy", train_counts.astype(np.int32))
        xt = _memmap(partial / "test_x.tmp.npy", reader.x_dtype, (len(keep),) + fs)
        yt = _memmap(partial / "test_y.tmp.npy", np.int32, (len(keep),) + ls)
        _write(reader, "test", test_ids, test_counts, xt, yt, keep=keep, progress=progress,
               capped=max_records is not None)
        test_client = (np.searchsorted(np.cumsum(test_counts), keep, side="right")
                       .astype(np.int32))
        np.savez(partial / "server.npz", x_public=np.zeros((0,) + fs, reader.x_dtype),
                 y_public=np.zeros((0,) + ls, np.int32), x_test=xt, y_test=yt,
                 test_client=test_client, test_client_ids=np.asarray(test_ids, dtype=str),
                 num_classes=np.int64(reader.num_classes), name=np.str_(fmt))
        del xt, yt
        for tmp in ("test_x.tmp.npy", "test_y.tmp.npy"):
            (partial / tmp).unlink()
        if reader.task is not None:
            files.write_text(partial / "task.json", json.dumps(reader.task, indent=1))
        if reader.vocab is not None:
            reader.vocab.save(partial / "vocab.txt")
        summary = {"format": fmt, "source": str(Path(src).expanduser().resolve()),
                   "clients": num, "train_records": n_train, "n_max": n_max,
                   "test_clients": len(test_ids), "test_records": int(len(keep)),
                   "test_records_published": n_test_all, "num_classes": int(reader.num_classes),
                   "feature_shape": list(fs), "options": {
                       "vocab_size": vocab_size, "vocab_file": None if vocab_file is None
                       else str(vocab_file), "seq_len": seq_len, "max_clients": max_clients,
                       "max_records": max_records, "max_test_records": max_test_records,
                       "seed": seed, **({"split": split, "train_fraction": train_fraction,
                                         "split_seed": split_seed,
                                         "window_stride": window_stride}
                                        if fmt in SPLIT_FORMATS else {})}}
        if getattr(reader, "statistics", None):
            summary["statistics"] = reader.statistics
        files.write_text(partial / "clients.json", json.dumps({**summary, "train": train_ids}))
        _sync(partial)
        if dst.exists():
            dst.rmdir()                         # empty (checked above)
        os.replace(partial, dst)
        files.fsync_folder(dst.parent)
    except OSError as e:
        shutil.rmtree(partial, ignore_errors=True)
        if e.errno in _DISK_ERRORS:
            raise files.WriteError(e.errno, f"cannot write the population {str(dst)!r}: "
                                            f"{os.strerror(e.errno)}; nothing was kept (free some "
                                            f"space and convert again)") from None
        raise
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    finally:
        reader.close()
    return {**summary, "folder": str(dst), "dataset": f"stacked:{dst}"}
