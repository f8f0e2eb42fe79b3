"""Evaluation: held-out mIoU per prompt kind, COCO mAP of segmented pages, encoder probes."""
