"""Experiments: files that list runs (variant x seed x overrides), and the runner (run.py)."""
