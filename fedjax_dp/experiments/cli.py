"""``fedjax-dp`` command line: ``run``, ``list``, ``account``.

    fedjax-dp run CONFIG [--set key=value ...] [--out DIR] [--quiet]
    fedjax-dp list [--json]
    fedjax-dp account sampled-gaussian --noise-multiplier Z --sampling-rate Q --steps T --delta D
    fedjax-dp account gaussian --noise-multiplier Z --count K --delta D

Errors in the arguments or the config print one line naming the parameter and exit with status 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ACCOUNTANTS = ("rdp", "pld")


def _cmd_run(args) -> int:
    from fedjax_dp.experiments import config as config_lib
    from fedjax_dp.experiments import runner
    config = config_lib.load(args.config, args.set or [])
    runner.plan(config)          # fail on a bad config before loading data or compiling
    out = Path(args.out) if args.out else Path("runs") / Path(args.config).stem
    result = runner.run(config, out, progress=not args.quiet)
    print(json.dumps({"result": str(out / "result.json"),
                      "test_accuracy": result["test_accuracy"],
                      "privacy": [{k: g[k] for k in ("unit", "epsilon", "delta", "accountant",
                                                     "data_dependent")}
                                  for g in result["privacy"]]}, indent=2))
    return 0


def _cmd_list(args) -> int:
    from fedjax_dp import data
    from fedjax_dp.experiments import registry
    from fedjax_dp.models import MODELS
    listing = {
        "algorithms": {k: v.description for k, v in registry.ALGORITHMS.items()},
        "datasets": sorted(data.DATASETS),
        "partitions": sorted(data.PARTITIONS),
        "models": list(MODELS),
        "accountants": list(ACCOUNTANTS),
    }
    if args.json:
        print(json.dumps(listing, indent=2))
    else:
        for section, items in listing.items():
            print(f"{section}:")
            if isinstance(items, dict):
                for k, v in items.items():
                    print(f"  {k:<12} {v}")
            else:
                for k in items:
                    print(f"  {k}")
    return 0


def _report(event, delta: float, accountants, extra: dict) -> dict:
    from fedjax_dp.privacy import accounting
    return {**extra, "delta": delta,
            "epsilon": {a: accounting.epsilon(event, delta, accountant=a) for a in accountants},
            "event": accounting.event_to_json(event)}


def _cmd_account(args) -> int:
    from fedjax_dp.core import validation
    from fedjax_dp.privacy import accounting
    validation.check_open_unit("--delta", args.delta)
    accountants = ACCOUNTANTS if args.accountant == "both" else (args.accountant,)
    if args.mechanism == "sampled-gaussian":
        event = accounting.sampled_gaussian_event(args.noise_multiplier, args.sampling_rate,
                                                  args.steps)
        extra = {"mechanism": "sampled-gaussian", "noise_multiplier": args.noise_multiplier,
                 "sampling_rate": args.sampling_rate, "steps": args.steps}
    else:
        event = accounting.gaussian_event(args.noise_multiplier, args.count)
        extra = {"mechanism": "gaussian", "noise_multiplier": args.noise_multiplier,
                 "count": args.count}
    print(json.dumps(_report(event, args.delta, accountants, extra), indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="fedjax-dp", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one experiment from a config file")
    run.add_argument("config", help="TOML config (see configs/)")
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a config value, e.g. --set algorithm.rounds=5")
    run.add_argument("--out", help="output folder for result.json (default runs/<config name>)")
    run.add_argument("--quiet", action="store_true", help="no progress display")
    run.set_defaults(func=_cmd_run)

    lst = sub.add_parser("list", help="list algorithms, datasets, partitions and models")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(func=_cmd_list)

    acc = sub.add_parser("account", help="epsilon for a mechanism, without training")
    mech = acc.add_subparsers(dest="mechanism", required=True)
    sg = mech.add_parser("sampled-gaussian",
                         help="Poisson-subsampled Gaussian composed over steps (DP-FedAvg, DP-SGD)")
    sg.add_argument("--noise-multiplier", type=float, required=True)
    sg.add_argument("--sampling-rate", type=float, required=True)
    sg.add_argument("--steps", type=int, required=True)
    g = mech.add_parser("gaussian", help="Gaussian mechanism composed count times")
    g.add_argument("--noise-multiplier", type=float, required=True)
    g.add_argument("--count", type=int, required=True)
    for p in (sg, g):
        p.add_argument("--delta", type=float, required=True)
        p.add_argument("--accountant", choices=ACCOUNTANTS + ("both",), default="both")
    acc.set_defaults(func=_cmd_account)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as e:  # invalid parameter or config: one clear line, no traceback
        print(f"fedjax-dp: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
