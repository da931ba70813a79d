"""Packing equals the reference: captures land in their layout slot of one [T, K*H] buffer,
through the Collector and through the subclasses of SGLang's own collector classes."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from eagle3_backend.errors import LayoutMismatch
from eagle3_backend.layout import Layout
from eagle3_backend.serving import collect, runtime
from eagle3_backend.plan import Collector, ServingPlan, pack_reference
from eagle3_backend.serving.selfcheck import EmbeddingShard, self_check

H = 16


def plan(layout: str, num_layers: int = 8, hidden: int = H) -> ServingPlan:
    return ServingPlan(layout=Layout.parse(layout), architecture="LlamaForCausalLM",
                       num_layers=num_layers, hidden_size=hidden, draft_path="d",
                       layout_source="explicit")


def captures(p: ServingPlan, T: int, dtype=torch.float32, seed: int = 0) -> list[torch.Tensor]:
    """One [T, H] state per capture layer, in layer order (what the model hands over)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(T, p.hidden_size, generator=g).to(dtype) for _ in p.capture_layers]


LAYOUTS = ["[embed, layer_input:3, layer_input:6]", "[layer_input:6, embed, layer_input:3]",
           "[layer_input:7, layer_input:1]", "[layer_input:4]"]


def test_reference_places_each_capture_in_its_layout_slot():
    p = plan("[layer_input:6, embed, layer_input:3]")
    caps = [torch.full((2, H), float(layer)) for layer in p.capture_layers]  # value = layer index
    ref = pack_reference(caps, p)  # [2, 3H]
    assert [ref[0, j * H].item() for j in range(3)] == [6.0, 0.0, 3.0]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_collector_equals_reference(layout, dtype):
    p = plan(layout)
    caps = captures(p, T=7, dtype=dtype, seed=1)
    col = Collector(p)
    for c in caps:
        col.write(c)
    assert torch.equal(col.packed(), pack_reference(caps, p))


def test_collector_claim_and_preallocated_out():
    p = plan("[layer_input:6, embed, layer_input:3]")
    caps = captures(p, T=5, seed=2)
    out = torch.full((5, 3 * H), float("nan"))
    col = Collector(p, out=out)
    for c in caps:
        col.claim(c).copy_(c)  # a producer writing in place, as AuxHiddenStatePacker.slot allows
    assert col.packed() is out
    assert torch.equal(out, pack_reference(caps, p))


def test_collector_refuses_wrong_counts_and_shapes():
    p = plan("[embed, layer_input:3]")
    col = Collector(p)
    col.write(torch.zeros(4, H))
    with pytest.raises(LayoutMismatch, match="captured 1 of the 2 hidden states"):
        col.packed()
    col.write(torch.ones(4, H))
    with pytest.raises(LayoutMismatch, match="more than 2 hidden states"):
        col.write(torch.ones(4, H))
    with pytest.raises(LayoutMismatch, match=r"expected \[T, 16\]"):
        Collector(p).write(torch.zeros(4, H + 1))
    empty = Collector(p)
    empty.write(torch.zeros(0, H))
    assert empty.packed().shape == (0, 2 * H)  # an idle batch packs to nothing


# ------------------------------------------------------------------ SGLang's collector classes
@pytest.fixture
def active():
    pytest.importorskip("sglang")
    p = plan("[layer_input:6, embed, layer_input:3]")
    collect.activate(p, embed=None)
    yield p
    collect.deactivate()


@pytest.mark.sglang
def test_layout_aux_list_packs_like_the_reference(active):
    cls = collect.aux_list_class()
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStateList

    assert issubclass(cls, AuxHiddenStateList)
    caps = captures(active, T=6, seed=3)
    aux = cls()
    aux.capture(caps[0])  # the embedding, borrowed storage
    aux.capture(caps[1].clone(), owned=True)
    assert len(aux) == 2  # model files test len() for "anything captured"
    aux.append(caps[2])
    ref = pack_reference(caps, active)
    assert torch.equal(aux.pack(), ref)
    assert torch.equal(torch.cat(list(aux), dim=-1), ref)  # read as a list: layout order too
    caps[0].add_(1.0)  # later layers reuse the storage; the capture must be a copy
    assert torch.equal(aux.pack(), ref)


@pytest.mark.sglang
def test_layout_aux_list_is_stock_without_a_plan():
    pytest.importorskip("sglang")
    collect.deactivate()
    aux = collect.aux_list_class()()
    x = torch.randn(3, H)
    aux.capture(x)
    assert len(aux) == 1 and torch.equal(aux[0], x) and aux[0].data_ptr() != x.data_ptr()
    assert not aux.eagle3_active


@pytest.mark.sglang
def test_layout_aux_packer_packs_like_the_reference(active):
    cls = collect.aux_packer_class()
    from sglang.srt.layers.aux_hidden_states import AuxHiddenStatePacker

    assert issubclass(cls, AuxHiddenStatePacker)
    caps = captures(active, T=4, seed=4)
    packer = cls(3)
    packer.capture(caps[0], owned=False)
    packer.slot(caps[1]).copy_(caps[1])
    packer.append(caps[2])
    assert len(packer) == 3
    assert torch.equal(packer.finalize(), pack_reference(caps, active))
    with pytest.raises(LayoutMismatch, match="asks for 2 captures but layout"):
        cls(2)
    out = torch.zeros(4, 3 * H)
    batch = SimpleNamespace(aux_hidden_states_buffer=out)
    p2 = cls.for_batch(batch, 3)
    for c in caps:
        p2.capture(c)
    assert p2.finalize() is out and torch.equal(out, pack_reference(caps, active))


@pytest.mark.sglang
def test_layout_aux_packer_is_stock_without_a_plan():
    pytest.importorskip("sglang")
    collect.deactivate()
    p = plan("[layer_input:6, embed, layer_input:3]")
    caps = captures(p, T=2, seed=5)
    packer = collect.aux_packer_class()(3)
    for c in caps:
        packer.append(c)
    assert torch.equal(packer.finalize(), torch.cat(caps, dim=-1))  # layer order, unchanged


# ------------------------------------------------------------- logits-processor hook + self-check
class _Mode:
    def __init__(self, extend: bool) -> None:
        self._extend = extend

    def is_extend(self) -> bool:
        return self._extend


def _embedding(vocab: int = 50, seed: int = 6) -> torch.nn.Embedding:
    emb = torch.nn.Embedding(vocab, H)
    with torch.no_grad():
        emb.weight.copy_(torch.randn(vocab, H, generator=torch.Generator().manual_seed(seed)))
    return emb


@pytest.mark.sglang
def test_logits_hook_hands_on_the_packed_input_and_self_checks_once(active, caplog):
    emb = _embedding()
    collect.activate(active, embed=emb)
    ids = torch.tensor([3, 1, 4, 1, 5])
    caps = captures(active, T=5, seed=7)
    caps[0] = emb.weight[ids].detach().clone()  # layer 0's input is the embedding
    aux = collect.aux_list_class()()
    for c in caps:
        aux.capture(c)
    lp = object()
    decode = SimpleNamespace(forward_mode=_Mode(extend=False))
    args = (lp, ids, torch.zeros(5, H), None, decode, aux)
    new_args, _ = runtime.before_logits_forward(*args)
    assert torch.equal(new_args[5], pack_reference(caps, active))
    assert collect.state().selfcheck_pending  # a decode/verify batch is not the real prefill
    extend = SimpleNamespace(forward_mode=_Mode(extend=True))
    aux = collect.aux_list_class()()
    for c in caps:
        aux.capture(c)
    with caplog.at_level(logging.INFO, logger="eagle3_backend.serving.runtime"):
        runtime.before_logits_forward(lp, ids, torch.zeros(5, H), None, extend, aux_hidden_states=aux)
    assert not collect.state().selfcheck_pending
    lines = [r.getMessage() for r in caplog.records]
    assert "EAGLE-3 layout [layer_input:6, embed, layer_input:3] -> fc input 48 (checked); embed slot on this rank's vocabulary shard [0, 50): 5 of 5 tokens" in lines


def test_self_check_catches_a_wrong_embed_slot_and_identical_slots():
    layout = Layout.parse("[layer_input:6, embed, layer_input:3]")
    emb = _embedding()
    ids = torch.tensor([7, 8, 9])
    shard = EmbeddingShard.of(emb)
    g = torch.Generator().manual_seed(8)
    good = torch.cat([torch.randn(3, H, generator=g), emb.weight[ids].detach(), torch.randn(3, H, generator=g)], -1)
    assert self_check(good, ids, layout, shard).endswith(
        "-> fc input 48 (checked); embed slot on this rank's vocabulary shard [0, 50): 3 of 3 tokens")
    swapped = torch.cat([good[:, H:2 * H], good[:, :H], good[:, 2 * H:]], -1)  # embed in slot 0
    with pytest.raises(LayoutMismatch, match=r"fc slot 1 \(embed\) .* differs from the target's embedding"):
        self_check(swapped, ids, layout, shard)
    # tensor parallel: a rank holds rows [start, end) of the vocabulary and checks those ids
    half = EmbeddingShard(emb.weight[8:], 8, 50)
    assert self_check(good, ids, layout, half).endswith(
        "-> fc input 48 (checked); embed slot on this rank's vocabulary shard [8, 50): 2 of 3 tokens")
    twice = torch.cat([good[:, :H], good[:, H:2 * H], good[:, :H]], -1)
    with pytest.raises(LayoutMismatch, match=r"fc slots 0 \(layer_input:6\) and 2 \(layer_input:3\) .* identical"):
        self_check(twice, ids, layout, shard)


def test_self_check_compares_only_this_ranks_vocabulary_shard():
    """Tensor parallel: rank r holds embedding rows [start, end) and checks those tokens only."""
    layout = Layout.parse("[embed, layer_input:2]")
    full = _embedding(vocab=40)
    ids = torch.tensor([1, 25, 39, 10, 20])
    packed = torch.cat([full.weight[ids].detach(), torch.randn(5, H, generator=torch.Generator().manual_seed(9))], -1)
    for start, end in ((0, 20), (20, 40)):  # tp=2
        shard = EmbeddingShard(full.weight[start:end].detach(), start, end)
        mask, rows = shard.rows(ids)
        assert mask.tolist() == [start <= i < end for i in ids.tolist()]
        assert self_check(packed, ids, layout, shard).startswith("EAGLE-3 layout [embed, layer_input:2]")
    wrong = packed.clone()
    wrong[1, :H] += 1.0  # token 25 lives on rank 1 only
    assert self_check(wrong, ids, layout, EmbeddingShard(full.weight[:20].detach(), 0, 20))
    with pytest.raises(LayoutMismatch, match="over 3 tokens"):
        self_check(wrong, ids, layout, EmbeddingShard(full.weight[20:].detach(), 20, 40))


@pytest.mark.sglang
@pytest.mark.slow
@pytest.mark.parametrize("which", ["list", "packer"])
def test_collectors_trace_in_one_graph(active, monkeypatch, which):
    """SGLang's piecewise CUDA graphs run the target through torch.compile: capturing must not
    break the graph. (The op dispatch's extension probe is cached as it would be after the
    first call; see the report on eagle3_backend.ops._ext.available.)"""
    from eagle3_backend.ops import _ext

    answer = _ext.available()  # probed once, outside the traced region
    monkeypatch.setattr(_ext, "available", lambda: answer)
    cls = collect.aux_list_class() if which == "list" else collect.aux_packer_class()

    def forward(a, b, c):
        aux = cls() if which == "list" else cls(3)
        for x in (a, b, c):
            aux.capture(x * 2.0)
        return aux.pack() if which == "list" else aux.finalize()

    caps = captures(active, T=5, seed=10)
    torch._dynamo.reset()
    out = torch.compile(forward, backend="eager", fullgraph=True)(*caps)
    assert torch.equal(out, pack_reference([c * 2.0 for c in caps], active))
