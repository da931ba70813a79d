"""The verifier: acceptance length and tok/s of a draft against the target alone.

Offline (a transformers target + this project's draft, ``eagle3 eval``):

    targets.py   load a HF / GGUF target, capture a layout's hidden states
    tree.py      SpecSettings (SGLang names) and EAGLE chain / top-k tree drafting
    engine.py    speculative generation (greedy verify, rejection sampling), the
                 target-only baseline, KV-cache rollback
    sampling.py  rejection sampling that keeps the target distribution (torch; flashinfer on GPU)
    metrics.py   acceptance length / rate by position / histogram, tok/s, speedup
    datasets.py  MT-Bench, ShareGPT, prompt files (JSONL/JSON/txt/CSV/Parquet); chat template
    evaluate.py  baseline vs speculative over a prompt set

Live servers (``eagle3 bench``): bench.py. Results files and plots: report.py.
CLI parsers: cli.py. Modules are imported on use; importing this package is cheap.
"""
