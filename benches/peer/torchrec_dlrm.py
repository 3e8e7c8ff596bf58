"""The train bench's peer: TorchRec's DLRM trained on the same minibatches.

Reads the minibatches the train bench wrote (`export_dir/meta.json`, `batches.bin`: the
Criteo-like Parquet rows after the trainer's own feature transforms, keys renumbered per
feature), trains TorchRec's DLRM of the same shape with the same optimizers and
initialisation, and prints one JSON line: samples/s of the whole step, progressive AUC over
the last `eval_window` samples, and the dense network's forward and forward+backward alone.

Run by `cargo bench -p primus-benches --bench train` when benches/peer/install-torchrec.sh
has installed it; `python torchrec_dlrm.py EXPORT_DIR` by hand.
"""

import json
import os
import struct
import sys
import time

import numpy as np
import torch
from torch import nn
from torchrec import EmbeddingBagConfig, KeyedJaggedTensor
from torchrec.models.dlrm import DLRM
from torchrec.modules.fused_embedding_modules import FusedEmbeddingBagCollection


def read_batches(export_dir, meta):
    """Each batch as (labels, dense, KJT) tensors, all built before any timing."""
    features = meta["features"]
    dense_width = meta["dense"]
    names = meta["names"]
    batches = []
    with open(os.path.join(export_dir, "batches.bin"), "rb") as f:
        data = f.read()
    at = 0

    def take(dtype, count):
        nonlocal at
        array = np.frombuffer(data, dtype=dtype, count=count, offset=at)
        at += array.nbytes
        return array

    while at < len(data):
        (rows,) = struct.unpack_from("<I", data, at)
        at += 4
        labels = torch.from_numpy(take("<f4", rows).copy())
        dense = torch.from_numpy(take("<f4", rows * dense_width).copy()).view(rows, dense_width)
        lengths = take("<i4", rows * features)
        values = take("<i8", int(lengths.sum()))
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=names,
            values=torch.from_numpy(values.copy()),
            lengths=torch.from_numpy(lengths.copy()),
        )
        batches.append((labels, dense, kjt))
    return batches


def build_model(meta):
    dim = meta["dim"]
    tables = [
        EmbeddingBagConfig(
            name=f"t{i + 1}",
            embedding_dim=dim,
            num_embeddings=rows,
            feature_names=[name],
        )
        for i, (name, rows) in enumerate(zip(meta["names"], meta["table_rows"]))
    ]
    ebc = FusedEmbeddingBagCollection(
        tables=tables,
        optimizer_type=torch.optim.Adagrad,
        optimizer_kwargs={"lr": meta["embedding_lr"], "eps": meta["epsilon"]},
        device=torch.device("cpu"),
    )
    model = DLRM(
        embedding_bag_collection=ebc,
        dense_in_features=meta["dense"],
        dense_arch_layer_sizes=meta["bottom"],
        over_arch_layer_sizes=meta["top"],
    )
    scale = meta["embedding_init_scale"]
    with torch.no_grad():
        for name, tensor in ebc.state_dict().items():
            if name.endswith("weight"):
                tensor.uniform_(-scale, scale)
        # The accumulator's starting value, as the trainer's Adagrad starts it.
        for state in ebc.fused_optimizer().state_dict()["state"].values():
            for key, tensor in state.items():
                if "momentum" in key:
                    tensor.fill_(meta["initial_accumulator"])
        # Glorot-uniform weights and zero biases, like the trainer's dense parameters.
        for module in model.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                nn.init.zeros_(module.bias)
    return model, ebc


def auc(scores, labels):
    """Area under the ROC curve by ranks (ties averaged)."""
    order = np.argsort(scores, kind="mergesort")
    ranks = np.empty(len(scores))
    sorted_scores = scores[order]
    i = 0
    while i < len(scores):
        j = i
        while j + 1 < len(scores) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    positives = labels.sum()
    negatives = len(labels) - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    return float((ranks[labels == 1].sum() - positives * (positives + 1) / 2) / (positives * negatives))


def train(model, batches, meta):
    dense_params = [p for n, p in model.named_parameters() if "embedding_bag_collection" not in n]
    adam = torch.optim.Adam(dense_params, lr=meta["dense_lr"], eps=meta["dense_epsilon"])
    loss_fn = nn.BCEWithLogitsLoss()
    scores, labels_seen = [], []
    samples = 0
    started = time.perf_counter()
    for labels, dense, kjt in batches:
        logits = model(dense, kjt).squeeze(-1)
        loss = loss_fn(logits, labels)
        adam.zero_grad()
        loss.backward()
        adam.step()
        scores.append(torch.sigmoid(logits.detach()).numpy())
        labels_seen.append(labels.numpy())
        samples += len(labels)
    seconds = time.perf_counter() - started
    window = meta["eval_window"]
    scores = np.concatenate(scores)[-window:]
    labels_seen = np.concatenate(labels_seen)[-window:]
    return samples / seconds, auc(scores, labels_seen)


def dense_alone(model, batches, meta):
    """Forward, and forward plus backward, of the dense network on constant pooled
    embeddings (no lookups, no optimizer): milliseconds per minibatch, median of the runs."""
    features, dim = meta["features"], meta["dim"]
    forward_ms, step_ms = [], []
    for labels, dense, _ in batches[: meta["dense_runs"]]:
        pooled = torch.full((len(labels), features, dim), 0.01, requires_grad=True)
        started = time.perf_counter()
        with torch.no_grad():
            model.over_arch(model.inter_arch(model.dense_arch(dense), pooled))
        forward_ms.append(1000 * (time.perf_counter() - started))
        started = time.perf_counter()
        logits = model.over_arch(model.inter_arch(model.dense_arch(dense), pooled)).squeeze(-1)
        nn.functional.binary_cross_entropy_with_logits(logits, labels).backward()
        step_ms.append(1000 * (time.perf_counter() - started))
        model.zero_grad(set_to_none=True)
    return float(np.median(forward_ms)), float(np.median(step_ms))


def main():
    export_dir = sys.argv[1]
    with open(os.path.join(export_dir, "meta.json")) as f:
        meta = json.load(f)
    torch.set_num_threads(meta["threads"])
    torch.manual_seed(0)
    batches = read_batches(export_dir, meta)
    model, _ = build_model(meta)
    dense_forward_ms, dense_step_ms = dense_alone(model, batches, meta)
    model, _ = build_model(meta)
    samples_per_second, progressive_auc = train(model, batches, meta)
    print(
        json.dumps(
            {
                "versions": {
                    "torch": torch.__version__,
                    "torchrec": __import__("torchrec").__version__,
                    "fbgemm_gpu": __import__("fbgemm_gpu").__version__,
                },
                "threads": torch.get_num_threads(),
                "samples_per_second": samples_per_second,
                "auc": progressive_auc,
                "dense_forward_ms": dense_forward_ms,
                "dense_step_ms": dense_step_ms,
            }
        )
    )


if __name__ == "__main__":
    main()
