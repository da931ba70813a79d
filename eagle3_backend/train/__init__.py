"""Training EAGLE-3 drafts: self-distilled data (:mod:`.data`), the draft vocabulary
(:mod:`.vocab`), training-time-test training (:mod:`.trainer`) and ``eagle3 train``
(:mod:`.cli`).

    data = generate_data(target, prompts, layout, max_new_tokens=128)
    vocab = build_vocab_map(token_counts(answers, data.vocab_size), 8192)
    model = build_draft(config, data, vocab)
    result = train_draft(model, train_seqs, heldout_seqs, vocab, data.lm_head, TrainSettings())
"""

from eagle3_backend.train.data import (
    DataSequence,
    TrainingData,
    generate_data,
    load_data,
    save_data,
)
from eagle3_backend.train.trainer import TrainSettings, build_draft, train_draft, ttt_loss
from eagle3_backend.train.vocab import VocabMap, build_vocab_map, token_counts

__all__ = [
    "DataSequence",
    "TrainSettings",
    "TrainingData",
    "VocabMap",
    "build_draft",
    "build_vocab_map",
    "generate_data",
    "load_data",
    "save_data",
    "token_counts",
    "train_draft",
    "ttt_loss",
]
