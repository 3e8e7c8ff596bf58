"""DeepCTR-Torch's DIN on the rows `primus import movielens` wrote, scored as a Primus-rs Job
scores itself: progressive validation in time order (each minibatch is predicted before
the model trains on it) and the AUC over the last `--eval-window` predictions.

Features as examples/movielens-din.yaml reads them: `age` standardised, the user's and the
movie's attributes as 8-wide embeddings (`genres` a sum over its list), and `history` (the
user's last movies, oldest first) as DIN's behaviour sequence over the item embedding.
Ids are numbered from 1 per column in order of appearance (0 pads a list). Runs in the
venv benches/peer/install-deepctr.sh makes; prints one JSON line.
"""

import argparse
import contextlib
import io
import json
import pathlib
import sys
import time

import numpy as np
import pyarrow.parquet as pq
import torch
from deepctr_torch.inputs import DenseFeat, SparseFeat, VarLenSparseFeat, get_feature_names
from deepctr_torch.models import DIN
from sklearn.metrics import roc_auc_score

SINGLE = ["user_id", "item_id", "gender", "occupation", "zip_code", "release_year"]
LABEL = "rating_ge_4"
DIM = 8


def read_rows(data):
    files = sorted(pathlib.Path(data).rglob("*.parquet"))
    if not files:
        sys.exit(f"{data}: no Parquet files (run `primus import movielens` first)")
    tables = [pq.read_table(f).to_pydict() for f in files]
    return {c: [v for t in tables for v in t[c]] for c in tables[0]}


def numbered(values, vocab):
    """Each value's number, from 1 in order of appearance (a null is a value too)."""
    return [vocab.setdefault(v, len(vocab) + 1) for v in values]


def padded(lists, vocab, width):
    out = np.zeros((len(lists), width), dtype=np.int64)
    for row, values in enumerate(lists):
        ids = numbered(values or [], vocab)[-width:]
        out[row, : len(ids)] = ids
    return out


def inputs(rows, max_length):
    vocabs = {c: {} for c in SINGLE + ["genres"]}
    x = {c: np.array(numbered(rows[c], vocabs[c]), dtype=np.int64) for c in SINGLE}
    genre_width = max(len(g or []) for g in rows["genres"])
    x["genres"] = padded(rows["genres"], vocabs["genres"], genre_width)
    x["hist_item_id"] = padded(rows["history"], vocabs["item_id"], max_length)
    x["history_length"] = (x["hist_item_id"] != 0).sum(axis=1)
    x["age"] = (np.array(rows["age"], dtype=np.float32) - 33.0) / 11.6
    columns = [SparseFeat(c, len(vocabs[c]) + 1, embedding_dim=DIM) for c in SINGLE]
    columns.append(
        VarLenSparseFeat(
            SparseFeat("genres", len(vocabs["genres"]) + 1, embedding_dim=DIM),
            maxlen=genre_width,
            combiner="sum",
        )
    )
    columns.append(
        VarLenSparseFeat(
            SparseFeat("hist_item_id", len(vocabs["item_id"]) + 1, embedding_dim=DIM, embedding_name="item_id"),
            maxlen=max_length,
            length_name="history_length",
        )
    )
    columns.append(DenseFeat("age", 1))
    return x, columns


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="the folder `primus import movielens` wrote")
    parser.add_argument("--eval-window", type=int, default=20_000)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--max-length", type=int, default=20)
    parser.add_argument("--optimizer", default="adam", choices=["adam", "adagrad"])
    parser.add_argument("--learning-rate", type=float, default=0.001)
    parser.add_argument("--seed", type=int, default=1024)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rows = read_rows(args.data)
    x, columns = inputs(rows, args.max_length)
    y = np.array(rows[LABEL], dtype=np.float32)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints its device; fit a line per call
        model = DIN(columns, ["item_id"], dnn_hidden_units=(64, 32), seed=args.seed, task="binary", device="cpu")
    make = {"adam": torch.optim.Adam, "adagrad": torch.optim.Adagrad}[args.optimizer]
    model.compile(make(model.parameters(), lr=args.learning_rate), "binary_crossentropy")
    names = get_feature_names(columns)

    started = time.monotonic()
    scores = np.zeros(len(y), dtype=np.float64)
    for start in range(0, len(y), args.batch_size):
        batch = slice(start, start + args.batch_size)
        part = {n: x[n][batch] for n in names}
        scores[batch] = model.predict(part, batch_size=args.batch_size).reshape(-1)
        with contextlib.redirect_stdout(io.StringIO()):
            model.fit(part, y[batch], batch_size=args.batch_size, epochs=1, verbose=0, shuffle=False)
    window = slice(len(y) - args.eval_window, len(y))
    print(
        json.dumps(
            {
                "model": "DeepCTR-Torch DIN",
                "rows": len(y),
                "optimizer": args.optimizer,
                "learning_rate": args.learning_rate,
                "auc": round(float(roc_auc_score(y[window], scores[window])), 4),
                "eval_window": args.eval_window,
                "seconds": round(time.monotonic() - started, 1),
            }
        )
    )


if __name__ == "__main__":
    main()
