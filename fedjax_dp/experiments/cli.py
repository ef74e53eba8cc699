"""``fedjax-dp`` command line (``fedjax-dp COMMAND --help`` lists each command's flags).

Errors in the arguments or the config print one line naming the parameter and exit with status 2."""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ACCOUNTANTS = ("rdp", "pld")


def _need_matplotlib(flag: str) -> None:
    import importlib.util
    if importlib.util.find_spec("matplotlib") is None:
        raise ValueError(f"{flag} needs matplotlib: pip install 'fedjax-dp[plot]'")


def _cmd_run(args) -> int:
    from fedjax_dp.core import stop
    out = Path(args.resume or args.out) if (args.resume or args.out) else None
    try:
        result, out = _start_run(args)
    except KeyboardInterrupt as e:
        if _GROUP:                                # every process stopped after the same step
            group = _GROUP[-1]
            e.fedjax_dp_stop = (getattr(e, "fedjax_dp_stop", None) or
                                f"process {group.index} of {group.count} stopped with the others"
                                ) + f"; {group.resume_hint}"
            _leave(ok=False)
            raise
        if not hasattr(e, "fedjax_dp_stop"):      # before the run began: nothing written
            again = ("run the same command again" if out is None else
                     f"start it with: fedjax-dp run {args.config} --resume {out}" if args.config
                     else f"start it with: fedjax-dp run --resume {out}")
            e.fedjax_dp_stop = f"stopped before the run began (nothing written); {again}"
        raise
    try:
        if _GROUP and not _GROUP[-1].is_writer:   # process 0 reports; the others finish
            _leave(ok=True)
            return 0
        status = _report_run(args, result, out)
        _leave(ok=True)
        stop.check()                              # a signal a callback swallowed, after it
        return status
    except KeyboardInterrupt as e:                # the run had finished: its result is whole
        e.fedjax_dp_stop = (f"the run had finished; its result is {out / 'result.json'} "
                            f"(fedjax-dp run --resume {out} prints it)")
        raise


def _start_run(args) -> tuple[dict, Path]:
    """``run``'s config (a file, or a run folder's own), checked, then the run."""
    from fedjax_dp.experiments import config as config_lib
    from fedjax_dp.experiments import runner, shipped
    if args.plot:
        _need_matplotlib("--plot")           # before any work, not after the run
    source = None                            # result.json's config_source
    if args.resume:
        out = Path(args.resume)
        if args.out and Path(args.out) != out:
            raise ValueError("--out must be omitted (or equal --resume DIR) when resuming")
        if args.config is None:              # the run's own config (plus execution overrides)
            if not (out / "config.json").is_file():
                raise ValueError(f"--resume {str(out)!r} holds no run (no config.json); "
                                 f"fedjax-dp run CONFIG --resume {out} starts it there")
            config = config_lib.resolve(runner.read_config(out), args.set or [])
            source = {"kind": "run folder", "path": str((out / "config.json").resolve())}
        else:                                # a run's folder, or a new one to start it in
            path, source = shipped.resolve(args.config)     # a file, else a shipped config
            config = config_lib.load(path, args.set or [])
    else:
        if args.config is None:
            raise ValueError("CONFIG is required (a TOML file under configs/), unless "
                             "--resume DIR continues an earlier run")
        path, source = shipped.resolve(args.config)         # a file, else a shipped config
        config = config_lib.load(path, args.set or [])
        out = Path(args.out) if args.out else runner.fresh_out("runs", path.stem)
    runner.plan(config)          # fail on a bad config before loading data or compiling
    _process_spec(args, config)  # the multi-process flags checked before any work
    from fedjax_dp.core import compilation
    compilation.enable_cache(config["run"]["compilation_cache"])   # before anything compiles
    group, out = _join(args, config, out)
    result = runner.run(config, out, progress=not args.quiet and (group is None or
                                                                   group.is_writer),
                        resume=bool(args.resume), config_source=source, group=group)
    return result, out


def _report_run(args, result: dict, out: Path) -> int:
    """The JSON report a finished run prints on stdout (and ``--plot``'s curve)."""
    report = {"result": str(out / "result.json"),
              "test_accuracy": result["test_accuracy"],
              "privacy": [{k: g[k] for k in ("unit", "epsilon", "delta", "accountant",
                                             "data_dependent")}
                          for g in result["privacy"]]}
    for g, row in zip(result["privacy"], report["privacy"]):
        if g.get("covers_all_releases") is False:
            row["not_covered"] = g.get("not_covered", "")
    if result.get("non_finite"):
        report["non_finite"] = result["non_finite"]
    if args.plot:
        report["plot"] = plot_run(result, out)
    print(json.dumps(report, indent=2))
    return 0


def plot_run(result: dict, out: Path) -> list[str] | None:
    """``run --plot``: the run's training curve; a run whose history has nothing to draw still
    succeeded, so that is a warning, not an error."""
    from fedjax_dp.experiments import plots
    try:
        return plots.plot_run(result, out)
    except ValueError as e:
        print(f"fedjax-dp: warning: --plot: no training curve written: {e}", file=sys.stderr)
        return None


def _cmd_sweep(args) -> int:
    from fedjax_dp.experiments import runner, shipped, sweep
    paths = [str(shipped.resolve(c)[0]) for c in args.configs]    # files, else shipped configs
    sw = sweep.load(paths, grid=args.grid or [], seeds=args.seeds,
                    target_epsilon=args.target_epsilon, calibrate=args.calibrate or [],
                    overrides=args.set or [], select=args.select,
                    select_over=args.select_over, unit=args.unit)
    limits = _edge_limits(args.edge_limit or [])
    if args.extend_edges is not None and (args.extend_edges < 1 or sw.select is None):
        raise ValueError(f"--extend-edges must be a number of rounds >= 1 with --select "
                         f"val_accuracy (the file's or the flag), got {args.extend_edges}"
                         f"{'' if sw.select else ' and no --select'}")
    if limits and args.extend_edges is None:
        raise ValueError("--edge-limit bounds --extend-edges, which is not given: it would "
                         "change nothing")
    if args.dry_run:                       # validate every run, list them, run nothing
        idle = [flag for flag, given in (
            ("--out", args.out), ("--resume", args.resume), ("--extend-edges", args.extend_edges),
            ("--no-vmap-seeds", args.no_vmap_seeds), ("--quiet", args.quiet),
            ("--compilation-cache", args.compilation_cache != "user")) if given]
        if idle:
            raise ValueError(f"{idle[0]} does not apply with --dry-run, which runs, writes and "
                             f"logs nothing (it prints the plan)")
        runs = sweep.expand(sw)
        print(json.dumps({"name": sw.name, "runs": len(runs),
                          "cells": len({r.cell for r in runs}),
                          "bases": [n for n, _ in sw.bases], "grid": sw.grid,
                          "seeds": sw.seeds, "target_epsilon": sw.target_epsilon,
                          "calibrate": sw.calibrate, "unit": sw.unit, "set": sw.overrides,
                          "select": sw.select, "select_over": sw.select_over}, indent=2))
        return 0
    if args.resume:
        if args.out and Path(args.out) != Path(args.resume):
            raise ValueError("--out must be omitted (or equal --resume DIR) when resuming")
        out = Path(args.resume)
    else:
        out = Path(args.out) if args.out else runner.fresh_out("runs/sweeps", sw.name)
    say = (lambda msg: None) if args.quiet else (lambda msg: print(msg, file=sys.stderr,
                                                                     flush=True))
    from fedjax_dp.core import compilation
    compilation.enable_cache(args.compilation_cache)
    from fedjax_dp.core import files
    group = None
    if _process_spec(args, {"run": {}}) is not None:
        if args.extend_edges:
            raise ValueError("--extend-edges runs in one process (its selection reads the "
                             "records between rounds); run the sweep on several, then extend it "
                             "with --resume DIR --extend-edges R in one")
        group, out = _join(args, {"run": {}}, out, command="sweep")
        if not group.is_writer:
            sweep.follow(sw, group)
            _leave(ok=True)
            return 0
    try:             # the folder is this process's for the whole command (a second is refused)
        with sweep.hold(out, what="--resume" if args.resume else "--out",
                        resume=bool(args.resume)):
            if not (args.extend_edges and args.resume):     # resumed: only the extension
                records = sweep.run(sw, out, resume=bool(args.resume),
                                    vmap_seeds=not args.no_vmap_seeds,
                                    progress=not args.quiet, log=say, group=group)
            if args.extend_edges:
                records = sweep.extend_edges(sw, out, rounds=args.extend_edges, limits=limits,
                                             vmap_seeds=not args.no_vmap_seeds, log=say)
    except BaseException as e:
        if group is not None and not group.told:          # the others wait for a word
            from fedjax_dp.experiments import processes
            processes.tell(group, {"error": str(e) or type(e).__name__})
        if isinstance(e, (files.FolderBusyError, files.UntrustedFileError)):
            raise                        # another sweep's folder, or a file refused: no work
        done = out / "results.jsonl"
        kept = len(done.read_text().splitlines()) if done.is_file() else 0
        if kept == 0 and isinstance(e, ValueError):       # refused before any run
            raise
        e.fedjax_dp_stop = (f"the sweep stopped with {kept} finished run(s) kept in {out}; "
                            + (group.resume_hint if group is not None else
                               f"resume with the same command plus --resume {out}"))
        raise
    if not args.quiet:
        print((out / "summary.md").read_text(), file=sys.stderr)
        if (out / "selected.md").exists():
            print((out / "selected.md").read_text(), file=sys.stderr)
    print(json.dumps({"results": str(out / "results.jsonl"), "runs": len(records),
                      "summary_csv": str(out / "summary.csv"),
                      "summary_md": str(out / "summary.md")}, indent=2))
    _leave(ok=True)
    return 0


def _edge_limits(items: list[str]) -> dict[str, tuple]:
    """``--edge-limit KEY=LO:HI`` (either side may be empty) -> {key: (lo, hi)}."""
    out = {}
    for item in items:
        key, _, bounds = item.partition("=")
        lo, sep, hi = bounds.partition(":")
        try:
            if not key or not sep:
                raise ValueError
            out[key.strip()] = tuple(None if not b.strip() else json.loads(b) for b in (lo, hi))
            if not all(v is None or type(v) in (int, float) for v in out[key.strip()]):
                raise ValueError
        except ValueError:
            raise ValueError(f"--edge-limit expects KEY=LO:HI with numbers (either side may be "
                             f"empty, e.g. algorithm.num_queries=:1000), got {item!r}") from None
    return out


def _cmd_configs(args) -> int:
    """``fedjax-dp configs list | show NAME | copy NAME [DEST]``: the shipped configs
    (:mod:`fedjax_dp.experiments.shipped`), read as data."""
    from fedjax_dp.experiments import shipped
    if args.action == "list":
        rows = [shipped.describe(n) for n in shipped.names()]
        if args.json:
            print(json.dumps({"root": str(shipped.root()), "configs": rows}, indent=2))
        else:
            width = max(len(r["name"]) for r in rows)
            for r in rows:
                print(f"{r['name']:<{width}}  {r['kind']:<5}  {r['description'][:100]}")
        return 0
    path = shipped.path_of(args.name)
    if path is None:
        raise shipped.unknown(args.name)
    if args.action == "show":
        shipped.describe(args.name)               # read as a config first: bounded, TOML
        sys.stdout.write(path.read_text(encoding="utf-8"))
        return 0
    written = shipped.copy(args.name, args.dest)
    for target in written:
        print(target)
    first = written[0]
    cmd = "sweep" if shipped.describe(args.name)["kind"] == "sweep" else "run"
    print(f"edit it, then: fedjax-dp {cmd} {first}", file=sys.stderr)
    return 0


def _cmd_list(args) -> int:
    from fedjax_dp import data
    from fedjax_dp.stages import stage_kinds
    from fedjax_dp.algorithms import registry
    from fedjax_dp.models import MODELS
    listing = {
        "algorithms": {k: v.DESCRIPTION for k, v in registry.algorithms().items()},
        "datasets": sorted(data.DATASETS),
        "partitions": sorted(data.PARTITIONS),
        "models": list(MODELS),
        "accountants": list(ACCOUNTANTS),
        "stages": stage_kinds(),
    }
    if args.json:
        print(json.dumps(listing, indent=2))
    else:
        for section, items in listing.items():
            print(f"{section}:")
            if section == "stages":
                _print_stages(items)
            elif isinstance(items, dict):
                for k, v in items.items():
                    print(f"  {k:<12} {v}")
            else:
                for k in items:
                    print(f"  {k}")
    return 0


def _print_stages(kinds: dict) -> None:
    """The stage kinds a round chains (docs/mechanisms.md: which compose), each option with
    the config keys that select it and its options."""
    for kind, options in kinds.items():
        print(f"  {kind}:")
        for o in options:
            print(f"    {o['name']:<12} {o['summary']}")
            if o["config"]:
                print(f"    {'':<12} config: {o['config']}")
            for key, meaning in o["options"].items():
                print(f"    {'':<12}   {key}: {meaning}")


def _report(event, delta: float, accountants, extra: dict) -> dict:
    from fedjax_dp.privacy import accounting
    return {**extra, "delta": delta,
            "epsilon": {a: accounting.epsilon(event, delta, accountant=a) for a in accountants},
            "event": accounting.event_to_json(event)}


def _cmd_account(args) -> int:
    from fedjax_dp.core import validation
    from fedjax_dp.privacy import accounting
    validation.check_open_unit("--delta", args.delta)
    if args.mechanism == "distributed":
        return _cmd_account_distributed(args)
    accountants = ACCOUNTANTS if args.accountant == "both" else (args.accountant,)
    if args.mechanism == "fedkt":
        return _cmd_account_fedkt(args, accountants)
    if args.mechanism == "gaussian-vote":
        from fedjax_dp.privacy import vote
        knn_instance = args.algorithm == "knn" and args.unit == "instance"
        if knn_instance and args.k is None:
            raise ValueError("--k must be given (an integer >= 1) with --algorithm knn --unit "
                             "instance")
        for flag, value in (("--k", args.k), ("--rule", args.rule)):
            if value is not None and not knn_instance:     # the sensitivity would ignore it
                raise ValueError(f"{flag} applies to --algorithm knn --unit instance only (here "
                                 f"the sensitivity is "
                                 f"{'1' if args.unit == 'agent' else 'sqrt(2)'} whatever it is)")
        rule = args.rule or "derived"
        ballot = "neighbour_counts" if knn_instance else "one_hot"  # agent level: 1 for both
        sens = vote.vote_sensitivity(args.unit, ballot, args.k, rule)
        event = vote.vote_event(args.sigma, args.queries, sens)
        extra = {"mechanism": "gaussian-vote", "algorithm": args.algorithm, "unit": args.unit,
                 "relation": vote.RELATIONS[args.unit], "sigma": args.sigma,
                 "queries": args.queries, "k": args.k, "rule": rule if knn_instance else None,
                 "sensitivity": sens, "noise_multiplier": args.sigma / sens}
        print(json.dumps(_report(event, args.delta, accountants, extra), indent=2))
        return 0
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


def _cmd_account_distributed(args) -> int:
    """DDG / Skellam under secure aggregation: the plan (scale, noise, rounded norm) and the
    run's epsilon for a noise multiplier, or the smallest noise multiplier for a target epsilon
    (:mod:`fedjax_dp.privacy.distributed_accounting`)."""
    import dataclasses
    from fedjax_dp.privacy import distributed_accounting as da
    if (args.noise_multiplier is None) == (args.target_epsilon is None):
        raise ValueError("give exactly one of --noise-multiplier and --target-epsilon")
    from fedjax_dp.core import validation
    from fedjax_dp.privacy import delta_bound
    population = validation.check_int("--population", args.population, minimum=1)
    delta_bound.check(args.delta, ("agent",), agents=population, key="--delta",
                      override="pass --allow-large-delta", allow=args.allow_large_delta)
    common = dict(clip=args.clip, dim=args.dim, cohort=args.cohort, bits=args.bits,
                  k_stddevs=args.k_stddevs, beta=args.beta, min_survivors=args.min_survivors)
    z = args.noise_multiplier
    if z is None:
        z = da.calibrate(args.kind, target_epsilon=args.target_epsilon, delta=args.delta,
                         population=args.population, rounds=args.rounds, **common)
    plan = da.plan(args.kind, noise_multiplier=z, **common)
    rdp = da.run_rdp(args.kind, da.ORDERS, scaled_clip=args.clip / plan.scale,
                     dim=plan.padded_dim, beta=plan.beta, total_variance=plan.total_variance,
                     cohort=args.cohort, min_survivors=plan.min_survivors,
                     population=args.population, rounds=args.rounds)
    print(json.dumps({"mechanism": "distributed", "kind": args.kind,
                      "relation": "replace one agent's entire local dataset",
                      "noise_multiplier": z, "calibrated": args.target_epsilon is not None,
                      "epsilon": da.epsilon(da.ORDERS, rdp, args.delta), "delta": args.delta,
                      "population": args.population, "rounds": args.rounds,
                      "plan": dataclasses.asdict(plan)}, indent=2))
    return 0


def _cmd_account_fedkt(args, accountants) -> int:
    from fedjax_dp.algorithms.fedkt import files as fedkt_files
    from fedjax_dp.algorithms.fedkt import privacy as fedkt_privacy
    units = ("party", "example") if args.unit == "both" else (args.unit,)
    # where a flag would change nothing printed, it is refused (before the votes are read)
    unused = {"--z": (args.z is not None, "the L1 example level's k", args.level == "L1"
                      and "example" in units),
              "--example-rule": (args.example_rule is not None, "the L1 example level's k",
                                 args.level == "L1" and "example" in units),
              "--t": (args.t is not None, "the L2 party level's k (an example's k is 1)",
                      args.level == "L1" or "party" in units)}    # L1: the run's command has it
    for flag, (given, what, applies) in unused.items():
        if given and not applies:
            raise ValueError(f"{flag} sets {what} only: it changes nothing with --level "
                             f"{args.level} --unit {args.unit}")
    votes, z_file = fedkt_files.load_votes(args.votes)
    report = fedkt_privacy.account(votes, level=args.level, gamma=args.gamma, delta=args.delta,
                                   num_partitions=args.s,
                                   num_teachers=5 if args.t is None else args.t,
                                   z=args.z if args.z is not None else z_file, units=units,
                                   moment_orders=args.orders,
                                   example_rule=args.example_rule or "consistent",
                                   accountants=accountants)
    print(json.dumps(report, indent=2))
    return 0


#: ``fedjax-dp audit`` flags -> the mechanisms' parameter names (:mod:`fedjax_dp.audit.harness`).
AUDIT_PARAMS = {"sigma": float, "noise_multiplier": float, "clip": float, "gamma": float,
                "k": int, "unit": str, "ballot": str, "noise": str, "num_agents": int,
                "num_classes": int, "num_teachers": int, "gap": int, "num_examples": int,
                "num_records": int, "canary_scale": float, "noise_trials": int,
                "granularity": int, "accountant": str}
#: the audit flags with a default, filled in where they apply (given elsewhere, they are refused)
AUDIT_DEFAULTS = {"trials": 100_000, "seed": 0, "confidence": 0.95, "canaries": 1000,
                  "significance": 0.05}
#: flags of the one-run audit only (``fedjax-dp audit run``), and of the single releases only
AUDIT_RUN_ONLY = ("config", "set", "canaries", "significance")
AUDIT_MECHANISM_ONLY = ("trials", "seed", "confidence")
#: the mechanism parameters ``audit run`` takes (the others are the config's: ``--set``)
AUDIT_RUN_PARAMS = ("canary_scale", "accountant")
#: where ``audit run`` takes a mechanism flag's value from instead
AUDIT_RUN_KEYS = {"noise_multiplier": "algorithm.noise_multiplier", "clip": "algorithm.clip_norm",
                  "num_agents": "data.num_agents", "num_classes": "the data set"}
#: config keys of [run] that a one-run audit reads (the others are a run's outputs: progress,
#: checkpoints, evaluations, logs, the non-finite check, rounds per compiled call)
AUDIT_RUN_READS = ("run.chunk_size", "run.agents_on", "run.compilation_cache")


def _audit_flag(name: str) -> str:
    """The flag of an audit argument or mechanism parameter (``clip_norm`` -> ``--clip``)."""
    return "--clip" if name in ("clip", "clip_norm") else "--" + name.replace("_", "-")


def _given(args, name: str) -> bool:
    return getattr(args, name) not in (None, [])


def _cmd_audit(args) -> int:
    from fedjax_dp.algorithms import registry
    from fedjax_dp.audit import audit, harness
    registry.algorithms()                    # imports every family: their audit harnesses register
    try:
        if args.mechanism == "run":
            print(json.dumps(_audit_run(args), indent=2))
            return 0
        for name in AUDIT_RUN_ONLY:
            if _given(args, name):
                raise ValueError(f"{_audit_flag(name)} goes with the mechanism \"run\" "
                                 f"(fedjax-dp audit run --config CONFIG --canaries M), not with "
                                 f"{args.mechanism!r}")
        params = {name: getattr(args, name) for name in AUDIT_PARAMS if _given(args, name)}
        spec = harness.MECHANISMS.get(args.mechanism)
        for name in params:                  # named by its flag (audit() names the parameter)
            if spec is not None and ("clip_norm" if name == "clip" else name) not in spec.defaults:
                raise ValueError(f"{_audit_flag(name)} ({'clip_norm' if name == 'clip' else name})"
                                 f" is not a parameter of mechanism {args.mechanism!r}; its flags "
                                 f"are {', '.join(sorted(map(_audit_flag, spec.defaults)))}")
        if "clip" in params:
            params["clip_norm"] = params.pop("clip")
        d = {name: getattr(args, name) if _given(args, name) else AUDIT_DEFAULTS[name]
             for name in AUDIT_MECHANISM_ONLY}
        result = audit(args.mechanism, trials=d["trials"],
                       delta=1e-5 if args.delta is None else args.delta, seed=d["seed"],
                       confidence=d["confidence"], weaken=args.weaken, **params)
    except harness.ParameterError as e:      # the parameter's name -> its flag
        raise ValueError(f"{_audit_flag(e.param)} {e.reason}") from None
    print(json.dumps(result.to_json(), indent=2))
    return 0


def _audit_run(args) -> dict:
    """``fedjax-dp audit run --config CONFIG``: the one-run audit of the config's run, canary
    agents inserted (:mod:`fedjax_dp.audit.one_run`), its lower bound beside the ledger's. Every
    flag it would not use is refused with one line before any work."""
    from fedjax_dp.audit import one_run
    from fedjax_dp.experiments import config as config_lib
    from fedjax_dp.experiments import runner
    for name in AUDIT_MECHANISM_ONLY:
        if _given(args, name):
            why = {"trials": "a one-run audit trains once; its sample is the --canaries",
                   "seed": "the run's seed is the config's (--set seed=N)",
                   "confidence": "its bound holds with probability 1 - --significance"}[name]
            raise ValueError(f"{_audit_flag(name)} does not apply to audit run: {why}")
    for name in AUDIT_PARAMS:
        if name not in AUDIT_RUN_PARAMS and _given(args, name):
            key = AUDIT_RUN_KEYS.get(name)
            where = (f"--set {key}=VALUE" if key and "." in key else key) or "--set KEY=VALUE"
            raise ValueError(f"{_audit_flag(name)} is a parameter of the single-release "
                             f"mechanisms, not of audit run: the run is its config's "
                             f"({where})")
    if args.config is None:
        raise ValueError("fedjax-dp audit run needs --config CONFIG (a run config)")
    keys = [item.partition("=")[0].strip() for item in args.set or []]
    for key in keys:
        if key.startswith("run.") and key not in AUDIT_RUN_READS:
            raise ValueError(f"--set {key} does not apply to audit run: it writes no progress, "
                             f"checkpoint, evaluation or log (it reads "
                             f"{', '.join(AUDIT_RUN_READS)} of [run])")
    for flag, key in (("delta", "privacy.delta"), ("accountant", "privacy.accountants")):
        if _given(args, flag) and key in keys:
            raise ValueError(f"--{flag} and --set {key} both set the audit's {flag}: give one")
    from fedjax_dp.experiments import shipped
    config = config_lib.load(shipped.resolve(args.config)[0], args.set or [])
    plan = runner.plan(config)
    name = config["algorithm"]["name"]
    if name not in one_run.RUN_AUDITS:
        raise ValueError(f"algorithm.name = {name!r} has no one-run audit; one of "
                         f"{sorted(one_run.RUN_AUDITS)}")
    delta = config["privacy"]["delta"] if args.delta is None else args.delta
    accountant = args.accountant or config["privacy"]["accountants"][0]
    canaries = AUDIT_DEFAULTS["canaries"] if args.canaries is None else args.canaries
    significance = (AUDIT_DEFAULTS["significance"] if args.significance is None
                    else args.significance)
    if canaries < 2 or not 0 < significance < 1:
        raise ValueError(f"--canaries must be >= 2 and --significance in (0, 1), got "
                         f"{canaries} and {significance}")
    if accountant not in ACCOUNTANTS:
        raise ValueError(f"--accountant must be one of {list(ACCOUNTANTS)}, got {accountant!r}")
    one_run.RUN_CHECKS[name](plan.algorithm_config, canary_scale=args.canary_scale,
                             weaken=args.weaken)           # before loading any data
    from fedjax_dp.core import compilation
    compilation.enable_cache(config["run"]["compilation_cache"])   # as fedjax-dp run
    s = runner.setup(config)
    scores = one_run.RUN_AUDITS[name](s.key, s.fed, s.model, plan.algorithm_config,
                                      canaries=canaries, canary_scale=args.canary_scale,
                                      delta=delta, accountant=accountant, weaken=args.weaken,
                                      chunk_size=config["run"]["chunk_size"] or None)
    return {"config": str(args.config), "algorithm": name,
            **one_run.report(scores, significance=significance)}


def _check_out_stem(stem: str | None) -> None:
    """``--out STEM``: the folder its files go to can be made there, checked before any work."""
    if not stem:
        return
    for folder in [Path(stem).parent, *Path(stem).parent.parents]:
        if folder.exists():
            if not folder.is_dir():
                raise ValueError(f"--out {stem!r}: {str(folder)!r} is a file, not a folder")
            if not os.access(folder, os.W_OK):
                raise ValueError(f"--out {stem!r}: {str(folder)!r} is not writable")
            return


def _cmd_plot(args) -> int:
    import re
    import warnings
    from fedjax_dp.experiments import plots, records
    _need_matplotlib("fedjax-dp plot")
    _check_out_stem(args.out)
    recs = records.read(args.results)
    if not recs:
        raise ValueError(f"RESULTS {[str(p) for p in args.results]} hold no records "
                         f"(an empty results file?)")
    if args.selected:          # only the runs of the cells --select chose, a line per row
        recs = records.selected_records(recs, records.read_selected(args.results))
        if args.hue == "algorithm":
            args.hue = "setting"
    hue = None if args.hue.lower() in ("", "none") else args.hue
    first = Path(args.results[0])
    folder = first if first.is_dir() else first.parent

    def stem(y: str, x: str) -> Path:
        if args.out:
            return Path(args.out)
        return folder / re.sub(r"[^A-Za-z0-9._-]+", "_", f"plot_{y}_vs_{x}")

    labels = {}
    for item in args.label or []:          # --label KEY=TEXT: a display name replaced
        key, eq, text = item.partition("=")
        if not eq or not key.strip() or not text.strip():
            raise ValueError(f"--label: expected KEY=TEXT (e.g. dp_fedavg=DP-FedAvg), got "
                             f"{item!r}")
        labels[key.strip()] = text.strip()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if args.curve:
                if args.x not in (None, "round"):
                    raise ValueError("--x does not apply with --curve: curves are drawn "
                                     "against the round")
                if args.logx is not None:
                    raise ValueError("--logx / --no-logx do not apply with --curve")
                if args.reference is not None:
                    raise ValueError("--reference does not apply with --curve: a reference "
                                     "band is drawn on a metric-against-parameter plot")
                y = args.y or plots.default_curve_metric(recs)
                written = plots.plot_curves(recs, y=y, hue=hue, out_stem=stem(y, "round"),
                                            title=args.title, labels=labels)
            else:
                x, y = args.x or "epsilon", args.y or "test_accuracy"
                reference = None
                if args.reference is not None:
                    key, eq, value = args.reference.partition("=")
                    if not eq or not key:
                        raise ValueError(f"reference: expected KEY=VALUE, got "
                                         f"{args.reference!r}")
                    reference = (key.strip(), value.strip())
                written = plots.plot_xy(recs, x, y, hue, stem(y, x), title=args.title,
                                        logx=args.logx, reference=reference, labels=labels)
        except ValueError as e:                  # "x: ..." -> "--x: ...": the flag's name
            msg = str(e)
            if msg.split(":")[0] in ("x", "y", "hue", "logx", "reference"):
                raise ValueError("--" + msg) from None
            raise
    for w in caught:
        print(f"fedjax-dp: warning: {w.message}", file=sys.stderr)
    print(json.dumps({"written": written, "records": len(recs)}, indent=2))
    return 0


def _cmd_compare(args) -> int:
    from fedjax_dp.experiments import compare
    _check_out_stem(args.out)
    if args.compare_command == "selected":
        names = args.names.split(",") if args.names else None
        rows = args.rows.split(",") if args.rows else None
        md, data = compare.selected_table(args.sweeps, names=names, rows=rows,
                                          ceiling=args.ceiling, title=args.title or "",
                                          tuning=args.tuning_cost)
        if args.tuning_cost and not any(r["tuning_cost"] for r in data["rows"]):
            print("fedjax-dp: warning: --tuning-cost: no chosen cell's runs hold dp-accounting "
                  "events to compose (records without a privacy list, or a shuffle guarantee): "
                  "no tuning cost in the table", file=sys.stderr)
        written = compare.write(args.out, md, data)
    else:
        from fedjax_dp.experiments import records
        recs = records.read(args.results)
        if args.selected:        # only the runs of the cells --select chose
            recs = records.selected_records(recs, records.read_selected(args.results))
        labels = args.labels.split(",") if args.labels else None
        data = compare.arms(recs, args.arm, unit=args.unit, labels=labels, metric=args.y)
        md = compare.arms_markdown(data, title=args.title or "",
                                   source=", ".join(map(str, args.results)))
        written = compare.write(args.out, md, {"sources": list(map(str, args.results)), **data})
        _need_matplotlib("fedjax-dp compare arms")
        written += compare.arms_plot(data, args.out, title=args.title or "")
    print(md, end="")
    print(json.dumps({"written": written}), file=sys.stderr)
    return 0


def _cmd_bench(args) -> int:
    from fedjax_dp.bench import suite as bench_suite
    only = [s for s in args.only.split(",") if s] if args.only else None
    bench_suite.check_request(args.suite, only, args.sizes, args.population)
    record = bench_suite.run(args.suite, args.out, only=only, sizes=args.sizes,
                             population=args.population,
                             log=lambda line: print(line, file=sys.stderr, flush=True))
    print(bench_suite.markdown(record), end="")
    if args.out:
        print(f"wrote {args.out}.json and {args.out}.md", file=sys.stderr)
    if record["errors"]:
        print(f"fedjax-dp: error: bench part(s) failed: {record['errors']}", file=sys.stderr)
        return 1
    return 0


def _cmd_data(args) -> int:
    from fedjax_dp.data import convert
    if args.seed is not None and args.max_test_records is None:
        raise ValueError("--seed draws --max-test-records' subset, which is not given: it would "
                         "change nothing")
    summary = convert.convert(args.format, args.src, args.dst, vocab_size=args.vocab_size,
                              vocab_file=args.vocab, seq_len=args.seq_len,
                              max_clients=args.max_clients, max_records=args.max_records,
                              max_test_records=args.max_test_records,
                              seed=0 if args.seed is None else args.seed,
                              progress=not args.quiet, split=args.split,
                              train_fraction=args.train_fraction, split_seed=args.split_seed,
                              window_stride=args.window_stride)
    summary["run_with"] = (f'data.dataset = "{summary["dataset"]}", data.num_agents = '
                           f'{summary["clients"]}')
    print(json.dumps(summary, indent=2))
    return 0


def _cmd_devices(args) -> int:
    from fedjax_dp.core import defaults as defaults_lib
    from fedjax_dp.core.memory import format_bytes
    info = defaults_lib.describe()
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"jax {info['jax']}: platform {info['platform']}, {len(info['devices'])} device(s), "
          f"{info['process_count']} process(es)")
    for dv in info["devices"]:
        mem = dv.get("memory_bytes")
        print(f"  {dv['repr']} ({dv['kind']}, process {dv['process']}"
              + (f", {format_bytes(mem)}" if mem else "") + ")")
    print("defaults (fedjax_dp.core.defaults, docs/devices.md):")
    for key, value in info["defaults"].items():
        print(f"  {key} = {value}")
    xla = info["xla_workarounds"]
    when = {False: "before any backend started", True: "after a backend had started",
            None: "unknown whether a backend had started"}[xla["backend_started_before"]]
    print(f"XLA flags for platform {xla['platform']} (decided at import, {when}): "
          f"XLA_FLAGS={xla['xla_flags']!r}")
    for flag in xla["flags"]:
        print(f"  {flag['flag']}: {flag['status']}, "
              f"{'in effect' if flag['in_effect'] else 'NOT in effect'}")
    if not xla["flags"]:
        print("  no workaround needed")
    return 0


def _cmd_selftest(args) -> int:
    from fedjax_dp.core import compilation
    from fedjax_dp.experiments import selftest
    cases = selftest.select(args.families.split(",") if args.families else None)
    compilation.enable_cache(args.compilation_cache)     # a second selftest loads, not compiles
    say = (lambda line: None) if args.json else (lambda line: print(line, flush=True))
    report = selftest.run(cases, log=say)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(selftest.summary(report))
    return 0 if report["passed"] else 1


def _cmd_show(args) -> int:
    from fedjax_dp.core import files
    from fedjax_dp.experiments import runner
    path = Path(args.run)
    folder = path.parent if path.name == "result.json" else path
    record = folder / "result.json"
    if not record.is_file():
        raise ValueError(f"RUN {args.run!r} is not a finished run's folder (no result.json"
                         f"{' there' if folder.is_dir() else '; no such folder'})")
    try:
        result = files.read_json(record, what="result", expect=dict)
    except files.UntrustedFileError as e:
        raise ValueError(f"RUN {args.run!r}: {e}") from None
    if not {"test_accuracy", "privacy"} <= set(result):
        raise ValueError(f"RUN {args.run!r}: {str(record)!r} is not a run's record")
    print("\n".join(runner.report_lines(result, folder)))
    return 0


#: ``fedjax-dp data convert`` formats (kept here so that building the parser imports no data
#: module; fedjax_dp.data.convert.FORMATS is the list the command checks against)
DATA_FORMATS = ("tff_emnist", "tff_emnist_digits", "tff_shakespeare", "tff_stackoverflow",
                "tff_cifar100", "leaf_femnist", "leaf_shakespeare", "leaf_sent140",
                "gutenberg_shakespeare")


def _process_flags(parser) -> None:
    """The flags of a multi-process run (docs/scale.md#several-hosts-from-the-command-line)."""
    g = parser.add_argument_group("several processes (the same command on every host)")
    g.add_argument("--coordinator", metavar="HOST:PORT", default=None,
                   help="process 0's address and a free port (jax.distributed)")
    g.add_argument("--num-processes", type=int, metavar="N", default=None,
                   help="processes in the job (default: detected from SLURM, Open MPI, a TPU "
                        "pod slice or JAX_* variables; else 1)")
    g.add_argument("--process-id", type=int, metavar="I", default=None,
                   help="this process's index, 0..N-1 (process 0 writes the run's files)")
    g.add_argument("--process-timeout", type=int, metavar="S", default=None,
                   help="seconds without a heartbeat after which a process counts as lost "
                        "and every other one stops (default 60)")


def _process_spec(args, config: dict):
    """The :class:`~fedjax_dp.experiments.processes.Spec` of flags, config and environment."""
    from fedjax_dp.experiments import processes
    return processes.resolve(
        {"coordinator": getattr(args, "coordinator", None),
         "num_processes": getattr(args, "num_processes", None),
         "process_id": getattr(args, "process_id", None),
         "timeout_s": getattr(args, "process_timeout", None)},
        config["run"].get("distributed") or {})


#: the job this command joined (None: one process); read by :func:`_main`'s error path
_GROUP: list = []


def _join(args, config: dict, out: Path | None, command: str = "run"):
    """Join the job the flags, config or environment describe (None: a single process), and
    agree on the run folder (process 0's). Returns ``(group, out)``."""
    spec = _process_spec(args, config)
    if spec is None:
        return None, out
    from fedjax_dp.core import stop
    from fedjax_dp.experiments import processes
    group = processes.initialize(spec)
    _GROUP.append(group)
    stop.set_agreement(group.agree_stop)
    shared = group.broadcast_bytes(str(out).encode() if group.is_writer and out else None)
    out = Path(shared.decode()) if shared else None
    flags = f"--coordinator {spec.coordinator} --num-processes {spec.num_processes} " \
            f"--process-id I" if spec.coordinator else "(in the same job environment)"
    group.resume_hint = (f"resume on every host with: fedjax-dp {command} "
                         f"{'SWEEP ' if command == 'sweep' else ''}--resume {out} {flags}"
                         if out is not None else "run the same command again on every host")
    group.start_watchdog()
    return group, out


def _leave(ok: bool) -> None:
    """End this process's part in the job: a barrier when it finished (no process leaves
    while another still works), then the watchdog stops and the processes leave JAX's job,
    process 0 (which hosts the coordination service) last. Every process gets here together
    (a finished command, an agreed stop, the same error); a lost process ends the others in
    the watchdog instead."""
    if not _GROUP:
        return
    group = _GROUP.pop()
    import jax
    from fedjax_dp.core import stop
    stop.set_agreement(None)
    try:
        if ok:
            group.sync("fedjax-dp: every process finished")
    finally:
        group.announce_leaving("finished" if ok else "stopped")
        group.stop_watchdog()
    if group.is_writer:              # the service lives in process 0: it leaves last
        group.wait_alone(group.spec.timeout_s)
    jax.distributed.shutdown()


def build_parser() -> argparse.ArgumentParser:
    import fedjax_dp
    parser = argparse.ArgumentParser(prog="fedjax-dp", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"fedjax-dp {fedjax_dp.version()}")
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run one experiment from a config file")
    run.add_argument("config", nargs="?", help="TOML config (see configs/)")
    run.add_argument("--set", action="append", metavar="KEY=VALUE",
                     help="override a config value, e.g. --set algorithm.rounds=5")
    run.add_argument("--out", help="a new output folder (default: runs/<config name>/<time>)")
    run.add_argument("--resume", metavar="DIR",
                     help="continue the run in DIR from its last checkpoint (CONFIG optional)")
    run.add_argument("--quiet", action="store_true", help="no progress display")
    run.add_argument("--plot", action="store_true", help="also write training_curve.png/.svg/.pdf")
    run.add_argument("--debug", action="store_true", help="the traceback, not one error line")
    _process_flags(run)
    run.set_defaults(func=_cmd_run)

    sw = sub.add_parser("sweep", help="grid of configs x target epsilons x seeds (docs/sweeps.md)")
    sw.add_argument("configs", nargs="+", metavar="CONFIG",
                    help="run configs and/or sweep files (a TOML with a [sweep] table)")
    sw.add_argument("--grid", action="append", metavar="KEY=V1,V2",
                    help="a config key and its values, e.g. --grid algorithm.sigma=5,10,20")
    sw.add_argument("--seeds", metavar="S|s1,s2", default=None,
                    help="a count S (seeds 0..S-1) or a list (default: the file's, else 0)")
    sw.add_argument("--target-epsilon", metavar="E1,E2", default=None,
                    help="calibrate --calibrate KEY so that each run's headline epsilon is E")
    sw.add_argument("--calibrate", action="append", metavar="[ALGORITHM=]KEY",
                    help="the config key to calibrate, for all or per algorithm")
    sw.add_argument("--set", action="append", metavar="KEY=VALUE",
                    help="override a config value in every run")
    sw.add_argument("--unit", default=None, metavar="UNIT",
                    help="the unit calibrated and reported (default: the algorithm's first)")
    sw.add_argument("--select", metavar="val_accuracy", default=None,
                    help="per algorithm and target, the grid point with this metric's best mean")
    sw.add_argument("--select-over", metavar="KEY1,KEY2", default=None,
                    help="the grid keys chosen over (default: all grid keys)")
    sw.add_argument("--out", help="output folder (default: a new runs/sweeps/<name>/<time>)")
    sw.add_argument("--resume", metavar="DIR", help="run only the runs missing from DIR")
    sw.add_argument("--no-vmap-seeds", action="store_true",
                    help="run seeds one by one even where they could share one vmapped call")
    sw.add_argument("--extend-edges", type=int, metavar="ROUNDS", default=None,
                    help="then, up to ROUNDS times, run the next grid value past every selected "
                         "cell's edge and select again (needs --select)")
    sw.add_argument("--edge-limit", action="append", metavar="KEY=LO:HI",
                    help="a hard limit --extend-edges never passes, e.g. "
                         "algorithm.batch_size=1:96")
    sw.add_argument("--dry-run", action="store_true", help="validate and print the plan only")
    sw.add_argument("--quiet", action="store_true", help="no progress or per-run lines")
    sw.add_argument("--debug", action="store_true", help="the traceback, not one error line")
    sw.add_argument("--compilation-cache", default="user", metavar="user|off|DIR",
                    help="JAX's persistent compilation cache (default: a user-level folder)")
    _process_flags(sw)
    sw.set_defaults(func=_cmd_sweep)

    cfg = sub.add_parser("configs", help="the shipped configs: list, show or copy one")
    csub = cfg.add_subparsers(dest="action", required=True)
    cl = csub.add_parser("list", help="every shipped config: name, kind (run / sweep), what")
    cl.add_argument("--json", action="store_true", help="print it as JSON")
    cl.set_defaults(func=_cmd_configs)
    cs_ = csub.add_parser("show", help="a shipped config's text")
    cs_.add_argument("name", metavar="NAME", help="e.g. dp_fedavg/mnist5k (configs list)")
    cs_.set_defaults(func=_cmd_configs)
    cc = csub.add_parser("copy", help="copy a shipped config (a sweep file with its bases) to "
                         "edit and run")
    cc.add_argument("name", metavar="NAME", help="e.g. dp_fedavg/mnist5k (configs list)")
    cc.add_argument("dest", metavar="DEST", nargs="?", default="configs",
                    help="a folder; the file lands at DEST/NAME.toml (default: ./configs)")
    cc.set_defaults(func=_cmd_configs)

    lst = sub.add_parser("list", help="list algorithms, datasets, partitions, models and the "
                                      "stages a round chains")
    lst.add_argument("--json", action="store_true")
    lst.set_defaults(func=_cmd_list)

    acc = sub.add_parser("account", help="epsilon for a mechanism, without training")
    mech = acc.add_subparsers(dest="mechanism", required=True)
    sg = mech.add_parser("sampled-gaussian", help="Poisson-subsampled Gaussian over steps")
    sg.add_argument("--noise-multiplier", type=float, required=True)
    sg.add_argument("--sampling-rate", type=float, required=True)
    sg.add_argument("--steps", type=int, required=True)
    g = mech.add_parser("gaussian", help="Gaussian mechanism composed count times")
    g.add_argument("--noise-multiplier", type=float, required=True)
    g.add_argument("--count", type=int, required=True)
    gv = mech.add_parser("gaussian-vote", help="AE-DPFL / kNN-DPFL MPC vote: Q Gaussian votes")
    gv.add_argument("--sigma", type=float, required=True, help="std of the noise on the vote sum")
    gv.add_argument("--queries", type=int, required=True, help="number of queries Q")
    gv.add_argument("--unit", choices=("agent", "instance"), required=True)
    gv.add_argument("--algorithm", choices=("ae", "knn"), default="ae")
    gv.add_argument("--k", type=int, default=None, help="neighbours per agent (kNN-DPFL)")
    gv.add_argument("--rule", choices=("derived", "paper"), default=None,
                    help="kNN instance sensitivity: derived sqrt(2)/k (default), or the paper's "
                    "sqrt(2/k)")
    for p in (sg, g, gv):
        p.add_argument("--delta", type=float, required=True)
        p.add_argument("--accountant", choices=ACCOUNTANTS + ("both",), default="both")
    dd = mech.add_parser("distributed", help="DDG / Skellam under secure aggregation: the "
                         "plan and epsilon, or the noise for a target epsilon")
    dd.add_argument("--kind", choices=("ddg", "skellam"), required=True)
    dd.add_argument("--bits", type=int, required=True, help="b: the modular sum's bits")
    dd.add_argument("--dim", type=int, required=True, help="d: the model's parameters")
    dd.add_argument("--clip", type=float, required=True, help="S: the update clip norm")
    dd.add_argument("--population", type=int, required=True, help="N agents")
    dd.add_argument("--cohort", type=int, required=True, help="m agents a round (fixed size)")
    dd.add_argument("--rounds", type=int, required=True)
    dd.add_argument("--delta", type=float, required=True,
                    help="below 1/population (fedjax_dp.privacy.delta_bound)")
    dd.add_argument("--allow-large-delta", action="store_true",
                    help="report a delta >= 1/population anyway (it permits releasing one "
                         "agent's data)")
    dd.add_argument("--noise-multiplier", type=float, default=None,
                    help="z, the central-equivalent noise multiplier")
    dd.add_argument("--target-epsilon", type=float, default=None,
                    help="calibrate z to this epsilon instead")
    dd.add_argument("--k-stddevs", type=float, default=4.0)
    dd.add_argument("--beta", type=float, default=0.6065306597126334)
    dd.add_argument("--min-survivors", type=int, default=None)
    fk = mech.add_parser("fedkt", help="FedKT-L1/L2 LNMax votes (moments, Laplace composition)")
    fk.add_argument("--votes", required=True,
                    help=".npz (array 'votes', optional 'z') or .json ({'votes': ..., 'z': ...}); "
                         "L1: server histograms [Q, C]; L2: teacher histograms [n, s, Q, C]")
    fk.add_argument("--gamma", type=float, required=True, help="Laplace parameter (noise 1/gamma)")
    fk.add_argument("--level", choices=("L1", "L2"), required=True)
    fk.add_argument("--s", type=int, default=2, help="partitions per party")
    fk.add_argument("--t", type=int, default=None, help="teachers per partition (default 5)")
    fk.add_argument("--z", type=int, default=None,
                    help="L1 example level: most at-risk partitions of a party (default s)")
    fk.add_argument("--unit", choices=("party", "example", "both"), default="both")
    fk.add_argument("--orders", type=int, default=8, help="moment orders 1..ORDERS")
    fk.add_argument("--example-rule", choices=("consistent", "paper"), default=None,
                    help="L1 example level's k: consistent (default) or the paper's k = z")
    fk.add_argument("--delta", type=float, required=True)
    fk.add_argument("--accountant", choices=ACCOUNTANTS + ("both",), default="both")
    acc.set_defaults(func=_cmd_account)

    # no import of fedjax_dp.audit (the parser stays JAX-free): audit() checks the mechanism
    aud = sub.add_parser("audit", help="empirical epsilon lower bound vs its claim (docs/audit.md)")
    aud.add_argument("mechanism", help="gaussian-vote, fedkt-laplace, dp-sgd-step, "
                     "dp-fedavg-round, isrl-upload or sdp-upload; or \"run\": the one-run "
                     "audit of --config's run with canary agents")
    aud.add_argument("--trials", type=int, default=None,
                     help="runs per world (D and D'), default 100000 (not for run)")
    aud.add_argument("--delta", type=float, default=None,
                     help="default 1e-5 (run: the config's privacy.delta)")
    aud.add_argument("--config", default=None, help="run: the run config audited")
    aud.add_argument("--set", action="append", default=None, metavar="KEY=VALUE",
                     help="run: override a config value")
    aud.add_argument("--canaries", type=int, default=None,
                     help="run: canary agents, each included with probability 1/2 (default 1000)")
    aud.add_argument("--significance", type=float, default=None,
                     help="run: the lower bound holds with probability 1 - significance "
                     "(default 0.05)")
    aud.add_argument("--seed", type=int, default=None,
                     help="default 0 (not for run: the config's seed)")
    aud.add_argument("--confidence", type=float, default=None,
                     help="default 0.95 (not for run: --significance)")
    aud.add_argument("--weaken", choices=("halve-noise", "no-clip"), default=None,
                     help="audit a deliberately broken variant against the original claim "
                     "(the mechanisms that offer it; run: both)")
    for name, kind in AUDIT_PARAMS.items():
        flags = ("--clip", "--clip-norm") if name == "clip" else ("--" + name.replace("_", "-"),)
        aud.add_argument(*flags, dest=name, type=kind, default=None,
                         help="mechanism parameter" + (" (clip_norm)" if name == "clip" else "")
                         + (" (also run)" if name in AUDIT_RUN_PARAMS else ""))
    aud.set_defaults(func=_cmd_audit)

    plt = sub.add_parser("plot", help="a metric against a parameter (mean +- std), or curves")
    plt.add_argument("results", nargs="+", metavar="RESULTS",
                     help="sweep results.jsonl files, run result.json files, or their folders")
    plt.add_argument("--x", default=None, help="a record, swept or config key (default epsilon)")
    plt.add_argument("--y", default=None, help="metric (default test_accuracy; with --curve a "
                     "history metric, default test_accuracy if logged, else the first one)")
    plt.add_argument("--hue", default="algorithm", help="a line per value of the field (none: one)")
    plt.add_argument("--curve", action="store_true", help="training curves: --y against the round")
    plt.add_argument("--selected", action="store_true",
                     help="only the grid points a sweep's --select chose, a line per row "
                     "(default --hue setting)")
    plt.add_argument("--out", metavar="STEM", default=None, help="writes STEM.png, STEM.svg "
                     "and STEM.pdf (default plot_<y>_vs_<x> beside the first RESULTS file)")
    plt.add_argument("--title", default=None, help="a title above the axes (default none: a "
                     "paper's caption names the data)")
    plt.add_argument("--label", metavar="KEY=TEXT", action="append", default=None,
                     help="display TEXT for KEY: a field or metric (test_accuracy=Accuracy), "
                     "an algorithm or a line's value (dp_fedavg=DP-FedAvg); repeatable")
    plt.add_argument("--reference", metavar="KEY=VALUE", default=None,
                     help="draw the records with KEY = VALUE (e.g. a baseline arm without the "
                     "x key) as a horizontal mean +- std band")
    plt.add_argument("--logx", action=argparse.BooleanOptionalAction, default=None,
                     help="log-scale x axis (default: for epsilon only)")
    plt.set_defaults(func=_cmd_plot)

    cmp_ = sub.add_parser("compare", help="sweeps compared: chosen cells, or a key's arms")
    csub = cmp_.add_subparsers(dest="compare_command", required=True)
    cs = csub.add_parser("selected", help="sweeps' validation-chosen cells, a column per sweep")
    cs.add_argument("sweeps", nargs="+", metavar="SWEEP", help="sweep output folders")
    cs.add_argument("--names", default=None, help="column names, comma-separated (default: "
                    "each sweep's algorithm)")
    cs.add_argument("--rows", default=None, help="row keys, comma-separated (default: all)")
    cs.add_argument("--ceiling", default=None, metavar="SWEEP",
                    help="a sweep without privacy; its best chosen cell is the reference line")
    cs.add_argument("--tuning-cost", action="store_true", help="also each chosen cell's "
                    "epsilon with all its candidates' runs composed (docs/sweeps.md)")
    ca = csub.add_parser("arms", help="the runs split by one grid key's values, Welch's t-test")
    ca.add_argument("results", nargs="+", metavar="RESULTS",
                    help="sweep results.jsonl(.gz) files or their folders")
    ca.add_argument("--arm", required=True, metavar="KEY", help="the grid key whose values are "
                    "the arms, e.g. algorithm.private+algorithm.fixed_genotype")
    ca.add_argument("--unit", default="seed", metavar="KEY", help="the unit a test counts once "
                    "(its runs averaged first; default seed)")
    ca.add_argument("--labels", default=None, help="the arms' names in their order of first "
                    "appearance, comma-separated")
    ca.add_argument("--y", default="test_accuracy", help="the metric (default test_accuracy)")
    ca.add_argument("--selected", action="store_true", help="only the runs of the cells the "
                    "sweep's --select chose (selected.json beside the results)")
    for c in (cs, ca):
        c.add_argument("--title", default=None)
        c.add_argument("--out", required=True, metavar="STEM", help="writes STEM.md and "
                       "STEM.json" + (" and STEM.png / .svg" if c is ca else ""))
        c.add_argument("--debug", action="store_true", help="the traceback, not one error line")
        c.set_defaults(func=_cmd_compare)

    be = sub.add_parser("bench", help="the headline measurements in one process (docs/bench.md)")
    be.add_argument("--suite", default="quick", help="quick or full")
    be.add_argument("--out", metavar="FILE", default=None, help="writes FILE.json and FILE.md")
    be.add_argument("--only", metavar="PART,PART", default=None, help="run these parts only: "
                    "local_training, peers_dp_fedavg, dp_sgd_step, knn_vote, "
                    "isrl_spider_round, dp_fnas_search_step, ae_dpfl_end_to_end, "
                    "char_lstm_round")
    be.add_argument("--population", metavar="DIR", default=None,
                    help="the char_lstm_round part on this converted text population (fedjax-dp "
                    "data convert gutenberg_shakespeare SRC DIR) instead of synthetic clients")
    be.add_argument("--sizes", default=None, help=argparse.SUPPRESS)    # "tiny": the tests
    be.add_argument("--debug", action="store_true", help="the traceback, not one error line")
    be.set_defaults(func=_cmd_bench)

    dat = sub.add_parser("data", help="federated datasets from the files they are published in")
    dsub = dat.add_subparsers(dest="data_command", required=True)
    cv = dsub.add_parser("convert", help="a published dataset (TFF HDF5, LEAF JSON) as a "
                         "stacked population for data.dataset = \"stacked:DST\"")
    cv.add_argument("format", metavar="FORMAT", help=", ".join(DATA_FORMATS))
    cv.add_argument("src", metavar="SRC", help="the downloaded files: TFF: the folder of "
                    "<name>_train.h5, _test.h5 (or the _train.h5); LEAF: that of train/, test/; "
                    "Gutenberg: the complete works' .txt or a folder of one .txt per play")
    cv.add_argument("dst", metavar="DST", help="a new folder for the stacked population")
    cv.add_argument("--max-clients", type=int, default=None, metavar="K",
                    help="keep the first K train clients (default: all)")
    cv.add_argument("--max-records", type=int, default=None, metavar="k",
                    help="keep the first k records of every client (default: all)")
    cv.add_argument("--max-test-records", type=int, default=None, metavar="M",
                    help="a uniform random subset of M test records (default: all)")
    cv.add_argument("--vocab-size", type=int, default=None, metavar="V",
                    help="tff_stackoverflow / leaf_sent140: the V most frequent training words "
                    "(default 10000), or the first V words of --vocab")
    cv.add_argument("--vocab", default=None, metavar="FILE", help="a word a line, commonest first")
    cv.add_argument("--seq-len", type=int, default=None, metavar="T",
                    help="tokens/record (defaults: Shakespeare 80, StackOverflow 20, Sent140 25)")
    cv.add_argument("--seed", type=int, default=None,
                    help="seed of --max-test-records' subset (default 0)")
    cv.add_argument("--split", choices=("sample", "user"), default=None,
                    help="gutenberg_shakespeare: LEAF's split, each client's first samples "
                    "for training (sample, the default) or whole clients (user)")
    cv.add_argument("--train-fraction", type=float, default=None, metavar="F",
                    help="gutenberg_shakespeare: the training fraction (default 0.8)")
    cv.add_argument("--split-seed", type=int, default=None, metavar="S",
                    help="gutenberg_shakespeare: seed of --split user's draw (default 0)")
    cv.add_argument("--window-stride", type=int, default=None, metavar="S",
                    help="gutenberg_shakespeare: keep every S-th window of each client's "
                    "split (default 1, LEAF's; 80: non-overlapping windows)")
    cv.add_argument("--quiet", action="store_true", help="no progress bar")
    cv.add_argument("--debug", action="store_true", help="the traceback, not one error line")
    cv.set_defaults(func=_cmd_data)

    sh = sub.add_parser("show", help="the full report of a finished run: every guarantee and "
                        "what it does not cover")
    sh.add_argument("run", metavar="RUN", help="a run folder (or its result.json)")
    sh.set_defaults(func=_cmd_show)

    dev = sub.add_parser("devices", help="the devices JAX sees and the defaults chosen for them")
    dev.add_argument("--json", action="store_true", help="print it as JSON")
    dev.set_defaults(func=_cmd_devices)

    st = sub.add_parser("selftest", help="every family at a tiny size, default device vs CPU; "
                        "exit 1 on a crash or a mismatch")
    st.add_argument("--json", action="store_true", help="print the report as JSON")
    st.add_argument("--families", default=None, metavar="FAMILY,FAMILY",
                    help="only these families (averaging, voting, fedkt, isrl, fnas) or algorithms")
    st.add_argument("--compilation-cache", default="user", metavar="user|off|DIR",
                    help="JAX's persistent compilation cache (default: a user-level folder)")
    st.add_argument("--debug", action="store_true", help="the traceback, not one error line")
    st.set_defaults(func=_cmd_selftest)
    return parser


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[0]}" if text else type(e).__name__


def main(argv: list[str] | None = None, *, exiting: bool = False) -> int:
    """The command line. Every error ends in ONE line on stderr (``--debug``: the traceback):
    a bad parameter or config exits 2 before any work; a run that stops after it started (an
    error, Ctrl-C, SIGTERM) exits 1 (130 for SIGINT, 143 for SIGTERM, at any moment:
    :mod:`fedjax_dp.core.stop`) with a line naming the last finished and saved round, the
    privacy spent and the ``--resume`` command.

    ``exiting`` (the console script, :func:`script`): the process ends after this returns, so a
    signal in its last instant is ignored (its work is done and written), not left to the
    interpreter's shutdown, which would die of it; otherwise the caller's handlers come back."""
    import signal
    import threading
    original = {}
    early: list[int] = []                     # a signal while the library (jax) is imported
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            original[sig] = signal.getsignal(sig)
            signal.signal(sig, lambda signum, frame: early.append(signum))
    try:
        from fedjax_dp.experiments import processes
        words = sys.argv[1:] if argv is None else argv
        if any(w.split("=")[0] in ("--coordinator", "--num-processes") for w in words) or \
                processes.detect() is not None:
            processes.quiet_runtime_logs()    # before jaxlib loads: our line, not its pages
        from fedjax_dp.core import stop as stop_lib
        try:
            with stop_lib.handling(early[0] if early else None):    # from here to the exit
                try:
                    stop_lib.check()
                    args = build_parser().parse_args(argv)
                except KeyboardInterrupt as e:
                    stop_lib.clear()
                    print(f"fedjax-dp: {stop_lib.what(e)}: stopped before the run began "
                          f"(nothing written); run the same command again", file=sys.stderr)
                    return stop_lib.exit_status(e)
                return _main(args)
        except KeyboardInterrupt as e:        # in the last instant, the command's work done
            print(f"fedjax-dp: {stop_lib.what(e)}: the command had finished; nothing was lost",
                  file=sys.stderr)
            return stop_lib.exit_status(e)
    finally:
        for sig, handler in original.items():
            signal.signal(sig, signal.SIG_IGN if exiting else
                          signal.SIG_DFL if handler is None else handler)


def script() -> int:
    """The ``fedjax-dp`` console script: :func:`main` in a process that exits after it."""
    return main(exiting=True)


def _main(args) -> int:
    from fedjax_dp.core import stop as stop_lib
    debug = getattr(args, "debug", False)
    try:
        status = args.func(args)
        stop_lib.check()                      # a signal a callback swallowed is not lost
        return status
    except KeyboardInterrupt as e:
        if debug:
            raise
        if _GROUP:                            # a multi-process sweep: every process stopped
            e.fedjax_dp_stop = (getattr(e, "fedjax_dp_stop", None) or
                                f"process {_GROUP[-1].index} stopped with the others") + \
                f"; {_GROUP[-1].resume_hint}"
            _leave(ok=False)
        with stop_lib.ignored():              # a second signal does not cut the stop line
            stop_lib.clear()
            stop = getattr(e, "fedjax_dp_stop", None) or "nothing was kept"
            print(f"fedjax-dp: {stop_lib.what(e)}: {stop}", file=sys.stderr)
        return stop_lib.exit_status(e)
    except Exception as e:
        if _GROUP:                                # a collective failed: a process was lost?
            group = _GROUP[-1]
            why = None if isinstance(e, ValueError) else group.wait_for_loss(
                group.spec.timeout_s + 5)
            if why is not None:
                group.fail(why)                   # one line; ends this process
            _leave(ok=False)
        if debug:
            raise
        stop = getattr(e, "fedjax_dp_stop", None)
        from fedjax_dp.core import memory
        oom = memory.explain_oom(e)
        if oom is not None:
            msg = oom
        elif isinstance(e, ValueError):   # invalid parameter or config, or a diverged run
            msg = str(e)
        else:
            msg = f"{_first_line(e)} (--debug shows the traceback)"
        print(f"fedjax-dp: error: {msg}" + (f"; {stop}" if stop else ""), file=sys.stderr)
        return 2 if stop is None and isinstance(e, ValueError) else 1


if __name__ == "__main__":
    sys.exit(script())
