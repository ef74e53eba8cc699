"""A real full disk at every write of a small ``fedjax-dp run``, each run then resumed.

A tmpfs of ``--size`` KiB is mounted (root only; ``mount -t tmpfs``), and a ballast file leaves
``free`` bytes for the run, for ``free`` from ``--max-free`` KiB down to 0 in steps of
``--step`` KiB: the disk fills at a different write each time (config.json, a progress line, a
checkpoint's arrays or metadata, result.json). Each failed run must end in ONE line (status 1
or 2, no traceback); the ballast is then removed and ``fedjax-dp run --resume DIR`` (or the
command again, when nothing was written) must finish the run, equal to an uninterrupted one,
with ``result.json`` absent or valid JSON at every moment it was looked at. Writes one JSON.

    sudo python tools/bench_disk_full.py --out results/robustness/disk_full.json
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_signal_storm import CONFIG, _cli, _same


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=4096, help="tmpfs size, KiB")
    ap.add_argument("--max-free", type=int, default=160, help="largest free space, KiB")
    ap.add_argument("--step", type=int, default=4, help="KiB")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="disk_full_"))
    cfg = work / "small.toml"
    cfg.write_text(CONFIG.replace("rounds = 12", "rounds = 6"))
    env = dict(os.environ, JAX_PLATFORMS="cpu", FEDJAX_DP_CACHE_DIR=str(work / "cache"))
    subprocess.run(_cli() + ["run", str(cfg), "--out", str(work / "ref"), "--quiet"], env=env,
                   check=True, capture_output=True)
    reference = _same(json.loads((work / "ref" / "result.json").read_text()))
    mnt = work / "tmpfs"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={args.size}k", "tmpfs", str(mnt)],
                   check=True)
    rows = []
    try:
        for free in range(args.max_free, -1, -args.step):
            for p in mnt.iterdir():
                subprocess.run(["rm", "-rf", str(p)], check=True)
            avail = os.statvfs(mnt).f_bavail * os.statvfs(mnt).f_frsize
            with open(mnt / "ballast", "wb") as f:
                f.write(b"\0" * max(0, avail - free * 1024))
            out = mnt / "run"
            r = subprocess.run(_cli() + ["run", str(cfg), "--out", str(out), "--quiet"],
                               env=env, capture_output=True, text=True)
            lines = [x for x in r.stderr.strip().splitlines() if x.strip()]
            result = out / "result.json"
            valid = True
            if result.exists():
                try:
                    json.loads(result.read_text())
                except ValueError:
                    valid = False
            row = {"free_kib": free, "rc": r.returncode, "line": lines[-1] if lines else "",
                   "one_line": r.returncode == 0 or (len(lines) == 1 and
                                                     "Traceback" not in r.stderr),
                   "result_absent_or_valid": valid}
            (mnt / "ballast").unlink()
            if r.returncode != 0:
                again = (["run", "--resume", str(out)] if (out / "config.json").exists()
                         else ["run", str(cfg), "--out", str(out)])
                rr = subprocess.run(_cli() + again + ["--quiet"], env=env, capture_output=True,
                                    text=True)
                row["resume_rc"] = rr.returncode
                row["resume_line"] = rr.stderr.strip().splitlines()[-1:] if rr.returncode else []
            row["equal"] = result.is_file() and _same(json.loads(result.read_text())) == reference
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
    summary = {"runs": len(rows), "failed_writes": sum(r["rc"] != 0 for r in rows),
               "all_one_line": all(r["one_line"] for r in rows),
               "all_results_absent_or_valid": all(r["result_absent_or_valid"] for r in rows),
               "all_resumed_equal": all(r["equal"] for r in rows),
               "exit_status": sorted({r["rc"] for r in rows})}
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"summary": summary, "runs": rows}, indent=1))
    return 0 if summary["all_one_line"] and summary["all_resumed_equal"] and \
        summary["all_results_absent_or_valid"] else 1


if __name__ == "__main__":
    sys.exit(main())
