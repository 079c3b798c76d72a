"""The known case with room for both (docs/concepts/rates.md, "A latent with room for both").

One in-process trial on the known case's own rows (``scripts/rate_study.py``: WordNet
definitions over a closed vocabulary, the two-way label as the first target token, x empty;
``ROWS`` of them drawn with seed 0), a K-category latent held at a target rate, and the label's
information in z on test, I(z; label) / log 2 (argmax of q), beside AMI. Needs Debian's
``wordnet-base``. Run from the repository root:

    python docs/science/real_text_rate/room_for_both_pilot.py K RATE ROWS EPOCHS SEED
    # 2026-12-08: K = 4, RATE = 1.2, ROWS = 600, EPOCHS = 12, SEED = 0, 1, 2
"""

from __future__ import annotations

import math
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import torch
from sklearn.metrics import mutual_info_score

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # run as a file, from anywhere

from scripts.build_wordnet import WORDNET_DIR, read_definitions  # noqa: E402
from scripts.rate_study import closed_vocabulary_sentences, known_case_rows, write_table  # noqa: E402
from workers.data.config import DatasetDataConfig  # noqa: E402
from workers.datasets.resolve import resolve_dataset  # noqa: E402
from workers.datasets.store import DatasetStore  # noqa: E402
from workers.datasets.table import canonicalize  # noqa: E402
from workers.train import Trainer, TrialConfig  # noqa: E402


def main(categories: int, rate: float, rows: int, epochs: int, seed: int) -> None:
    root = Path(tempfile.mkdtemp(prefix="room_for_both_"))
    write_table(known_case_rows(closed_vocabulary_sentences(read_definitions(WORDNET_DIR)), rows),
                root / "known_case.parquet")
    DatasetStore(root / "datasets").add(canonicalize(pq.read_table(root / "known_case.parquet"),
                                                     "known_case.parquet"), name="known-case", owner="local")
    data = resolve_dataset(DatasetDataConfig(dataset="known-case"), root / "datasets")
    config = TrialConfig.model_validate({
        "seed": seed, "data": data.model_dump(),
        "base": {"kind": "learned", "epochs": 3, "embedding_dim": 16, "hidden_dim": 32},
        "model": {"embedding_dim": 16, "hidden_dim": 32, "prior": "standard",
                  "num_categories": categories, "target_encoder": "bidirectional"},
        "loss_stack": {"preset": "uniform", "alpha": 1.0, "terms": {"kl": {"weight": 0.05, "options": {
            "target_rate": rate, "rate_control_lr": 0.05}}}},
        "training": {"epochs": epochs, "batch_size": 32, "learning_rate": 3e-3, "device": "cpu"},
        "readouts": {"gradient_batch": 0, "train_subset": 128, "test_every_epoch": False}})
    trainer = Trainer.create(config, root)
    trainer.run()
    final = trainer.final_metrics
    test = trainer.splits["test"]
    trainer.model.eval()
    with torch.no_grad():  # the last epoch's model on the whole test split (189 rows: one batch)
        out = trainer.model(test.split.context, test.decoder_input, test.split.target, test.split.mask)
    z = out.posterior_probs.argmax(-1).numpy()
    label = test.split.target[:, 0].numpy()  # the label token, first in y
    print(f"K={categories} target {rate} seed {seed}: test KL at the chosen checkpoint "
          f"{final['selected/test/kl']:.3f}, last val KL {trainer.history['val/kl'][-1]:.3f}, "
          f"AMI {final['selected/test/latent_ami']:.3f}; last epoch I(z; label) / log 2 = "
          f"{mutual_info_score(label, z) / math.log(2):.3f} on {len(label)} test rows, "
          f"z counts {np.bincount(z, minlength=categories).tolist()}")


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
