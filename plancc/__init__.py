"""plancc: compile fine-tuning datasets into packed, label-balanced, token-exact training plans."""

__version__ = "0.1.0"
