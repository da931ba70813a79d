"""The scheduler-side hook handlers, run in process against SGLang's real functions:
configure_aux_hidden_state_capture with the real LlamaForCausalLM capture rule, and
LlamaForCausalLMEagle3.load_weights with a renamed tensor."""

from __future__ import annotations

import pkgutil
from types import SimpleNamespace

import pytest
import torch

from eagle3_backend.errors import CheckpointError, ServingError
from eagle3_backend.serving import checks, collect, hooks, runtime
from eagle3_backend.plan import ServingPlan

pytestmark = pytest.mark.sglang

CONFIGURE = ("sglang.srt.model_executor.model_runner_components.attention_backend_setup."
             "configure_aux_hidden_state_capture")


@pytest.fixture
def plan_env(monkeypatch):
    pytest.importorskip("sglang")
    plan = ServingPlan(layout="[layer_input:5, embed, layer_input:2]", architecture="LlamaForCausalLM",
                       num_layers=8, hidden_size=16, draft_path="/drafts/d", layout_source="explicit")
    monkeypatch.setenv(checks.PLAN_ENV, plan.to_json())
    runtime.process_plan.cache_clear()
    spec = SimpleNamespace(speculative_algorithm="EAGLE3", speculative_draft_model_path="/drafts/d")
    real = hooks._resolve
    monkeypatch.setattr(hooks, "_resolve", lambda t: (lambda: spec) if t.endswith("runtime_context.get_spec") else real(t))
    yield plan
    runtime.process_plan.cache_clear()
    collect.deactivate()


def _llama(rule_override=None):
    """A LlamaForCausalLM instance without weights: the real class, its real capture rule."""
    base = pkgutil.resolve_name("sglang.srt.models.llama.LlamaForCausalLM")
    namespace = {} if rule_override is None else {"set_eagle3_layers_to_capture": rule_override}
    cls = type("LlamaForCausalLM", (base,), {**namespace, "__module__": "tests.fake"})
    model = object.__new__(cls)
    object.__setattr__(model, "__dict__", {})
    model.pp_group = SimpleNamespace(is_last_rank=True)
    model.config = SimpleNamespace(num_hidden_layers=8)
    model.model = SimpleNamespace(layers_to_capture=[], embed_tokens=torch.nn.Embedding(10, 16))
    return model


def _configure(model, ids_from_sglang=(1, 2, 3)):
    original = pkgutil.resolve_name(CONFIGURE)
    return runtime.around_configure_capture(
        original, model=model, eagle_use_aux_hidden_state=True,
        eagle_aux_hidden_state_layer_ids=list(ids_from_sglang), dflash_use_aux_hidden_state=False,
        dflash_target_layer_ids=None, is_dspark=False)


def test_target_captures_the_plan_and_collectors_follow_it(plan_env):
    model = _llama()
    _configure(model)  # SGLang's own ids from the draft config are replaced
    assert sorted(model.model.layers_to_capture) == [0, 2, 5]
    assert model.capture_aux_hidden_states is True
    st = collect.state()
    assert st.plan == plan_env and st.embed is model.model.embed_tokens and st.selfcheck_pending


def test_a_model_file_with_another_rule_is_refused(plan_env):
    def verbatim(self, layer_ids=None):  # not SGLang 0.5.23's llama rule
        self.capture_aux_hidden_states = True
        self.model.layers_to_capture = list(layer_ids)

    with pytest.raises(ServingError, match=r"turned ids \[-1, 1, 4\] into layers_to_capture "
                                           r"\[-1, 1, 4\]; expected \[0, 2, 5\]"):
        _configure(_llama(verbatim))
    assert collect.state().plan is None  # nothing activated


def test_another_model_class_is_refused(plan_env):
    with pytest.raises(ServingError, match="not the sglang.srt.models.llama.LlamaForCausalLM"):
        _configure(SimpleNamespace(model=_llama().model))


def test_capture_only_mode_and_draft_runners_are_left_alone(plan_env):
    seen = []
    runtime.around_configure_capture(lambda **kw: seen.append(kw), model=None,
                                     eagle_use_aux_hidden_state=False,
                                     eagle_aux_hidden_state_layer_ids=None,
                                     dflash_use_aux_hidden_state=False, dflash_target_layer_ids=None,
                                     is_dspark=False)
    assert seen and seen[0]["eagle_aux_hidden_state_layer_ids"] is None
    assert collect.state().plan is None


def test_a_scheduler_without_a_checked_plan_refuses(plan_env, monkeypatch):
    monkeypatch.delenv(checks.PLAN_ENV)
    runtime.process_plan.cache_clear()
    with pytest.raises(ServingError, match="has no checked serving plan"):
        _configure(_llama())


# ---------------------------------------------------------------------- draft load_weights
class _FakeDraft(torch.nn.Module):
    """Parameters named like LlamaForCausalLMEagle3's (enough for its real load_weights)."""

    def __init__(self) -> None:
        super().__init__()
        self.model = torch.nn.Module()
        self.model.fc = torch.nn.Linear(6, 4, bias=False)
        self.model.norm = torch.nn.Module()
        self.model.norm.weight = torch.nn.Parameter(torch.zeros(4))
        self.model.embed_tokens = torch.nn.Embedding(10, 4)
        self.lm_head = torch.nn.Parameter(torch.zeros(3, 4))
        self.load_lm_head_from_target = False


def _load(weights):
    original = pkgutil.resolve_name("sglang.srt.models.llama_eagle3.LlamaForCausalLMEagle3.load_weights")
    draft = _FakeDraft()
    runtime.around_draft_load_weights(original, draft, iter(weights))
    return draft


def test_draft_load_weights_consumes_every_tensor(plan_env):
    fc = torch.arange(24.0).view(4, 6)
    draft = _load([("fc.weight", fc), ("norm.weight", torch.ones(4)), ("lm_head", torch.ones(3, 4)),
                   ("d2t", torch.zeros(3, dtype=torch.int64))])
    assert torch.equal(draft.model.fc.weight, fc)
    assert "weight_loader" not in draft.model.fc.weight.__dict__  # the tracking loaders are gone


def test_draft_load_weights_refuses_a_skipped_tensor(plan_env):
    with pytest.raises(CheckpointError, match=r"skipped draft tensor\(s\) \['fc_proj.weight'\] and left "
                                              r"parameter\(s\) \['model.fc.weight'\] unloaded"):
        _load([("fc_proj.weight", torch.ones(4, 6)), ("norm.weight", torch.ones(4)),
               ("lm_head", torch.ones(3, 4))])
