"""Target loading and layout hidden-state capture (canonical names vs HF hidden_states)."""

from __future__ import annotations

import pytest
import torch

from eagle3_backend.errors import LayoutError, TargetError
from eagle3_backend.verify.targets import HiddenCapture, load_target, parse_dtype


def test_bundled_target_shape(smol_target):
    assert (smol_target.num_layers, smol_target.hidden_size, smol_target.vocab_size) == (30, 576, 49152)
    assert smol_target.dtype == torch.float32
    assert 2 in smol_target.eos_token_ids  # <|im_end|>
    assert smol_target.tokenizer.chat_template


@torch.inference_mode()
def test_capture_matches_hf_hidden_states(smol_target):
    ids = torch.tensor([[1, 504, 3575, 282, 4649, 314]])
    layout = "[layer_input:29, embed, layer_input:3, layer_input:30]"  # not in layer order
    with HiddenCapture(smol_target.model, layout) as cap:
        out = smol_target.model(ids, output_hidden_states=True)
        aux = cap.take()
    hs = out.hidden_states
    H = smol_target.hidden_size
    assert aux.shape == (1, 6, 4 * H)
    chunks = aux.split(H, dim=-1)
    # layout order is kept: chunk i is source i
    torch.testing.assert_close(chunks[0], hs[29], rtol=0, atol=0)
    torch.testing.assert_close(chunks[1], hs[0], rtol=0, atol=0)
    torch.testing.assert_close(chunks[1], smol_target.model.get_input_embeddings()(ids), rtol=0, atol=0)
    torch.testing.assert_close(chunks[2], hs[3], rtol=0, atol=0)
    # layer_input:30 is the last layer's output BEFORE the final norm; HF's last entry is normed.
    last = chunks[3]
    assert (last - hs[30]).abs().max() > 1.0
    torch.testing.assert_close(smol_target.model.model.norm(last), hs[30], rtol=0, atol=0)


@torch.inference_mode()
def test_capture_hooks_removed_and_take_requires_forward(smol_target):
    model = smol_target.model
    layer0 = model.model.layers[0]
    before = len(layer0._forward_pre_hooks)
    with HiddenCapture(model, "[embed]") as cap:
        assert len(layer0._forward_pre_hooks) == before + 1
        with pytest.raises(TargetError, match="take\\(\\) must follow a target forward"):
            cap.take()
    assert len(layer0._forward_pre_hooks) == before


def test_capture_rejects_layer_beyond_target(smol_target):
    with pytest.raises(LayoutError, match="30 decoder layers"):
        HiddenCapture(smol_target.model, "[embed, layer_input:31]")


def test_load_target_errors(tmp_path):
    with pytest.raises(TargetError, match="does not exist"):
        load_target(tmp_path / "nope")
    bad = tmp_path / "weights.bin"
    bad.write_bytes(b"x")
    with pytest.raises(TargetError, match="not a .gguf"):
        load_target(bad)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(TargetError, match="no config.json and 0 .gguf"):
        load_target(empty)
    with pytest.raises(TargetError, match="unknown dtype"):
        parse_dtype("float8")
    assert parse_dtype("bf16") == torch.bfloat16
    assert parse_dtype("half") == torch.float16  # torch.half, as config.json files write it


def test_unreadable_gguf_target_is_one_sentence(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_text("garbage")
    with pytest.raises(TargetError) as info:
        load_target(bad)
    assert str(info.value) == (
        f"transformers could not load target {str(bad)!r}: {bad} does not start with the GGUF "
        "magic bytes, so it is not a GGUF file. Expected a causal LM model dir or GGUF file "
        "that transformers supports.")


def test_a_multimodal_target_loads_its_language_model(tiny_target_dir, tmp_path):
    """Kimi-K2.5 (a vision tower around Kimi-K2's model): the offline tools run its language
    model, exactly the Kimi-K2 model it wraps (transformers refused the whole with a list of
    ~200 causal LM config classes). Language tensors that do not fit text_config are refused,
    never run random."""
    from eagle3_backend.cpu.tiny_targets import write_kimi_k25, write_target

    inner = write_target("kimi_k2", tmp_path / "kimi-k2", hidden_size=64, layers=3)
    wrapped = load_target(write_kimi_k25(inner, tmp_path / "k25"), progress=False)
    plain = load_target(inner, progress=False)
    assert type(wrapped.model).__name__ == "DeepseekV3ForCausalLM"
    assert (wrapped.num_layers, wrapped.hidden_size, wrapped.vocab_size) == (3, 64, 49152)
    ids = torch.tensor([[5, 900, 31, 7, 7, 4000]])
    with torch.no_grad():
        assert torch.equal(wrapped.model(ids).logits, plain.model(ids).logits)

    # a Llama's tensors under a Kimi-K2.5 config: other shapes, and DeepSeek's experts missing
    with pytest.raises(TargetError) as info:
        load_target(write_kimi_k25(tiny_target_dir, tmp_path / "k25-llama"), progress=False)
    assert str(info.value).startswith(
        f"transformers could not load target {str(tmp_path / 'k25-llama')!r}: its language model "
        "(text_config, DeepseekV3Config) does not match its tensors: ")


def test_load_hf_dir_target(tiny_target_dir):
    t = load_target(tiny_target_dir, "bfloat16")
    assert (t.num_layers, t.hidden_size, t.dtype) == (8, 64, torch.bfloat16)
    assert next(t.model.parameters()).dtype == torch.bfloat16
    # its config.json, as validate and convert take it, means the dir (eval refused it)
    t = load_target(tiny_target_dir / "config.json", "bfloat16")
    assert (t.path, t.num_layers) == (str(tiny_target_dir), 8)


class _RunsCode:
    """Pickled, it calls os.system on load unless the loader restricts globals."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_pickle_target_weights_are_refused_unless_allowed(tiny_target_dir, tmp_path, capsys):
    """A HF dir whose weights are pytorch_model.bin: refused by load_target and by the eval /
    doctor / train commands (exit 2, naming --allow-pickle); with allow_pickle it loads the
    same weights, and a pickle that runs code is still not run (weights_only)."""
    import shutil

    from safetensors.torch import load_file

    from eagle3_backend.cli import main

    pk = tmp_path / "pickled"
    shutil.copytree(tiny_target_dir, pk)
    sd = load_file(str(pk / "model.safetensors"))
    (pk / "model.safetensors").unlink()
    torch.save(sd, pk / "pytorch_model.bin")
    message = (f"target {str(pk)!r} has its weights only in pickle file(s) pytorch_model.bin, "
               "which can run arbitrary code when loaded, so they are refused; expected "
               "model.safetensors. If you trust them, pass --allow-pickle")
    with pytest.raises(TargetError, match=r"^" + message.replace("(", r"\(").replace(")", r"\)")):
        load_target(pk)
    from eagle3_backend.checkpoint.demo import make_demo_draft
    from eagle3_backend.target import TargetInfo

    make_demo_draft(tmp_path / "d", TargetInfo.from_path(tiny_target_dir))  # eval checks it first
    for argv in (["eval", "--draft", tmp_path / "d"], ["doctor", tmp_path / "d"],
                 ["train", "--out", tmp_path / "o", "--layout", "[embed]"]):
        assert main([*map(str, argv), "--target", str(pk), "--no-progress"]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith(f"eagle3 {argv[0]}: error: {message}"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "pickled"]

    t = load_target(pk, allow_pickle=True)
    ref = load_target(tiny_target_dir)
    for (name, a), (_, b) in zip(t.model.state_dict().items(), ref.model.state_dict().items()):
        assert torch.equal(a, b), name

    marker = tmp_path / "ran"
    torch.save({**sd, "x": _RunsCode(marker)}, pk / "pytorch_model.bin")
    with pytest.raises(TargetError, match=r"its pickle weights do not load with torch.load\("
                                          r"weights_only=True\) \(Weights only load failed"):
        load_target(pk, allow_pickle=True)
    assert not marker.exists()


def test_transformers_progress_off_hides_the_gguf_bar_and_restores_it(capfd):
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    from eagle3_backend.verify.targets import transformers_progress

    def bar_output() -> str:
        for _ in gguf_utils.tqdm(range(3), desc="de-quantizing probe"):
            pass
        return capfd.readouterr().err

    assert "de-quantizing probe" in bar_output()  # the probe shows a bar when left alone
    bar = gguf_utils.tqdm
    with transformers_progress(False):
        assert bar_output() == ""
        assert not hf_logging.is_progress_bar_enabled()
    assert gguf_utils.tqdm is bar and hf_logging.is_progress_bar_enabled()
    with transformers_progress(True):
        assert "de-quantizing probe" in bar_output()


def test_load_target_without_progress_prints_no_bar(capfd):
    """The bundled GGUF de-quantizes with transformers' own tqdm bar unless told not to."""
    target = load_target("bundled", "float32", "cpu", progress=False)
    assert target.num_layers == 30
    err = capfd.readouterr().err
    assert "de-quantizing" not in err and "it/s]" not in err, err[-500:]
