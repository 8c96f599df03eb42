"""Does the toy detector learn the detection demo? mAP@0.5 and mAP@[.5:.95] on its val split, trained vs untrained.

    python benchmarks/detection_learns.py                       # demo in data/demo_detection (generated on first use)
    python benchmarks/detection_learns.py --epochs 15 --image-size 128

A learning check, not a test: it trains ``ToyCNN(target_kind="boxes")`` (the CenterNet-style head and loss of
:mod:`lightning_lmdb.experiment.detection`) in-process on the demo's ``instances_train.json``, read by a small ``Dataset``
of its own (no DataModule: each image resized to ``S x S``, its boxes scaled with it, flipped at random in training,
normalised with ImageNet's mean and std as the DataModule's batch finish does), and prints the val split's mAP of the same
model before and after training, computed by the metric ``train.py`` logs (torchmetrics' ``MeanAveragePrecision``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset
from torchvision import tv_tensors

from lightning_lmdb.experiment import detection
from lightning_lmdb.experiment.demo import DETECTION_ANNOTATIONS, make_detection_demo

MEAN = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
STD = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)


class CocoBoxes(Dataset):
    """A COCO annotation file's images, resized to ``size x size``, with ``{"boxes": BoundingBoxes, "labels", "iscrowd"}``."""

    def __init__(self, annotations: Path, root: Path, size: int, flip: bool):
        raw = json.loads(annotations.read_text(encoding="utf-8"))
        self.label_of = {c["id"]: i for i, c in enumerate(sorted(raw["categories"], key=lambda c: c["id"]))}
        self.images = raw["images"]
        self.boxes: dict[int, list[dict[str, Any]]] = {image["id"]: [] for image in self.images}
        for annotation in raw["annotations"]:
            self.boxes[annotation["image_id"]].append(annotation)
        self.root, self.size, self.flip = root, size, flip

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, dict[str, Any]]:
        image = self.images[index]
        with Image.open(self.root / image["file_name"]) as file:
            rgb = file.convert("RGB")
            scale_x, scale_y = self.size / rgb.width, self.size / rgb.height
            pixels = torch.from_numpy(np.asarray(rgb.resize((self.size, self.size), Image.BILINEAR)).copy()).permute(2, 0, 1)
        annotations = self.boxes[image["id"]]
        boxes = torch.tensor([[a["bbox"][0] * scale_x, a["bbox"][1] * scale_y, (a["bbox"][0] + a["bbox"][2]) * scale_x,
                               (a["bbox"][1] + a["bbox"][3]) * scale_y] for a in annotations], dtype=torch.float32).reshape(-1, 4)
        if self.flip and torch.rand(()) < 0.5:
            pixels = pixels.flip(-1)
            boxes = torch.stack([self.size - boxes[:, 2], boxes[:, 1], self.size - boxes[:, 0], boxes[:, 3]], 1)
        target = {"boxes": tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(self.size, self.size)),
                  "labels": torch.tensor([self.label_of[a["category_id"]] for a in annotations], dtype=torch.int64),
                  "iscrowd": torch.tensor([a.get("iscrowd", 0) for a in annotations], dtype=torch.uint8)}
        return (pixels.float() / 255 - MEAN) / STD, target


def collate(batch: list[tuple[torch.Tensor, dict[str, Any]]]) -> tuple[torch.Tensor, list[dict[str, Any]]]:
    return torch.stack([image for image, _ in batch]), [target for _, target in batch]


def evaluate(model: Any, loader: DataLoader) -> dict[str, float]:
    """mAP@0.5 and mAP@[.5:.95] of ``model`` over ``loader`` (the metric ``train.py`` logs)."""
    metric = detection.make_map()
    model.eval()
    with torch.no_grad():
        for images, targets in loader:
            outputs = model(images)
            metric.update(detection.decode(outputs, tuple(images.shape[-2:])), detection.metric_targets(targets, "cpu"))
    result = metric.compute()
    return {"map_50": float(result["map_50"]), "map": float(result["map"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path("data/demo_detection"), help="the detection demo (generated when absent)")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--image-size", type=int, default=64, help="S: images resized to S x S (train.py's data.image_size)")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--width", type=int, default=32, help="ToyCNN's width")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from lightning_lmdb.experiment.toy_model import ToyCNN

    torch.manual_seed(args.seed)
    root = make_detection_demo(args.root)
    train = CocoBoxes(root / DETECTION_ANNOTATIONS["train"], root, args.image_size, flip=True)
    val = CocoBoxes(root / DETECTION_ANNOTATIONS["val"], root, args.image_size, flip=False)
    train_loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, collate_fn=collate)
    val_loader = DataLoader(val, batch_size=32, collate_fn=collate)
    model = ToyCNN(num_classes=len(train.label_of), width=args.width, lr=args.lr, target_kind="boxes", num_outputs=len(train.label_of))
    untrained = evaluate(model, val_loader)
    optimizer = model.configure_optimizers()
    started = time.perf_counter()
    for epoch in range(args.epochs):
        model.train()
        losses = []
        for images, targets in train_loader:
            loss = detection.detection_loss(model, model(images), targets, "train")
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        print(f"epoch {epoch}: train loss {np.mean(losses):.3f}", flush=True)
    seconds = time.perf_counter() - started
    trained = evaluate(model, val_loader)
    print(f"\n{len(train)} train / {len(val)} val images at {args.image_size} px, {args.epochs} epochs in {seconds:.1f} s "
          f"({torch.get_num_threads()} threads)")
    print(f"untrained: mAP@0.5 {untrained['map_50']:.3f}  mAP@[.5:.95] {untrained['map']:.3f}")
    print(f"trained:   mAP@0.5 {trained['map_50']:.3f}  mAP@[.5:.95] {trained['map']:.3f}")


if __name__ == "__main__":
    main()
