"""The model store: models pulled from a hub onto this machine, kept in the Hugging Face Hub's
cache layout (docs/models.md). ``source`` is the one module that talks to a hub."""
