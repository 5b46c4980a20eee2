"""Review: reading stored plans back."""
