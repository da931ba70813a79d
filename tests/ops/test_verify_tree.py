"""verify_tree_greedy: exact outputs on hand-built trees, every backend.

Trees are written as (parent, token) per node; node 0 is the root. Expected
outputs are worked out by hand in each case's comment, not by the reference.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass

import pytest
import torch

from eagle3_backend.errors import KernelError
from eagle3_backend.ops import _ext, allocate_verify_outputs, verify_tree_greedy
from eagle3_backend.ops.reference import verify_tree_greedy_ref

BACKEND_DEVICES = [
    pytest.param("torch", "cpu", id="torch-cpu"),
    pytest.param("triton", "cpu", id="triton-cpu"),
    pytest.param("triton", "cuda", marks=pytest.mark.gpu, id="triton-cuda"),
    pytest.param("cuda", "cuda", marks=pytest.mark.gpu, id="cuda-cuda"),
]


@dataclass
class Tree:
    parents: list[int]  # parents[0] == -1
    tokens: list[int]  # tokens[0] is the root's (unused by the walk)
    targets: list[int]  # target argmax after each node, by node
    rows: list[int] | None = None  # node -> row within the request (default: identity)


def build_batch(trees: list[Tree], num_draft: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    """SGLang-style tree tensors [B, D]; unused node slots are -1 / unreachable."""
    batch = len(trees)
    cand = torch.full((batch, num_draft), -1, dtype=torch.int64)
    rindex = torch.full((batch, num_draft), -1, dtype=torch.int64)
    first = torch.full((batch, num_draft), -1, dtype=torch.int64)
    sibling = torch.full((batch, num_draft), -1, dtype=torch.int64)
    target = torch.full((batch, num_draft), -5, dtype=torch.int64)
    for b, tree in enumerate(trees):
        rows = tree.rows or list(range(len(tree.parents)))
        last_child: dict[int, int] = {}
        for node, parent in enumerate(tree.parents):
            cand[b, node] = tree.tokens[node]
            rindex[b, node] = b * num_draft + rows[node]
            target.view(-1)[b * num_draft + rows[node]] = tree.targets[node]
            if parent >= 0:
                if parent in last_child:
                    sibling[b, last_child[parent]] = node
                else:
                    first[b, parent] = node
                last_child[parent] = node
    tensors = {
        "candidates": cand,
        "retrieve_index": rindex,
        "retrieve_next_token": first,
        "retrieve_next_sibling": sibling,
        "target_predict": target,
    }
    return {k: v.to(device) for k, v in tensors.items()}


def run(trees: list[Tree], num_draft: int, max_accept: int, backend: str, device: str):
    if backend == "cuda" and not _ext.available() and not _ext.jit_build():
        pytest.fail(f"CUDA extension unavailable on a GPU machine: {_ext.load_error()}")
    tensors = build_batch(trees, num_draft, device)
    outs = allocate_verify_outputs(len(trees), num_draft, max_accept, device)
    result = verify_tree_greedy(*outs, **tensors, backend=backend)
    assert result.predicts is outs.predicts
    return [t.cpu().tolist() for t in result]


# chain 0 -> 1 -> 2 -> 3. Target after root says 10 (= node 1), after node 1
# says 11 (= node 2), after node 2 says 99 (node 3 holds 12): two accepted.
CHAIN = Tree(parents=[-1, 0, 1, 2], tokens=[3, 10, 11, 12], targets=[10, 11, 99, 7])
# root has children 1 (5), 2 (6), 3 (7); node 2 has children 4 (8), 5 (9).
# Target: after root 6 -> node 2 (second sibling); after node 2: 9 -> node 5
# (second child); node 5 is a leaf -> stop with two accepted, bonus 42.
BRANCHY = Tree(parents=[-1, 0, 0, 0, 2, 2], tokens=[1, 5, 6, 7, 8, 9], targets=[6, 30, 9, 31, 32, 42])
# no child of the root holds the target's 1234: nothing accepted.
REJECT = Tree(parents=[-1, 0, 0], tokens=[1, 5, 6], targets=[1234, 8, 9])
# every level matches: all three drafts accepted, bonus 55 after node 3.
FULL = Tree(parents=[-1, 0, 1, 2], tokens=[2, 20, 21, 22], targets=[20, 21, 22, 55])
# two siblings hold the same token 5: the first in sibling order (node 1) wins.
TIE = Tree(parents=[-1, 0, 0, 1, 2], tokens=[0, 5, 5, 6, 7], targets=[5, 6, 4, 3, 2])
# rows are not node ids: node 1 sits at row 2, node 2 at row 1.
PERMUTED = Tree(parents=[-1, 0, 1], tokens=[0, 40, 41], targets=[40, 41, 77], rows=[0, 2, 1])


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_chain_partial(backend, device):
    predicts, accept, num = run([CHAIN], 4, 4, backend, device)
    assert accept == [[0, 1, 2, -1]]
    assert num == [2]
    assert predicts == [10, 11, 99, 0]


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_branching(backend, device):
    predicts, accept, num = run([BRANCHY], 6, 4, backend, device)
    assert accept == [[0, 2, 5, -1]]
    assert num == [2]
    assert predicts == [6, 0, 9, 0, 0, 42]


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_all_rejected(backend, device):
    predicts, accept, num = run([REJECT], 3, 3, backend, device)
    assert accept == [[0, -1, -1]]
    assert num == [0]
    assert predicts == [1234, 0, 0]


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_full_accept(backend, device):
    predicts, accept, num = run([FULL], 4, 4, backend, device)
    assert accept == [[0, 1, 2, 3]]
    assert num == [3]
    assert predicts == [20, 21, 22, 55]


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_depth_capped_by_accept_width(backend, device):
    # FULL would accept 3, but accept_index has room for the root + 2.
    predicts, accept, num = run([FULL], 4, 3, backend, device)
    assert accept == [[0, 1, 2]]
    assert num == [2]
    assert predicts == [20, 21, 22, 0]


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_first_matching_sibling_wins_and_rows_indirect(backend, device):
    predicts, accept, num = run([TIE], 5, 4, backend, device)
    assert accept == [[0, 1, 3, -1]] and num == [2]
    assert predicts == [5, 6, 0, 3, 0]
    predicts, accept, num = run([PERMUTED], 3, 3, backend, device)
    assert accept == [[0, 2, 1]] and num == [2]
    assert predicts == [40, 77, 41]


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES)
def test_batch_of_several(backend, device):
    """Rows are global (b * D + node): each request's writes land in its block."""
    predicts, accept, num = run([CHAIN, BRANCHY, REJECT, FULL], 6, 4, backend, device)
    assert num == [2, 2, 0, 3]
    assert accept == [[0, 1, 2, -1], [6, 8, 11, -1], [12, -1, -1, -1], [18, 19, 20, 21]]
    expected = [0] * 24
    for row, token in {0: 10, 1: 11, 2: 99, 6: 6, 8: 9, 11: 42, 12: 1234, 18: 20, 19: 21, 20: 22, 21: 55}.items():
        expected[row] = token
    assert predicts == expected


def random_trees(batch: int, num_draft: int, vocab: int, generator: torch.Generator) -> list[Tree]:
    trees = []
    for _ in range(batch):
        parents = [-1] + [int(torch.randint(0, i, (1,), generator=generator)) for i in range(1, num_draft)]
        tokens = torch.randint(0, vocab, (num_draft,), generator=generator).tolist()
        targets = torch.randint(0, vocab, (num_draft,), generator=generator).tolist()
        for node in range(num_draft):  # mostly point at some child's token: deep accepts
            children = [c for c in range(num_draft) if parents[c] == node]
            if children and float(torch.rand((), generator=generator)) < 0.8:
                pick = int(torch.randint(0, len(children), (1,), generator=generator))
                targets[node] = tokens[children[pick]]
        trees.append(Tree(parents, tokens, targets))
    return trees


@pytest.mark.parametrize("backend,device", BACKEND_DEVICES[1:])
def test_random_trees_match_reference(backend, device):
    generator = torch.Generator().manual_seed(7)
    trees = random_trees(batch=12, num_draft=8, vocab=5, generator=generator)
    expected = run(trees, 8, 6, "torch", "cpu")
    assert max(expected[2]) >= 3, "fuzz trees too shallow to test anything"
    assert run(trees, 8, 6, backend, device) == expected


def test_input_checks():
    tensors = build_batch([CHAIN], 4)
    outs = allocate_verify_outputs(1, 4, 4, "cpu")
    bad = dict(tensors, candidates=tensors["candidates"].int())
    with pytest.raises(KernelError, match="candidates must be int64"):
        verify_tree_greedy(*outs, **bad)
    bad = dict(tensors, retrieve_next_token=tensors["retrieve_next_token"][:, :3])
    with pytest.raises(KernelError, match=r"retrieve_next_token must be \[1, 4\] like candidates"):
        verify_tree_greedy(*outs, **bad)
    with pytest.raises(KernelError, match=r"predicts must be \[4\]"):
        verify_tree_greedy(torch.zeros(3, dtype=torch.int32), outs.accept_index, outs.accept_token_num, **tensors)
    with pytest.raises(KernelError, match="accept_token_num must be int32"):
        verify_tree_greedy(outs.predicts, outs.accept_index, outs.accept_token_num.long(), **tensors)
    with pytest.raises(KernelError, match="backend='cuda' cannot run"):
        verify_tree_greedy(*outs, **tensors, backend="cuda")


def test_empty_batch():
    tensors = build_batch([], 4)
    outs = allocate_verify_outputs(0, 4, 4, "cpu")
    result = verify_tree_greedy(*outs, **tensors, backend="triton")
    assert result.accept_token_num.shape == (0,)


_SGLANG_SCRIPT = textwrap.dedent(
    """
    import json, sys, torch
    from sglang.kernels.ops.speculative.spec_tree import verify_tree_greedy_triton
    cases = json.load(open(sys.argv[1]))
    results = []
    for case in cases:
        t = {k: torch.tensor(v, dtype=torch.int64) for k, v in case["tree"].items()}
        b, d = t["candidates"].shape
        predicts = torch.zeros(b * d, dtype=torch.int32)
        accept = torch.full((b, case["max_accept"]), -1, dtype=torch.int32)
        num = torch.zeros(b, dtype=torch.int32)
        verify_tree_greedy_triton(predicts, accept, num, t["candidates"], t["retrieve_index"],
                                  t["retrieve_next_token"], t["retrieve_next_sibling"], t["target_predict"])
        results.append([predicts.tolist(), accept.tolist(), num.tolist()])
    json.dump(results, open(sys.argv[2], "w"))
    """
)


@pytest.mark.sglang
@pytest.mark.slow
def test_reference_matches_sglang_triton_kernel(tmp_path):
    """Differential check of the contract against SGLang 0.5.23's own Triton
    kernel (run under the interpreter in a subprocess; SGLang never loads here)."""
    pytest.importorskip("sglang")
    generator = torch.Generator().manual_seed(11)
    cases, expected = [], []
    for trees, num_draft, max_accept in [
        ([CHAIN, BRANCHY, REJECT, FULL], 6, 4),
        ([TIE, PERMUTED], 5, 4),
        (random_trees(16, 8, 3, generator), 8, 6),
        (random_trees(8, 10, 2, generator), 10, 10),
    ]:
        tensors = build_batch(trees, num_draft)
        outs = allocate_verify_outputs(len(trees), num_draft, max_accept, "cpu")
        verify_tree_greedy_ref(*outs, *tensors.values())
        expected.append([t.tolist() for t in outs])
        cases.append({"tree": {k: v.tolist() for k, v in tensors.items()}, "max_accept": max_accept})
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    (tmp_path / "check.py").write_text(_SGLANG_SCRIPT)
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "check.py"), str(tmp_path / "cases.json"), str(tmp_path / "out.json")],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "out.json").read_text()) == expected
