"""The run directory: its files and saved config, checkpoints, opening a run, Hugging Face import and export."""
