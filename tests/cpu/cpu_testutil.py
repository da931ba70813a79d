"""Helpers shared by the CPU-tier tests (imported as a module: tests/cpu is on sys.path)."""

from __future__ import annotations

from pathlib import Path

import torch


def assert_close_report(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float,
                        what: str) -> None:
    """assert_close that names the first mismatching index and both values."""
    actual = actual.double()
    expected = expected.double()
    bad = ~torch.isclose(actual, expected, atol=atol, rtol=rtol)
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.numel()} elements differ; first at {idx}: "
            f"got {actual[idx].item():.6g}, expected {expected[idx].item():.6g} "
            f"(atol={atol}, rtol={rtol})")


def assert_same_tokens(got: dict[str, dict], ref: dict[str, dict], what: str) -> None:
    """Every prompt's output_ids equal the reference server's; names the first divergence."""
    for name, out in got.items():
        a, b = out["output_ids"], ref[name]["output_ids"]
        if a != b:
            i = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            raise AssertionError(f"{what}: prompt {name} diverges from target-only at output token {i}: "
                                 f"{a[i:i + 5]} vs {b[i:i + 5]} (lengths {len(a)}, {len(b)})")


def offline_acceptance(target_dir, draft_dir, prompts, names, steps, topk, n):
    """The offline verifier's (acceptance length, output ids) per prompt, same draft and settings."""
    from eagle3_backend.verify.engine import SpeculativeEngine, load_draft_model
    from eagle3_backend.verify.metrics import acceptance_length
    from eagle3_backend.verify.targets import load_target
    from eagle3_backend.verify.tree import SpecSettings

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # this process spins its OpenMP threads by default; one thread never waits
    try:
        target = load_target(str(target_dir), dtype="float32")
        engine = SpeculativeEngine(target, load_draft_model(draft_dir, target), SpecSettings(steps, topk, n))
        out = {}
        for name in names:
            ids, max_new = prompts[name]
            res = engine.generate(ids, max_new)
            out[name] = (acceptance_length(res.completion_tokens, res.verify_steps), res.tokens)
    finally:
        torch.set_num_threads(threads)
    return out


def assert_fc_input_matches_hf(dump, target_dir, layout: str, rtol: float = 1e-4) -> None:
    """The fc input a server dumped (EAGLE3_DUMP_FC_INPUT) equals HF transformers' hidden_states
    of the same ids, slot by slot in layout order (hidden_states[k] is the residual stream
    entering layer k; 0 the embedding, which must match bit for bit; L the last layer's output
    before the final norm, read with a hook)."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from eagle3_backend.layout import Layout

    got = load_file(str(dump))
    ids, fc = got["input_ids"].long(), got["fc_input"].float()            # [T], [T, K*H]
    lay = Layout.parse(layout)
    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()
    layers = model.model.layers
    last: list[torch.Tensor] = []  # the last layer's output before the final norm (layer_input:L)
    hook = layers[-1].register_forward_hook(
        lambda _m, _i, out: last.append(out[0] if isinstance(out, tuple) else out))
    try:
        with torch.no_grad():
            hs = list(model(ids[None], output_hidden_states=True).hidden_states)  # L+1 x [1, T, H]
    finally:
        hook.remove()
    hs[len(layers)] = last[0]
    h = hs[0].shape[-1]
    assert fc.shape == (ids.shape[0], len(lay) * h), (fc.shape, ids.shape, len(lay), h)
    for j, src in enumerate(lay.sources):
        want = hs[src.layer][0]
        slot = fc[:, j * h:(j + 1) * h]
        if src.is_embed:
            assert torch.equal(slot, want), f"slot {j} ({src}): the embed slot is the embedding, bit for bit"
        else:
            assert_close_report(slot, want, atol=rtol * max(1.0, want.abs().max().item()), rtol=rtol,
                                what=f"fc input slot {j} ({src}) vs HF hidden_states[{src.layer}]")


# ------------------------------------------------------------------ servers of the family tier
START_TIMEOUT = 420.0
REQUEST_TIMEOUT = 120.0
REPO = Path(__file__).resolve().parents[2]


def family_spec(target, draft=None, tree: bool = False, tp: int = 1):
    """Target-only, EAGLE-3 chain (3 steps) or top-k 4 tree, input ids only (random targets)."""
    from eagle3_backend.cpu.launch import ServerSpec

    extra = ("--skip-tokenizer-init",) + (("--tp-size", str(tp)) if tp > 1 else ())
    if draft is None:
        return ServerSpec(str(target), extra_args=extra)
    if tree:
        return ServerSpec(str(target), str(draft), num_steps=3, topk=4, num_draft_tokens=8, extra_args=extra)
    return ServerSpec(str(target), str(draft), num_steps=3, topk=1, num_draft_tokens=4, extra_args=extra)


def serve_prompts(spec, plugin_site, log, prompts, env: dict[str, str] | None = None) -> tuple[dict, str]:
    """Start a bounded server, send every prompt greedily one at a time, stop it: (outputs, log)."""
    from eagle3_backend.cpu.launch import CpuServer

    with CpuServer(spec, Path(log), pythonpath=(str(plugin_site), str(REPO)), start_timeout=START_TIMEOUT,
                   env_extra=env or {}) as srv:
        outs = {name: srv.generate(ids, n, timeout=REQUEST_TIMEOUT) for name, (ids, n) in prompts.items()}
        return outs, srv.log_text()
