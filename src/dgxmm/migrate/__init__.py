"""``dgxmm import``: the models of another server (llama-swap's YAML, Ollama's store) as declared
deployment files, with a report of what each setting became and what was not carried."""
