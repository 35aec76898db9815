"""The run config: its schema (schema.py) and the scales' presets (scales.py)."""
