"""Perception (AutoThinkRAG's DPR): the VLM turns each selected image, table, chart and page into text.

The answerer then reasons over text only. Images come from the evidence's stored asset (a unit's crop as the
parser saved it) or the page render; visual evidence without an image (an equation parsed as LaTeX, a table
given as HTML) is already text and is not sent. Descriptions run concurrently so Triton overlaps them.
"""

from __future__ import annotations

import asyncio
from typing import Optional, Sequence

from ..knowledge.storage.snapshot import Snapshot
from ..prompts import perception_prompt
from ..models import contracts
from ..models.chat_template import chat_template_of
from ..models.protocol import GenerationOptions
from .accounting import StageModels
from .events import EvidenceItem


def visual_items(items: Sequence[EvidenceItem], limit: int) -> list[EvidenceItem]:
    """Evidence with an image to look at (units with an asset, pages), best first, at most `limit`."""
    return [item for item in items if item.record.kind in ("unit", "page") and item.record.asset][:limit]


def load_image(snapshot: Snapshot, item: EvidenceItem) -> Optional[bytes]:
    path = snapshot.asset_file(item.record.asset)
    return path.read_bytes() if path is not None else None


async def perceive(
    models: StageModels,
    snapshot: Snapshot,
    question: str,
    items: Sequence[EvidenceItem],
    max_tokens: int,
    timeout_s: float,
    request_id: str = "",
) -> dict[int, str]:
    """Evidence rank -> the VLM's description, for every item given that has an image."""
    options = GenerationOptions(max_tokens=max_tokens, temperature=0.0, top_p=1.0)
    chat = chat_template_of(await models.generator_facts(contracts.VLM.name), contracts.VLM.name)
    images = await asyncio.to_thread(lambda: [load_image(snapshot, item) for item in items])

    async def describe(item: EvidenceItem, image: bytes) -> tuple[int, str]:
        completion = await models.complete(perception_prompt(chat, question, item), options, [image], timeout_s, request_id)
        return item.rank, completion.text

    tasks = [asyncio.ensure_future(describe(item, image)) for item, image in zip(items, images) if image]
    try:
        described = await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:  # one failed or time ran out: the others stop too, not run on unobserved
            task.cancel()
        raise
    return {rank: text for rank, text in described if text}
