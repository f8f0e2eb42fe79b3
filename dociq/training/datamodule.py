"""One LightningDataModule for every data set (synthetic / coco / funsd / engine store).

The data sets arrive already built (Hydra instantiates `train_set`/`val_set` from `configs/data/`);
this module only wires them to loaders with the collator that makes the batch contract.
"""
from __future__ import annotations

import logging
from typing import Callable

import lightning as L
import torch
from torch.utils.data import DataLoader, Dataset

from dociq.data.collate import DocumentCollator
from dociq.data.sampling import SeedCarryingDataset, SeededCollate, StepBatchSampler, StepDataLoader
from dociq.data.tokenize import OcrTokenizer, QuestionTokenizer

log = logging.getLogger(__name__)


class DocumentDataModule(L.LightningDataModule):
    def __init__(
        self,
        train_set: Dataset,
        val_set: Dataset | None,
        image_size: int,
        batch_size: int = 8,
        num_workers: int = 0,
        tokenizer: dict | None = None,
        question_context_length: int = 32,
        questions: bool = False,
        max_questions: int = 4,
        max_question_words: int = 12,
        points_per_prompt: int = 1,
        image_masking: Callable | None = None,
        text_masking: Callable | None = None,
        val_seed: int = 1234,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if len(train_set) == 0:
            raise ValueError("data.train_set is empty: it has no pages; check its path/num_pages")
        self.train_set, self.val_set = train_set, val_set
        self.batch_size, self.num_workers = batch_size, num_workers
        self.seed = int(seed)
        ocr_tokenizer = OcrTokenizer(**(tokenizer or {}))
        common = dict(
            image_size=image_size, ocr_tokenizer=ocr_tokenizer,
            question_tokenizer=QuestionTokenizer(question_context_length) if questions else None,
            questions=questions, max_questions=max_questions, points_per_prompt=points_per_prompt,
            image_masking=image_masking, text_masking=text_masking,
            max_question_words=max_question_words,
        )
        self.train_collator = DocumentCollator(**common)
        # validation sees the same masks and prompts every time, so its losses are comparable
        self.val_collator = DocumentCollator(**common, seed=val_seed)

    @property
    def ocr_tokenizer(self) -> OcrTokenizer:
        return self.train_collator.ocr_tokenizer


    def train_dataloader(self) -> DataLoader:
        """Batches in an order fixed by (seed, step), starting at the step the trainer is at (after a
        resume: the checkpoint's), so resumed and uninterrupted runs see the same batches."""
        trainer = self.trainer
        ranks = {"num_replicas": trainer.world_size, "rank": trainer.global_rank} if trainer is not None else {}
        sampler = StepBatchSampler(len(self.train_set), self.batch_size, self.seed,
                                   start_step=self._batches_consumed(), **ranks)
        # The loader's own generator: creating its iterator must not draw from the global RNG (the
        # resumed run creates it at step k, the uninterrupted one at step 0).
        return StepDataLoader(SeedCarryingDataset(self.train_set), batch_sampler=sampler,
                          num_workers=self.num_workers, collate_fn=SeededCollate(self.train_collator),
                          persistent_workers=self.num_workers > 0,
                          generator=torch.Generator().manual_seed(self.seed))

    def _batches_consumed(self) -> int:
        trainer = self.trainer
        if trainer is None:
            return 0
        return trainer.global_step * trainer.accumulate_grad_batches

    def val_dataloader(self) -> DataLoader | list:
        if self.val_set is None or len(self.val_set) == 0:
            return []
        return DataLoader(self.val_set, batch_size=self.batch_size, shuffle=False,
                          num_workers=self.num_workers, collate_fn=self.val_collator,
                          persistent_workers=self.num_workers > 0)
