"""``Eagle3CpuPlatform``: SGLang's in-tree CPU platform, served by this package's ops.

It is the in-tree ``CpuSRTPlatform`` (so every ``is_cpu()`` code path in
SGLang stays the same) with one fact changed: SGLang asks
``get_platform().has_amx`` whether the ``intel_amx`` attention backend's
kernels exist, and rewrites ``--attention-backend intel_amx`` to
``torch_native`` when they do not; torch_native cannot run EAGLE. With the
stand-in ``sgl_kernel`` installed those kernels exist
(``torch.ops.sgl_kernel.extend_attention_cpu`` / ``decode_attention_cpu``),
so the platform overrides that fact for the process, through SGLang's own
``runtime_context.override_platform``.

After each model loads, ``post_load_model`` moves its unquantized linear
layers onto prepacked oneDNN weights and the few-row kernel, from exact bf16 copies
where bf16 holds a weight (``packed_linear``, ``small_gemm``; off with
``EAGLE3_CPU_PACKED_LINEAR=0``) and its RMSNorm / SiluAndMul / rotary layers onto
one-call C++ kernels (``layer_ops``; off with ``EAGLE3_CPU_LAYER_OPS=0``).

Layers that test AMX themselves (``cpu_has_amx_support()``: the real probe,
true only with the compiled ``convert_weight_packed``) keep their native
torch paths, so no weight is repacked for kernels this package lacks.

Imported only by SGLang's platform resolution (after ``entry.activate``).
"""

from __future__ import annotations

import logging
import os

from sglang.srt.platforms.cpu import CpuSRTPlatform

logger = logging.getLogger(__name__)

_overridden = False

ENV_OVERLAP = "EAGLE3_CPU_OVERLAP_SCHEDULE"
FEW_CPUS = 4


def _usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def overlap_schedule_off_by_default() -> bool:
    """True on a machine with at most ``FEW_CPUS`` usable CPUs unless
    ``EAGLE3_CPU_OVERLAP_SCHEDULE=1``.

    SGLang's overlap scheduler prepares the next batch on a second thread while the
    model runs. On a CPU engine that thread competes with the model's own OpenMP
    threads for the same few cores. Measured on this project's 2-core machine with
    SmolLM2-135M fp32, target-only, in one run: 122.8 ms a token with overlap and
    106.9 ms without (0.77x and 0.88x of plain transformers). Speculative servers
    already run without it on CPU.
    """
    if os.environ.get(ENV_OVERLAP, "0") == "1":
        return False
    return _usable_cpus() <= FEW_CPUS


def _declare_attention_kernels() -> None:
    global _overridden
    if _overridden:
        return
    from sglang.srt.runtime_context import override_platform

    override_platform(has_amx=True).install()
    _overridden = True
    logger.info("eagle3_backend.cpu: intel_amx attention backend served by torch ops")


class Eagle3CpuPlatform(CpuSRTPlatform):
    """CPU platform whose sgl_kernel ops come from eagle3_backend.cpu.ops."""

    def __init__(self) -> None:
        super().__init__()
        _declare_attention_kernels()

    def apply_server_args_defaults(self, server_args) -> None:
        """Default ``--sleep-on-idle`` on: an idle CPU scheduler otherwise spins a core at
        100%, which on a small machine is taken straight from the model's own threads.
        On a machine with few cores also default ``--disable-overlap-schedule`` (see
        :func:`overlap_schedule_off_by_default`)."""
        if not getattr(server_args, "sleep_on_idle", True):
            server_args.sleep_on_idle = True
        if overlap_schedule_off_by_default() and not getattr(server_args, "disable_overlap_schedule", True):
            server_args.disable_overlap_schedule = True
            logger.info("eagle3_backend.cpu: --disable-overlap-schedule (%d CPUs; %s=1 keeps the "
                        "overlap scheduler)", _usable_cpus(), ENV_OVERLAP)

    def post_load_model(self, model) -> None:
        """Pack linear weights once so that few-row GEMMs (verify, tree drafts) stay cheap, and
        run the norms, activations and rotary embeddings on the layer kernels (layer_ops)."""
        from eagle3_backend.cpu import layer_ops, packed_linear, small_gemm
        from eagle3_backend.cpu.ops import registry

        logger.info("eagle3_backend.cpu platform: %s loaded; %d sgl_kernel ops from torch "
                    "(stand-in module), GOMP_SPINCOUNT=%s", type(model).__name__,
                    len(registry.registered()), os.environ.get("GOMP_SPINCOUNT", "unset"))
        if packed_linear.enabled():
            small_gemm.load()  # built (or found in its cache) now, not inside the first forward
            packed_linear.pack_model(model)
            small_gemm.few_row_linears(model)  # plain nn.Linear layers (an EAGLE-3 draft's fc)
        layer_ops.fuse_model(model)


_PYNCCL_ARG = 3  # init_model_parallel_group(group_ranks, local_rank, backend, use_pynccl=None, ...)


def before_init_model_parallel_group(*args, **kwargs):
    """BEFORE ``parallel_state.init_model_parallel_group``: no PyNccl communicator on the CPU
    engine (its groups all-reduce through gloo). SGLang decides ``use_pynccl`` from the
    platform: an in-tree CPU platform gets True, and PyNccl refuses a CPU device."""
    if len(args) > _PYNCCL_ARG:
        if args[_PYNCCL_ARG] is None:
            args = (*args[:_PYNCCL_ARG], False, *args[_PYNCCL_ARG + 1:])
    elif kwargs.get("use_pynccl") is None:
        kwargs["use_pynccl"] = False
    return args, kwargs

