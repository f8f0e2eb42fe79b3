"""Inference: the Predictor (questions, points, boxes, masks), the page segmenter and model folders."""
