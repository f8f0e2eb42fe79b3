"""Evaluation: held-out mIoU per prompt kind, COCO mAP of segmented pages, encoder probes,
and a peer baseline with no model of ours (an off-the-shelf layout detector + text search)."""
