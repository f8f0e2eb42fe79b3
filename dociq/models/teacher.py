"""A bidirectional LLM teacher for distilling the text encoder (LLM2Vec, steps 1 and 2).

LLM2Vec step 1 (bidirectional attention): McGill-NLP/llm2vec subclasses each decoder so that the
attention modules have `is_causal = False` and `_update_causal_mask` builds a mask of zeros plus
the padding mask. In current transformers the same two switches exist without subclassing:
  * `config.is_causal = False` — `masking_utils.create_causal_mask`, which Llama, Mistral, Qwen2,
    GPT-2, ... all call, then builds a *bidirectional* mask that still hides padding;
  * `module.is_causal = False` on every attention module — the SDPA/flash paths otherwise pass
    `is_causal=True` to the kernel whenever no explicit mask was built (no padding in the batch).
`make_bidirectional` flips both and `assert_bidirectional` proves it took (a later token must change
an earlier position), so an architecture that masks some other way fails loudly, not silently.

LLM2Vec step 2 (masked next-token prediction, MNTP): mask input tokens and predict token i from the
hidden state at position i-1 — the position whose LM head was trained to predict it — so the
bidirectional model learns to use its new right context without a new head (`mntp_loss`).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Iterable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger(__name__)


def make_bidirectional(model: nn.Module) -> nn.Module:
    """Switch a Hugging Face causal LM to bidirectional attention (padding mask kept), in place."""
    config = model.config
    for cfg in {id(c): c for c in (config, config.get_text_config())}.values():
        cfg.is_causal = False
    switched = 0
    for module in model.modules():
        if isinstance(getattr(module, "is_causal", None), bool) and module is not model:
            module.is_causal = False
            switched += 1
    if switched == 0:
        raise RuntimeError(f"{type(model).__name__}: found no attention module with `is_causal`; "
                           "dociq cannot make this architecture bidirectional")
    return model


@torch.no_grad()
def is_bidirectional(model: nn.Module, length: int = 6) -> bool:
    """True when changing the last token changes the first position's final hidden state."""
    vocab = model.config.get_text_config().vocab_size
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (1, length), generator=g)
    changed = ids.clone()
    changed[0, -1] = (ids[0, -1] + 1) % vocab
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    base = getattr(model, "base_model", model)
    a = base(input_ids=ids.to(device)).last_hidden_state[0, 0]
    b = base(input_ids=changed.to(device)).last_hidden_state[0, 0]
    model.train(was_training)
    return not torch.allclose(a, b)


def assert_bidirectional(model: nn.Module) -> None:
    if not is_bidirectional(model):
        raise RuntimeError(f"{type(model).__name__} is still causal after make_bidirectional: its "
                           "attention mask is built outside transformers' masking_utils; this "
                           "teacher architecture is not supported")


class Teacher(nn.Module):
    """A (bidirectional) Hugging Face causal LM with its tokenizer, used frozen by distillation.

    encode(ids, mask) -> hidden states of `layer` (default: final) and the final ones [B, L, H];
    logits_at(hidden, positions) -> LM-head logits only where needed (LLM vocabularies are large).
    """

    def __init__(self, model: nn.Module, tokenizer, layer: int = -1,
                 untrained_head: Sequence[str] = ()) -> None:
        super().__init__()
        self.model = model
        # LM-head tensors the checkpoint did not have (a sentence encoder such as MiniLM, loaded as
        # a causal LM, gets a freshly initialised head): its logits are noise.
        self.untrained_head = tuple(untrained_head)
        self.tokenizer = tokenizer
        self.layer = layer
        text_config = model.config.get_text_config()
        self.hidden_size = text_config.hidden_size
        self.vocab_size = model.get_output_embeddings().weight.shape[0]
        self.bidirectional = not getattr(text_config, "is_causal", True)
        # Right padding: causal-LM tokenizers often pad left, which would shift rotary positions.
        tokenizer.padding_side = "right"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token or tokenizer.unk_token
        # LLMs have no mask token; LLM2Vec masks Llama/Mistral with "_" (its `blank` option).
        self.mask_token_id = (tokenizer.mask_token_id if tokenizer.mask_token_id is not None
                              else tokenizer.encode("_", add_special_tokens=False)[-1])

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, bidirectional: bool = True, layer: int = -1,
                        dtype: torch.dtype | None = None) -> "Teacher":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(path)
        if not (path / "config.json").exists():
            raise FileNotFoundError(f"teacher.path={path} has no config.json: point teacher.path at a "
                                    "local Hugging Face causal LM directory (save_pretrained output)")
        model, info = AutoModelForCausalLM.from_pretrained(
            str(path), local_files_only=True, dtype=dtype, attn_implementation="sdpa",
            output_loading_info=True)
        base = model.base_model_prefix + "."
        untrained_head = sorted(k for k in info["missing_keys"] if not k.startswith(base))
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
        if bidirectional:
            make_bidirectional(model)
            assert_bidirectional(model)
        log.info("teacher %s (%s, hidden %d, vocab %d) loaded, %s attention", path,
                 type(model).__name__, model.config.get_text_config().hidden_size,
                 len(tokenizer), "bidirectional" if bidirectional else "causal")
        if untrained_head:
            log.warning("teacher %s has no trained LM head (%s newly initialised): only its hidden "
                        "states can be distilled", path, ", ".join(untrained_head))
        return cls(model, tokenizer, layer=layer, untrained_head=untrained_head)

    @property
    def max_positions(self) -> int | None:
        """The longest input the teacher's position embeddings cover (None: not stated)."""
        return getattr(self.model.config.get_text_config(), "max_position_embeddings", None)

    @property
    def has_lm_head(self) -> bool:
        return not self.untrained_head

    def vocab(self) -> dict[str, int]:
        return self.tokenizer.get_vocab()

    def encode(self, ids: torch.Tensor,
               attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(hidden states of `layer`, final hidden states) [B, L, H]; the final ones feed the LM head."""
        out = self.model.base_model(input_ids=ids, attention_mask=attention_mask.long(),
                                    output_hidden_states=self.layer != -1)
        final = out.last_hidden_state
        return (final if self.layer == -1 else out.hidden_states[self.layer]), final

    def logits_at(self, final_hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(final_hidden)

    def tokenize_words(self, pages: Sequence[Sequence[str]], max_length: int,
                       device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Teacher tokens of each page's words joined by spaces: (ids, mask, word_index [B, L]).

        word_index maps each token to the page word its last character falls in (-1 for special
        tokens and bare spaces), from the tokenizer's character offsets — this works for BPE,
        SentencePiece and WordPiece alike."""
        texts, char_words = [], []
        for words in pages:
            text, owner = "", []
            for w, word in enumerate(words):
                if text:
                    text += " "
                    owner.append(-1)
                text += word
                owner.extend([w] * len(word))
            texts.append(text)
            char_words.append(owner)
        enc = self.tokenizer(texts, padding=True, truncation=True, max_length=max_length,
                             return_offsets_mapping=True, return_tensors="pt")
        word_index = torch.full(enc["input_ids"].shape, -1, dtype=torch.long)
        for i, offsets in enumerate(enc["offset_mapping"].tolist()):
            for t, (start, end) in enumerate(offsets):
                if end > start and enc["attention_mask"][i, t]:
                    word_index[i, t] = char_words[i][end - 1]
        return (enc["input_ids"].to(device), enc["attention_mask"].bool().to(device),
                word_index.to(device))


def mntp_loss(teacher: Teacher, masked_ids: torch.Tensor, attention_mask: torch.Tensor,
              labels: torch.Tensor) -> torch.Tensor:
    """Masked next-token prediction: the hidden state at i-1 predicts the masked token at i."""
    hidden = teacher.model.base_model(input_ids=masked_ids,
                                      attention_mask=attention_mask.long()).last_hidden_state
    target = labels[:, 1:]
    chosen = target != -100
    if not chosen.any():
        return hidden.sum() * 0.0
    logits = teacher.logits_at(hidden[:, :-1][chosen])
    return F.cross_entropy(logits.float(), target[chosen])


def adapt_with_mntp(teacher: Teacher, batches: Iterable[tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                    masking, steps: int, lr: float = 5e-5,
                    generator: torch.Generator | None = None) -> list[float]:
    """LLM2Vec step 2: train the bidirectional teacher with MNTP for `steps` batches.

    `batches` yields (ids, attention_mask, special_mask) in teacher tokens; `masking` is an
    `MLMMasking` with the teacher's mask id and vocabulary. Returns the per-step losses."""
    generator = generator or torch.Generator().manual_seed(0)
    params = [p for p in teacher.model.parameters()]
    for p in params:
        p.requires_grad_(True)
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    teacher.model.train()
    losses: list[float] = []
    iterator = iter(batches)
    while len(losses) < steps:
        try:
            ids, mask, special = next(iterator)
        except StopIteration:
            if not losses:
                raise ValueError("MNTP adaptation got no batches") from None
            iterator = iter(batches)
            continue
        masked, labels = masking(ids.cpu(), special.cpu(), generator)
        loss = mntp_loss(teacher, masked.to(ids.device), mask, labels.to(ids.device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
    teacher.model.eval()
    for p in params:
        p.requires_grad_(False)
    log.info("MNTP teacher adaptation: %d steps, loss %.3f -> %.3f", steps, losses[0], losses[-1])
    return losses


def build_tiny_teacher(out_dir: str | os.PathLike, hidden_size: int = 128, layers: int = 2,
                       heads: int = 4, seed: int = 0) -> Path:
    """A tiny *random* Llama with the MiniLM WordPiece vocabulary, saved with save_pretrained.

    Same vocabulary as the default student tokenizer, so distillation's KL term applies. It makes
    the distill stage runnable offline; it teaches nothing useful."""
    from transformers import LlamaConfig, LlamaForCausalLM

    # deferred: text_encoder imports transformers, which this module loads only when a teacher is built
    from dociq.models.text_encoder import load_tokenizer

    out = Path(out_dir)
    tokenizer = load_tokenizer()
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=hidden_size,
                         intermediate_size=hidden_size * 4, num_hidden_layers=layers,
                         num_attention_heads=heads, num_key_value_heads=heads,
                         max_position_embeddings=512, pad_token_id=tokenizer.pad_token_id,
                         bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return out
