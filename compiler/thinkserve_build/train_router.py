"""`thinkserve-build train-router`: fine-tune a 3-way router classifier from a user's labelled questions.

Input: JSONL, one {"question": "...", "route": "simple" | "moderate" | "complex"} per line. The base is any
sequence-classification checkpoint (a folder or hub id; a fresh head of 3 labels is put on it). The whole model
is fine-tuned (the usual learning rate for a pretrained encoder by default); `head_only` trains only the new head,
which needs an encoder whose features already tell the routes apart (it learned nothing on a random-weight one). A tenth of each route's questions (of a
route with at least 10) is held out to report accuracy on questions the model did not train on. The output is an ordinary checkpoint folder that `thinkserve-build --router-checkpoint`
serves as the router in place of asking the LLM.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from orchestrator.models.contracts import ROUTE_LABELS


@dataclass(frozen=True)
class LabelledQuestion:
    question: str
    route: str


@dataclass(frozen=True)
class TrainingReport:
    examples: int
    held_out: int
    losses: tuple[float, ...]  # mean training loss per epoch
    train_accuracy: float
    held_out_accuracy: float  # nan without a held-out set


def read_questions(path: Path) -> list[LabelledQuestion]:
    """The labelled questions of a JSONL file; a bad line is named with its number and what is wrong."""
    questions = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error.msg})") from None
        if not isinstance(record, dict) or not isinstance(record.get("question"), str) or not record["question"].strip():
            raise ValueError(f"{path}:{number}: needs a non-empty \"question\" string")
        if record.get("route") not in ROUTE_LABELS:
            raise ValueError(f"{path}:{number}: \"route\" must be one of {', '.join(ROUTE_LABELS)}, got {record.get('route')!r}")
        questions.append(LabelledQuestion(record["question"].strip(), record["route"]))
    if len({q.route for q in questions}) < 2:
        raise ValueError(f"{path}: needs questions of at least two routes to learn anything")
    return questions


def split(questions: Sequence[LabelledQuestion], seed: int) -> tuple[list[LabelledQuestion], list[LabelledQuestion]]:
    """(train, held out): a tenth of each route held out, when the route has at least 10 questions."""
    rng = random.Random(seed)
    train, held = [], []
    for route in ROUTE_LABELS:
        mine = [q for q in questions if q.route == route]
        rng.shuffle(mine)
        cut = len(mine) // 10
        held += mine[:cut]
        train += mine[cut:]
    rng.shuffle(train)
    return train, held


def train_router(
    base: str, questions: Sequence[LabelledQuestion], output: Path, epochs: int = 10, batch_size: int = 16,
    learning_rate: float = 5e-5, head_only: bool = False, max_length: int = 128, seed: int = 0,
    log: Callable[[str], None] = print,
) -> TrainingReport:
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForSequenceClassification.from_pretrained(
        base, num_labels=len(ROUTE_LABELS), id2label=dict(enumerate(ROUTE_LABELS)),
        label2id={label: i for i, label in enumerate(ROUTE_LABELS)}, ignore_mismatched_sizes=True,
    )
    if head_only:
        for parameter in model.base_model.parameters():
            parameter.requires_grad = False
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=learning_rate)
    train, held = split(questions, seed)

    def batches(items: Sequence[LabelledQuestion]):
        for start in range(0, len(items), batch_size):
            chunk = items[start : start + batch_size]
            encoded = tokenizer([q.question for q in chunk], padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            yield encoded, torch.tensor([ROUTE_LABELS.index(q.route) for q in chunk])

    def accuracy(items: Sequence[LabelledQuestion]) -> float:
        if not items:
            return float("nan")
        model.eval()
        right = 0
        with torch.no_grad():
            for encoded, labels in batches(items):
                right += int((model(**encoded).logits.argmax(dim=1) == labels).sum())
        return right / len(items)

    losses = []
    order = list(train)
    rng = random.Random(seed)
    for epoch in range(1, epochs + 1):
        model.train()
        rng.shuffle(order)
        total, seen = 0.0, 0
        for encoded, labels in batches(order):
            loss = torch.nn.functional.cross_entropy(model(**encoded).logits, labels)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(labels)
            seen += len(labels)
        losses.append(total / seen)
        if epoch == 1 or epoch == epochs or epoch % 10 == 0:
            log(f"  epoch {epoch}/{epochs}: loss {losses[-1]:.4f}")
    report = TrainingReport(len(questions), len(held), tuple(losses), accuracy(train), accuracy(held))
    output.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(output))
    tokenizer.save_pretrained(str(output))
    (output / "training_report.json").write_text(json.dumps(report.__dict__, indent=2) + "\n")
    log(f"router checkpoint {output}: {report.examples} questions ({report.held_out} held out), training accuracy "
        f"{report.train_accuracy:.3f}, held-out accuracy {report.held_out_accuracy:.3f}")
    return report
