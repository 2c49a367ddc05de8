"""``python -m harness compile +env=NAME [task=...] [device=cuda arch=90] [overrides]``: compile
every kernel a run of this config loads into Warp's kernel cache (``WARP_CACHE_PATH``), on any
machine, and print the seconds per module (:mod:`harness.compile`, docs/gpu.md).

- ``device=cpu``: the run's CPU kernels; ``null``: those of the device a run would choose
  (:func:`harness.devices.choose`: the CPU on a machine without a GPU).
- ``device=cuda`` / ``cuda:N``: its CUDA kernels for ``sm_<arch>``, with or without a GPU here
  (NVRTC needs neither a GPU nor a driver). Without a GPU, ``arch`` is required; with one, it
  defaults to the GPU's own. The modules are found by one tiny iteration of the run on the CPU,
  with the kernels CUDA would use (:func:`harness.compile.record_loads`).

Writes nothing but the kernel cache (no run folder). SIGINT and SIGTERM stop it within a
fraction of a second, also inside the compiler, leaving no half-written module in the cache.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any

from harness.commands.common import collector_paused, fail

__all__ = ["main"]

HELP = """usage: python -m harness compile +env=NAME [task=...] [device=cpu|cuda|cuda:N] [arch=N] [overrides...]

Compile every kernel a training run of this config loads into Warp's kernel cache
(WARP_CACHE_PATH, default ~/.cache/warp/<version>), and print the seconds per module.
  device=null     the kernels of the device a run of this config picks (the CPU without a GPU)
  device=cpu      the CPU's kernels
  device=cuda     CUDA kernels for sm_<arch>, with or without a GPU here; arch=90 for
                  H100/H200 (required without a GPU; with one, the GPU's own)
A run that starts afterwards with the same config on a device of that kind compiles nothing.
Example (a login node without a GPU):
  python -m harness compile +env=ant task=shac device=cuda arch=90
"""

_CUDA_NAME = re.compile(r"cuda(:\d+)?")


def _target(device: str, arch: Any) -> tuple[str, int | None]:
    """``("cpu", None)`` or ``("cuda", arch)`` from the values of ``device`` and ``arch``.

    Raises:
        harness.config.ConfigError: One line naming the field and what is accepted.
    """
    from harness import compile as kernel_compile
    from harness import devices
    from harness.config import ConfigError, check_device

    gpus = [alias for alias, cuda in devices.listed() if cuda]
    if device != "cpu" and not _CUDA_NAME.fullmatch(device):
        raise ConfigError(f"device: '{device}' is not a device compile knows; accepted: cpu, cuda, cuda:N")
    if device == "cpu":
        if arch is not None:
            raise ConfigError(f"arch: {arch} is for CUDA kernels, and device=cpu; accepted: arch=null, or device=cuda")
        return "cpu", None
    known = kernel_compile.known_archs()
    if not known:
        raise ConfigError("device: CUDA kernels need Warp's NVRTC, which this Warp build lacks; accepted: device=cpu")
    if arch is None:
        if not gpus:
            raise ConfigError(
                f"arch: required for device={device} on a machine without a GPU; accepted: "
                f"{', '.join(map(str, known))} (90: H100, H200)"
            )
        import warp as wp

        arch = wp.get_device(check_device(device)).arch
    if isinstance(arch, bool) or not isinstance(arch, int) or arch not in known:
        raise ConfigError(
            f"arch: {arch!r} is not an architecture NVRTC compiles for; accepted: {', '.join(map(str, known))}"
        )
    return "cuda", int(arch)


def _line(seconds: float, name: str, block: int | None, state: str) -> str:
    where = f" (block {block})" if block is not None else ""
    return f"{seconds:7.1f} s  {name}{where}  {state}"


def main(rest: list[str]) -> None:
    """``python -m harness compile [overrides]``."""
    if any(a in ("-h", "--help", "help") for a in rest):
        print(HELP, end="")
        return
    flags = [a for a in rest if a.startswith("-")]
    if flags:
        fail(f"compile: {flags[0]}: not accepted (compile takes no Hydra flags); accepted: key=value overrides")
    from omegaconf import open_dict

    from harness import build, config, init_warp
    from harness import compile as kernel_compile

    with collector_paused():
        try:
            cfg, choices, parsed = config.compose_command("compile", rest)
            if any(o.is_sweep_override() for o in parsed):
                raise config.ConfigError(
                    "compile: a sweep (a,b,...) compiles one config at a time; accepted: one value per key"
                )
            config.require_env(cfg)
            config.apply_task_env_defaults(cfg, choices, rest)
            init_warp()
            with open_dict(cfg):
                arch = cfg.pop("arch", None)  # not a training run's setting
                if cfg.get("device") is None:  # the device a run of this config would choose
                    cfg.device = build.validate(cfg, choices).settings.device
            kind, arch = _target(str(cfg.device), arch)
            with open_dict(cfg):
                cfg.device = "cpu" if kind == "cuda" else cfg.device
            build.validate(cfg, choices)  # the run's own config, as train checks it
        except config.ConfigError as exc:
            fail(exc)
    import warp as wp

    cache = wp.config.kernel_cache_dir
    target = f"sm_{arch}" if kind == "cuda" else "the CPU"
    print(f"compiling the kernels of this run for {target} into {cache}", flush=True)
    start = time.perf_counter()
    timings: list[tuple[str, float]] = []

    def report(r: kernel_compile.CompileRecord) -> None:
        if r.skipped is not None:
            print(f"   skipped  {r.name}: {r.skipped} (its GPU run compiles it)", flush=True)
        else:
            print(_line(r.seconds, r.name, r.block_dim, "compiled" if r.compiled else "cached"), flush=True)

    kernel_compile.time_compiles(timings)
    try:
        with kernel_compile.record_loads(
            cuda=kind == "cuda", arch=arch, report=report if kind == "cuda" else None
        ) as recording:
            build.tiny_iteration(cfg, choices)
    except config.ConfigError as exc:
        fail(exc)
    except kernel_compile.ModuleCompileError as exc:
        print(f"error: compile: {exc}", file=sys.stderr, flush=True)
        sys.exit(1)
    finally:
        kernel_compile.time_compiles(None)
    wall = time.perf_counter() - start
    if kind == "cpu":
        for name, seconds in timings:
            print(_line(seconds, name, None, "compiled"), flush=True)
        print(
            f"done: {len(timings)} modules compiled for the CPU ({sum(s for _, s in timings):.1f} s), the others "
            f"this run loads were in the cache; {wall:.1f} s",
            flush=True,
        )
        return
    done, cached, skipped = recording.compiled, recording.cached, recording.skipped
    cpu = f"; the tiny iteration on the CPU that found them compiled {len(timings)} for the CPU" if timings else ""
    print(
        f"done: {len(done)} modules compiled for sm_{arch} in {sum(r.seconds for r in done):.1f} s, "
        f"{len(cached)} found in the cache, {len(skipped)} skipped; {wall:.1f} s{cpu}",
        flush=True,
    )
