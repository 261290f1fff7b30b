"""Estimators and planners: bytes for weights, activations, decode and host buffers; recommendations."""
