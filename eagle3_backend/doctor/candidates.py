"""The layouts the doctor tries: the plausible miswirings of the recorded one, then a
coordinate search that moves each fc slot over the target's layers.

Fixed candidates (:func:`candidate_layouts`):

* the recorded layout (what this backend serves);
* every slot shifted one or two layers (SpecForge "output of k" read as speculators
  "input of k", and the reverse: the off-by-one of the conventions table);
* the same states in another fc order (list order vs layer order);
* ``embed`` in place of ``layer_input:1`` and the reverse;
* the engines' default layout for this target (inputs of 2, L//2, L-3).

A draft trained on a layout none of these name is found by :func:`coordinate_search`:
from the best of them, each slot in turn is moved to the layer that scores best with
the other slots fixed, until no move helps.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eagle3_backend.layout import Layout, Source

SEARCH_PASSES = 3   # rounds over the slots; each round tries every slot on every free layer


@dataclass(frozen=True, slots=True)
class Candidate:
    """One layout to try and why it is a plausible wiring."""

    layout: Layout
    why: str


def candidate_layouts(recorded: Layout, num_layers: int,
                      max_permuted_slots: int = 4) -> list[Candidate]:
    """The recorded layout first, then the plausible miswirings of it (deduplicated,
    each with as many slots as the recorded one, every layer in [0, num_layers])."""
    recorded = Layout.parse(recorded)
    out: dict[Layout, str] = {recorded: "recorded"}

    def add(layers: Sequence[int], why: str) -> None:
        if all(0 <= k <= num_layers for k in layers) and len(set(layers)) == len(layers):
            out.setdefault(Layout.of_layers(layers), why)

    layers = list(recorded.layers)
    for shift, why in ((-1, "every slot one layer earlier (ids read as input-of-k, trained as output-of-k)"),
                       (+1, "every slot one layer later (ids read as output-of-k, trained as input-of-k)"),
                       (-2, "every slot two layers earlier"), (+2, "every slot two layers later")):
        add([k + shift for k in layers], why)
    if len(layers) <= max_permuted_slots:
        for perm in itertools.permutations(layers):
            add(perm, "the same states in another fc order (list order vs layer order)")
    if 0 in layers:
        add([1 if k == 0 else k for k in layers], "layer_input:1 where the recorded layout has embed")
    if 1 in layers:
        add([0 if k == 1 else k for k in layers], "embed where the recorded layout has layer_input:1")
    default = Layout.eagle_repo(num_layers)
    if len(default) == len(recorded):
        out.setdefault(default, "the engines' default (inputs of 2, L//2, L-3): what a draft that "
                                "records no layer ids is served with")
    return [Candidate(lay, why) for lay, why in out.items()]


def coordinate_search(start: Layout, num_layers: int, score: Callable[[Layout], float],
                      better: Callable[[Layout, Layout], bool] | None = None, *,
                      passes: int = SEARCH_PASSES) -> list[Layout]:
    """Greedy coordinate ascent from ``start``: each slot in turn moves to the free layer
    in [0, num_layers] with the highest ``score`` (the other slots fixed) when that layout
    is ``better(moved, current)`` (default: a higher score), for at most ``passes`` rounds
    or until a round moves nothing. Returns the layouts it moved to, in order (empty when
    ``start`` is a local optimum); ``score`` is called once per layout tried (cache it
    there when it is costly)."""
    if better is None:
        def better(new: Layout, cur: Layout) -> bool:
            return score(new) > score(cur)
    current = list(Layout.parse(start).layers)
    path: list[Layout] = []
    for _ in range(passes):
        moved = False
        for slot in range(len(current)):
            others = set(current[:slot] + current[slot + 1:])
            tried = [(score(Layout.of_layers(current[:slot] + [k] + current[slot + 1:])),
                      -abs(k - current[slot]), k)
                     for k in range(num_layers + 1) if k not in others and k != current[slot]]
            if not tried:
                continue
            layers = current[:slot] + [max(tried)[2]] + current[slot + 1:]  # ties: the nearest layer
            if better(Layout.of_layers(layers), Layout.of_layers(current)):
                current, moved = layers, True
                path.append(Layout.of_layers(current))
        if not moved:
            break
    return path


def describe_move(start: Layout, layout: Layout) -> str:
    """Why the search tried ``layout``: the slots it holds elsewhere than ``start``."""
    moved = [f"slot {i} on {Source(b)}" for i, (a, b) in enumerate(zip(start.layers, layout.layers))
             if a != b]
    return f"coordinate search from {start}: {', '.join(moved) or 'no slot moved'}"
