"""Convert the bundled SmolLM2-135M-Instruct GGUF into an HF dir SGLang can load.

    python scripts/cpu_make_target.py artifacts/smollm2-135m-instruct
"""

import argparse
import logging

from eagle3_backend.cpu.target_convert import convert_gguf_to_hf


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--gguf", default=None, help="GGUF file (default: the bundled one)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO)
    print(convert_gguf_to_hf(args.out_dir, args.gguf, args.dtype))


if __name__ == "__main__":
    main()
