"""``make demo``: a real on-demand cold start of llama.cpp through the gateway of a running dgxmm.

Not part of the service: it is a walk-through a newcomer runs against ``make run``, and a test
runs it against a served dgxmm so that it keeps working. It needs the ``demo`` extra.
"""
