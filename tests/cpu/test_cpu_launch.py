"""Server launch helpers (no server started here) and the GGUF -> HF target conversion."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle3_backend.cpu.launch import ServerSpec, entry_point_site

REPO = Path(__file__).resolve().parents[2]


def test_server_spec_args_follow_sglang_flags():
    spec = ServerSpec("/t", "/d", num_steps=2, topk=4, num_draft_tokens=6, extra_args=("--x",))
    args = spec.args(1234)
    assert args[args.index("--speculative-algorithm") + 1] == "EAGLE3"
    assert args[args.index("--speculative-num-draft-tokens") + 1] == "6"
    assert args[args.index("--port") + 1] == "1234" and args[-1] == "--x"
    assert "--speculative-algorithm" not in ServerSpec("/t").args(1)


def test_server_spec_refuses_inconsistent_chain():
    with pytest.raises(ValueError, match="num_draft_tokens=4"):
        ServerSpec("/t", "/d", num_steps=3, topk=1, num_draft_tokens=5)


def test_entry_point_site_declares_the_pyproject_entry_points(tmp_path):
    import tomllib

    site = entry_point_site(REPO / "pyproject.toml", tmp_path / "site")
    declared = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["entry-points"]
    assert declared["sglang.srt.platforms"]["eagle3_cpu"] == "eagle3_backend.cpu.entry:activate"
    infos = list(site.glob("*.dist-info"))
    if infos:  # not pip-installed: the generated dist-info carries every declared group
        text = (infos[0] / "entry_points.txt").read_text()
        for group, eps in declared.items():
            assert f"[{group}]" in text
            for name, value in eps.items():
                assert f"{name} = {value}" in text


@pytest.mark.slow
def test_converted_target_is_a_plain_fp32_llama_dir(smollm2_dir):
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert "quantization_config" not in cfg
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["vocab_size"]) == (30, 576, 49152)
    from safetensors import safe_open

    with safe_open(str(smollm2_dir / "model.safetensors"), "pt") as f:
        emb = f.get_tensor("model.embed_tokens.weight")
    assert emb.shape == (49152, 576) and str(emb.dtype) == "torch.float32"
    assert (smollm2_dir / "tokenizer.json").is_file()
    assert "im_start" in (smollm2_dir / "chat_template.jinja").read_text()


def test_sse_events_reads_data_lines_until_done():
    from eagle3_backend.cpu.launch import sse_events

    lines = [b'data: {"text": "a"}\n', b"\n", b": keep-alive\n", b'data: {"text": "ab"}\n', b"\n",
             b"data: [DONE]\n", b'data: {"text": "after"}\n']
    assert sse_events(lines) == ([{"text": "a"}, {"text": "ab"}], True)
    assert sse_events(lines[:4]) == ([{"text": "a"}, {"text": "ab"}], False)  # cut off: no [DONE]


@pytest.mark.server
@pytest.mark.sglang
def test_a_taken_port_is_refused_when_chosen_and_replaced_when_picked(family_target, plugin_site,
                                                                     tmp_path, monkeypatch):
    """Another process listens on the port. Chosen by the caller: SGLang fails to bind it, and
    start() stops the server and says which port is taken. Picked by CpuServer itself (taken
    between the pick and the bind, as a parallel test can): it starts again on a fresh one."""
    import socket

    from cpu_testutil import START_TIMEOUT, family_spec

    from eagle3_backend.cpu import launch

    spec = family_spec(family_target("llama"))
    paths = {"pythonpath": (str(plugin_site), str(REPO)), "start_timeout": START_TIMEOUT}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        chosen = launch.CpuServer(spec, tmp_path / "chosen.log", port=port, **paths)
        with pytest.raises(launch.ServerError, match=f"port {port} is already in use by another process"):
            chosen.start()
        assert launch.BIND_ERROR in chosen.log_text() and chosen.proc.poll() is not None
        picks = iter([port, launch.free_port()])
        monkeypatch.setattr(launch, "free_port", lambda: next(picks))
        with launch.CpuServer(spec, tmp_path / "picked.log", **paths) as server:
            assert server.port != port
            out = server.generate([101, 2002, 303, 4004], 4, timeout=120)
    assert len(out["output_ids"]) == 4
