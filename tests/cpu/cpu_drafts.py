"""Drafts for the CPU serving tier, built with the package's own checkpoint tooling.

``make_random_draft``: ``eagle3 make-demo-draft``'s random draft (SGLang's
default layout for the target); its proposals are almost never accepted.

``make_echo_draft``: a constructed draft whose proposals *are* accepted on
repetitive text, so the accept path (multi-token commits, KV compaction,
bonus tokens) runs end to end without a trained draft. Its fc copies the
``embed`` slot (the target's embedding of the current token x_t) through an
identity block and zeroes the other slots; the midlayer's o_proj and
down_proj are zero, so the draft's output hidden state is that embedding;
its lm_head is the target embedding with unit-norm rows, so the proposal is
the token whose embedding points the same way: x_t itself. At every step it
proposes "the same token again", which the target accepts when it repeats a
token (e.g. "apple apple apple ..."). The echo depends on the ``embed`` slot
being served exactly: fed any other slot (even layer_input:1) the proposal is
almost never the current token (measured on SmolLM2-135M: 100% vs 1.4%).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

ECHO_LAYOUT = "[embed, layer_input:15, layer_input:27]"


def make_random_draft(out: Path, target_dir: Path, seed: int = 0, layout: str | None = None) -> Path:
    """The demo draft (random weights); ``layout`` None: the target's engine default."""
    from eagle3_backend.checkpoint.demo import build_demo_draft, make_demo_draft
    from eagle3_backend.checkpoint.write import save_sglang
    from eagle3_backend.layout import Layout
    from eagle3_backend.model import Eagle3DraftModel
    from eagle3_backend.target import TargetInfo

    target = TargetInfo.from_path(str(target_dir))
    if layout is None:
        path, _ = make_demo_draft(out, target, seed=seed, dtype="float32", force=True)
        return Path(path)
    lay = Layout.parse(layout)
    base = build_demo_draft(target, seed=seed, dtype="float32")
    cfg = dataclasses.replace(base.config, layout=lay)
    sd = dict(base.state_dict)
    sd["fc.weight"] = Eagle3DraftModel.init_random(cfg, seed=seed).state_dict()["fc.weight"].clone()
    draft = dataclasses.replace(base, config=cfg, state_dict=sd, layout_explanation=f"random draft, layout {lay}")
    return _keep_order(Path(save_sglang(draft, out, target=target, force=True)), lay)


def _keep_order(path: Path, layout) -> Path:
    """Undo the SGLang writer's reordering into layer order: the checkpoint records ``layout``
    in its own (fc-input) order, fc column blocks permuted back, and no eagle_config ids (stock
    SGLang concatenates in layer order, so no ids can express this order; the plugin serves it)."""
    import json

    from safetensors.torch import load_file, save_file

    cfg_path = path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    if cfg["eagle3_layout"] == layout.to_strings():
        return path
    sorted_layout, perm = layout.sorted_order()       # sorted slot k holds layout slot perm[k]
    assert cfg["eagle3_layout"] == sorted_layout.to_strings(), cfg["eagle3_layout"]
    tensors = load_file(str(path / "model.safetensors"))
    blocks = tensors["fc.weight"].chunk(len(perm), dim=-1)  # in sorted order
    back = [None] * len(perm)
    for k, p in enumerate(perm):
        back[p] = blocks[k]
    tensors["fc.weight"] = torch.cat(back, dim=-1).contiguous()
    save_file(tensors, str(path / "model.safetensors"))
    cfg["eagle3_layout"] = layout.to_strings()
    del cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    cfg_path.write_text(json.dumps(cfg, indent=2))
    return path


def make_echo_draft(out: Path, target_dir: Path, layout: str = ECHO_LAYOUT, seed: int = 1) -> Path:
    from eagle3_backend.checkpoint.demo import build_demo_draft
    from eagle3_backend.checkpoint.write import save_sglang
    from eagle3_backend.layout import Layout
    from eagle3_backend.model import Eagle3DraftModel
    from eagle3_backend.target import TargetInfo

    target = TargetInfo.from_path(str(target_dir))
    base = build_demo_draft(target, seed=seed, draft_vocab_size=target.vocab_size, dtype="float32")
    lay = Layout.parse(layout)
    cfg = dataclasses.replace(base.config, layout=lay)
    model = Eagle3DraftModel.init_random(cfg, seed=seed)
    model.set_vocab_map(torch.arange(cfg.draft_vocab_size))
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    h = cfg.hidden_size
    embed = base.state_dict["embed_tokens.weight"].float()              # [V, H]
    slot = [str(s) for s in lay.sources].index("embed")
    fc = torch.zeros_like(sd["fc.weight"])                               # [H, K*H]
    fc[:, slot * h:(slot + 1) * h] = torch.eye(h)
    sd["fc.weight"] = fc
    sd["midlayer.self_attn.o_proj.weight"].zero_()
    sd["midlayer.mlp.down_proj.weight"].zero_()
    sd["norm.weight"] = torch.ones(h)
    sd["embed_tokens.weight"] = embed
    sd["lm_head.weight"] = embed / embed.norm(dim=-1, keepdim=True)
    draft = dataclasses.replace(base, config=cfg, state_dict=sd,
                                layout_explanation=f"echo probe draft, layout {lay}")
    return _keep_order(Path(save_sglang(draft, out, target=target, force=True)), lay)
