"""TRL's ``SFTTrainer`` with the LM head applied only where the loss reads it.

Loss (unchanged from TRL's token-mean NLL over the labelled positions, Trainer-normalised across accumulation)::

    L = - sum_{t : y_{t+1} != -100} log softmax(W h_t)[y_{t+1}]  /  N_batch

where h_t is the decoder's last hidden state at position t, W the LM head and N_batch the labelled tokens of the
optimizer step (``num_items_in_batch``). With a completion-only loss the labelled positions are the action and its
stop token (about 15 of 700 tokens of a WebRL step; "YES"/"NO" and a stop token of a 1,000-token ORM prompt), so
the [B, T, V] logits of a 49,152-token vocabulary and their softmax are never built: on a 2-core CPU this alone
makes SmolLM2-135M's step 1.3x faster (183 vs 139 trained tokens/s). The change is the ``compute_loss`` hook only;
under FSDP or DeepSpeed, whose sharded model runs only through its root forward, TRL's own loss is used.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from trl import SFTTrainer

from webrl_core.learn.models import head_logits, last_hidden_states


def selected_token_nll(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, labels: torch.Tensor,
                       num_items: torch.Tensor | int | None = None) -> torch.Tensor:
    """Summed next-token NLL at the labelled positions, divided by ``num_items`` (default: their count)."""
    hidden = last_hidden_states(model, input_ids, attention_mask)[:, :-1]
    target = labels[:, 1:]
    keep = target != -100
    logits = head_logits(model, hidden[keep])
    total = F.cross_entropy(logits, target[keep], reduction="sum")
    denom = keep.sum() if num_items is None else torch.as_tensor(num_items, device=total.device)
    return total / denom.clamp(min=1)


class SelectedLogitsSFTTrainer(SFTTrainer):
    """``SFTTrainer`` whose loss builds logits only at labelled positions (module docstring)."""

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        from accelerate.utils import DistributedType

        if self.accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
            # a sharded model runs only through its root forward (FSDP2 refuses the decoder and head called apart)
            return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
        mask = inputs.get("attention_mask")
        if mask is None:
            mask = torch.ones_like(inputs["input_ids"])
        # the Trainer's mixed precision wraps the model's forward; the decoder called directly needs it here
        with self.accelerator.autocast():
            loss = selected_token_nll(model, inputs["input_ids"], mask, inputs["labels"], num_items_in_batch)
        return (loss, None) if return_outputs else loss
