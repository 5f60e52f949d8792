"""dgxmm's client of the engines: one pool of kept-alive connections per deployment."""
