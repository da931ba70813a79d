"""The collectors SGLang's model files capture into, made layout-exact.

The target model files build an ``AuxHiddenStateList()`` (llama, qwen, glm4_moe,
gpt-oss, qwen3_moe) or an ``AuxHiddenStatePacker(K)`` (deepseek_v2: Kimi-K2,
DeepSeek-V3) in every forward and hand each captured state to it in layer
order. This module's subclasses replace both classes (REPLACE hooks, see
``hooks.py``). While a :class:`~eagle3_backend.plan.ServingPlan` is
active in the process (set when the target's capture is configured), they
write each capture straight into its *layout* slot of one [T, K*H] buffer
(``capture_into``: one copy, no concat); with no active plan they are the
stock classes, unchanged.

Under CUDA graphs the Python bookkeeping runs at capture time only; the
recorded copies land in the same slots at every replay.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

import torch

from eagle3_backend.serving import hooks
from eagle3_backend.plan import Collector, ServingPlan

logger = logging.getLogger(__name__)

LIST_TARGET = "sglang.srt.layers.aux_hidden_states.AuxHiddenStateList"
PACKER_TARGET = "sglang.srt.layers.aux_hidden_states.AuxHiddenStatePacker"


@dataclass(slots=True)
class CaptureState:
    """Per-process capture state: set once by the target's capture configuration."""

    plan: ServingPlan | None = None
    embed: Any = None  # the target's VocabParallelEmbedding, for the warm-up self-check
    selfcheck_pending: bool = False
    last_packed: torch.Tensor | None = None  # kept only until the self-check ran


_STATE = CaptureState()


def state() -> CaptureState:
    return _STATE


def activate(plan: ServingPlan, embed: Any) -> None:
    """Make every collector built from now on in this process layout-exact for ``plan``."""
    _STATE.plan = plan
    _STATE.embed = embed
    _STATE.selfcheck_pending = True
    _STATE.last_packed = None


def deactivate() -> None:
    _STATE.plan = None
    _STATE.embed = None
    _STATE.selfcheck_pending = False
    _STATE.last_packed = None


def _start(out: torch.Tensor | None = None) -> Collector | None:
    plan = _STATE.plan
    return None if plan is None else Collector(plan, out=out)


def _finished(collector: Collector) -> torch.Tensor:
    packed = collector.packed()  # [T, K*H]
    if _STATE.selfcheck_pending:
        _STATE.last_packed = packed
    return packed


@functools.cache
def aux_list_class() -> type:
    """Subclass of SGLang's AuxHiddenStateList (a list of K [T, H] captures)."""
    base = hooks.use(LIST_TARGET)

    class LayoutAuxList(base):
        """Stock list without a plan; with one, a packer that still reads as a list.

        ``len()`` counts captures (the model files test it for 0). Once all K
        arrived, the items are the K slot views in layout order, so code that
        concatenates the list gets the layout too; ``pack()`` returns the
        [T, K*H] buffer itself (what the logits-processor hook hands on).
        Written so torch.compile traces it without a graph break.
        """

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._eagle3 = _start()

        def capture(self, hidden: torch.Tensor, *, owned: bool = False) -> None:
            if self._eagle3 is None:
                return super().capture(hidden, owned=owned)
            self._add(hidden)

        def append(self, hidden: torch.Tensor) -> None:
            if self._eagle3 is None:
                return super().append(hidden)
            self._add(hidden)

        def extend(self, hiddens: Any) -> None:
            if self._eagle3 is None:
                return super().extend(hiddens)
            for hidden in hiddens:
                self._add(hidden)

        def _add(self, hidden: torch.Tensor) -> None:
            col = self._eagle3
            col.write(hidden)
            # The k-th item is the view of fc slot k (layout order): once all K arrived,
            # the list reads [slot 0, ..., slot K-1] whichever order they were written in.
            super().append(col.slot_view(col.count - 1))

        def pack(self) -> torch.Tensor:
            """The [T, K*H] fc input in layout order."""
            if self._eagle3 is None:
                raise TypeError("pack() is only defined while an EAGLE-3 serving plan is active")
            return _finished(self._eagle3)

        @property
        def eagle3_active(self) -> bool:
            return self._eagle3 is not None

    LayoutAuxList.__qualname__ = LayoutAuxList.__name__ = "LayoutAuxList"
    return LayoutAuxList


@functools.cache
def aux_packer_class() -> type:
    """Subclass of SGLang's AuxHiddenStatePacker (captures into one [T, K*H] buffer)."""
    base = hooks.use(PACKER_TARGET)

    class LayoutAuxPacker(base):
        """Stock packer without a plan; with one, slots follow the layout, not layer order."""

        def __init__(self, num_captures: int, out: torch.Tensor | None = None) -> None:
            super().__init__(num_captures, out)
            self._eagle3 = _start(out)
            if self._eagle3 is not None and int(num_captures) != self._eagle3.num_slots:
                from eagle3_backend.errors import LayoutMismatch

                raise LayoutMismatch(
                    f"the target model asks for {num_captures} captures but layout "
                    f"{self._eagle3.plan.layout} has {self._eagle3.num_slots}; its "
                    f"layers_to_capture was changed after eagle3_backend configured it."
                )

        def slot(self, like: torch.Tensor) -> torch.Tensor:
            if self._eagle3 is None:
                return super().slot(like)
            return self._eagle3.claim(like)

        def append(self, hidden: torch.Tensor) -> None:
            if self._eagle3 is None:
                return super().append(hidden)
            self._eagle3.write(hidden)

        def extend(self, hiddens: Any) -> None:
            for hidden in hiddens:
                self.append(hidden)

        def capture(self, hidden: torch.Tensor, *, owned: bool = False) -> None:
            if self._eagle3 is None:
                return super().capture(hidden, owned=owned)
            self._eagle3.write(hidden)

        def __len__(self) -> int:
            if self._eagle3 is None:
                return super().__len__()
            return self._eagle3.count

        def finalize(self) -> torch.Tensor:
            if self._eagle3 is None:
                return super().finalize()
            return _finished(self._eagle3)

    LayoutAuxPacker.__qualname__ = LayoutAuxPacker.__name__ = "LayoutAuxPacker"
    return LayoutAuxPacker
