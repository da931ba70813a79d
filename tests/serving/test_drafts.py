"""The live-draft admin's pieces in process (serving/drafts.py); the server tier is
tests/cpu/test_cpu_draft_admin.py."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest
import torch

from eagle3_backend.serving import checks, drafts, runtime
from eagle3_backend.plan import ServingPlan

LAUNCH = "/venv/lib/python3.11/site-packages/sglang/launch_server.py"


def test_restart_command_sets_the_draft_path():
    argv = [LAUNCH, "--model-path", "/m", "--speculative-draft-model-path", "/old", "--port", "1"]
    assert drafts.restart_command(argv, "/new dir", env={}) == (
        "python -m sglang.launch_server --model-path /m --speculative-draft-model-path '/new dir' --port 1")
    assert drafts.restart_command([LAUNCH, "--speculative-draft-model-path=/old"], "/n", env={}) == (
        "python -m sglang.launch_server --speculative-draft-model-path=/n")
    assert drafts.restart_command([LAUNCH, "--model-path", "/m"], "/n", env={}) == (
        "python -m sglang.launch_server --model-path /m --speculative-draft-model-path /n")
    assert drafts.restart_command(["/venv/bin/sglang", "serve", "--model-path", "/m"], "/n", env={}) == (
        "sglang serve --model-path /m --speculative-draft-model-path /n")
    assert drafts.restart_command(["my_engine.py"], "/n", env={}) == (
        "your launch command with --speculative-draft-model-path /n")


def test_restart_command_repeats_the_launch_environment_but_no_key():
    env = {"SGLANG_USE_CPU_ENGINE": "1", "SGLANG_CPU_OMP_THREADS_BIND": "0|1", "SGLANG_API_KEY": "secret",
           "SGLANG_PLUGINS": ""}
    assert drafts.restart_command([LAUNCH, "--model-path", "/m"], "/n", env=env) == (
        "SGLANG_USE_CPU_ENGINE=1 SGLANG_CPU_OMP_THREADS_BIND='0|1' python -m sglang.launch_server "
        "--model-path /m --speculative-draft-model-path /n")


def test_weights_digest_covers_names_dtypes_shapes_and_bytes():
    a = [("w", torch.arange(6, dtype=torch.float32).reshape(2, 3)), ("b", torch.ones(2, dtype=torch.bfloat16))]
    digest, n = drafts.weights_digest(a)
    assert n == 2 and digest == drafts.weights_digest(list(reversed(a)))[0]  # name order
    changed = [("w", a[0][1].clone()), a[1]]
    changed[0][1][1, 2] = 5.5
    assert drafts.weights_digest(changed)[0] != digest
    assert drafts.weights_digest([("w", a[0][1].reshape(3, 2)), a[1]])[0] != digest
    assert drafts.weights_digest([("v", a[0][1]), a[1]])[0] != digest


@dataclass
class _Req:
    model_path: str


@dataclass
class _Out:
    success: bool
    message: str
    num_paused_requests: int = 0


@pytest.fixture
def plan(monkeypatch):
    p = ServingPlan(layout="[embed, layer_input:2]", architecture="LlamaForCausalLM", num_layers=4,
                    hidden_size=8, draft_path="/drafts/d", layout_source="explicit")
    monkeypatch.setenv(checks.PLAN_ENV, p.to_json())
    runtime.process_plan.cache_clear()
    drafts.record_load(p.draft_path, str(p.layout))
    yield p
    runtime.process_plan.cache_clear()


def _stock_select(manager, selector="all"):
    return [("target", "T"), ("draft", "D0"), ("draft", "D1")]


def test_disk_update_reaches_the_target_runner_only(plan, tmp_path):
    selected = []

    def original(manager, recv_req):  # SGLang's update: select the runners, load each
        selected.append(drafts.around_select_runners(_stock_select, manager))
        return _Out(True, "Succeeded to update model weights.")

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    out = drafts.around_update_weights_from_disk(original, object(), _Req(str(tmp_path)))
    assert selected == [[("target", "T")]]
    assert out.success and out.message == (
        "Succeeded to update model weights. eagle3_backend: updated the target only; the EAGLE-3 "
        "draft /drafts/d was kept (SGLang 0.5.23 would also load the target's checkpoint into the "
        "draft). Change the draft with POST /eagle3/draft/swap.")
    # outside the guard (tensor/distributed updates with their own selector) nothing changes
    assert drafts.around_select_runners(_stock_select, object(), "all") == _stock_select(None)


def test_disk_update_failure_says_the_draft_was_not_touched(plan, tmp_path):
    out = drafts.around_update_weights_from_disk(
        lambda m, r: _Out(False, "Failed to get weights iterator: boom."), object(), _Req(str(tmp_path)))
    assert not out.success and out.message == (
        "Failed to get weights iterator: boom. (eagle3_backend: the EAGLE-3 draft /drafts/d was not touched.)")


def test_disk_update_of_a_draft_checkpoint_is_refused_before_loading(plan, tmp_path):
    pytest.importorskip("sglang")
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLMEagle3"]}))

    def original(manager, recv_req):
        raise AssertionError("SGLang's update must not run")

    out = drafts.around_update_weights_from_disk(original, object(), _Req(str(tmp_path)))
    assert not out.success and out.num_paused_requests == 0
    assert out.message == (
        f"eagle3_backend: {tmp_path} is an EAGLE-3 draft checkpoint (architectures "
        f"['LlamaForCausalLMEagle3']); /update_weights_from_disk loads the target's weights and "
        f"would put it into the target. Nothing was changed. To change the draft, POST "
        f'/eagle3/draft/swap {{"path": "{tmp_path}"}}.')


def test_without_a_plan_the_update_is_sglangs_own(monkeypatch):
    monkeypatch.delenv(checks.PLAN_ENV, raising=False)
    runtime.process_plan.cache_clear()
    try:
        out = drafts.around_update_weights_from_disk(lambda m, r: _Out(True, "ok"), object(), _Req("/x"))
    finally:
        runtime.process_plan.cache_clear()
    assert out == _Out(True, "ok")


def test_acceptance_counts_start_at_the_load(plan):
    drafts.after_update_spec_metrics(None, object(), 2, 3, num_accept_tokens=7)
    drafts.after_update_spec_metrics(None, object(), 1, 0, num_accept_tokens=1, num_cap_tokens=0)
    rec = drafts.active()
    assert (rec.verify_steps, rec.accepted_tokens, rec.correct_drafts) == (3, 8, 3)
    drafts.record_load("/drafts/e", "[embed, layer_input:2]")
    rec = drafts.active()
    assert (rec.path, rec.verify_steps, rec.accepted_tokens) == ("/drafts/e", 0, 0)


# ------------------------------------------------------------------------ the swap's pieces
def test_swap_request_defaults_and_refusals():
    req = drafts._swap_request({"path": "/d"})
    assert (req.path, req.probes, req.tokens, req.margin, req.keep_if_worse, req.texts, req.input_ids) == (
        "/d", drafts.PROBE_PROMPTS, drafts.PROBE_TOKENS, drafts.MARGIN, False, None, None)
    req = drafts._swap_request({"path": "/d", "probe_input_ids": [[1, 2], [3]], "margin": 0})
    assert (req.probes, req.input_ids, req.margin) == (2, ((1, 2), (3,)), 0.0)
    assert drafts._swap_request({"path": "/d", "probe_texts": ["hi"], "probe_prompts": 3}).probes == 3

    def refusal(body):
        v = drafts._swap_request(body)
        assert isinstance(v, drafts.SwapVerdict) and v.status == 400 and v.body["stage"] == "request"
        return v.body["message"]

    assert refusal([]) == 'eagle3_backend: /eagle3/draft/swap expects a JSON body {"path": DIR}; got [].'
    assert refusal({"path": "/d", "probe_prompts": True}).startswith(
        "eagle3_backend: /eagle3/draft/swap expects probe_prompts as an integer >= 0 (0: no canary); got ")
    assert "expects probe_tokens as an integer in [1, 4096]" in refusal({"path": "/d", "probe_tokens": 0})
    assert "expects keep_if_worse as true or false" in refusal({"path": "/d", "keep_if_worse": "yes"})
    assert "expects probe_texts as a list of non-empty strings" in refusal({"path": "/d", "probe_texts": [""]})
    assert "(not with probe_texts)" in refusal({"path": "/d", "probe_texts": ["a"], "probe_input_ids": [[1]]})
    assert "(not with probe_texts)" in refusal({"path": "/d", "probe_input_ids": [[-1]]})


def test_each_rank_reads_safetensors_only_and_checks_them(tmp_path):
    from safetensors.torch import save_file

    from eagle3_backend.errors import ServingError
    from eagle3_backend.serving.swap import read_checkpoint

    manifest = {"fc.weight": (4, 8), "norm.weight": (4,), "d2t": (3,)}
    good = {"fc.weight": torch.ones(4, 8), "norm.weight": torch.ones(4), "d2t": torch.zeros(3, dtype=torch.int64)}

    def write(name, tensors):
        d = tmp_path / name
        d.mkdir()
        save_file(tensors, str(d / "model.safetensors"))
        return d

    got = read_checkpoint(str(write("good", good)), manifest)
    assert set(got) == set(good) and all(torch.equal(got[k], good[k]) for k in good)

    def refused(path) -> str:
        with pytest.raises(ServingError) as err:
            read_checkpoint(str(path), manifest)
        return str(err.value)

    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "pytorch_model.bin").write_bytes(b"not read")
    assert refused(empty) == (  # checkpoint.files.read_tensors's words: never unpickled
        f"{empty}: weights are in pickle file(s) pytorch_model.bin, which can run arbitrary code when "
        f"loaded, so they are refused; expected model.safetensors. If you trust the file, make a "
        f"safetensors copy once and use it (a server or `eagle3 swap` too): `eagle3 convert {empty} "
        f"OUT --to sglang --allow-pickle` (read with torch.load(weights_only=True)); the other "
        f"eagle3 commands also take --allow-pickle.")
    odd = {"fc.weight": torch.ones(4, 9), "norm.weight": torch.ones(4), "extra": torch.ones(1)}
    assert refused(write("odd", odd)) == (
        "its tensors differ from the served draft's: missing ['d2t']; not in the served draft ['extra']; "
        "other shapes: fc.weight [4, 9] (served [4, 8])")
    nan = dict(good, **{"norm.weight": torch.tensor([1.0, float("nan"), 1.0, float("inf")])})
    assert refused(write("nan", nan)) == "tensor(s) ['norm.weight'] hold NaN or Inf values"
    cut = write("cut", good)
    data = (cut / "model.safetensors").read_bytes()
    (cut / "model.safetensors").write_bytes(data[: len(data) - 7])
    assert refused(cut).startswith(f"{cut / 'model.safetensors'}: not a readable safetensors file (")
    assert refused(cut).endswith("); re-copy or re-export it.")


def test_target_owned_params_get_write_nothing_placeholders():
    from eagle3_backend.serving.swap import _Placeholders

    class Draft(torch.nn.Module):
        def __init__(self, shared):
            super().__init__()
            self.embed = torch.nn.Embedding(4, 2)
            self.embed.weight = shared                       # the target's own parameter object
            self.fc = torch.nn.Linear(2, 2, bias=False)

        def load_weights(self, weights):                     # SGLang's pattern: the param's loader
            params = dict(self.named_parameters())
            for name, w in weights:
                p = params[name]
                getattr(p, "weight_loader", lambda q, x: q.data.copy_(x))(p, w)

    shared = torch.nn.Parameter(torch.arange(8.0).reshape(4, 2), requires_grad=False)
    model = Draft(shared)
    with _Placeholders(model, {id(shared)}) as ph:
        model.load_weights([("embed.weight", torch.zeros(4, 2)), ("fc.weight", torch.full((2, 2), 3.0))])
    assert ph.skipped == ["embed.weight"]
    assert model.embed.weight is shared and torch.equal(shared, torch.arange(8.0).reshape(4, 2))
    assert torch.equal(model.fc.weight, torch.full((2, 2), 3.0))


def test_swap_is_refused_where_not_every_rank_gets_its_requests():
    from types import SimpleNamespace as Args

    assert drafts.unsupported_parallelism(Args(enable_dp_attention=False, pp_size=1)) == []
    assert drafts.unsupported_parallelism(Args(tp_size=8)) == []
    assert drafts.unsupported_parallelism(Args(enable_dp_attention=True, pp_size=2)) == [
        "--enable-dp-attention", "--pp-size 2"]
