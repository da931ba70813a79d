"""The layouts the doctor tries: the fixed miswirings and the coordinate search."""

from __future__ import annotations

from eagle3_backend.doctor.candidates import candidate_layouts, coordinate_search, describe_move
from eagle3_backend.layout import Layout

TRAINED = "[layer_input:2, layer_input:15, layer_input:27]"


def _layouts(cands):
    return [str(c.layout) for c in cands]


def test_candidates_of_a_llama_layout():
    cands = candidate_layouts(Layout.parse(TRAINED), num_layers=30)
    assert _layouts(cands) == [
        TRAINED,
        "[layer_input:1, layer_input:14, layer_input:26]",
        "[layer_input:3, layer_input:16, layer_input:28]",
        "[embed, layer_input:13, layer_input:25]",
        "[layer_input:4, layer_input:17, layer_input:29]",
        "[layer_input:2, layer_input:27, layer_input:15]",
        "[layer_input:15, layer_input:2, layer_input:27]",
        "[layer_input:15, layer_input:27, layer_input:2]",
        "[layer_input:27, layer_input:2, layer_input:15]",
        "[layer_input:27, layer_input:15, layer_input:2]",
    ]  # the engines' default is the recorded layout here, so it is not repeated
    assert cands[0].why == "recorded"


def test_candidates_of_a_kimi_layout_with_embed():
    cands = candidate_layouts(Layout.parse("[embed, layer_input:3, layer_input:31]"), num_layers=61)
    by_layout = {str(c.layout): c.why for c in cands}
    assert "[layer_input:1, layer_input:4, layer_input:32]" in by_layout      # +1: all slots
    assert "[layer_input:1, layer_input:3, layer_input:31]" in by_layout      # embed -> layer 1
    assert by_layout["[layer_input:2, layer_input:30, layer_input:58]"].startswith("the engines' default")
    assert all(min(c.layout.layers) >= 0 and max(c.layout.layers) <= 61 for c in cands)
    assert len(cands) == len(by_layout) == 1 + 2 + 5 + 1 + 1  # recorded, +1, +2, 5 orders, embed swap, default


def _bowl(truth):
    """A score that falls with the distance of each slot from ``truth``."""
    def score(layout):
        calls.append(layout)
        return -sum(abs(a - b) for a, b in zip(layout.layers, truth))
    calls = []
    return score, calls


def test_coordinate_search_moves_each_slot_to_a_layout_no_fixed_candidate_names():
    score, calls = _bowl((5, 11, 22))
    path = coordinate_search(Layout.parse(TRAINED), 30, score)
    assert [p.layers for p in path] == [(5, 15, 27), (5, 11, 27), (5, 11, 22)]
    assert Layout.of_layers((5, 11, 22)) not in {c.layout for c in candidate_layouts(TRAINED, 30)}
    # each round tries every slot on the 28 layers the other slots leave free (plus the
    # default comparator's two calls per slot); the second round moves nothing: stop
    assert len(calls) == 2 * 3 * (28 + 2)
    assert describe_move(Layout.parse(TRAINED), path[-1]) == (
        f"coordinate search from {TRAINED}: slot 0 on layer_input:5, slot 1 on layer_input:11, "
        "slot 2 on layer_input:22")


def test_coordinate_search_reaches_embed_and_the_last_layer_and_takes_only_wanted_moves():
    score, _ = _bowl((0, 12, 30))
    assert coordinate_search(Layout.parse(TRAINED), 30, score)[-1].layers == (0, 12, 30)
    # a move is taken only when `better` says so: gains below 6 are refused
    score, _ = _bowl((5, 11, 22))               # gains per slot: 3, 4, 5
    assert coordinate_search(Layout.parse(TRAINED), 30, score,
                             lambda new, cur: score(new) >= score(cur) + 6) == []
    assert [p.layers for p in coordinate_search(
        Layout.parse(TRAINED), 30, score, lambda new, cur: score(new) >= score(cur) + 4)] == [
        (2, 11, 27), (2, 11, 22)]
    # ties go to the layer nearest the current one; a flat score moves nothing
    assert coordinate_search(Layout.parse(TRAINED), 30, lambda lay: 0.0) == []
