"""Kernel launches, copies and memsets per simulated step of a training iteration, by owner.

A GPU pays a few microseconds per launch, so a training iteration of small worlds is bound by
the number of launches (and, captured, by the number of graph nodes). For each run below this
builds the run as ``python -m harness train`` does (``harness.build.build_run``,
``run.trainer(settings)``, ``trainer.step.run()``, as ``harness.sweep.WarmKernelCache``), runs
one warm-up iteration (kernel loading, lazy buffers), then counts every operation of the next
eager iteration:

* kernel launches, forward and adjoint, each attributed to the module that defines the kernel
  (``kernel.module.name``): ``newton...`` is Newton's, ``harness...`` / ``envs...`` ours,
  ``warp...`` / ``map_...`` Warp's own (the adjoint of a ``wp.copy`` adds with a ``wp.map`` kernel,
  or with :mod:`harness.warp_fixes`' replacement of it, counted as Warp's too). A kernel in a
  module of its own (``module="unique"``) belongs to the file that defines it, except
  ``envs/featherstone.py``'s ``rigid_tau``, Newton's ``eval_rigid_tau`` with a corrected adjoint
  that Newton's own Featherstone step launches (counted as Newton's);
* copies (``wp.copy``: one memcpy, or one strided-copy kernel on CUDA) and memsets / fills
  (``array.zero_()``, ``fill_``): on CUDA each is a graph node of its own although it is no
  Warp kernel. They are attributed to the code that called them (the first frame outside Warp;
  inside a ``wp.copy``'s recorded adjoint, whoever made the copy).

It counts at Warp's lowest Python entry points, patched at runtime: the CPU kernel invokers
(``warp._src.context.invoke`` / ``invoke_cpu_blocks``, which every ``wp.launch``, adjoint
launch and ``Launch.launch`` ends in), the CPU device's ``memset`` / ``memtile`` and the
runtime's ``wp_memcpy_h2h`` / ``wp_array_copy_host`` / ``wp_array_fill_host``. A self-check
with a hand-counted tiny tape runs first (``check_counter``).

"Per simulated step" is the slope between two rollout lengths (``env.horizon``, or SHAC's
``task.window``): launches that do not grow with the rollout (the optimizer, statistics, the
critic's epochs, the history row) are the "per iteration" remainder. A SHAC step is one
control step of ``env.substeps`` Featherstone substeps.

Then the same iteration is captured (``TrainStep.capture``, as ``capture=auto`` does): on the
CPU Warp records it as an APIC byte stream, and its operation count (the graph's nodes) is
printed beside the eager count of kernels + copies + memsets.

Run::

    .venv/bin/python scripts/count_launches.py [--runs cartpole swingup_shac ant_shac] [--worlds 4] \
        [--json PATH] [--kernels]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import warp as wp

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RUNS: dict[str, dict[str, Any]] = {
    # name: the command's overrides, the key that sets the rollout's length, two lengths
    "cartpole": {
        "command": "python -m harness train +env=cartpole",
        "overrides": ["+env=cartpole"],
        "length_key": "env.horizon",
        "lengths": (240, 120),
    },
    "swingup_shac": {
        "command": "python -m harness train +env=cartpole_swingup task=shac",
        "overrides": ["+env=cartpole_swingup", "task=shac"],
        "length_key": "task.window",
        "lengths": (32, 16),
    },
    "ant_shac": {
        "command": "python -m harness train +env=ant task=shac",
        "overrides": ["+env=ant", "task=shac"],
        "length_key": "task.window",
        "lengths": (32, 16),
    },
}

_WARP_DIR = str(Path(wp.__file__).resolve().parent)
_THIS = str(Path(__file__).resolve())
OWNERS = ("newton", "ours", "warp", "other")


def kernel_owner(kernel: Any) -> str:
    """Who defines a kernel, from its module's name (a kernel in a module of its own,
    ``module="unique"``, from the file that defines it)."""
    name = kernel.module.name
    if name.startswith("newton"):
        return "newton"
    if name.startswith(("harness", "envs")):
        return "ours"
    if name.startswith(("warp", "map_", "_accumulate_kernel")):
        return "warp"  # Warp's own, and the copy adjoint's add (harness.warp_fixes replaces Warp's wp.map one)
    if name.startswith("_rigid_tau_kernel"):
        return "newton"  # envs/featherstone.py's stand-in for Newton's eval_rigid_tau, launched by Newton's step
    path = getattr(getattr(kernel, "func", None), "__code__", None)
    return file_owner(path.co_filename) if path is not None else "other"


def file_owner(path: str) -> str:
    path = os.path.abspath(path)
    if "/newton/" in path:
        return "newton"
    if path.startswith(str(ROOT / "harness")) or path.startswith(str(ROOT / "envs")):
        return "ours"
    return "other"


class Counter:
    """Counts operations while :attr:`active`; see the module docstring."""

    def __init__(self) -> None:
        self.active = False
        self.backward_depth = 0  # inside Tape.backward
        self.owner_override: list[str] = []  # inside a recorded wp.copy adjoint: who made the copy
        self.events: collections.Counter[tuple[str, str, str, str]] = collections.Counter()
        self._installed = False

    # -- what is counted --------------------------------------------------------------------

    def _caller_owner(self) -> str:
        if self.owner_override:
            return self.owner_override[-1]
        frame = sys._getframe(2)
        while frame is not None:
            path = frame.f_code.co_filename
            if not path.startswith(_WARP_DIR) and path != _THIS:
                return file_owner(path)
            frame = frame.f_back
        return "other"

    def _phase(self) -> str:
        return "backward" if self.backward_depth else "forward"

    def kernel(self, kernel: Any, adjoint: bool) -> None:
        if self.active:
            kind = "adjoint" if adjoint else "kernel"
            self.events[(self._phase(), kind, kernel_owner(kernel), f"{kernel.module.name}.{kernel.key}")] += 1

    def op(self, kind: str, what: str) -> None:
        if self.active:
            self.events[(self._phase(), kind, self._caller_owner(), what)] += 1

    # -- patching Warp -------------------------------------------------------------------------

    def install(self) -> None:
        if self._installed:
            return
        self._installed = True
        import warp._src.context as ctx
        import warp._src.tape as tape_module

        counter = self
        invoke, invoke_blocks = ctx.invoke, ctx.invoke_cpu_blocks

        def counted_invoke(kernel, hooks, params, adjoint):
            counter.kernel(kernel, adjoint)
            return invoke(kernel, hooks, params, adjoint)

        def counted_invoke_blocks(kernel, hooks, params, adjoint):
            counter.kernel(kernel, adjoint)
            return invoke_blocks(kernel, hooks, params, adjoint)

        ctx.invoke, ctx.invoke_cpu_blocks = counted_invoke, counted_invoke_blocks

        core = ctx.runtime.core
        for name, kind in (
            ("wp_memcpy_h2h", "copy"),
            ("wp_array_copy_host", "copy"),
            ("wp_array_fill_host", "memset"),
        ):
            native = getattr(core, name)

            def wrapped(*args, _native=native, _kind=kind, _name=name):
                counter.op(_kind, _name)
                return _native(*args)

            setattr(core, name, wrapped)

        cpu = wp.get_device("cpu")
        for attr in ("memset", "memtile"):
            native = getattr(cpu, attr)

            def wrapped_dev(*args, _native=native, _attr=attr):
                counter.op("memset", _attr)
                return _native(*args)

            setattr(cpu, attr, wrapped_dev)

        backward = tape_module.Tape.backward

        def counted_backward(tape, *args, **kwargs):
            counter.backward_depth += 1
            try:
                return backward(tape, *args, **kwargs)
            finally:
                counter.backward_depth -= 1

        tape_module.Tape.backward = counted_backward

        record_func = tape_module.Tape.record_func

        def counted_record_func(tape, backward, arrays):
            owner = counter._caller_owner()

            def run_as_owner():
                counter.owner_override.append(owner)
                try:
                    return backward()
                finally:
                    counter.owner_override.pop()

            return record_func(tape, run_as_owner, arrays)

        tape_module.Tape.record_func = counted_record_func

    @contextlib.contextmanager
    def counting(self) -> Iterator[collections.Counter]:
        self.install()
        self.events = collections.Counter()
        self.active = True
        try:
            yield self.events
        finally:
            self.active = False


COUNTER = Counter()


def summarize(events: collections.Counter) -> dict[str, Any]:
    """Totals of one counted iteration (or of a difference of two)."""
    return _totals(events, 0, backward_phase=True)


def _totals(events: Mapping[tuple[str, str, str, str], float], zero: float, *, backward_phase: bool) -> dict[str, Any]:
    """Kernels (forward, adjoint), copies and memsets of ``events``, by owner, starting from
    ``zero`` (0 for counts, 0.0 for rates); with ``backward_phase``, also the operations issued
    inside ``Tape.backward``."""
    out: dict[str, Any] = {
        "kernels_forward": zero,  # forward kernels, whatever the phase (an adjoint clip hook's included)
        "kernels_adjoint": zero,
        "copies": zero,
        "memsets": zero,
        "by_owner": {owner: zero for owner in OWNERS},  # kernels, forward + adjoint
        "ops_by_owner": {owner: zero for owner in OWNERS},  # copies + memsets
    }
    if backward_phase:
        out["backward_phase"] = zero  # every operation issued inside Tape.backward
    for (phase, kind, owner, _), n in events.items():
        if kind in ("kernel", "adjoint"):
            out["kernels_adjoint" if kind == "adjoint" else "kernels_forward"] += n
            out["by_owner"][owner] += n
        else:
            out["copies" if kind == "copy" else "memsets"] += n
            out["ops_by_owner"][owner] += n
        if backward_phase and phase == "backward":
            out["backward_phase"] += n
    out["kernels"] = out["kernels_forward"] + out["kernels_adjoint"]
    out["operations"] = out["kernels"] + out["copies"] + out["memsets"]
    return out


def check_counter() -> None:
    """The counter against a hand count: one zero_, 3 forward launches on a tape, a recorded
    wp.copy of arrays with gradients (2 memcpy: values and gradients); the backward: the seed
    fill, 3 adjoint launches and the copy's adjoint (one forward add kernel and one zero)."""

    @wp.kernel
    def _double(x: wp.array(dtype=float), y: wp.array(dtype=float)):
        i = wp.tid()
        y[i] = 2.0 * x[i]

    @wp.kernel
    def _sum(x: wp.array(dtype=float), total: wp.array(dtype=float)):
        wp.atomic_add(total, 0, x[wp.tid()])

    device = "cpu"
    a = wp.ones(4, dtype=float, device=device, requires_grad=True)
    b = wp.zeros(4, dtype=float, device=device, requires_grad=True)
    c = wp.zeros(4, dtype=float, device=device, requires_grad=True)
    d = wp.zeros(4, dtype=float, device=device, requires_grad=True)
    total = wp.zeros(1, dtype=float, device=device, requires_grad=True)
    for _ in range(2):  # the first pass compiles
        for array in (a, b, c, d, total):
            array.grad.zero_()
        with COUNTER.counting() as events:
            total.zero_()
            tape = wp.Tape()
            with tape:
                wp.launch(_double, dim=4, inputs=[a], outputs=[b], device=device)
                wp.copy(c, b)
                wp.launch(_double, dim=4, inputs=[c], outputs=[d], device=device)
                wp.launch(_sum, dim=4, inputs=[d], outputs=[total], device=device)
            tape.backward(total)
    got = summarize(events)
    expected = {"kernels_forward": 3 + 1, "kernels_adjoint": 3, "copies": 2, "memsets": 1 + 1 + 1}
    found = {key: got[key] for key in expected}
    if found != expected:
        raise SystemExit(f"count_launches: the counter's self-check failed: counted {found}, expected {expected}")
    if abs(float(a.grad.numpy()[0]) - 4.0) > 1e-6:
        raise SystemExit("count_launches: the self-check's gradient is wrong (the patched launches misbehave)")


def build_trainer(run_name: str, length: int, worlds: int) -> Any:
    from harness import build, config

    spec = RUNS[run_name]
    overrides = [*spec["overrides"], "device=cpu", f"env.world_count={worlds}", f"{spec['length_key']}={length}"]
    cfg, choices = config.compose_config("train", overrides)
    run = build.build_run(cfg, choices)
    settings = config.TrainSettings(iterations=4, log_every=4, seed=run.settings.seed, device=run.settings.device)
    return run.trainer(settings), run


def measure(run_name: str, length: int, worlds: int, *, capture: bool) -> dict[str, Any]:
    """Counts of one eager iteration (after a warm-up one) at this rollout length, and the node
    count of the same iteration captured."""
    trainer, run = build_trainer(run_name, length, worlds)
    step = trainer.step
    step.run()  # warm-up: kernel loading, lazily allocated buffers
    with COUNTER.counting() as events:
        step.run()
    wp.synchronize()
    result = {"events": events.copy(), "summary": summarize(events)}
    if capture:
        try:
            step.capture()
            apic = getattr(step.graph, "_apic_capture", None)
            result["graph_nodes"] = apic.operation_count if apic is not None else None
            if step._program:
                result["graph_nodes"] = None  # split capture: several graphs
        except Exception as exc:  # report, don't stop: the eager counts stand
            result["graph_nodes"] = None
            result["capture_error"] = str(exc).splitlines()[0]
    substeps = getattr(run.env.config, "substeps", 1)
    result["substeps"] = substeps
    result["horizon"] = run.env.horizon
    return result


def difference(a: collections.Counter, b: collections.Counter, steps: int) -> dict[tuple, float]:
    keys = set(a) | set(b)
    return {key: (a.get(key, 0) - b.get(key, 0)) / steps for key in keys if a.get(key, 0) != b.get(key, 0)}


def per_step_summary(per_step: dict[tuple, float]) -> dict[str, Any]:
    """Totals of the operations per simulated step (:func:`difference`)."""
    return _totals(per_step, 0.0, backward_phase=False)


def analyse(run_name: str, worlds: int) -> dict[str, Any]:
    spec = RUNS[run_name]
    long, short = spec["lengths"]
    t0 = time.perf_counter()
    at_long = measure(run_name, long, worlds, capture=True)
    at_short = measure(run_name, short, worlds, capture=True)
    steps = long - short
    per_step = difference(at_long["events"], at_short["events"], steps)
    step_summary = per_step_summary(per_step)
    nodes_long, nodes_short = at_long.get("graph_nodes"), at_short.get("graph_nodes")
    nodes_per_step = (nodes_long - nodes_short) / steps if nodes_long is not None and nodes_short is not None else None
    fixed = {
        key: at_long["summary"][key] - step_summary[key] * long
        for key in ("kernels_forward", "kernels_adjoint", "copies", "memsets", "operations")
    }
    by_kernel = sorted(
        ((n, phase, kind, owner, what) for (phase, kind, owner, what), n in per_step.items()),
        key=lambda row: (-row[0], row[4]),
    )
    return {
        "run": run_name,
        "command": spec["command"],
        "length_key": spec["length_key"],
        "lengths": [long, short],
        "world_count": worlds,
        "substeps": at_long["substeps"],
        "per_step": step_summary,
        "per_iteration_fixed": fixed,
        "iteration_at": {"length": long, **{k: v for k, v in at_long["summary"].items()}},
        "graph_nodes": {"at_long": nodes_long, "at_short": nodes_short, "per_step": nodes_per_step},
        "capture_error": at_long.get("capture_error") or at_short.get("capture_error"),
        "per_step_by_kernel": [
            {"per_step": n, "phase": phase, "kind": kind, "owner": owner, "what": what}
            for n, phase, kind, owner, what in by_kernel
        ],
        "seconds": time.perf_counter() - t0,
    }


def fmt(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if abs(x - round(x)) < 1e-9 else f"{x:.2f}"


def print_report(result: dict[str, Any], kernels: bool) -> None:
    s, it = result["per_step"], result["iteration_at"]
    sub = result["substeps"]
    print(f"\n== {result['run']}: {result['command']}")
    print(
        f"   counted at {result['length_key']}={result['lengths'][0]} and {result['lengths'][1]}, "
        f"env.world_count={result['world_count']}, device=cpu"
        + (f"; one step = {sub} Featherstone substeps" if sub != 1 else "")
    )
    header = (
        f"   {'':<22}{'fwd':>8}{'adj':>8}{'kernels':>9}{'Newton':>8}{'ours':>8}{'Warp':>7}"
        f"{'copies':>8}{'memsets':>8}{'all ops':>9}"
    )
    print(header)

    def row(label: str, d: dict[str, Any], owners: dict[str, float] | None) -> None:
        o = owners or {}
        print(
            f"   {label:<22}{fmt(d['kernels_forward']):>8}{fmt(d['kernels_adjoint']):>8}"
            f"{fmt(d['kernels_forward'] + d['kernels_adjoint']):>9}{fmt(o.get('newton')):>8}{fmt(o.get('ours')):>8}"
            f"{fmt(o.get('warp')):>7}{fmt(d['copies']):>8}{fmt(d['memsets']):>8}{fmt(d['operations']):>9}"
        )

    row("per simulated step", s, s["by_owner"])
    row("per iteration, fixed", result["per_iteration_fixed"], None)
    row(f"iteration ({result['lengths'][0]} steps)", it, it["by_owner"])
    kernels_step = s["kernels"]
    if kernels_step:
        print(
            f"   per step: Newton's kernels {fmt(s['by_owner']['newton'])} of {fmt(kernels_step)} "
            f"({100 * s['by_owner']['newton'] / kernels_step:.0f} %), of all operations "
            f"{100 * s['by_owner']['newton'] / s['operations']:.0f} %; copies+memsets by caller: "
            + ", ".join(f"{k} {fmt(v)}" for k, v in s["ops_by_owner"].items() if v)
        )
    g = result["graph_nodes"]
    if g["at_long"] is not None:
        print(
            f"   captured graph: {g['at_long']} nodes at {result['lengths'][0]} steps "
            f"(eager operations {it['operations']}), {fmt(g['per_step'])} per step"
        )
    else:
        print(f"   captured graph: not counted ({result.get('capture_error') or 'no APIC operation count'})")
    if kernels:
        print("   per step, by kernel / operation (owner, phase):")
        for entry in result["per_step_by_kernel"]:
            kind, owner, phase = entry["kind"], entry["owner"], entry["phase"]
            print(f"     {fmt(entry['per_step']):>7}  {kind:<8}{owner:<8}{phase:<9}{entry['what']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", choices=list(RUNS), default=list(RUNS))
    parser.add_argument("--worlds", type=int, default=4, help="env.world_count (launch counts do not depend on it)")
    parser.add_argument("--json", type=Path, default=None, help="write the numbers here")
    parser.add_argument("--kernels", action="store_true", help="list every kernel and operation per step")
    args = parser.parse_args()

    import harness  # noqa: F401  (quiet Warp start-up)

    wp.init()
    check_counter()
    results = []
    for name in args.runs:
        result = analyse(name, args.worlds)
        print_report(result, args.kernels)
        results.append(result)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=1))
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
