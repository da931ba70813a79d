"""The canonical, engine-neutral hidden-state layout of an EAGLE-3 draft.

An EAGLE-3 draft's fc layer reads K target hidden states side by side. Every
engine numbers those states differently (see docs/design.md,
"The bug class this project exists to end"), so
this module gives them one name and owns every translation:

* ``embed``          the residual stream entering decoder layer 0 (the token
                     embedding, before any norm).
* ``layer_input:K``  the residual stream (hidden + residual, before any norm)
                     entering decoder layer K; ``K == num_layers`` is the last
                     layer's output before the final norm.

``layer_input:0`` *is* ``embed`` and is always written as ``embed``.

A :class:`Layout` is the ordered tuple of sources, in the order their chunks
appear in the fc input. Example, a Kimi-K2 / DeepSeek-V3 target (hidden 7168,
61 layers)::

    >>> lay = Layout.parse("[embed, layer_input:3, layer_input:31]")
    >>> lay.fc_in_features(7168)
    21504
    >>> lay == Layout.parse("[layer_input:3, layer_input:31, layer_input:59]")
    False

Engine conventions (one function pair per column of the conventions table in
docs/design.md, "The bug class this project exists to end"):

============  ==========================================  ===================
engine        id k means                                  order
============  ==========================================  ===================
SpecForge     output of layer k  -> layer_input:k+1       list order
SGLang        per target architecture, see ``SGLANG_ID``  layer order
vLLM /        input of layer k   -> layer_input:k         layer order (vLLM),
speculators   (0 is the embedding)                        list order (data)
EAGLE repo    fixed inputs of 2, L//2, L-3                layer order
============  ==========================================  ===================
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

from eagle3_backend.errors import LayoutError

__all__ = [
    "EMBED",
    "ENGINES",
    "SGLANG_ID",
    "Layout",
    "Source",
    "parse_layout_flag",
    "sglang_id_rule",
]

# the fix a layout error names when the layout came with a draft (parse_layout_flag swaps them)
_DRAFT_FIX_TWICE = "Check the layer ids recorded with the draft."
_DRAFT_FIX_RANGE = "The draft was trained for a different target; use a draft trained on this target."

_SOURCE_RE = re.compile(r"^\s*(?:(embed)|layer_input\s*:\s*(-?\d+))\s*$")


@dataclass(frozen=True, slots=True, order=True)
class Source:
    """One hidden state: the residual stream entering decoder layer ``layer``.

    ``layer == 0`` is the embedding output (``embed``).
    """

    layer: int

    def __post_init__(self) -> None:
        if not isinstance(self.layer, int) or isinstance(self.layer, bool) or self.layer < 0:
            raise LayoutError(
                f"hidden-state source layer must be an integer >= 0, got {self.layer!r}. "
                "Use 'embed' for the embedding output and 'layer_input:K' (K >= 1) "
                "for the residual stream entering decoder layer K."
            )

    @property
    def is_embed(self) -> bool:
        return self.layer == 0

    @classmethod
    def parse(cls, text: "str | Source") -> "Source":
        """Parse ``embed`` or ``layer_input:K``."""
        if isinstance(text, Source):
            return text
        if not isinstance(text, str):
            raise LayoutError(
                f"hidden-state source must be a string like 'embed' or 'layer_input:3', "
                f"got {type(text).__name__} {text!r}."
            )
        m = _SOURCE_RE.match(text)
        if m is None or (m.group(2) is not None and int(m.group(2)) < 0):
            raise LayoutError(
                f"cannot parse hidden-state source {text!r}: expected 'embed' or "
                "'layer_input:K' with K >= 0 (the residual stream entering decoder "
                "layer K; K = num_layers is the last layer's output before the final norm)."
            )
        return cls(0 if m.group(1) else int(m.group(2)))

    def __str__(self) -> str:
        return "embed" if self.layer == 0 else f"layer_input:{self.layer}"

    def __repr__(self) -> str:
        return f"Source({str(self)!r})"


EMBED = Source(0)

ENGINES = ("sglang", "specforge", "speculators", "vllm", "eagle")


@dataclass(frozen=True, slots=True)
class Layout:
    """Ordered hidden-state sources feeding the draft's fc layer (fc input order)."""

    sources: tuple[Source, ...]

    def __post_init__(self) -> None:
        srcs = tuple(Source.parse(s) for s in self.sources)
        object.__setattr__(self, "sources", srcs)
        if not srcs:
            raise LayoutError(
                "a layout needs at least one hidden-state source, got []. "
                "EAGLE-3 drafts usually read three, e.g. "
                "[layer_input:2, layer_input:16, layer_input:29]."
            )
        seen: set[Source] = set()
        for s in srcs:
            if s in seen:
                raise LayoutError(
                    f"layout {_fmt(srcs)} names {s} twice; two identical fc input "
                    "slots carry no information and no engine captures a state twice. "
                    f"{_DRAFT_FIX_TWICE}"
                )
            seen.add(s)

    # ----------------------------------------------------------- parse / format
    @classmethod
    def parse(cls, value: "str | Layout | Iterable[str | Source]") -> "Layout":
        """From ``"[embed, layer_input:3]"``, ``"embed,layer_input:3"`` or a list."""
        if isinstance(value, Layout):
            return value
        if isinstance(value, str):
            body = value.strip()
            if body.startswith("[") and body.endswith("]"):
                body = body[1:-1]
            items = [p for p in (x.strip().strip("'\"") for x in body.split(",")) if p]
            return cls(tuple(items))
        try:
            items = list(value)
        except TypeError:
            raise LayoutError(
                f"a layout must be a string or a list of sources, got "
                f"{type(value).__name__} {value!r}."
            ) from None
        return cls(tuple(items))

    @classmethod
    def of_layers(cls, layers: Iterable[int]) -> "Layout":
        """From residual-stream layer indices (0 = embed)."""
        return cls(tuple(Source(int(k)) for k in layers))

    def __str__(self) -> str:
        return _fmt(self.sources)

    def __repr__(self) -> str:
        return f"Layout({str(self)!r})"

    def __len__(self) -> int:
        return len(self.sources)

    def __iter__(self):
        return iter(self.sources)

    def to_strings(self) -> list[str]:
        return [str(s) for s in self.sources]

    @property
    def layers(self) -> tuple[int, ...]:
        """Residual-stream layer index of each slot (0 = embed), in fc order."""
        return tuple(s.layer for s in self.sources)

    @property
    def has_embed(self) -> bool:
        return any(s.is_embed for s in self.sources)

    # ------------------------------------------------------------------ checks
    def fc_in_features(self, target_hidden_size: int) -> int:
        """Width of the fc input: ``len(layout) * target_hidden_size``."""
        if target_hidden_size <= 0:
            raise LayoutError(f"target hidden size must be positive, got {target_hidden_size}.")
        return len(self.sources) * int(target_hidden_size)

    def check_range(self, num_layers: int) -> None:
        """Raise if a source names a layer the target does not have."""
        bad = [s for s in self.sources if s.layer > num_layers]
        if bad:
            raise LayoutError(
                f"layout {self} names {', '.join(map(str, bad))}, but the target has "
                f"{num_layers} decoder layers (valid: embed, layer_input:1 .. "
                f"layer_input:{num_layers}). {_DRAFT_FIX_RANGE}"
            )

    def is_layer_ordered(self) -> bool:
        return list(self.layers) == sorted(self.layers)

    def sorted_order(self) -> tuple["Layout", tuple[int, ...]]:
        """The layout in ascending layer order, and ``perm`` with
        ``sorted.sources[i] == self.sources[perm[i]]`` (fc chunk i of the
        sorted layout is chunk ``perm[i]`` of this one)."""
        perm = tuple(sorted(range(len(self.sources)), key=lambda i: self.sources[i].layer))
        return Layout(tuple(self.sources[i] for i in perm)), perm

    def describe_difference(self, other: "Layout") -> str | None:
        """None when equal, else a one-line description of how they differ."""
        other = Layout.parse(other)
        if self == other:
            return None
        if sorted(self.layers) == sorted(other.layers):
            return f"same sources in a different order: {self} vs {other}"
        return f"different sources: {self} vs {other}"

    # ---------------------------------------------------------------- SpecForge
    @classmethod
    def from_specforge_ids(cls, ids: Sequence[int]) -> "Layout":
        """SpecForge id k = output of ``layers[k]`` = layer_input:k+1, list order."""
        ids = _int_list(ids, "SpecForge eagle_aux_hidden_state_layer_ids")
        if any(i < 0 for i in ids):
            raise LayoutError(
                f"SpecForge layer ids {ids} contain a negative id; SpecForge ids name "
                "decoder-layer outputs (0 = output of the first layer) and cannot name "
                "the embedding."
            )
        return cls.of_layers(i + 1 for i in ids)

    def to_specforge_ids(self) -> list[int]:
        if self.has_embed:
            raise LayoutError(
                f"layout {self} includes embed, which SpecForge ids (outputs of decoder "
                "layers) cannot express. Store it as an explicit eagle3_layout instead."
            )
        return [s.layer - 1 for s in self.sources]

    # ------------------------------------------------------ vLLM / speculators
    @classmethod
    def from_speculators_ids(cls, ids: Sequence[int]) -> "Layout":
        """vLLM / speculators id k = input of layer k (HF ``hidden_states[k]``)."""
        ids = _int_list(ids, "speculators eagle_aux_hidden_state_layer_ids")
        if any(i < 0 for i in ids):
            raise LayoutError(
                f"speculators/vLLM layer ids {ids} contain a negative id; these ids are "
                "inputs of decoder layers (0 = the embedding)."
            )
        return cls.of_layers(ids)

    def to_speculators_ids(self) -> list[int]:
        return list(self.layers)

    from_vllm_ids = from_speculators_ids
    to_vllm_ids = to_speculators_ids

    # ------------------------------------------------------------------ SGLang
    @classmethod
    def from_sglang_ids(
        cls, ids: Sequence[int] | None, arch: str, num_layers: int
    ) -> "Layout":
        """What SGLang 0.5.23 captures for draft-config ``ids`` on target ``arch``.

        ``ids=None`` (no ids in the draft config) gives SGLang's default. SGLang
        concatenates in layer order whatever the list order.
        """
        rule = sglang_id_rule(arch)
        if ids is None:
            return cls.engine_default("sglang", num_layers, arch)
        ids = _int_list(ids, "SGLang eagle_aux_hidden_state_layer_ids")
        captures = sorted(_sglang_captures(rule, ids, num_layers))
        if captures[0] < 0:
            raise LayoutError(
                f"SGLang ids {ids} on {arch} capture the input of layer {captures[0]}, "
                "which does not exist (the embedding is id -1 under the +1 rule)."
            )
        layout = cls.of_layers(captures)
        if layout.layers[-1] >= num_layers and rule != "gpt_oss":
            raise LayoutError(
                f"SGLang ids {ids} on {arch} capture layer {layout.layers[-1]}, but "
                f"the {arch} model file only captures inputs of layers 0..{num_layers - 1}; "
                "the draft would get fewer hidden states than its fc expects."
            )
        return layout

    def to_sglang_ids(self, arch: str, num_layers: int) -> list[int]:
        """Draft-config ids that make stock SGLang 0.5.23 capture this layout.

        Raises when stock SGLang cannot express it (not in layer order, or a
        source the architecture's model file cannot capture); this package's
        plugin captures any layout, and ``eagle3 convert`` reorders fc columns.
        """
        self.check_range(num_layers)
        if not self.is_layer_ordered():
            raise LayoutError(
                f"layout {self} is not in layer order, but SGLang concatenates captured "
                "states in layer order. Convert with `eagle3 convert --to sglang`, which "
                "permutes the fc weight columns into layer order (an exactly equivalent "
                "draft)."
            )
        ids = sglang_ids_for(self.layers, arch, num_layers, what=f"layout {self}")
        assert Layout.from_sglang_ids(ids, arch, num_layers) == self, (ids, self)
        return ids

    def sglang_capture_layers(self) -> list[int]:
        """Indices ``i`` whose layer-input SGLang's ``layers_to_capture`` names."""
        return list(self.layers)

    # ---------------------------------------------------------- EAGLE / defaults
    @classmethod
    def eagle_repo(cls, num_layers: int) -> "Layout":
        """The EAGLE repo's hard-coded inputs of layers 2, L//2, L-3."""
        return cls.of_layers(_default_layers(num_layers))

    @classmethod
    def engine_default(cls, engine: str, num_layers: int, arch: str | None = None) -> "Layout":
        """The layout an engine uses when a draft records no layer ids.

        All engines land on inputs of 2, L//2, L-3 (SpecForge spells it as
        outputs of 1, L//2-1, L-4), which is exactly why a missing layout is so
        easy to miss: it is a guess that is right only for drafts trained with
        the default.
        """
        engine = engine.lower()
        if engine not in ENGINES:
            raise LayoutError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}.")
        if engine == "sglang" and arch is not None:
            sglang_id_rule(arch)  # validate the architecture name
        if engine == "specforge":
            return cls.from_specforge_ids([1, num_layers // 2 - 1, num_layers - 4])
        return cls.eagle_repo(num_layers)


def parse_layout_flag(text: str, num_layers: int | None, flag: str = "--layout") -> Layout:
    """A layout typed on the command line, checked against the target's layer count: its
    errors name the flag and ask for another value, not for another draft."""
    try:
        layout = Layout.parse(text)
        if num_layers is not None:
            layout.check_range(num_layers)
    except LayoutError as exc:
        fix = f"Give {flag} sources of this target's layers, each once."
        raise LayoutError(f"{flag} {text!r}: " + str(exc).replace(_DRAFT_FIX_TWICE, fix)
                          .replace(_DRAFT_FIX_RANGE, fix)) from None
    return layout


# SGLang 0.5.23's set_eagle3_layers_to_capture rule per target model file.
# "plus_one":    layers_to_capture = [id + 1 for id in ids]
# "deepseek_v2": +1 only when ids[0] == 1, otherwise ids verbatim
# "gpt_oss":     ids verbatim when max(ids) == num_layers, otherwise +1
SGLANG_ID: dict[str, str] = {
    "llama": "plus_one",
    "mistral": "plus_one",
    "qwen2": "plus_one",
    "qwen3": "plus_one",
    "qwen3_moe": "plus_one",
    "glm4_moe": "plus_one",
    "llama4": "plus_one",  # Llama4ForConditionalGeneration -> its Llama4ForCausalLM
    "llama4_text": "plus_one",
    "qwen2_5_vl": "plus_one",
    "qwen3_vl": "plus_one",
    "qwen3_vl_moe": "plus_one",
    "minimax_m2": "plus_one",
    "bailing_moe": "plus_one",
    # read and written by the layout tools; the plugin does not serve these (plan.ARCHS)
    "qwen2_moe": "plus_one",
    "qwen3_next": "plus_one",
    "qwen3_5": "plus_one",  # Qwen3_5(Moe)ForConditionalGeneration -> its language model's flags
    "qwen3_5_moe": "plus_one",
    "qwen3_5_text": "plus_one",
    "qwen3_5_moe_text": "plus_one",
    "apertus": "plus_one",
    "glm5_next": "plus_one",
    "deepseek_v2": "deepseek_v2",
    "deepseek_v3": "deepseek_v2",
    "deepseek_v32": "deepseek_v2",  # DeepseekV32ForCausalLM: DeepseekV2ForCausalLM's file and rule
    "glm_moe_dsa": "deepseek_v2",  # GlmMoeDsaForCausalLM (GLM-5): the same
    "kimi_k2": "deepseek_v2",
    "kimi_k25": "deepseek_v2",  # KimiK25ForConditionalGeneration -> its DeepseekV3ForCausalLM
    "glm4_moe_lite": "deepseek_v2",
    "gpt_oss": "gpt_oss",
}

_ARCH_ALIASES = {
    "llamaforcausallm": "llama",
    "mistralforcausallm": "mistral",
    "qwen2forcausallm": "qwen2",
    "qwen3forcausallm": "qwen3",
    "qwen3moeforcausallm": "qwen3_moe",
    "glm4moeforcausallm": "glm4_moe",
    "deepseekv2forcausallm": "deepseek_v2",
    "deepseekv3forcausallm": "deepseek_v3",
    "deepseekv32forcausallm": "deepseek_v32",
    "glmmoedsaforcausallm": "glm_moe_dsa",
    "kimik2forcausallm": "kimi_k2",
    "gptossforcausallm": "gpt_oss",
    "llama4forcausallm": "llama4_text",
    "llama4forconditionalgeneration": "llama4",
    "qwen2_5_vlforconditionalgeneration": "qwen2_5_vl",
    "qwen3vlforconditionalgeneration": "qwen3_vl",
    "qwen3vlmoeforconditionalgeneration": "qwen3_vl_moe",
    "minimaxm2forcausallm": "minimax_m2",
    "bailingmoeforcausallm": "bailing_moe",
    "bailingmoev2forcausallm": "bailing_moe",
    "kimik25forconditionalgeneration": "kimi_k25",
    "glm4moeliteforcausallm": "glm4_moe_lite",
    "qwen2moeforcausallm": "qwen2_moe",
    "qwen3nextforcausallm": "qwen3_next",
    "qwen3_5forconditionalgeneration": "qwen3_5",
    "qwen3_5moeforconditionalgeneration": "qwen3_5_moe",
    "qwen3_5forcausallm": "qwen3_5_text",
    "qwen3_5moeforcausallm": "qwen3_5_moe_text",
    "apertusforcausallm": "apertus",
    "glm5nextforconditionalgeneration": "glm5_next",
}


def _norm_arch(arch: str) -> str:
    key = str(arch).strip()
    low = key.lower()
    if low in _ARCH_ALIASES:
        return _ARCH_ALIASES[low]
    return low.replace("-", "_")


def sglang_id_rule(arch: str) -> str:
    """The SGLang 0.5.23 id rule for a target ``model_type`` or architecture class."""
    key = _norm_arch(arch)
    if key not in SGLANG_ID:
        known = ", ".join(sorted(SGLANG_ID))
        raise LayoutError(
            f"no SGLang layer-id rule known for target architecture {arch!r} (known: {known}), "
            "so eagle3_backend can neither read nor write eagle_aux_hidden_state_layer_ids for "
            "its SGLang 0.5.23 model file. To read a draft's ids as SpecForge wrote them (id k = "
            "the output of layer k, what most SGLang model files capture), pass --ids-as "
            "specforge; to carry the layout without SGLang ids, convert with --to speculators."
        )
    return SGLANG_ID[key]


def sglang_captures_last(arch: str) -> bool:
    """Whether SGLang 0.5.23's ``arch`` model file can capture layer_input:L (the last layer's
    output before the final norm): only a file whose id rule reads ``L`` (gpt-oss)."""
    return sglang_id_rule(arch) == "gpt_oss"


def sglang_ids_for(layers: Iterable[int], arch: str, num_layers: int, what: str = "") -> list[int]:
    """Ids that make SGLang 0.5.23's ``arch`` model file capture exactly the inputs of ``layers``.

    The one inverse of :func:`_sglang_captures` (``set_eagle3_layers_to_capture``):
    ``Layout.to_sglang_ids`` writes these into checkpoints, the serving plugin hands them
    to the model file. The files keep ``layers_to_capture`` as a set (membership tests in
    the layer loop) and concatenate in layer order, so only the set matters, and a list
    that does not start with 1 escapes deepseek_v2's "+1 when ids[0] == 1".
    """
    caps = sorted(set(int(c) for c in layers))
    rule = sglang_id_rule(arch)
    what = what or f"layer inputs {caps}"
    if not caps:
        raise LayoutError(f"{what}: no layer to capture; a draft reads at least one hidden state.")
    if caps[-1] >= num_layers and not (sglang_captures_last(arch) and caps[-1] == num_layers):
        raise LayoutError(
            f"{what} needs layer_input:{caps[-1]}, which SGLang 0.5.23's {arch} model file "
            f"cannot capture (it captures layer inputs 0..{num_layers - 1}"
            f"{', and the last output only on gpt-oss' if caps[-1] == num_layers else ''}).")
    if rule == "plus_one":  # layers_to_capture = [id + 1 for id in ids]
        ids = [c - 1 for c in caps]
    elif rule == "gpt_oss":  # verbatim when max(ids) == L, else +1
        ids = caps if caps[-1] == num_layers else [c - 1 for c in caps]
    elif rule == "deepseek_v2":  # +1 only when ids[0] == 1, else verbatim
        if caps[0] == 2:
            ids = [c - 1 for c in caps]  # the engine default's [1, L//2 - 1, L - 4]: also right
            #                              under the plus-one rule the other files apply
        elif caps[0] != 1:
            ids = caps
        elif len(caps) == 1:
            raise LayoutError(
                f"{what} is layer_input:1 alone, which SGLang 0.5.23's {arch} model file cannot "
                f"be asked for (ids [1] are read as [2], ids [0] as [0]). Serve a draft with more "
                f"than one source.")
        else:
            ids = caps[1:] + caps[:1]  # 1 not first: read verbatim
    else:  # pragma: no cover - sglang_id_rule only returns the rules above
        raise AssertionError(rule)
    assert sorted(_sglang_captures(rule, ids, num_layers)) == caps, (rule, ids, caps)
    return ids


def _sglang_captures(rule: str, ids: list[int], num_layers: int) -> list[int]:
    if rule == "plus_one":
        return [i + 1 for i in ids]
    if rule == "deepseek_v2":
        return [i + 1 for i in ids] if ids and ids[0] == 1 else list(ids)
    if rule == "gpt_oss":
        return list(ids) if ids and max(ids) == num_layers else [i + 1 for i in ids]
    raise AssertionError(rule)  # pragma: no cover


def _default_layers(num_layers: int) -> list[int]:
    if num_layers < 7:  # below 7, 2 < L//2 < L-3 fails: two slots would be one state
        raise LayoutError(
            f"the engine default layout (inputs of layers 2, L//2, L-3) needs at least "
            f"7 decoder layers (three distinct states), got {num_layers}. Give the layout explicitly "
            f"(eagle3 train and make-demo-draft take e.g. "
            f"--layout \"[embed, layer_input:{max(num_layers, 1)}]\")."
        )
    return [2, num_layers // 2, num_layers - 3]


def _int_list(ids: Sequence[int], what: str) -> list[int]:
    if isinstance(ids, (str, bytes)) or not hasattr(ids, "__iter__"):
        raise LayoutError(f"{what} must be a list of integers, got {ids!r}.")
    out = []
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int):
            raise LayoutError(f"{what} must be a list of integers, got {list(ids)!r}.")
        out.append(int(i))
    if not out:
        raise LayoutError(f"{what} is empty; a draft reads at least one hidden state.")
    return out


def _fmt(sources: Iterable[Source]) -> str:
    return "[" + ", ".join(str(s) for s in sources) + "]"
