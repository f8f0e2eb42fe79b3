"""Data sets on disk: COCO-format sets, FUNSD and the real-document corpus."""
