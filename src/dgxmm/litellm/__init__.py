"""The LiteLLM registration: the sync, LiteLLM's admin API, the purge of a host that is gone."""
