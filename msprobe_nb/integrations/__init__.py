"""Integrations with the training loops people use; each module is a shell over the public API and imports
its framework only when used (``msprobe_nb.integrations.transformers`` for the Hugging Face ``Trainer``)."""
